"""`Variable(..., volatile=True)`: the statements that use the value go
under `with torch.no_grad():` (AM222)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from .._base import code_of, walk
from .._item.syntax import AUTOGRAD_ATTRIBUTES, AUTOGRAD_CALLS, first_line, method_name
from ..script import vocabulary as v
from ..script.scopes import Scope
from .syntax import (
    Expression,
    assigned_names,
    bound_names,
    is_true,
    operand,
    plain_target_names,
    reads_any,
    reads_outside,
    target_names,
)

if TYPE_CHECKING:
    from ..modernize import Modernize

# Methods that only move or view a batch: a statement made of these builds no graph worth keeping.
MOVING_METHODS = frozenset(
    {"cuda", "cpu", "to", "float", "double", "half", "long", "int", "type", "view", "contiguous",
     "squeeze", "unsqueeze", "size", "t", "permute", "transpose"}
)  # fmt: skip
TRAINING_METHODS = frozenset({"backward", "step", "zero_grad", "manual_backward"})


class Regions:
    """Where the values made with `volatile=True` are used: the statements
    that go under `with torch.no_grad():`."""

    def __init__(self, codemod: "Modernize") -> None:
        self.codemod = codemod
        self.model = codemod.model
        self.starts: dict[cst.CSTNode, list] = {}  # block -> [(first statement that uses the values, call)]

    def add(self, call: cst.Call, flag: Expression) -> None:
        codemod = self.codemod
        if not is_true(flag):
            codemod.report(call, "AM222", f"volatile={code_of(flag)} has had no effect since PyTorch 0.4 and was dropped: "
                           f"run the code that uses this value under `with torch.set_grad_enabled(not {operand(flag)}):`")
            return
        if self.model.in_evaluation(call):
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4; this code already runs under no_grad")
            return
        statement = self._statement(call)
        block = self.model.parent(statement) if statement is not None else None
        if statement is None or not self._is_body(block):
            self._refuse(call, "it is not made in the loop body or function body that uses it")
            return
        names = assigned_names(self.model, call)
        body = list(block.body)
        after = body[body.index(statement) + (1 if names else 0):]
        first = next((s for s in after if not names or reads_any(s, names)), None)
        if first is None:
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4, and the value is not used after: dropped")
            return
        self.starts.setdefault(block, []).append((first, call))

    def plan(self) -> None:
        for block, starts in self.starts.items():
            body = list(block.body)
            first = min((s for s, _ in starts), key=body.index)
            calls = [call for _, call in starts]
            region = body[body.index(first):]
            why = self._why_not(region, block)
            if why is not None:
                for call in calls:
                    self._refuse(call, why)
                continue
            if self.codemod._torch is None or not self.codemod.torch_reads_torch(first):
                for call in calls:
                    self._refuse(call, "the name torch means something else here")
                continue
            target = self._whole_loop(block, body[: body.index(first)])
            if target is not None and self._why_not([target], self.model.parent(target)) is None:
                holder, span = self.model.parent(target), (target, target)
            else:
                holder, span = block, (first, region[-1])
            fixed = [
                self.codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4 (every batch "
                                 "built a graph): the code using this value runs under torch.no_grad()")
                for call in calls
            ]
            if all(fixed):
                self.codemod._wraps.setdefault(holder, []).append(span)
                self.codemod._need_torch(first)

    def _refuse(self, call: cst.Call, why: str) -> None:
        self.codemod.report(call, "AM222", f"volatile=True has had no effect since PyTorch 0.4, and was dropped; "
                            f"no torch.no_grad() region was added because {why}: put the code that uses "
                            "this value under `with torch.no_grad():` by hand")

    def _statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        return self.codemod._statement_line(call)

    def _is_body(self, block: Optional[cst.CSTNode]) -> bool:
        holder = self.model.parent(block) if isinstance(block, cst.IndentedBlock) else None
        return isinstance(holder, (cst.For, cst.While, cst.FunctionDef)) and holder.body is block

    def _whole_loop(self, block: cst.IndentedBlock, before: list) -> Optional[cst.For]:
        """The loop itself, when everything its body runs before the region only moves data."""
        loop = self.model.parent(block)
        holder = self.model.parent(loop)
        if not isinstance(loop, cst.For) or loop.orelse is not None or not isinstance(holder, (cst.IndentedBlock, cst.Module)):
            return None
        doomed = self.codemod._doomed
        if all(s in doomed or self._only_moves_data(s) for s in before):
            return loop
        return None

    def _only_moves_data(self, statement: cst.CSTNode) -> bool:
        for node in walk(statement):
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(node, cst.Call) and not (
                self.model.is_call_to(node, v.VARIABLE | {"torch.cuda.is_available"})
                or (method_name(node) in MOVING_METHODS and not self.codemod.values._is_module_function(node))
            ):
                return False
        return True

    def _why_not(self, region: list, block: cst.CSTNode) -> Optional[str]:
        """Why these statements cannot go under no_grad, or None."""
        for statement in region:
            for node in walk(statement):
                if isinstance(node, cst.Call) and (
                    method_name(node) in TRAINING_METHODS or self.model.is_call_to(node, AUTOGRAD_CALLS)
                ):
                    return f"`{first_line(node)}` in that region needs gradients"
                if isinstance(node, cst.Attribute) and node.attr.value in AUTOGRAD_ATTRIBUTES:
                    return f"`{first_line(node)}` in that region reads gradient state"
        scope = self.model.scope_of(region[0])
        if not self._backpropagates(scope):
            return None
        for name in sorted(bound_names(region)):
            if self._only_numbers_bound(region, name):
                continue  # `test_loss += loss.data[0]`: nothing with a graph leaves the region
            for read in reads_outside(self.model, scope, name, region):
                if not self._assigned_before(read, name, scope, region):
                    return f"{name}, made there, is read later in code that also trains (line {self.model.line(read)})"
        return None

    def _only_numbers_bound(self, region: list, name: str) -> bool:
        """Every assignment of `name` in the region gives a value without a graph."""
        values = []
        for statement in region:
            for node in walk(statement):
                if isinstance(node, (cst.Assign, cst.AugAssign)):
                    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                    if any(name in plain_target_names(t) for t in targets):
                        values.append(node.value if len(targets) == 1 and isinstance(targets[0], cst.Name) else None)
                elif isinstance(node, (cst.For, cst.CompFor, cst.WithItem, cst.AnnAssign, cst.NamedExpr)):
                    bound = node.asname.name if isinstance(node, cst.WithItem) and node.asname else getattr(node, "target", None)
                    if bound is not None and name in plain_target_names(bound):
                        values.append(None)
        return all(value is not None and self.codemod.values.is_detached(value) for value in values)

    def _backpropagates(self, scope: Scope) -> bool:
        return any(
            method_name(c) in ("backward", "manual_backward") or self.model.is_call_to(c, AUTOGRAD_CALLS)
            for c in walk(scope.node)
            if isinstance(c, cst.Call)
        )

    def _assigned_before(self, read: cst.Name, name: str, scope: Scope, region: list) -> bool:
        """Between any run of the region and `read`, a plain assignment of
        `name` runs: one before the read in a block that does not hold the
        region, or a `for` around the read, not around the region, binds it."""
        around_region = set(self.model.ancestors(region[0]))
        child: cst.CSTNode = read
        for ancestor in self.model.ancestors(read):
            if ancestor is scope.node or ancestor in around_region:
                return False
            if isinstance(ancestor, cst.For) and child is ancestor.body and name in target_names(ancestor.target):
                return True
            body = getattr(ancestor, "body", None)
            if isinstance(body, (list, tuple)) and child in body:
                for statement in body[: body.index(child)]:
                    if isinstance(statement, cst.SimpleStatementLine) and any(
                        isinstance(small, cst.Assign) and any(name in target_names(t.target) for t in small.targets)
                        for small in statement.body
                    ):
                        return True
            child = ancestor
        return False
