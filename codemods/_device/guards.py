"""Guards that the runtime's device makes useless (`if torch.cuda.is_available():`
around device moves, `x.cuda() if use_cuda else x`), `torch.cuda.set_device`,
and legacy CUDA tensor types used as values."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of
from .literals import (
    COMPUTED_GPU, CUDA_DEVICE_CONTEXT, LEGACY_TYPES, LEGACY_VALUE_ADVICE, RUNTIME, SET_DEVICE, SET_DEVICE_ADVICE,
    SET_DEVICE_REMOVED,
)
from .syntax import has_no_side_effects


class GuardPlans:
    """Mixed into the codemod, after the calls are planned."""

    def _plan_guards(self) -> None:
        for statement in self.facts.ifs:
            if self._is_removable_guard(statement):
                if self.fix(statement, "AM309", "`if torch.cuda.is_available():` around device moves removed: `.to(device)` is a no-op on the CPU"):
                    self._unwrapped.add(statement)
        for conditional in self._conditional_moves():
            if self._is_availability(conditional.test):
                if self.fix(conditional, "AM309", "`x.cuda() if <CUDA available> else x` -> `x.to(device)`"):
                    self._edits[conditional] = lambda updated: updated.body.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _conditional_moves(self) -> list[cst.IfExp]:
        """`x.cuda() if test else x` whose move is rewritten."""
        found = []
        for call in list(self._edits):
            parent = self.parent(call)
            if isinstance(parent, cst.IfExp) and parent.body is call and self._is_planned_move_of(call, parent.orelse):
                found.append(parent)
        return found

    def _is_removable_guard(self, statement: cst.If) -> bool:
        if statement.orelse is not None or not self._is_availability(statement.test):
            return False
        block = statement.body
        if isinstance(block, cst.IndentedBlock):
            if block.header.comment is not None or block.footer:
                return False
            lines = block.body
        else:
            lines = [statement]  # `if c: x = x.cuda()` on one line
            if block.trailing_whitespace.comment is not None:
                return False
        smalls = []
        for line in lines:
            if line is statement:
                smalls.extend(block.body)
            elif isinstance(line, cst.SimpleStatementLine):
                smalls.extend(line.body)
            else:
                return False
        return bool(smalls) and all(self._is_move_statement(small) for small in smalls)

    def _is_move_statement(self, small: cst.BaseSmallStatement) -> bool:
        """`model.cuda()`, `x = x.cuda()`, `x, y = x.cuda(), y.cuda()` (all rewritten)."""
        if isinstance(small, cst.Expr):
            return self._is_planned_move_of(small.value, None)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
                return all(self._is_planned_move_of(v.value, t.value) for t, v in zip(target.elements, value.elements))
            return self._is_planned_move_of(value, target)
        return False

    def _is_planned_move_of(self, value: cst.BaseExpression, target: Optional[cst.BaseExpression]) -> bool:
        if not isinstance(value, cst.Call) or value not in self._edits or self._move_kind(value) != "cuda":
            return False
        receiver = value.func.value
        while isinstance(receiver, cst.Call) and receiver in self._edits and self._move_kind(receiver) == "cuda":
            receiver = receiver.func.value
        return target is None or receiver.deep_equals(target)

    # torch.cuda.set_device.

    def _plan_set_device(self) -> None:
        for call in self.facts.calls:
            if call is self._gpu_choice and self.is_call_to(call, CUDA_DEVICE_CONTEXT):
                self.report(call, "AM313", f"{code_of(call.func)}(...): {self._gpu_choice_reason()}")
            if not self.is_call_to(call, SET_DEVICE) or self._expects_error(call):
                continue
            if call.args and self._is_explicit(call.args[0].value):
                self.report(call, "AM310", f"torch.cuda.set_device({code_of(call.args[0].value)}): {self._explicit_reason()}")
                continue
            if call.args and self._index_kind(call.args[0].value, call) == COMPUTED_GPU or self._gpu_choice is not None:
                shown = code_of(call.args[0].value) if call.args else ""
                self.report(call, "AM313", f"torch.cuda.set_device({shown}): {self._gpu_choice_reason()}")
                continue
            statement = self._statement_of_call(call)
            runtime_chosen = self._uses_runtime or self._fallback_sites or any(d.device.kind == RUNTIME for d in self._definitions)
            if statement is None or not runtime_chosen:
                self.report(call, "AM307", SET_DEVICE_ADVICE)
                continue
            if self.fix(call, "AM307", SET_DEVICE_REMOVED):
                self._dropped.add(self._removable_guard_of(statement) or statement)

    def _statement_of_call(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        expression = self.parent(call)
        line = self.parent(expression) if isinstance(expression, cst.Expr) else None
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def _removable_guard_of(self, line: cst.SimpleStatementLine) -> Optional[cst.If]:
        """`if args.gpu is not None:` whose only statement is `line` goes with it."""
        block = self.parent(line)
        guard = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(guard, cst.If)
            and guard.orelse is None
            and len(block.body) == 1
            and not any(empty.comment for empty in line.leading_lines)
            and not block.footer
            and block.header.comment is None
            and has_no_side_effects(guard.test)
            and isinstance(self.parent(guard), (cst.IndentedBlock, cst.Module))
        ):
            return guard
        return None

    def _report_legacy_references(self) -> None:
        for node in self.facts.legacy_references:
            if self.is_qualified(node, LEGACY_TYPES):
                self.report(node, "AM308", LEGACY_VALUE_ADVICE)
