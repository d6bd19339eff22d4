"""Training steps, the loops around them, and evaluation regions.

A training step is a backward call (`loss.backward()`,
`scaler.scale(loss).backward()`, `torch.autograd.backward(loss)`,
`self.manual_backward(loss)`) with the optimizer steps in reach: the
`.step()` calls of the same function on an optimizer (traced to its
constructor, through parameters and `self.` attributes) or through a
gradient scaler (`scaler.step(optimizer)`), else those of the functions that
call it (a `train_step()` helper whose caller steps). The loss is the name
the backward runs on; the models are those whose forward the loss is
computed from, followed through the function's assignments.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterator, Optional, Union

import libcst as cst

from .._syntax import code_of, dotted_name
from . import vocabulary as v
from .entities import Entities, Entity
from .flow import Flow
from .positions import Lines
from .scopes import Index, Scope
from .scopes import children as walk_children

DETACHING = frozenset({"detach", "detach_", "item", "tolist", "numpy"})
# Wrappers a loop's iterable is often built with around the loader itself.
ITERATION_WRAPPERS = frozenset({"builtins.enumerate", "builtins.iter", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.autonotebook.tqdm"})
LoopNode = Union[cst.For, cst.While]


def within_wrappers(iterable: Optional[cst.BaseExpression], is_wrapper) -> Optional[cst.BaseExpression]:
    """What `enumerate(tqdm(loader))` iterates over: `loader`, through every
    call that `is_wrapper` says is an iteration wrapper (ITERATION_WRAPPERS)."""
    while isinstance(iterable, cst.Call) and iterable.args and is_wrapper(iterable):
        iterable = iterable.args[0].value
    return iterable


@dataclasses.dataclass(eq=False)
class Loop:
    """A `for` or `while` loop; `loader` when it iterates over a DataLoader
    (directly, or through enumerate/iter/tqdm)."""

    node: LoopNode = dataclasses.field(repr=False)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    header: str  # "for x, y in train_loader", "while True"
    loader: Optional[Entity] = None

    @property
    def line(self) -> int:
        return self.lines(self.node)

    def __repr__(self) -> str:
        over = f", loader {self.loader.name}" if self.loader is not None else ""
        return f"Loop({self.header}, line {self.line}{over})"


@dataclasses.dataclass(eq=False)
class OptimizerStep:
    """`optimizer.step()` or `scaler.step(optimizer)`; `entity` None: untraced."""

    call: cst.Call = dataclasses.field(repr=False)
    optimizer: str  # as written: "optimizer", "self.opt_g"
    entity: Optional[Entity]
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    through_scaler: bool = False

    @property
    def line(self) -> int:
        return self.lines(self.call)

    def __repr__(self) -> str:
        traced = self.entity.made_by if self.entity is not None else "untraced"
        return f"OptimizerStep({self.optimizer} ({traced}), line {self.line}{', scaler' if self.through_scaler else ''})"


@dataclasses.dataclass(eq=False)
class TrainingStep:
    """A backward call and what trains with it."""

    backward: cst.Call = dataclasses.field(repr=False)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    function: Scope = dataclasses.field(repr=False)  # where the backward runs
    loss: str  # the name backward runs on ("loss", "self.loss"); "" when it is an expression
    optimizer_steps: list = dataclasses.field(default_factory=list)
    zero_grads: list = dataclasses.field(default_factory=list, repr=False)  # zero_grad() calls
    models: list = dataclasses.field(default_factory=list)  # Entities whose forward makes the loss
    loops: list = dataclasses.field(default_factory=list)  # innermost first, in the same function
    called_in_loops: list = dataclasses.field(default_factory=list)  # loops around the function's call sites
    steps_in_caller: bool = False  # the optimizer steps in a function that calls this one

    @property
    def line(self) -> int:
        return self.lines(self.backward)

    @property
    def optimizers(self) -> list[str]:
        return list(dict.fromkeys(s.optimizer for s in self.optimizer_steps))

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys(m.name for m in self.models))

    @property
    def is_complete(self) -> bool:
        """A backward with an optimizer step in reach."""
        return bool(self.optimizer_steps)

    def __repr__(self) -> str:
        called = f", called in loops={self.called_in_loops}" if self.called_in_loops else ""
        return (
            f"TrainingStep(line {self.line} in {self.function.name}: loss={self.loss or '<expression>'}, "
            f"optimizers={self.optimizers}, models={self.model_names}, loops={self.loops}{called})"
        )


@dataclasses.dataclass(eq=False)
class EvaluationRegion:
    """Code that runs without gradients or with the model in eval mode."""

    kind: str  # "no_grad", "inference_mode", "decorator", "eval"
    node: cst.CSTNode = dataclasses.field(repr=False)  # the With, the FunctionDef, or the `.eval()` call
    scope: Scope = dataclasses.field(repr=False)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    model: Optional[str] = None  # for "eval": the receiver

    @property
    def line(self) -> int:
        return self.lines(self.node)

    def __repr__(self) -> str:
        on = f" {self.model}" if self.model else ""
        return f"EvaluationRegion({self.kind}{on}, line {self.line}, in {self.scope.name})"


class Steps:
    def __init__(self, index: Index, flow: Flow, entities: Entities, lines: Lines) -> None:
        self.index, self.flow, self.entities, self.lines = index, flow, entities, lines
        order = index.order
        self._assigned: dict[tuple[str, Scope], list[tuple]] = {}  # memo of `_assigned_events`
        self._steps_of_scope: dict[Scope, list[OptimizerStep]] = {}  # memo of `_optimizer_steps`
        self._zero_grads_of_scope: dict[Scope, list[cst.Call]] = {}
        self.training: list[TrainingStep] = []
        self.evaluation: list[EvaluationRegion] = []
        for scope in index.scopes:
            backwards = []
            for call in scope.calls:
                loss = self._backward_operand(call, scope)
                if loss is not None:
                    backwards.append((call, loss))
                self._evaluation_call(call, scope)
            if backwards:
                steps = _StepsInOrder(self._optimizer_steps(scope), sorted(order[call] for call, _ in backwards), order)
                for call, loss in backwards:
                    self.training.append(self._step(call, loss, scope, steps.fed_by(order[call])))
        for function in flow.functions.values():
            if any(index.is_qualified(_callee(d.decorator), v.NO_GRAD) for d in function.node.decorators):
                self.evaluation.append(EvaluationRegion("decorator", function.node, function.scope, lines))
        self.training.sort(key=lambda s: order[s.backward])
        self.evaluation.sort(key=lambda r: order[r.node])

    # -- backward calls ------------------------------------------------------------------

    def _backward_operand(self, call: cst.Call, scope: Scope) -> Optional[cst.BaseExpression]:
        """What the backward call differentiates, when `call` is one."""
        func = call.func
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if self.index.is_qualified(func, v.AUTOGRAD_BACKWARD):
            return positional[0] if positional else call
        if not isinstance(func, cst.Attribute):
            return None
        if func.attr.value == "manual_backward" and positional:
            return positional[0]
        if func.attr.value != "backward":
            return None
        receiver = dotted_name(func.value)
        if positional and receiver and (receiver in ("self", "accelerator", "fabric") or receiver.endswith((".accelerator", ".fabric"))):
            return positional[0]  # `accelerator.backward(loss)`
        return func.value

    def _step(self, backward: cst.Call, operand: cst.BaseExpression, scope: Scope, steps: list) -> TrainingStep:
        step = TrainingStep(backward, self.lines, scope, _loss_name(operand))
        step.optimizer_steps = steps
        step.zero_grads = list(self._zero_grads(scope))
        if not step.optimizer_steps:
            function = self.flow.function_of(scope)
            for site in function.callers if function is not None else ():
                step.optimizer_steps.extend(self._optimizer_steps(site.caller))
                step.zero_grads.extend(self._zero_grads(site.caller))
            step.steps_in_caller = bool(step.optimizer_steps)
        step.models = self._models_of(operand, scope)
        step.loops = self.loops_around(backward)
        function = self.flow.function_of(scope)
        for site in function.callers if function is not None else ():
            step.called_in_loops.extend(self.loops_around(site.call))
        return step

    def _zero_grads(self, scope: Scope) -> list[cst.Call]:
        found = self._zero_grads_of_scope.get(scope)
        if found is None:
            found = self._zero_grads_of_scope[scope] = [c for c in scope.calls if _method(c) == "zero_grad"]
        return found

    def _optimizer_steps(self, scope: Scope) -> list[OptimizerStep]:
        """The optimizer steps `scope`'s own code takes, in source order (once per scope)."""
        found = self._steps_of_scope.get(scope)
        if found is None:
            found = self._steps_of_scope[scope] = self._find_optimizer_steps(scope)
        return found

    def _find_optimizer_steps(self, scope: Scope) -> list[OptimizerStep]:
        found = []
        for call in scope.calls:
            if _method(call) != "step":
                continue
            receiver = call.func.value
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            entity = self._entity(receiver, scope)
            if (entity is not None and entity.kind == "scaler") or (positional and dotted_name(receiver).endswith("scaler")):
                if positional:
                    found.append(OptimizerStep(call, code_of(positional[0]), self._entity(positional[0], scope), self.lines, True))
            elif entity is not None and entity.kind == "optimizer":
                found.append(OptimizerStep(call, code_of(receiver), entity, self.lines))
            elif entity is None and _looks_like_optimizer_step(receiver, positional):
                found.append(OptimizerStep(call, code_of(receiver), None, self.lines))
        return found

    def _entity(self, expression: cst.BaseExpression, scope: Scope) -> Optional[Entity]:
        if isinstance(expression, (cst.Name, cst.Attribute)) and dotted_name(expression):
            return self.entities.of(expression, scope)
        return None

    def _models_of(self, operand: cst.BaseExpression, scope: Scope) -> list[Entity]:
        """The models whose forward the loss is computed from: calls of a model
        in the backward's operand or in the values assigned (in the same
        function) to the names it reads, followed transitively, depth first."""
        models: dict[Entity, None] = {}
        seen: set[str] = set()
        pending = [self._events(operand, scope)]
        while pending:
            for event in pending.pop():
                if isinstance(event, str):
                    if event not in seen:
                        seen.add(event)
                        pending.extend(self._assigned_events(event, scope))
                else:
                    models[event] = None
        return list(models)

    def _events(self, expression: cst.BaseExpression, scope: Scope) -> tuple:
        """What `_models_of` meets in an expression, in order: the model of
        each call of one (an Entity), and each name read (a str)."""
        events: list = []
        for node in _attached(expression):
            if isinstance(node, cst.Call):
                called = node.func.value if _method(node) == "forward" else node.func
                entity = self._entity(called, scope)
                if entity is not None and entity.kind == "model":
                    events.append(entity)
            elif isinstance(node, cst.Name):
                events.append(node.value)
        return tuple(events)

    def _assigned_events(self, name: str, scope: Scope) -> list[tuple]:
        """The events of the values assigned to `name` in `scope`, once per
        (name, scope). Of values with the same events only the last is kept:
        `_models_of` takes the last first, and the same events again add
        nothing (a flat script that repeats one block thousands of times
        stays linear)."""
        key = (name, scope)
        found = self._assigned.get(key)
        if found is None:
            found = []
            last: dict[tuple, int] = {}
            for events in (self._events(value, scope) for value in _values_assigned(self.index, name, scope)):
                last[events] = len(found)
                found.append(events)
            found = self._assigned[key] = [events for i, events in enumerate(found) if last[events] == i]
        return found

    # -- loops ----------------------------------------------------------------------------

    def loops_around(self, node: cst.CSTNode) -> list[Loop]:
        """The loops whose bodies run `node`, innermost first, within its function."""
        loops = []
        child = node
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
                loops.append(self._loop(ancestor))
            child = ancestor
        return loops

    def _loop(self, node: LoopNode) -> Loop:
        if isinstance(node, cst.While):
            return Loop(node, self.lines, f"while {code_of(node.test)}")
        header = f"for {code_of(node.target)} in {code_of(node.iter)}"
        return Loop(node, self.lines, header, self._loader_of(node.iter, self.index.scope_of(node)))

    def _loader_of(self, iterable: cst.BaseExpression, scope: Scope) -> Optional[Entity]:
        iterable = within_wrappers(iterable, lambda call: self.index.is_qualified(call.func, ITERATION_WRAPPERS))
        entity = self._entity(iterable, scope)
        if entity is None and isinstance(iterable, cst.Name):
            return self._loader_through_wrapper(iterable.value, scope)
        return entity if entity is not None and entity.kind == "loader" else None

    def _loader_through_wrapper(self, name: str, scope: Scope) -> Optional[Entity]:
        """The loader of `progress_bar = tqdm(train_loader)` iterated as `enumerate(progress_bar)`: every binding
        of the name in its scope wraps the same loader (a progress bar or iterator over it, made again each epoch)."""
        bindings = self.index.bindings_of(name, scope)
        found = set()
        for binding in bindings:
            value = binding.value if binding.kind == "assign" else None
            inner = within_wrappers(value, lambda call: self.index.is_qualified(call.func, ITERATION_WRAPPERS))
            if inner is value:  # not a wrapper
                return None
            entity = self._entity(inner, binding.scope)
            if entity is None or entity.kind != "loader":
                return None
            found.add(entity)
        return found.pop() if len(found) == 1 else None

    # -- evaluation ------------------------------------------------------------------------

    def _evaluation_call(self, call: cst.Call, scope: Scope) -> None:
        if _method(call) == "eval" and not call.args:
            entity = self._entity(call.func.value, scope)
            if entity is None or entity.kind == "model":
                self.evaluation.append(EvaluationRegion("eval", call, scope, self.lines, code_of(call.func.value)))
            return
        item = self.index.parent(call)
        region = self.index.parent(item)
        if isinstance(item, cst.WithItem) and isinstance(region, cst.With) and self.index.is_qualified(call.func, v.NO_GRAD):
            kind = "inference_mode" if any(q.endswith("inference_mode") for q in self.index.qualified_names(call.func)) else "no_grad"
            self.evaluation.append(EvaluationRegion(kind, region, scope, self.lines))


