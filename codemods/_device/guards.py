"""Guards that the runtime's device makes useless (`if torch.cuda.is_available():`
around device moves, `x.cuda() if use_cuda else x`), and `torch.cuda.set_device`."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of
from .literals import CUDA_DEVICE_CONTEXT, SET_DEVICE, SET_DEVICE_ADVICE, SET_DEVICE_GUARDED
from .syntax import guarded_by


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
        """`torch.cuda.set_device(i)` fails without CUDA: it runs only where CUDA
        is available, so the GPU it selects (before NCCL starts, for a spawned
        worker's rank) stays selected on a GPU."""
        for call in self.facts.calls:
            if call is self._gpu_choice and self.is_call_to(call, CUDA_DEVICE_CONTEXT):
                self.report(call, "AM313", f"{code_of(call.func)}(...): {self._gpu_choice_reason()}")
            if not self.is_call_to(call, SET_DEVICE) or self._expects_error(call) or self._under_cuda_check(call):
                continue
            if call.args and self._is_explicit(call.args[0].value):
                self.report(call, "AM310", f"torch.cuda.set_device({code_of(call.args[0].value)}): {self._explicit_reason()}")
                continue
            statement = self._statement_of_call(call)
            if statement is None:
                self.report(call, "AM307", SET_DEVICE_ADVICE)
            elif self.fix(call, "AM307", SET_DEVICE_GUARDED):
                test = self._availability_check()
                self._edits[statement] = lambda updated: guarded_by(updated, test)

    def _statement_of_call(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        """The line that holds only `call`, in an indented block or at module level."""
        expression = self.parent(call)
        line = self.parent(expression) if isinstance(expression, cst.Expr) else None
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def _availability_check(self) -> cst.BaseExpression:
        """`torch.cuda.is_available()`, with the file's name for torch."""
        return cst.parse_expression(f"{self._torch_name()}.cuda.is_available()")
