"""A training loop in another module of the project, handed the model and
the loader this file builds (`train_one_epoch(model, train_loader,
optimizer, criterion, device)` from `engine.py`), seen from both files.

In the file that builds them (the project fact `training_loops`), the call
is the training step: the model it is handed is wrapped once it is on its
device, the loader it is handed gets its sampler and split batch, and the
epoch loop around the call its `set_epoch`. In the module that trains (the
fact `received_loops`), the model parameter is the wrapped model (its
`state_dict` read through `unwrap_model`), the loader parameter a sharded
loader (`set_loader_epoch` in an epoch loop there), and the output rank 0's.

The engine writes the two files together, and migrates both again without
these facts when ddp refuses either of them (accelmigrate/engine/migrate.py): a
model wrapped in one file for a loop the other could not make distributed
would print and save on every rank.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import walk
from ..script import project_facts, vocabulary as v
from ..script.project_facts import LoaderClass, LoopFunction, argument_of
from ..script.reduction import SUM, UNCLEAR, backward_reduction, sums_or_unclear
from .common import CannotMigrate, Var
from .queries import ScriptQueries


class HandedLoops(ScriptQueries):
    """Finds the calls that hand a loop its model and loader, and the
    parameters that receive them."""

    _handed: Optional[list] = None

    def _handed_calls(self) -> list[tuple[cst.Call, LoopFunction]]:
        """The calls of another module's training loop that this file hands its model and loader."""
        if self._handed is None:
            facts = {fact.name: fact for fact in project_facts.current().training_loops} if self.reads_handoffs else {}
            self._handed = [
                (call, facts[name])
                for call in self._uses.calls if facts and not any(a.star for a in call.args)
                for name in sorted(self.script.qualified_names(call.func) & facts.keys())[:1]
            ]
        return self._handed

    def _handed_argument(self, call: cst.Call, fact: LoopFunction, which: str) -> Optional[cst.BaseExpression]:
        return fact.argument(_passed(call), which)

    def _hands_to_a_loop(self, reference: cst.CSTNode, which: str) -> bool:
        """`reference` is the model (or the loader) argument of a handed call."""
        return any(self._handed_argument(call, fact, which) is reference for call, fact in self._handed_calls())

    def _trains(self, node: cst.CSTNode) -> bool:
        """Running `node` trains: a backward of its own, or a handed loop's."""
        return super()._trains(node) or self._calls_a_handed_loop(node)

    def _calls_a_handed_loop(self, node: cst.CSTNode) -> bool:
        handed = {id(call) for call, _ in self._handed_calls()}
        return bool(handed) and any(id(n) in handed for n in walk(node))

    def _only_evaluated(self, loader: Var) -> bool:
        """Every read of the loader hands it to a function of another module
        of the project that trains nothing (`evaluate(model, val_loader)`)."""
        evaluating = project_facts.current().evaluating_functions if self.reads_handoffs else frozenset()
        references = self._references(loader) if evaluating else []
        for reference in references:
            argument = self.parent(reference)
            call = self.parent(argument) if isinstance(argument, cst.Arg) else None
            if not (isinstance(call, cst.Call) and argument.value is reference and self.script.qualified_names(call.func) & evaluating):
                return False
        return bool(references)

    def _refuse_summed_losses_handed(self) -> None:
        """A criterion built here and handed to the loop (`nn.MSELoss(reduction="sum")`):
        the loop's loss sums over the batch, and DDP's average would be a
        fraction of the original's gradient."""
        for call, _ in self._handed_calls():
            for argument in call.args:
                if sums_or_unclear(self.script, argument.value):
                    raise CannotMigrate(
                        argument, "AM520",
                        "the loop this file hands its model to computes a loss this criterion sums over the batch "
                        "(or whose reduction cannot be read): DDP averages the ranks' gradients, so ddp changed "
                        "nothing; use a mean, or wrap the model by hand and add "
                        "`sum_gradients_across_ranks(model)` after the wrap",
                    )

    # -- the module that trains ------------------------------------------------------

    def _received(self) -> Iterator[tuple[cst.FunctionDef, LoopFunction]]:
        """This module's functions that a script hands its model and loader."""
        facts = {fact.name: fact for fact in project_facts.current().received_loops} if self.reads_handoffs else {}
        for statement in self._module.body if facts else ():
            if isinstance(statement, cst.FunctionDef) and statement.name.value in facts:
                yield statement, facts[statement.name.value]

    def _received_parameter(self, function: cst.FunctionDef, name: str) -> Optional[Var]:
        param = next((p for p in [*function.params.posonly_params, *function.params.params] if p.name.value == name), None)
        return self._target_var(param.name) if param is not None else None

    def _received_models(self) -> list[Var]:
        """The models the handed loops train: wrapped by the script that hands them."""
        found = []
        for function, fact in self._received():
            model = self._received_parameter(function, fact.model)
            if model is None or self._parameter_of(model) is None:
                raise CannotMigrate(
                    function.name, "AM520",
                    f"`{fact.model}` of `{function.name.value}` is rebound in the function: the wrapped model the "
                    f"script hands it would be lost; make the model the script hands in the one that trains",
                )
            reductions = {backward_reduction(self.script, backward) for backward in self._backwards_run_by(function)} - {None}
            if reductions & {SUM, UNCLEAR}:
                raise CannotMigrate(
                    function.name, "AM520",
                    f"the loss that trains `{fact.model}` in `{function.name.value}` sums over the batch (or its "
                    f"reduction cannot be read): DDP averages the ranks' gradients, so ddp changed nothing; write it "
                    f"as a mean, or add `sum_gradients_across_ranks(model)` after the wrap in the script by hand",
                )
            found.append(model)
        return found

    def _backwards_run_by(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The backward calls in `function` and in the functions of this file it calls."""
        called = {
            node for node, known in self.script.flow.functions.items()
            if any(any(a is function for a in self.ancestors(site.call)) for site in known.callers)
        }
        return [
            backward for backward in self._uses.backward_calls
            if any(a is function or a in called for a in self.ancestors(backward))
        ]

    def _sharded_elsewhere(self, loader: cst.BaseExpression) -> bool:
        """`loader` is bound once, here, to the result of a function of the
        project that builds it sharded (the fact `sharded_loaders`):
        `train_loader, val_loader = data.get_loaders(...)`."""
        return self.reads_handoffs and self.script.loader_built_elsewhere(loader) is not None

    def _rank_zero_library(self) -> bool:
        """A helper module of a script of the run (the fact `rank_zero_library`)."""
        return self.reads_handoffs and project_facts.current().rank_zero_library

    # -- the module that builds the loader -------------------------------------------

    def _built_loader_calls(self) -> list[cst.Call]:
        """The `DataLoader(...)` calls of this module's functions whose loader
        a script hands a training loop (the fact `built_loaders`): the name
        each such function returns at that position, bound once to one."""
        facts = project_facts.current().built_loaders if self.reads_handoffs else frozenset()
        found = []
        for statement in self._module.body if facts else ():
            if not isinstance(statement, cst.FunctionDef):
                continue
            for function, position in sorted(facts):
                if statement.name.value == function:
                    found += [call for call in self._returned_loaders(statement, position) if call not in found]
        return found

    def _returned_loaders(self, function: cst.FunctionDef, position: int) -> list[cst.Call]:
        found = []
        for node in walk(function.body):
            if not isinstance(node, cst.Return) or node.value is None:
                continue
            value = node.value
            if position >= 0:
                value = value.elements[position].value if isinstance(value, cst.Tuple) and position < len(value.elements) else None
            bindings = self.script.bindings_of(value.value, value) if isinstance(value, cst.Name) else []
            if len(bindings) == 1 and isinstance(bindings[0].value, cst.Call) and self.is_call_to(bindings[0].value, v.DATALOADER):
                found.append(bindings[0].value)
        return found

    def _received_loaders(self) -> Iterator[Var]:
        for function, fact in self._received():
            loader = self._received_parameter(function, fact.loader)
            if loader is not None:
                yield loader
        for klass, fact in self._received_loader_classes():
            yield Var(fact.attribute, klass, is_attribute=True)

    def _received_loader_classes(self) -> list[tuple[cst.ClassDef, LoaderClass]]:
        """This module's classes that a script hands the DataLoader they train on."""
        facts = {fact.name: fact for fact in project_facts.current().received_loader_classes} if self.reads_handoffs else {}
        return [(s, facts[s.name.value]) for s in self._module.body if isinstance(s, cst.ClassDef) and s.name.value in facts]

    def _loader_class_calls(self) -> list[tuple[cst.Call, LoaderClass]]:
        """The calls that hand a class of another module the DataLoader it trains on."""
        facts = {fact.name: fact for fact in project_facts.current().loader_classes} if self.reads_handoffs else {}
        return [
            (call, facts[name])
            for call in self._uses.calls if facts and not any(a.star for a in call.args)
            for name in sorted(self.script.qualified_names(call.func) & facts.keys())[:1]
        ]

    def _loaders_handed_to_classes(self) -> list[cst.Call]:
        """The `DataLoader(...)` calls whose loader this file hands a class that trains on it."""
        found = []
        for call, fact in self._loader_class_calls():
            argument = argument_of(_passed(call), fact.loader, fact.loader_index)
            made = self._made_by_call(argument) if argument is not None else None
            if made is not None and self.is_call_to(made, v.DATALOADER) and made not in found:
                found.append(made)
        return found


def _passed(call: cst.Call) -> list[tuple[Optional[str], cst.BaseExpression]]:
    """A call's arguments as (keyword or None, value) pairs."""
    return [(a.keyword.value if a.keyword else None, a.value) for a in call.args]
