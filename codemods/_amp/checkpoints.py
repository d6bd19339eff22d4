"""The GradScaler's state saved next to the optimizer's in checkpoints, and
loaded back after it."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, walk
from .plan import APEX_LOAD_STATE_DICT, APEX_STATE_DICT, SCALER_NAMES, Problem, method_call, statement


class Checkpoints:
    """Mixed into the codemod."""

    def plan_checkpoints(self, plans: list) -> None:
        """`optimizer.state_dict()` in a dict literal (or stored under a key)
        gains the scaler's next to it; `optimizer.load_state_dict(ckpt[key])`
        is followed by the scaler's, when the checkpoint has it."""
        scalers = {ref.key: self.scaler_of(plan) for plan in plans for ref in plan.optimizers}
        pending = list(scalers.values())
        while pending:  # the scalers of callers that pass their optimizer in
            for _, home, source in pending.pop().passed:
                if source.key not in scalers:
                    scalers[source.key] = self.scaler_bindings[home]
                    pending.append(self.scaler_bindings[home])
        for call in self.facts.calls:
            if not (method_call(call, "state_dict") or method_call(call, "load_state_dict")):
                continue
            ref = self.optimizer_of(call.func.value, call)
            if ref is None or ref.key not in scalers:
                continue
            binding = scalers[ref.key]
            try:
                if binding.kind == "name" and not self.name_visible(binding, call):
                    raise Problem(call, "AM417", "the optimizer's state is saved or loaded where the scaler is out of reach: save and load `scaler.state_dict()` with it by hand")
                if method_call(call, "state_dict"):
                    self.plan_save(call, binding.text(self.owner_at(call)))
                else:
                    self.plan_load(call, binding.text(self.owner_at(call)))
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)

    def plan_save(self, call: cst.Call, scaler: str) -> None:
        parent = self.parent(call)
        if isinstance(parent, cst.DictElement) and parent.value is call:
            self.plan_save_in_dict(call, parent, scaler)
            return
        line = self.own_line(call)
        assign = line.body[0] if line is not None else None
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Subscript):
            self.plan_save_in_subscript(call, line, assign.targets[0].target, scaler)
            return
        if not self.scaler_state_near(call, "state_dict"):
            raise Problem(call, "AM417", f"the optimizer's state is saved without the scaler's: save `{scaler}.state_dict()` with it")

    def plan_save_in_dict(self, call: cst.Call, element: cst.DictElement, scaler: str) -> None:
        dictionary = self.parent(element)
        entries = [e for e in dictionary.elements if isinstance(e, cst.DictElement)]
        if any(self.is_scaler_state(e.value, "state_dict") for e in entries):
            return
        key = self.sibling_key(element.key)
        if key is None or any(isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == "scaler" for e in entries):
            raise Problem(call, "AM417", f"cannot add a 'scaler' entry next to the optimizer's here: add `{scaler}.state_dict()` to the checkpoint by hand")
        if not self.fix(call, "AM405", "the GradScaler's state is saved next to the optimizer's (a resumed fp16 run keeps its loss scale)"):
            return
        index = list(dictionary.elements).index(element)
        new = cst.DictElement(key=cst.SimpleString(key), value=cst.parse_expression(f"{scaler}.state_dict()"))
        self.edits.replace[dictionary] = lambda updated: updated.with_changes(elements=self.with_entry(list(updated.elements), index, new))

    @staticmethod
    def with_entry(elements: list, index: int, new: cst.DictElement) -> list:
        """`elements` with `new` after `elements[index]`, following the layout."""
        current = elements[index]
        if index + 1 < len(elements):
            between, trailing = current.comma, current.comma
        else:
            previous = elements[index - 1].comma if index > 0 else None
            between = previous if isinstance(previous, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            trailing = current.comma
        elements[index] = current.with_changes(comma=between)
        elements.insert(index + 1, new.with_changes(comma=trailing))
        return elements

    @staticmethod
    def sibling_key(key: Optional[cst.BaseExpression]) -> Optional[str]:
        """'scaler', in the quotes of the optimizer's key."""
        if not isinstance(key, cst.SimpleString) or key.prefix:
            return None
        return f"{key.quote}scaler{key.quote}"

    def is_scaler_state(self, node: cst.CSTNode, method: str) -> bool:
        """`scaler.state_dict()` (or apex's amp.state_dict(), being replaced by it)."""
        if not method_call(node, method):
            return False
        if self.is_qualified(node.func, {APEX_STATE_DICT, APEX_LOAD_STATE_DICT}):
            return True
        receiver = self.dotted(node.func.value) or ""
        return receiver.split(".")[-1] in SCALER_NAMES

    def scaler_state_near(self, call: cst.Call, method: str) -> bool:
        block = self.parent(self.line_of(call))
        return any(self.is_scaler_state(c, method) for c in walk(block, into_definitions=False))

    def plan_save_in_subscript(self, call: cst.Call, line: cst.SimpleStatementLine, target: cst.Subscript, scaler: str) -> None:
        index = target.slice[0].slice if len(target.slice) == 1 else None
        key = self.sibling_key(index.value) if isinstance(index, cst.Index) else None
        if key is None or self.dotted(target.value) is None:
            raise Problem(call, "AM417", f"save `{scaler}.state_dict()` next to the optimizer's state by hand")
        if self.scaler_state_near(call, "state_dict"):
            return
        if self.fix(call, "AM405", "the GradScaler's state is saved next to the optimizer's (a resumed fp16 run keeps its loss scale)"):
            self.edits.insert_after(line, statement(f"{code_of(target.value)}[{key}] = {scaler}.state_dict()"))

    def plan_load(self, call: cst.Call, scaler: str) -> None:
        line = self.own_line(call)
        argument = call.args[0].value if len(call.args) == 1 and not call.args[0].keyword else None
        index = argument.slice[0].slice if isinstance(argument, cst.Subscript) and len(argument.slice) == 1 else None
        key = self.sibling_key(index.value) if isinstance(index, cst.Index) else None
        container = self.dotted(argument.value) if isinstance(argument, cst.Subscript) else None
        if line is None or key is None or container is None:
            raise Problem(call, "AM417", f"the optimizer's state is loaded without the scaler's: load `{scaler}.load_state_dict(...)` from the checkpoint by hand")
        if self.scaler_state_near(call, "load_state_dict"):
            return
        if self.fix(call, "AM405", "the GradScaler's state is loaded after the optimizer's, when the checkpoint has it"):
            self.edits.insert_after(line, statement(f"if {key} in {container}:\n    {scaler}.load_state_dict({container}[{key}])"))