class _StepsInOrder:
    """A scope's optimizer steps and backward calls by source position."""

    def __init__(self, steps: list, backwards: list, order: dict) -> None:
        self.steps = sorted(steps, key=lambda s: order[s.call])
        self.positions = [order[s.call] for s in self.steps]
        self.backwards = backwards  # sorted positions

    def fed_by(self, backward: int) -> list:
        """The optimizer steps that the backward at source position `backward`
        feeds: the first steps after it, up to the next backward after them (the
        discriminator's two backwards feed `optimizerD.step()`, the generator's
        `optimizerG.step()`); all of the scope's steps when none comes after it."""
        first = bisect.bisect_right(self.positions, backward)
        if first == len(self.steps):
            return list(self.steps)
        fed = [self.steps[first]]
        for at in range(first + 1, len(self.steps)):
            if self._backward_between(self.positions[at - 1], self.positions[at]):
                break
            fed.append(self.steps[at])
        return fed

    def _backward_between(self, start: int, end: int) -> bool:
        after = bisect.bisect_right(self.backwards, start)
        return after < len(self.backwards) and self.backwards[after] < end


def _attached(expression: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The nodes of an expression whose values keep their autograd graph:
    not below `.detach()`, `.item()`, `.data`, nor in nested definitions."""
    stack = [expression]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and node is not expression:
            continue
        if isinstance(node, cst.Call) and _method(node) in DETACHING:
            continue
        if isinstance(node, cst.Attribute) and node.attr.value == "data":
            continue
        yield node
        stack.extend(reversed(list(walk_children(node))))


def _method(call: cst.Call) -> Optional[str]:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def _callee(decorator: cst.BaseExpression) -> cst.BaseExpression:
    return decorator.func if isinstance(decorator, cst.Call) else decorator


def _loss_name(operand: cst.BaseExpression) -> str:
    """`loss` for `loss`, `scaler.scale(loss)`, `(loss / n)`, `loss.mean()`, `loss[0]`."""
    while True:
        if isinstance(operand, (cst.Name, cst.Attribute)) and dotted_name(operand):
            return dotted_name(operand)
        if isinstance(operand, cst.Call) and _method(operand) in ("scale", "mean", "sum", "float"):
            positional = [a.value for a in operand.args if a.keyword is None]
            operand = positional[0] if _method(operand) == "scale" and positional else operand.func.value
        elif isinstance(operand, cst.BinaryOperation):
            operand = operand.left
        elif isinstance(operand, cst.UnaryOperation):
            operand = operand.expression
        elif isinstance(operand, cst.Subscript):
            operand = operand.value
        else:
            return ""


def _looks_like_optimizer_step(receiver: cst.BaseExpression, positional: list) -> bool:
    """An untraced `.step()` that may be an optimizer's: no argument but a
    closure, on a name that does not say scheduler (`env.step(action)` and
    `scheduler.step()` are not)."""
    name = dotted_name(receiver).lower()
    return bool(name) and "sched" not in name and len(positional) <= 1 and (not positional or "closure" in code_of(positional[0]) or isinstance(positional[0], cst.Lambda))


def _values_assigned(index: Index, name: str, scope: Scope) -> Iterator[cst.BaseExpression]:
    """The values assigned to `name` in `scope` itself (unpacking included)."""
    for binding in scope.bindings.get(name, ()):
        if binding.value is not None:
            yield binding.value
        elif isinstance(binding.statement, (cst.Assign, cst.AugAssign)) and binding.statement.value is not None:
            yield binding.statement.value  # `output, hidden = model(x, hidden)`, `loss += ...`


__all__ = ["EvaluationRegion", "Loop", "OptimizerStep", "Steps", "TrainingStep"]
