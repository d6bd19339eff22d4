"""State dicts of a model sharded with FSDP2. Each rank holds a shard of
every parameter, so `model.state_dict()` is that rank's shards (DTensors),
and saving it on rank 0 alone would keep a quarter of a model. The full
dict is gathered by a collective, which every rank must reach together:

- `torch.save(model.state_dict(), path)` becomes
  `save_full_state_dict(model, path)` on every rank (rank 0 writes);
- `model.load_state_dict(state)` becomes `load_full_state_dict(model, state)`
  (plain `load_state_dict` on a model that is not sharded);
- an `if` around either whose test each rank computes for itself
  (`if val_loss < best:`) becomes `if rank_zero_decides(...)`: one rank
  entering a collective alone would wait for the others forever.

Any other read of the model's state dict, a pickled whole model, and an
optimizer's state dict are findings.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from .._base import has_star_args, is_main_guard, is_name, walk
from .._ddp.common import RUNTIME, CannotMigrate, Var, call_of
from .._ddp.queries import ScriptQueries, method_of
from .._ddp.references import INSPECTING_CALLS, MODULE_API, UNWRAP_API
from ..script import vocabulary as v

SHARDING = "accelmigrate.runtime.sharding"
STATE_DICT_METHODS = frozenset({"state_dict", "load_state_dict"})
UNWRAP = frozenset({f"{RUNTIME}.unwrap_model"})
GATHER_BY_HAND = (
    "gather it on every rank with `state = get_model_state_dict({model}, options=StateDictOptions(full_state_dict=True, "
    "cpu_offload=True))` (torch.distributed.checkpoint.state_dict, a collective) before the code that uses it, "
    "then run fsdp again"
)


def bare_model(holder: cst.BaseExpression) -> cst.BaseExpression:
    """`model` of `model.module` or `unwrap_model(model)`: the sharded model
    is the user's module itself."""
    return holder.args[0].value if isinstance(holder, cst.Call) else holder.value


