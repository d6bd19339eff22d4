"""The statements a training step's autocast region takes in, and where
`scaler.unscale_()` and `scaler.update()` go."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import CLIP_GRAD_FUNCTIONS, walk
from .._syntax import starts_cell
from ..script import vocabulary as v
from .plan import APEX_MASTER_PARAMS, RUNTIME_DEVICE, MOVES, Backward, Block, Problem, Region, is_block, method_call


# Losses torch will not compute under CUDA autocast (it raises at the first
# step): float16 cannot hold the probabilities they take the log of. (CPU
# autocast computes them in float32.)
REFUSED_UNDER_AUTOCAST = frozenset({"torch.nn.functional.binary_cross_entropy", "torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})
FOLLOWED_CALLS = 2  # how deep calls of the file's own functions are followed for one


class Regions:
    """Mixed into the codemod."""

    def refused_under_autocast(self, region: Region) -> Optional[cst.Call]:
        """A call in the region (or in a function of the file it calls) that
        computes a loss torch refuses under autocast: `F.binary_cross_entropy`,
        an `nn.BCELoss` however it reaches the step."""
        body = list(region.block.body)
        statements = body[body.index(region.first): body.index(region.last) + 1]
        return next((c for s in statements for c in self._refusing_calls(s, FOLLOWED_CALLS)), None)

    def refused_in(self, node: cst.CSTNode) -> Optional[cst.Call]:
        """The first such call in `node` (an evaluation block or function)."""
        return next(self._refusing_calls(node, FOLLOWED_CALLS), None)

    def _refusing_calls(self, node: cst.CSTNode, depth: int):
        """The calls in `node` that compute such a loss: the function itself,
        a criterion made by its class (bound here, passed in, returned by a
        function of the file), or a function of the file that calls one."""
        for call in walk(node, into_definitions=False):
            if not isinstance(call, cst.Call):
                continue
            if self.script.qualified_names(call.func) & REFUSED_UNDER_AUTOCAST or self._makes_refused(call.func, depth):
                yield call
                continue
            callee = self.script.flow.callee(call, self.script.scope_of(call)) if depth else None
            if callee is not None and any(True for _ in self._refusing_calls(callee[0].node.body, depth - 1)):
                yield call

    def _makes_refused(self, value: cst.BaseExpression, depth: int) -> bool:
        """`value` holds a criterion of a refused class."""
        if isinstance(value, cst.Call):
            if self.script.qualified_names(value.func) & REFUSED_UNDER_AUTOCAST:
                return True
            callee = self.script.flow.callee(value, self.script.scope_of(value)) if depth else None
            returns = [n.value for n in walk(callee[0].node.body, into_definitions=False) if isinstance(n, cst.Return) and n.value is not None] if callee else []
            return any(self._makes_refused(r, depth - 1) for r in returns)
        if isinstance(value, (cst.Name, cst.Attribute)) and depth:
            return any(self._makes_refused(v, depth - 1) for v in self.script.values_of(value) if v is not value)
        return False

    def region_for(self, backward: Backward) -> Optional[Region]:
        """The statements that compute the backward's loss: the last statement
        before it that binds the loss (looking outward through `if`/`try`/`with`
        blocks, never out of the loop or function), and before that the
        statements of the same block it depends on. None when the user's own
        autocast computes the loss."""
        wanted = self.reads(backward.loss)
        node = backward.call or backward.statement
        current = backward.statement
        while True:
            block = self.parent(current)
            body = list(block.body)
            for position in range(body.index(current) - 1, -1, -1):
                if self.binds(body[position]) & wanted:
                    return self.extend_region(block, body, position, node)
            current = self.statement_around(block, node)

    def computes_forward(self, loss: Optional[cst.BaseExpression]) -> bool:
        """`loss` calls a function, a model, a criterion or a functional loss
        (`F.mse_loss(self.model(x), y).backward()`): no statement before the
        backward computes it, and none can go under autocast without it."""
        return loss is not None and any(
            isinstance(call, cst.Call) and (
                not isinstance(call.func, cst.Attribute)
                or self.script.kind_of(call.func) in ("model", "criterion")
                or any(n.startswith("torch.nn.functional.") for n in self.script.qualified_names(call.func))
            )
            for call in walk(loss, into_definitions=False)
        )

    def statement_around(self, block: cst.CSTNode, node: cst.CSTNode) -> cst.BaseStatement:
        owner = self.parent(block)
        while owner is not None and not is_block(self.parent(owner)):
            owner = self.parent(owner)
        if owner is None or isinstance(owner, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            raise Problem(node, "AM410", "the loss of this backward is not computed before it in the same loop or function (forward and backward apart?): wrap the forward and the loss in `torch.autocast(device_type=device.type, dtype=amp_dtype)` and scale by hand")
        return owner

    def extend_region(self, block: Block, body: list, last: int, node: cst.CSTNode) -> Optional[Region]:
        binding = body[last]
        if self.contains_autocast(binding):
            return None
        if self.is_barrier(binding):
            raise Problem(node, "AM410", "the loss is bound by a loop, a `with` block or a statement that steps or returns: wrap the forward and the loss in autocast by hand")
        needed = self.reads(binding)
        contributors = {last}
        first = last
        for position in range(last - 1, -1, -1):
            candidate = body[position]
            if self.is_barrier(candidate) or starts_cell(body[position + 1]):  # a region never spans two cells
                break
            if self.binds(candidate) & needed:
                contributors.add(position)
                needed |= self.reads(candidate)
                first = position
        while first < last and (first not in contributors or self.is_data_statement(body[first])):
            first += 1
        return Region(block, body[first], body[last])

    def is_barrier(self, line: cst.CSTNode) -> bool:
        """A statement an autocast region must not take in. A loop that only
        computes (a decoder unrolled step by step, a loss summed over heads)
        goes in whole: autocast is a context, not a scope, and a `break` of
        the loop's own stays inside it; one that steps, returns or leaves an
        outer loop does not."""
        if isinstance(line, (cst.With, cst.FunctionDef, cst.ClassDef)):
            return True
        if isinstance(line, (cst.For, cst.While)) and (line.orelse is not None or isinstance(line, cst.For) and line.asynchronous is not None):
            return True
        for child in walk(line, into_definitions=False):
            if isinstance(child, (cst.Return, cst.Yield, cst.Global, cst.Nonlocal, cst.Await, cst.With)):
                return True
            if isinstance(child, (cst.Break, cst.Continue)) and not self.leaves_within(child, line):
                return True
            if method_call(child, "backward") or method_call(child, "step"):
                return True
        return False

    def leaves_within(self, jump: cst.CSTNode, line: cst.CSTNode) -> bool:
        """The `break`/`continue` belongs to a loop that is `line` or inside it."""
        for ancestor in self.ancestors(jump):
            if isinstance(ancestor, (cst.For, cst.While)):
                return True
            if ancestor is line:
                return False
        return False

    def is_data_statement(self, line: cst.CSTNode) -> bool:
        """`x, y = batch` or `x = x.to(device)`: unpacks, moves or casts data only."""
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
            return False
        return all(
            (isinstance(child.func, cst.Attribute) and child.func.attr.value in MOVES)
            or self.is_qualified(child.func, v.VARIABLE)
            or any(name.startswith(RUNTIME_DEVICE) for name in self.qualified_names(child.func))  # `device_at(args.gpu)`
            for child in walk(line.body[0].value, into_definitions=False)
            if isinstance(child, cst.Call)
        )

    def merged(self, regions: list) -> list:
        """Overlapping regions of one block merge; a region inside another's
        statements is dropped."""
        result: list = []
        for region in sorted(regions, key=lambda r: self.order(r.first)):
            previous = result[-1] if result else None
            if previous is not None and previous.block is region.block:
                body = list(region.block.body)
                if body.index(region.first) <= body.index(previous.last):
                    if body.index(region.last) > body.index(previous.last):
                        previous.last = region.last
                    continue
            if not any(self.inside_region(region.first, other) for other in result):
                result.append(region)
        return result

    def inside_region(self, node: cst.CSTNode, region: Region) -> bool:
        body = list(region.block.body)
        span = body[body.index(region.first): body.index(region.last) + 1]
        return any(ancestor in span for ancestor in self.ancestors(node))

    # -- unscale_ and update --------------------------------------------------------

    def unscales(self, unit: cst.CSTNode, backwards: list, steps: list) -> list:
        """(statement, optimizers, first gradient user): `scaler.unscale_()` of
        each optimizer goes before the first statement that clips or reads
        gradients after a backward and before the optimizer's step."""
        events = [(self.order(b.statement), "backward", b) for b in backwards]
        events += [(self.order(call), "step", ref) for call, ref in steps]
        events += [(self.order(user), "gradients", user) for user in self.gradient_users(unit)]
        events.sort(key=lambda event: event[0])
        pending: Optional[list] = None  # gradient users since the last backward
        users_of: dict = {}  # optimizer key -> (Ref, [users])
        for _, kind, payload in events:
            if kind == "backward":
                pending = []
            elif kind == "gradients" and pending is not None:
                self.check_stepped_with(payload, steps)
                pending.append(payload)
            elif kind == "step" and pending:
                users_of.setdefault(payload.key, (payload, []))[1].extend(pending)
        placements: dict = {}  # statement -> ([Ref], first user)
        for ref, users in users_of.values():
            statements = [self.statement_in_unit(user, unit) for user in users]
            _, anchors = self.common_block(statements)
            anchor = min(anchors, key=self.order)
            if not any(self.ends_before(b.statement, anchor) for b in backwards):
                raise Problem(users[0], "AM415", "gradients are clipped or read where scaler.unscale_(optimizer) cannot go between the backward and the step: unscale by hand")
            placements.setdefault(anchor, ([], users[0]))[0].append(ref)
        return [(anchor, refs, user) for anchor, (refs, user) in placements.items()]

    def check_stepped_with(self, user: cst.CSTNode, steps: list) -> None:
        """Gradients read in a branch where no optimizer steps (`else:` a
        hand-written update): with float16 they would carry the loss scale,
        and no scaler.unscale_(optimizer) can go where no optimizer is."""
        if all(self.exclusive(user, call) for call, _ in steps):
            raise Problem(user, "AM415", "gradients are read on a path where no optimizer steps (a hand-written update?): with float16 they would carry the GradScaler's loss scale; step an optimizer on that path too, or add autocast and a GradScaler by hand")

    def exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """`first` and `second` are in different branches of one `if`."""
        below = {}  # ancestor of `first` -> the node under it on the way to `first`
        child = first
        for ancestor in self.ancestors(first):
            below[ancestor] = child
            child = ancestor
        child = second
        for ancestor in self.ancestors(second):
            if ancestor in below:
                return isinstance(ancestor, cst.If) and below[ancestor] is not child and ancestor.test not in (below[ancestor], child)
            child = ancestor
        return False

    def gradient_users(self, unit: cst.CSTNode) -> list:
        """Clipping calls, reads of `.grad`, and calls of the project's own
        functions that clip or read gradients, in the unit."""
        users = [
            c for c in self.calls_within(unit)
            if self.is_call_to(c, CLIP_GRAD_FUNCTIONS | {APEX_MASTER_PARAMS}) or self.uses_gradients_through(c, FOLLOWED_CALLS)
        ]
        grads = [n for n in walk(unit, into_definitions=False) if isinstance(n, cst.Attribute) and n.attr.value == "grad"]
        for attribute in grads:
            if (
                not self.facts.stored(attribute)
                and not self.only_clears(attribute)
                and not any(self.within(attribute, c) or attribute is c for c in users)
            ):
                users.append(attribute)
        return users

    def uses_gradients_through(self, call: cst.Call, depth: int) -> bool:
        """`call` runs a function of the project that clips or reads
        gradients: one of another module (the project's facts) or of this file."""
        if self.qualified_names(call.func) & self.script.project.gradient_functions:
            return True
        callee = self.script.flow.callee(call, self.script.scope_of(call)) if depth else None
        if callee is None:
            return False
        for node in walk(callee[0].node.body, into_definitions=False):
            if isinstance(node, cst.Call) and (self.is_call_to(node, CLIP_GRAD_FUNCTIONS) or self.uses_gradients_through(node, depth - 1)):
                return True
            if isinstance(node, cst.Attribute) and node.attr.value == "grad" and not self.facts.stored(node) and not self.only_clears(node):
                return True
        return False

    def only_clears(self, attribute: cst.Attribute) -> bool:
        """`p.grad.zero_()`, `p.grad.detach_()`, `if p.grad is not None`."""
        parent = self.parent(attribute)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("zero_", "detach_", "requires_grad_"):
            return True
        return isinstance(parent, cst.Comparison) and all(isinstance(c.operator, (cst.Is, cst.IsNot)) for c in parent.comparisons)

    def update_anchor(self, steps: list) -> cst.BaseStatement:
        """The statement after which `scaler.update()` runs once per iteration
        in which the optimizers stepped: after the last step, or after the
        branch that holds it when an unconditional step comes first."""
        lines = [self.own_line(call) for call, _ in steps]
        _, anchors = self.common_block(lines)
        distinct = {id(line) for line in lines}
        if len(distinct) > 1 and not any(anchor is line for anchor, line in zip(anchors, lines)):
            raise Problem(steps[0][0], "AM415", "the optimizers step only in separate branches: call scaler.update() once per iteration, after the last scaler.step(), by hand")
        return max(anchors, key=self.order)

