"""`Variable(..., volatile=True)`: the statements that use the value go
under `with torch.no_grad():` (AM222)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, is_main_guard, walk
from .._item.syntax import AUTOGRAD_ATTRIBUTES, AUTOGRAD_CALLS, first_line, method_name
from ..script import vocabulary as v
from ..script.scopes import Scope
from .planning import Planning
from .volatile_flow import GRAPH, NO_GRAPH, VOLATILE, RegionValues, assignment_of, backward_through
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

# Methods that only move or view a batch: a statement made of these builds no graph worth keeping.
MOVING_METHODS = frozenset(
    {"cuda", "cpu", "to", "float", "double", "half", "long", "int", "type", "view", "contiguous",
     "squeeze", "unsqueeze", "size", "t", "permute", "transpose"}
)  # fmt: skip
TRAINING_METHODS = frozenset({"backward", "step", "zero_grad", "manual_backward"})
# Whether a value has a graph: False for a volatile one then, and under no_grad now.
GRAPH_FLAGS = frozenset({"requires_grad", "grad_fn"})


class Regions:
    """Where the values made with `volatile=True` are used: the statements
    that go under `with torch.no_grad():`."""

    def __init__(self, codemod: Planning) -> None:
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
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4; "
                        "this code already runs under no_grad")
            return
        statement = self._statement(call)
        block = self.model.parent(statement) if statement is not None else None
        if statement is None or self._kind_of(block) is None:
            self._refuse(call, "it is not made in the loop body or function body that uses it")
            return
        names = assigned_names(self.model, call)
        if self._kind_of(block) == "top" and self._read_in_functions(names, statement):
            self._refuse(call, "it is read in a function, which runs elsewhere")
            return
        body = list(block.body)
        after = body[body.index(statement) + (1 if names else 0):]
        first = next((s for s in after if not names or reads_any(s, names) and not _sets_volatile(s)), None)
        if first is None:
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4, "
                        "and the value is not used after: dropped")
            return
        self.starts.setdefault(block, []).append((first, call))

    def plan(self) -> None:
        for block, starts in self.starts.items():
            body = list(block.body)
            first = min((s for s, _ in starts), key=body.index)
            calls = [call for _, call in starts]
            if self.codemod._torch is None or not self.codemod.torch_reads_torch(first):
                for call in calls:
                    self._refuse(call, "the name torch means something else here")
                continue
            why = None
            for holder, region in self._candidates(block, body, first, calls):
                why = self._why_not(region, calls)
                if why is None:
                    break
            if why is not None:
                for call in calls:
                    self._refuse(call, why)
                continue
            fixed = [
                self.codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4 (each run "
                                 "built a graph): the code using this value runs under torch.no_grad()")
                for call in calls
            ]
            if all(fixed):
                self.codemod._wraps.setdefault(holder, []).append((region[0], region[-1]))
                self.codemod._need_torch(first)
                self.codemod._doomed.update(s for s in body if _sets_volatile(s))

    def _candidates(self, block: cst.IndentedBlock, body: list, first: cst.CSTNode, calls: list):
        """(block, statements) to put under no_grad, best first: the whole
        loop when what runs before `first` only moves data, the rest of the
        body, the statements up to the last that reads a volatile value."""
        start = body.index(first)
        last = self._values(body[start:], calls).last_use
        narrow = body[start : start + (last or 0) + 1]
        if self._kind_of(block) == "top":  # not the rest of the script: only what uses the values
            yield block, narrow
            return
        loop = self._whole_loop(block, body[:start])
        if loop is not None:
            yield self.model.parent(loop), [loop]
        yield block, body[start:]
        if len(narrow) < len(body) - start:
            yield block, narrow

    def _values(self, region: list, calls: list) -> RegionValues:
        names = {name for call in calls for name in assigned_names(self.model, call)}
        return RegionValues(self.model, self.codemod.values, set(calls), region, names)

    def _refuse(self, call: cst.Call, why: str) -> None:
        self.codemod.report(call, "AM222", f"volatile=True has had no effect since PyTorch 0.4, and was dropped; "
                            f"no torch.no_grad() region was added because {why}: put the code that uses "
                            "this value under `with torch.no_grad():` by hand, where no gradient should flow")

    def _statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        return self.codemod._statement_line(call)

    def _kind_of(self, block: Optional[cst.CSTNode]) -> Optional[str]:
        """"body" for the body of a loop or function, "top" for the module's
        statements or the main guard's, else None (a branch: its values may
        be used after it)."""
        if isinstance(block, cst.Module):
            return "top"
        holder = self.model.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(holder, (cst.For, cst.While, cst.FunctionDef)) and holder.body is block:
            return "body"
        main_guard = isinstance(holder, cst.If) and holder.body is block and is_main_guard(holder.test)
        return "top" if main_guard and isinstance(self.model.parent(holder), cst.Module) else None

    def _read_in_functions(self, names: list, statement: cst.CSTNode) -> bool:
        scope = self.model.scope_of(statement)
        return any(
            self.model.scope_of(read) is not scope
            for name in names
            for read in reads_outside(self.model, scope, name, [statement])
        )

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

    def _why_not(self, region: list, calls: list) -> Optional[str]:
        """Why these statements cannot go under no_grad, or None."""
        values = self._values(region, calls)
        for statement in region:
            for node in walk(statement):
                if isinstance(node, cst.Call) and (
                    method_name(node) in TRAINING_METHODS or self.model.is_call_to(node, AUTOGRAD_CALLS)
                ):
                    return f"`{first_line(node)}` in that region needs gradients"
                if isinstance(node, cst.Attribute) and node.attr.value in AUTOGRAD_ATTRIBUTES and not (
                    node.attr.value in GRAPH_FLAGS and values.kind_of(node.value) == VOLATILE
                ):
                    return f"`{first_line(node)}` in that region reads gradient state"
        scope = self.model.scope_of(region[0])
        for name in sorted(bound_names(region)):
            kinds = values.kinds.get(name, {GRAPH})
            if kinds == {NO_GRAPH}:
                continue  # `test_loss += loss.data[0]`: the same value either way
            reads = self._later_reads(name, scope, region)
            if not reads:
                continue
            if GRAPH in kinds:
                if self._backpropagates(scope):
                    made = self.model.line(values.made_at.get(name, region[0]))
                    return (f"{name}, made there (line {made}) from no volatile value, may keep a graph that code "
                            f"which also trains reads later (line {self.model.line(reads[0])})")
                continue
            backward = self._backward_through(name, reads, scope)
            if backward is not None:
                return (f"`{first_line(backward)}` (line {self.model.line(backward)}) backpropagates through {name}, "
                        "made there from the volatile value (PyTorch 0.3 refused that backward)")
        return None

    def _backward_through(self, name: str, reads: list, scope: Scope) -> Optional[cst.Call]:
        """A backward call that the value of `name` (at `reads`) reaches,
        followed through the assignments that use it."""
        pending, seen = [(name, reads)], set()
        while pending:
            name, reads = pending.pop()
            for read in reads:
                if read in seen:
                    continue
                seen.add(read)
                backward = backward_through(self.model, read)
                if backward is not None:
                    return backward
                assignment = assignment_of(self.model, read)
                line = self.codemod._statement_line(read) if assignment is not None else None
                if line is None:
                    continue
                targets = assignment.targets if isinstance(assignment, cst.Assign) else [assignment]
                for target in {n for t in targets for n in plain_target_names(t.target)}:
                    pending.append((target, self._later_reads(target, scope, [line])))
        return None

    def _later_reads(self, name: str, scope: Scope, statements: list) -> list[cst.Name]:
        """The reads of `name` outside `statements` that may see the value they give it."""
        return [
            read for read in reads_outside(self.model, scope, name, statements)
            if not self._assigned_before(read, name, scope, statements)
        ]  # fmt: skip

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


def _sets_volatile(statement: cst.CSTNode) -> bool:
    """`x.volatile = False`: how 0.3 code cut a value off its volatile
    origin; today it sets an attribute nothing reads."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign) and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Attribute) and assign.targets[0].target.attr.value == "volatile"
    )  # fmt: skip
