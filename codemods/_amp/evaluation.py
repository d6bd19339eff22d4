"""Evaluation (no_grad, inference_mode, functions decorated with them) under
the same autocast as training, without a scaler."""

from __future__ import annotations

import libcst as cst

from .._base import code_of, is_docstring, walk
from .plan import ACCESSORS, CPU, Problem


class Evaluation:
    """Mixed into the codemod."""

    def plan_evaluation(self) -> None:
        regions = dict.fromkeys(r.node for r in self.script.evaluation if r.kind != "eval")
        for node in regions:
            if isinstance(node, cst.With) and self.is_evaluation_block(node):
                self.plan_evaluation_block(node)
        for node in regions:
            if isinstance(node, cst.FunctionDef) and self.is_evaluation_function(node):
                self.plan_evaluation_function(node)

    def is_evaluation_block(self, with_node: cst.With) -> bool:
        return (
            not self.has_autocast(with_node)
            and not self.runs_under_autocast(with_node)
            and not self.contains_autocast(with_node.body)
            and not self.script.in_evaluation(with_node)
            and self.forward_like(with_node.body)
        )

    def is_evaluation_function(self, function: cst.FunctionDef) -> bool:
        return (
            isinstance(function.body, cst.IndentedBlock)
            and not self.contains_autocast(function.body)
            and not self.script.in_evaluation(function)
            and self.forward_like(function.body)
        )

    def forward_like(self, body: cst.CSTNode) -> bool:
        """Calls something (a model) besides builtins, in-place tensor methods
        and accessors: parameter updates such as EMAs gain nothing from autocast."""
        return any(isinstance(child, cst.Call) and self.may_compute(child) for child in walk(body, into_definitions=False))

    def may_compute(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Attribute):
            method = call.func.attr.value
            if method.endswith("_") or method in ACCESSORS:
                return False
        return not any(name.startswith("builtins.") for name in self.qualified_names(call.func))

    def refused_evaluation(self, body: cst.CSTNode) -> bool:
        """A loss torch refuses under autocast is computed there: reported, and left in float32."""
        refused = self.refused_in(body)
        if refused is not None:
            self.report(refused, "AM418", f"`{code_of(refused.func)}` computes a binary cross-entropy on probabilities, which torch refuses under autocast: amp left this evaluation in float32; use `nn.BCEWithLogitsLoss` on the logits (without the final sigmoid), then run amp again")
        return refused is not None

    def plan_evaluation_block(self, with_node: cst.With) -> None:
        device = self.device_at(with_node)
        if device is None:
            self.report(with_node, "AM413", "evaluation under no_grad with no device binding in reach (a `device` parameter may be a string): add `torch.autocast(device_type=device.type, dtype=amp_dtype)` to this block by hand")
            return
        if device.kind != CPU and self.refused_evaluation(with_node.body):
            return
        try:
            header = self.autocast_text(device, with_node)
        except Problem as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        if not self.fix(with_node, "AM402", "evaluation runs under torch.autocast too (no GradScaler: nothing is backpropagated)"):
            return

        def add_item(updated: cst.With) -> cst.With:
            items = list(updated.items)
            items[-1] = items[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(items=[*items, cst.WithItem(item=cst.parse_expression(header))])

        self.edits.replace[with_node] = add_item
        self.autocast_spans.append(with_node)
        self.use_dtype(device)

    def plan_evaluation_function(self, function: cst.FunctionDef) -> None:
        statements = list(function.body.body)
        first = 1 if is_docstring(statements[0]) and len(statements) > 1 else 0
        device = self.device_at(statements[first])
        while device is None and first < len(statements) - 1:
            first += 1  # the function finds its device first (`device = next(model.parameters()).device`)
            device = self.device_at(statements[first])
        name = function.name.value
        if device is None:
            self.report(function, "AM413", f"{name}() runs under no_grad with no device binding in reach: wrap its forward in `torch.autocast(device_type=device.type, dtype=amp_dtype)` by hand")
            return
        if device.kind != CPU and self.refused_evaluation(function.body):
            return
        try:
            header = self.autocast_text(device, statements[first])
        except Problem as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        if self.fix(function, "AM402", f"{name}() (under no_grad) runs its body under torch.autocast too"):
            self.edits.wrap[statements[first]] = (statements[-1], header)
            self.autocast_spans.extend(statements[first:])
            self.use_dtype(device)
