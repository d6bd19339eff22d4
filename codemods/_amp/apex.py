"""NVIDIA apex's amp migrated to torch.amp: all of its uses, or none."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from .._base import code_of, walk
from .plan import (
    APEX, APEX_INITIALIZE, APEX_LOAD_STATE_DICT, APEX_MASTER_PARAMS, APEX_SCALE_LOSS, APEX_STATE_DICT,
    ApexEdit, Problem, statement,
)


class Apex:
    """Mixed into the codemod."""

    def apex_scale_loss(self, with_node: cst.With) -> Optional[cst.Call]:
        for item in with_node.items:
            if self.is_call_to(item.item, {APEX_SCALE_LOSS}):
                return item.item
        return None

    def apex_scale_loss_blocks(self) -> list:
        """`with amp.scale_loss(...) as scaled:` blocks, in source order."""
        found = []
        for call in self.facts.calls:
            item = self.parent(call)
            block = self.parent(item)
            if isinstance(item, cst.WithItem) and isinstance(block, cst.With) and self.is_call_to(call, {APEX_SCALE_LOSS}) and block not in found:
                found.append(block)
        return found

    def plan_apex(self, plans: list) -> list:
        """apex goes as a whole or not at all: when one of its uses cannot be
        migrated, the steps that scale through it stay as they are."""
        uses = [n for n in self.apex_names() if self.is_apex_reference(n) and not self.in_import(n)]
        calls = [c for c in self.facts.calls if any(q.startswith(APEX + ".") for q in self.qualified_names(c.func))]
        if not uses and not calls:
            return plans
        problems, handled = [], set()
        for call in calls:
            handled.update(n for n in walk(call.func, into_definitions=False) if isinstance(n, cst.Name))
            try:
                self.plan_apex_call(call, plans)
            except Problem as problem:
                problems.append(problem)
        for name in uses:
            if name not in handled:
                problems.append(Problem(name, "AM416", "apex amp used other than through initialize/scale_loss/master_params/state_dict: migrate it to torch.amp by hand"))
        if problems or any(self.is_suppressed(edit.call, "AM403") for edit in self.apex_edits):
            for problem in problems:
                self.report(problem.node, problem.code, problem.message)
            self.apex_edits = []
            kept = []
            for plan in plans:
                apex_steps = [b.apex for b in plan.backwards if b.apex is not None]
                if apex_steps:
                    self.report(apex_steps[0], "AM416", "apex stays in this file (one of its uses has no torch.amp equivalent), so this step keeps amp.scale_loss: migrate it together with the rest of apex by hand")
                else:
                    kept.append(plan)
            return kept
        return plans

    def apex_names(self) -> list:
        """The names of the file, when it imports apex (else none to look at)."""
        if not any(b.qualified.split(".")[0] == "apex" for b in self.script.imports):
            return []
        return [n for n in self.script.index.order if isinstance(n, cst.Name)]

    def is_apex_reference(self, name: cst.Name) -> bool:
        return not self.is_attribute_name(name) and any(q == APEX or q.startswith(APEX + ".") for q in self.qualified_names(name))

    def in_import(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node))

    def plan_apex_call(self, call: cst.Call, plans: list) -> None:
        names = self.qualified_names(call.func)
        if APEX_INITIALIZE in names:
            self.plan_apex_initialize(call)
        elif APEX_SCALE_LOSS in names:
            if not any(b.apex is not None and self.apex_scale_loss(b.apex) is call for p in plans for b in p.backwards):
                raise Problem(call, "AM416", "amp.scale_loss() in a training step this codemod cannot migrate: replace it by `scaler.scale(loss).backward()` by hand")
            self.apex_edits.append(ApexEdit(call, "apex amp.scale_loss() replaced by scaler.scale(loss).backward()"))
        elif APEX_MASTER_PARAMS in names:
            if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
                raise Problem(call, "AM416", "amp.master_params() with unusual arguments: pass the optimizer's parameters by hand")
            parameters = cst.parse_expression(f'[p for group in {code_of(call.args[0].value)}.param_groups for p in group["params"]]')
            message = "apex amp.master_params(optimizer) replaced by the optimizer's parameters (torch.amp keeps no separate master copy)"
            self.apex_edits.append(ApexEdit(call, message, replace=lambda updated: parameters))
        elif APEX_STATE_DICT in names or APEX_LOAD_STATE_DICT in names:
            self.plan_apex_state(call, "state_dict" if APEX_STATE_DICT in names else "load_state_dict")
        else:
            raise Problem(call, "AM416", f"apex `{code_of(call.func)}` has no torch.amp equivalent: migrate it by hand")

    def plan_apex_initialize(self, call: cst.Call) -> None:
        line = self.own_line(call)
        assign = line.body[0] if line is not None else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            raise Problem(call, "AM416", "amp.initialize() whose result is not assigned: remove it by hand (native autocast needs no initialisation)")
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        target = assign.targets[0].target
        targets = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        if not positional or len(targets) != len(positional) or any(isinstance(v, (cst.List, cst.Tuple)) for v in positional):
            raise Problem(call, "AM416", "amp.initialize() with lists of models or optimizers: remove it by hand (native autocast needs no initialisation)")
        level = next((code_of(a.value) for a in call.args if a.keyword is not None and a.keyword.value == "opt_level"), None)
        extra = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in ("opt_level", "verbosity")]
        message = "apex amp.initialize()" + (f" (opt_level {level})" if level else "") + " removed: torch.autocast and GradScaler wrap neither model nor optimizer"
        if extra:
            message += f"; {', '.join(extra)} dropped: torch.amp keeps float32 weights and scales the loss dynamically"
        if all(self.dotted(t) is not None and self.dotted(t) == self.dotted(v) for t, v in zip(targets, positional)):
            self.apex_edits.append(ApexEdit(call, message, line=line))  # `model, optimizer = amp.initialize(model, optimizer)`: gone
        else:
            rebinding = statement(f"{code_of(target)} = {', '.join(code_of(v) for v in positional)}")
            self.apex_edits.append(ApexEdit(call, message, line=line, swap=lambda old: rebinding.with_changes(leading_lines=old.leading_lines)))

    def plan_apex_state(self, call: cst.Call, method: str) -> None:
        scalers = list(self.scaler_bindings.values())
        if len(scalers) != 1 or scalers[0].kind != "name" or not self.name_visible(scalers[0], call):
            raise Problem(call, "AM416", f"apex amp.{method}(): use the GradScaler's {method}() in its place by hand")
        func = cst.parse_expression(f"{scalers[0].name}.{method}")
        self.apex_edits.append(ApexEdit(call, f"apex amp.{method}() replaced by scaler.{method}()", replace=lambda updated: updated.with_changes(func=func)))

    def commit_apex(self) -> None:
        if not self.apex_edits:
            return
        for edit in self.apex_edits:
            if not self.fix(edit.call, "AM403", edit.message):
                continue
            if edit.replace is not None:
                self.edits.replace[edit.call] = edit.replace
            elif edit.swap is not None:
                self.edits.swap[edit.line] = edit.swap
            elif edit.line is not None:
                self.edits.remove.add(edit.line)
        for node in dict.fromkeys(b.statement for b in self.script.imports):
            if self.imports_apex_amp(node):
                self.remove_import_of(node)

    def imports_apex_amp(self, node: Union[cst.Import, cst.ImportFrom]) -> bool:
        if isinstance(node, cst.ImportFrom):
            module = self.dotted(node.module) if node.module is not None else None
            if isinstance(node.names, cst.ImportStar) or node.relative:
                return False
            return module == APEX or (module == "apex" and all(a.evaluated_name == "amp" for a in node.names))
        return all((self.dotted(a.name) or "") in ("apex", APEX) for a in node.names)