class ShardedCheckpoints(ScriptQueries):
    """Plans the gathered saves and loads of the sharded model."""

    def _plan_sharded_references(self, model: Var) -> None:
        for reference, _ in self._followed_references(model):
            self._plan_sharded_reference(model, reference)
        self._report_optimizer_state(model)

    def _plan_sharded_reference(self, model: Var, reference: cst.CSTNode) -> None:
        parent = self.parent(reference)
        name = self._code(reference)
        # `unwrap_model(model)`, as compile (or ddp) writes it, reads the model itself.
        holder = self._unwrapped_by(reference) or reference
        if isinstance(parent, cst.Attribute) and parent.value is reference and parent.attr.value == "module":
            holder = parent  # `model.module`, written for the DataParallel it had
            if self._method_called(holder) not in STATE_DICT_METHODS:
                self._plan_unwrap(holder, reference, f"`{name}.module` -> `unwrap_model({name})`: the model itself")
                return
        method = self._method_called(holder)
        if method == "state_dict":
            self._plan_gathered_save(holder, reference, name)
        elif method == "load_state_dict":
            self._plan_full_load(holder, reference, name)
        elif method is not None and method not in MODULE_API | UNWRAP_API and not self._only_through_forward(model, method):
            self.report(
                holder, "AM768",
                f"`{name}.{method}(...)` runs outside `forward`: on a sharded model, a method that computes with "
                f"the model's own parameters finds them sharded; after `shard_model({name})` add "
                f"`register_fsdp_forward_method({name}, \"{method}\")` (torch.distributed.fsdp) if it does",
            )
        else:
            self._check_passed_whole(reference, name)

    def _only_through_forward(self, model: Var, method: str) -> bool:
        """The model's class (in this file) computes in `method` only through
        `self(...)`, which gathers the shards: it calls none of its own layers
        and reads no attribute that `__init__` builds with a call (a layer, a
        parameter); plain values such as `self.block_size` are fine."""
        klass = self._model_class(model)
        found = method_of(klass, method) if klass is not None else None
        init = method_of(klass, "__init__") if klass is not None else None
        if found is None:
            return False
        built = {
            target.attr.value
            for node in (walk(init.body) if init is not None else ())
            if isinstance(node, cst.Assign) and not isinstance(node.value, (cst.Name, cst.Integer, cst.Float, cst.SimpleString))
            for target in (t.target for t in node.targets)
            if isinstance(target, cst.Attribute) and is_name(target.value, "self")
        }
        own_methods = {f.name.value for f in klass.body.body if isinstance(f, cst.FunctionDef)}
        return not any(
            isinstance(node, cst.Attribute) and is_name(node.value, "self") and node.attr.value in built | own_methods
            for node in walk(found.body)
        )

    def _unwrapped_by(self, reference: cst.CSTNode) -> Optional[cst.Call]:
        """The call `unwrap_model(<reference>)`, if that is where it is read."""
        argument = self.parent(reference)
        call = self.parent(argument) if isinstance(argument, cst.Arg) else None
        if isinstance(call, cst.Call) and len(call.args) == 1 and self.is_qualified(call.func, UNWRAP):
            return call
        return None

    def _method_called(self, holder: cst.CSTNode) -> Optional[str]:
        """`X` of `holder.X(...)`."""
        attribute = self.parent(holder)
        if not (isinstance(attribute, cst.Attribute) and attribute.value is holder):
            return None
        call = self.parent(attribute)
        return attribute.attr.value if isinstance(call, cst.Call) and call.func is attribute else None

    def _check_passed_whole(self, reference: cst.CSTNode, name: str) -> None:
        argument = self.parent(reference)
        call = self.parent(argument) if isinstance(argument, cst.Arg) else None
        if not (isinstance(call, cst.Call) and call.args and call.args[0] is argument and argument.keyword is None):
            return
        if self.is_call_to(call, v.TORCH_SAVE):
            raise CannotMigrate(
                call, "AM762",
                f"`torch.save({name}, ...)` pickles the module with its shards: fsdp changed nothing; save "
                f"`{name}.state_dict()` with `torch.save({name}.state_dict(), path)`, then run fsdp again",
            )
        if self.is_call_to(call, INSPECTING_CALLS):
            self.report(
                call, "AM768",
                f"`{self._code(call.func)}` traces or inspects `{name}`, whose parameters are sharded across the "
                f"ranks: do it before `shard_model({name})`, or on the bare model in a one-process run",
            )

    # -- saves and loads ----------------------------------------------------------------

    def _plan_gathered_save(self, holder: cst.CSTNode, reference: cst.CSTNode, name: str) -> None:
        state_call = self.parent(self.parent(holder))
        save = self._plain_save_of(state_call)
        if save is None:
            raise CannotMigrate(
                state_call, "AM762",
                f"`{name}.state_dict()` of a sharded model holds this rank's shards only, and is used here other "
                f"than as `torch.save({name}.state_dict(), path)`: fsdp changed nothing; "
                + GATHER_BY_HAND.format(model=name),
            )
        line = self.parent(self.parent(save))
        self._collective_saves.add(line)
        strip = holder is not reference
        self._plan_reached_alike(line)

        def gathered(updated: cst.Call) -> cst.Call:
            model = updated.args[0].value.func.value
            path = updated.args[1]
            return updated.with_changes(
                func=cst.Name("save_full_state_dict"),
                args=[
                    updated.args[0].with_changes(value=bare_model(model) if strip else model),
                    path.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT),
                ],
            )

        def apply() -> None:
            self._use("save_full_state_dict")
            self._forget_unwrap(holder)
            self._edits[save] = gathered

        self._step(
            save, "AM763",
            f"`save_full_state_dict({name}, ...)`: every rank gathers the full state dict (keys of the bare model), "
            f"rank 0 writes it",
            apply,
        )

    def _plain_save_of(self, state_call: cst.CSTNode) -> Optional[cst.Call]:
        """The `torch.save(<state_call>, path)` alone on its line, if that is
        where the state dict goes."""
        argument = self.parent(state_call)
        save = self.parent(argument) if isinstance(argument, cst.Arg) else None
        if not (isinstance(state_call, cst.Call) and not state_call.args and isinstance(save, cst.Call)):
            return None
        if not self.is_call_to(save, v.TORCH_SAVE) or has_star_args(save) or len(save.args) != 2:
            return None
        first, path = save.args
        if first is not argument or first.keyword is not None or (path.keyword is not None and path.keyword.value != "f"):
            return None
        expression = self.parent(save)
        line = self.parent(expression)
        if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            return None
        return save

    def _plan_full_load(self, holder: cst.CSTNode, reference: cst.CSTNode, name: str) -> None:
        load = self.parent(self.parent(holder))
        strip = holder is not reference
        statement, _ = self._block_statement(load)
        if statement is None:
            raise CannotMigrate(
                load, "AM762",
                f"`{name}.load_state_dict(...)` in a one-line block: put it on its own line, then run fsdp again",
            )
        self._plan_reached_alike(statement)

        def full(updated: cst.Call) -> cst.Call:
            model = updated.func.value
            first = cst.Arg(bare_model(model) if strip else model, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(func=cst.Name("load_full_state_dict"), args=[first, *updated.args])

        def apply() -> None:
            self._use("load_full_state_dict")
            self._forget_unwrap(holder)
            self._edits[load] = full

        self._step(
            load, "AM764",
            f"`load_full_state_dict({name}, ...)`: a full state dict (from rank 0) loaded into the shards of every "
            f"rank; a plain `load_state_dict` on a model that is not sharded",
            apply,
        )

    def _forget_unwrap(self, holder: cst.CSTNode) -> None:
        """`unwrap_model` may be unused once its call is rewritten."""
        if isinstance(holder, cst.Call):
            RemoveImportsVisitor.remove_unused_import(self.context, RUNTIME, "unwrap_model")

    def _report_optimizer_state(self, model: Var) -> None:
        for optimizer in self._optimizer_calls():
            if model not in self._models_trained_by(optimizer):
                continue
            assigned = self.assignment_line(optimizer)
            var = self._target_var(assigned[1].targets[0].target) if assigned else None
            for reference in self._references(var) if var is not None else ():
                method = self._method_called(reference)
                if method in STATE_DICT_METHODS:
                    self.report(
                        reference, "AM765",
                        f"`{self._code(reference)}.{method}()` of an optimizer over sharded parameters is this "
                        f"rank's shard of its state: gather it on every rank with "
                        f"`get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, "
                        f"cpu_offload=True))` and load it with `set_optimizer_state_dict` "
                        f"(torch.distributed.checkpoint.state_dict), or save both with torch.distributed.checkpoint",
                    )

    # -- every rank reaches a collective ------------------------------------------------

    def _plan_reached_alike(self, statement: cst.CSTNode) -> None:
        """Each `if` around `statement` in its function tests what every rank
        computes alike, or becomes rank 0's decision."""
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return
            if not isinstance(ancestor, cst.If) or is_main_guard(ancestor.test):
                continue
            test = ancestor.test
            if test in self._decisions_planned or self._decided_already(test) or self._same_on_every_rank(test):
                continue
            self._decisions_planned.add(test)
            self._plan_decision(test)

    def _plan_decision(self, test: cst.BaseExpression) -> None:
        def apply() -> None:
            self._use("rank_zero_decides")
            self._edits[test] = lambda updated: call_of("rank_zero_decides", updated)

        self._step(
            test, "AM769",
            f"`rank_zero_decides({self._code(test)})`: the state dict is gathered by every rank together, so every "
            f"rank takes this branch when rank 0 does",
            apply,
        )
