"""Which model the ddp codemod wraps in DistributedDataParallel, and where:
in place of `nn.DataParallel`, or else the one model the optimizers train, at
the binding training calls, once it is on its device; and the uses of the
model that must read the unwrapped one (`state_dict`, `.module`, `torch.save`).
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from .._base import is_main_guard
from ..script import vocabulary as v
from .bare_models import BareModelWrapping
from .common import CannotMigrate, Var, as_atom, first_positional, keyword_of


class ModelWrapping(BareModelWrapping):
    """Plans the wrap and the unwrapping reads: in place of DataParallel, else
    (and for the models no DataParallel covers) the bare models' wraps."""

    def _vars_wrapped_by(self, calls: list[cst.Call]) -> list[Var]:
        """`model` of each existing `model = DistributedDataParallel(model, ...)`."""
        found: list[Var] = []
        for call in calls:
            assign = self.parent(call)
            if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
                var = self._target_var(assign.targets[0].target)
                if var is not None and var not in found:
                    found.append(var)
        return found

    def _plan_models(self) -> list[Var]:
        """Plan wrapping the trained models in DistributedDataParallel; the variables that hold them."""
        wrappers = self._calls_to(v.DATA_PARALLEL)
        if not wrappers:
            return self._plan_bare_models()
        trained = {var: None for site in self._update_sites() for var in self._models_trained_by(site)}  # in order
        converted, covered = [], set()
        for call in wrappers:
            _, _, model = self._wrapper_assignment(call)
            inner = first_positional(call)
            inner_var = self._moved_var(inner.value) if inner is not None else None
            if trained and model not in trained and inner_var not in trained:
                self._plan_drop_data_parallel(call, model)
                continue
            if len(wrappers) > 1 and not trained:
                raise CannotMigrate(
                    call, "AM520",
                    f"several models are wrapped in DataParallel and no optimizer here shows which of them trains: "
                    f"ddp changed nothing; drop the DataParallel of each model that only runs inference (or wrap each "
                    f"trained one in DistributedDataParallel by hand), then run ddp again",
                )
            converted.append((call, model))
            covered.update({model, inner_var})
        several = len(converted) > 1
        models = [self._plan_data_parallel_step(call, model, several) for call, model in converted]
        left = {var: None for var in trained if var not in covered}
        return models + (self._plan_bare_models(left) if left else [])

    def _plan_data_parallel_step(self, call: cst.Call, model: Var, several: bool) -> Var:
        local_buffers = several and self._training_calls(model) > 1
        unused = self._unused_parameter_notes(model)
        model, anchor, apply = self._plan_data_parallel(call, local_buffers, bool(unused))
        message = f"`DataParallel` -> `DistributedDataParallel` for `{model.code}` once it is on its device (only when launched on several processes)"
        dropped = [keyword_of(a) or "a positional argument" for a in call.args[1:]]
        if dropped:
            message += f"; its {', '.join(dropped)} dropped: each process computes on its own device"
        message += self._wrap_notes(local_buffers, unused)
        self._plan_wrap_step(model, anchor, call, "AM502", message, apply, local_buffers)
        return model

    def _plan_drop_data_parallel(self, call: cst.Call, model: Var) -> None:
        """A model in DataParallel that no optimizer trains (a distillation
        teacher, a second model that reloads the trained one's checkpoint for
        inference): each process runs it whole on its own device, so its
        DataParallel goes; `.module` still reads the model itself."""
        line, assign, _ = self._wrapper_assignment(call)
        chained = self._self_returning_chain(call, assign.value)
        inner = first_positional(call)
        if inner is None:
            raise CannotMigrate(call, "AM520", "DataParallel without a module argument: remove it by hand")
        rebinds_itself = not chained and self._var_of(inner.value) == model
        imported = self._from_import(call.func)

        def apply() -> None:
            if rebinds_itself:  # teacher = nn.DataParallel(teacher)
                self._remove.add(line)
                self._forget_import(imported)
            else:
                self._strip_data_parallel(call, chained, imported)

        self._step(
            call, "AM513",
            f"`DataParallel` dropped from `{model.code}`: no optimizer trains it, so each process runs it whole on its "
            f"own device; `state_dict`s it loads carry no `module.` prefix (strip it from older checkpoints with "
            f"`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, \"module.\")`)",
            apply, core=True,
        )
        for reference, _ in self._followed_references(model):
            parent = self.parent(reference)
            if isinstance(parent, cst.Attribute) and parent.value is reference and parent.attr.value == "module":
                self._plan_unwrap(parent, reference, f"`{self._code(reference)}.module` -> `unwrap_model({self._code(reference)})`")

    def _plan_data_parallel(self, call: cst.Call, local_buffers: bool, unused: bool) -> tuple[Var, cst.CSTNode, Callable[[], None]]:
        line, assign, model = self._wrapper_assignment(call)
        inner = first_positional(call)
        if inner is None:
            raise CannotMigrate(call, "AM520", "DataParallel without a module argument: replace it by DistributedDataParallel by hand")
        chained = self._self_returning_chain(call, assign.value)
        same_model = self._var_of(inner.value) == model
        rebinds_itself = not chained and same_model  # model = nn.DataParallel(model)
        anchor, conditions = self._unconditional_anchor(line, model)
        # `if use_cuda: model = nn.DataParallel(model).cuda()`: the move stays under
        # its condition, as in the original; the wrap goes after the `if`.
        if conditions and not same_model:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel under a condition, in another form than `model = nn.DataParallel(model)`: replace it by "
                "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` "
                "after the model is on its device",
            )
        anchor = self._after_apex_initialize(model, self._after_moves(anchor, model))
        wrap = self._ddp_wrap(model, line.trailing_whitespace if rebinds_itself else None, local_buffers, unused)
        if rebinds_itself:  # the comments about the DataParallel line now describe the wrap
            wrap = wrap.with_changes(leading_lines=[l for l in line.leading_lines if l.comment is not None])
        imported = self._from_import(call.func)

        def apply() -> None:
            if rebinds_itself:
                self._remove.add(line)
                self._comments_moved.add(line)
                for condition in conditions:  # innermost first
                    if all(s in self._remove for s in condition.body.body):
                        self._remove.add(condition)
                self._forget_import(imported)
            else:
                self._strip_data_parallel(call, chained, imported)
            self._after.setdefault(anchor, []).append(wrap)

        return model, anchor, apply

    def _strip_data_parallel(self, call: cst.Call, chained: bool, imported) -> None:
        """`model = nn.DataParallel(Net()).to(device)` -> `model = Net().to(device)`."""
        self._edits[call] = lambda updated: as_atom(updated.args[0].value) if chained else updated.args[0].value
        self._forget_import(imported)

    def _forget_import(self, imported) -> None:
        """`from torch.nn import DataParallel` may be unused now."""
        if imported is not None:
            RemoveImportsVisitor.remove_unused_import(self.context, *imported)

    def _wrapper_assignment(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, cst.Assign, Var]:
        """`model = nn.DataParallel(...)[.to(...)...]`: its line, Assign and target."""
        expression: cst.CSTNode = call
        parent = self.parent(expression)
        while isinstance(parent, cst.Attribute) and isinstance(self.parent(parent), cst.Call):
            expression = self.parent(parent)
            parent = self.parent(expression)
        if isinstance(parent, cst.Return):
            raise CannotMigrate(
                call, "AM520",
                "DataParallel returned from a function: wrap the returned model where it is used, after it is "
                "on its device: `if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))`",
            )
        statement = self.assignment_line(expression)
        if statement is None:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel outside a plain `model = nn.DataParallel(...)` statement: replace it by "
                "DistributedDataParallel by hand, once the model is on its device",
            )
        line, assign = statement
        model = self._target_var(assign.targets[0].target)
        if model is None:
            raise CannotMigrate(call, "AM520", "DataParallel assigned to something other than a name or `self.<name>`: wrap the model by hand")
        return line, assign, model

    def _self_returning_chain(self, call: cst.Call, value: cst.BaseExpression) -> bool:
        """True when `value` is `call` followed by methods that return the model
        itself (`.to(device)`, `.cuda()`, ...); raises for any other chain."""
        node: cst.CSTNode = call
        chained = False
        while node is not value:
            attribute = self.parent(node)
            if not (isinstance(attribute, cst.Attribute) and attribute.attr.value in v.SELF_RETURNING_MODULE_METHODS):
                raise CannotMigrate(call, "AM520", "DataParallel(...) followed by a method other than .to()/.cuda(): wrap the model by hand")
            node = self.parent(attribute)
            chained = True
        return chained

    def _unconditional_anchor(self, line: cst.SimpleStatementLine, model: Optional[Var] = None) -> tuple[cst.CSTNode, list[cst.If]]:
        """The statement that runs whenever `line` could: `line` itself, or the
        outermost `if` around it whose bodies hold nothing else but output and
        moves of the model (`if torch.cuda.device_count() > 1: print(...);
        model = nn.DataParallel(model); model.cuda()`)."""
        anchor: cst.CSTNode = line
        conditions: list[cst.If] = []
        while True:
            block = self.parent(anchor)
            owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if isinstance(owner, cst.If) and is_main_guard(owner.test):
                return anchor, conditions  # the script's entry point runs unconditionally
            if not isinstance(owner, cst.If) or owner.orelse is not None or block is not owner.body:
                if isinstance(owner, (cst.For, cst.While, cst.With, cst.Try, cst.If)):
                    raise CannotMigrate(line, "AM520", "DataParallel inside a loop, `with`, `try` or `if`/`else`: wrap the model by hand")
                return anchor, conditions
            others = [s for s in owner.body.body if s is not anchor]
            if not all(self._is_output_statement(s) or (model is not None and self._moves_model(s, model)) for s in others):
                raise CannotMigrate(
                    line, "AM520",
                    "DataParallel under a condition that also does other work: replace it by "
                    "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` by hand",
                )
            conditions.append(owner)
            anchor = owner
