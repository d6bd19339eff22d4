"""batch-scale=K: K times the training batch, K times the learning rate.

What it does
    Multiplies the batch size of the training `DataLoader` (the one the loop
    holding `backward()` iterates over) and the learning rate of the
    optimizer that loop steps by K, the linear scaling rule. The factor is
    one constant, `BATCH_SCALE = K`, defined after the imports; each scaled
    value reads `<value> * BATCH_SCALE`.

    A value written in the call itself (`batch_size=64`, `lr=0.1 * world`)
    is scaled there. A value read from elsewhere is followed to its
    definition and scaled there, when that definition is used by nothing
    else:

    - an argparse default: `parser.add_argument("--batch-size", type=int,
      default=64)` read only as `args.batch_size` in the loader;
    - a constant or variable assigned once: `BATCH_SIZE = 64`;
    - a config dict literal: `config = {"lr": 0.1}` read only as
      `config["lr"]`, and `config` used only through such subscripts.

Why
    With K times more samples per step, the gradient's noise shrinks and
    there are K times fewer steps per epoch; raising the learning rate by K
    keeps the distance travelled per epoch about the same (Goyal et al.,
    2017, "Accurate, Large Minibatch SGD"). A larger batch keeps an
    accelerator busier: fewer, larger kernels and fewer optimizer steps. To
    find the largest batch that fits, see
    `accelmigrate.runtime.batch.find_max_batch_size`.

    For K > 8 (finding AM613) the rule is known to diverge early in
    training unless the learning rate warms up from its old value over the
    first epochs (Goyal et al. warm up linearly over 5 epochs). Adaptive
    optimizers (Adam, AdamW) often do better with sqrt(K) than K: the
    constant makes that a one-line change.

Example
    Before::

        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--lr", type=float, default=0.1)
        ...
        loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    After (`--to batch-scale=4`)::

        BATCH_SCALE = 4  # training batch size and learning rate multiplier (linear scaling rule)
        ...
        parser.add_argument("--batch-size", type=int, default=64 * BATCH_SCALE)
        parser.add_argument("--lr", type=float, default=0.1 * BATCH_SCALE)

Left alone (finding AM612, nothing changed)
    The batch size and the learning rate are scaled together or not at all.
    A value also read elsewhere (`args.lr` given to a scheduler as well,
    `BATCH_SIZE` shared with the test loader): scaling its definition would
    change the other reader too, scaling only this use would not. A function
    parameter, a `**kwargs` call, a `batch_sampler=`, an optimizer without an
    explicit `lr` or with per-group rates, and a file with several loaders
    or optimizers where the training loop cannot tell which one trains.
    A file that already defines `BATCH_SCALE` is left as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import libcst as cst

from ._accumulate.factor import constant_statement, insert_module_statement, is_integer, module_constant, parse_factor
from ._options import SCALE_MEANING
from ._accumulate.loops import LoopReader
from ._accumulate.syntax import Problem, is_method_call, positional_args, target_key
from ._base import Codemod, append_keyword_args, code_of, has_star_args, keyword_arg, times_or_divided
from .script import ScriptModel
from .script.accumulate_facts import Uses, backward_calls, made_by_call

SCALE_CONSTANT = "BATCH_SCALE"
WARM_UP_ABOVE = 8  # larger factors get finding AM613

def argparse_dest(call: cst.Call) -> Optional[str]:
    """The attribute that `parser.add_argument(...)` stores its value in."""
    dest = keyword_arg(call, "dest")
    if dest is not None:
        return dest.value.evaluated_value if isinstance(dest.value, cst.SimpleString) else None
    flags = [a.value.evaluated_value for a in positional_args(call) if isinstance(a.value, cst.SimpleString)]
    flags = [f for f in flags if isinstance(f, str)]
    for prefix in ("--", "-", ""):
        for flag in flags:
            if flag.startswith(prefix) and (prefix or not flag.startswith("-")):
                return flag[len(prefix) :].replace("-", "_")
    return None




@dataclasses.dataclass
class Scaling:
    """Where a value is multiplied: `node` (in the original tree) becomes
    `node * BATCH_SCALE`; `where` says it in words."""

    node: cst.BaseExpression
    where: str


class ValueTracer:
    """Follows a batch size or learning rate to the one place where scaling
    it changes nothing else: a definition that the model resolves the use
    to, and that nothing else in the file reads."""

    def __init__(self, script: ScriptModel, uses: Uses, numbers: tuple[type, ...]) -> None:
        self.script = script
        self.uses = uses
        self.numbers = numbers  # the literal types a followed definition may hold

    def trace(self, value: cst.BaseExpression, what: str, depth: int = 0, where: str = "") -> Union[Scaling, Problem]:
        if depth > 4:
            return Problem(value, "AM612", f"{what} is defined too many steps away: scale it by hand")
        if isinstance(value, cst.Name):
            return self._through_binding(value, value.value, self.uses.names[value.value], what, depth)
        if isinstance(value, cst.Attribute):
            key = target_key(value)
            if key is not None and any(_assigned_value(b) is not None for b in self.script.bindings_of_reference(value)):
                return self._through_binding(value, key, self.uses.attributes[value.attr.value], what, depth)
            return self._through_argparse(value, what, depth)
        if isinstance(value, cst.Subscript):
            return self._through_dict(value, what, depth)
        return Scaling(value, where or f"`{code_of(value)}`")  # used only here: scale it here

    def _through_binding(self, use: cst.BaseExpression, key: str, uses: int, what: str, depth: int) -> Union[Scaling, Problem]:
        bindings = self.script.bindings_of_reference(use)
        value = _assigned_value(bindings[0]) if len(bindings) == 1 else None
        if value is None:
            return Problem(use, "AM612", f"{what} is `{key}`, which is not assigned exactly once (a parameter, or reassigned): scale it by hand")
        if uses != 2:
            return Problem(use, "AM612", f"{what} is `{key}`, which is read elsewhere too (scaling it would change those readers): scale {what} by hand")
        return self.trace(value, what, depth + 1, f"the definition of `{key}`")

    def _through_argparse(self, use: cst.Attribute, what: str, depth: int) -> Union[Scaling, Problem]:
        dest = use.attr.value
        arguments = [c for c in _calls(self.script) if is_method_call(c, "add_argument") and argparse_dest(c) == dest]
        if len(arguments) != 1:
            return Problem(use, "AM612", f"{what} is `{code_of(use)}`, which cannot be followed to one definition: scale it by hand")
        (argument,) = arguments
        if self.uses.attributes[dest] != 1 or self.uses.strings[dest] != 0:
            return Problem(use, "AM612", f"{what} is `{code_of(use)}`, which is read elsewhere too (scaling its default would change those readers): scale {what} by hand")
        default = keyword_arg(argument, "default")
        if default is None:
            return Problem(argument, "AM612", f"the argument for {what} has no default: scale it by hand")
        if isinstance(default.value, cst.Name):
            return self.trace(default.value, what, depth + 1, f"the definition of `{default.value.value}`")
        if not isinstance(default.value, self.numbers):
            return Problem(argument, "AM612", f"the default of the argument for {what} is not a number: scale it by hand")
        return Scaling(default.value, f"the default of `{code_of(use)}`")

    def _through_dict(self, use: cst.Subscript, what: str, depth: int) -> Union[Scaling, Problem]:
        name, key = use.value, _string_index(use)
        if not isinstance(name, cst.Name) or key is None:
            return Problem(use, "AM612", f"{what} is `{code_of(use)}`: scale it by hand")
        bindings = self.script.bindings_of_reference(name)
        literal = _assigned_value(bindings[0]) if len(bindings) == 1 else None
        only_subscripted = self.uses.names[name.value] == 1 + self.uses.subscripted[name.value]
        if not isinstance(literal, cst.Dict) or not only_subscripted or self.uses.strings[key] != 2:
            return Problem(use, "AM612", f"{what} is `{code_of(use)}`, which is not a dict literal entry used only here: scale it by hand")
        for element in literal.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString) and element.key.evaluated_value == key:
                return self.trace(element.value, what, depth + 1, f"the {key!r} entry of `{name.value}`")
        return Problem(use, "AM612", f"`{name.value}` has no literal {key!r} entry: scale {what} by hand")


def _assigned_value(binding) -> Optional[cst.BaseExpression]:
    """The value of `name = value` (one target, not unpacked); None for a
    parameter, a loop target, an import, an augmented assignment..."""
    statement = binding.statement
    if binding.kind != "assign" or (isinstance(statement, cst.Assign) and len(statement.targets) != 1):
        return None
    return binding.value


def _calls(script: ScriptModel) -> list[cst.Call]:
    """Every call of the file, in source order."""
    return sorted((c for scope in script.scopes for c in scope.calls), key=script.index.order.__getitem__)


def _string_index(subscript: cst.Subscript) -> Optional[str]:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice.value
    return index.evaluated_value if isinstance(index, cst.SimpleString) and isinstance(index.evaluated_value, str) else None


class BatchScale(Codemod):
    word = "batch-scale"
    needs_torch = (0, 0)  # numbers only
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "multiply the training batch size and the learning rate by K (--to batch-scale=K)"
    codes = {
        "AM610": "training DataLoader's batch size multiplied by K",
        "AM611": "learning rate multiplied by K (linear scaling rule)",
        "AM612": "batch size or learning rate cannot be scaled safely: scale both by hand",
        "AM613": "large batch-scale factor: add a learning-rate warm-up",
    }
    triggers = ("DataLoader",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scale = parse_factor(self.options, self.word, SCALE_MEANING)
        self._scaled: set[cst.CSTNode] = set()  # original nodes to multiply
        self._missing_batch_size: set[cst.Call] = set()  # loaders that get `batch_size=BATCH_SCALE`

    # -- analysis ----------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        existing = module_constant(node, SCALE_CONSTANT)
        if existing is not None:
            if not is_integer(existing.value, self.scale):
                self.report(existing, "AM612", f"{SCALE_CONSTANT} is already {code_of(existing.value)}: set it to {self.scale} by hand")
            return
        script = self.script
        targets = self._training_targets(script)
        if isinstance(targets, Problem):
            self.report(targets.node, targets.code, targets.message)
            return
        loaders, optimizers = targets
        if not loaders:
            return
        uses = Uses.of(script)
        if SCALE_CONSTANT in uses.identifiers:
            self.report(loaders[0], "AM612", f"the name {SCALE_CONSTANT} is already used in this file (not as a module constant): rename it, then migrate")
            return
        batch = [self._batch_scaling(loader, ValueTracer(script, uses, (cst.Integer,))) for loader in loaders]
        rates = [self._rate_scaling(optimizer, ValueTracer(script, uses, (cst.Integer, cst.Float))) for optimizer in optimizers]
        problems = [p for p in (*batch, *rates) if isinstance(p, Problem)]
        for problem in problems:
            self.report(problem.node, problem.code, problem.message + " (the batch size and the learning rate are scaled together or not at all)")
        if problems:
            return
        self._apply(loaders, batch, optimizers, rates)

    def _apply(self, loaders, batch, optimizers, rates) -> None:
        fixes = [(loader, "AM610", f"batch size multiplied by {SCALE_CONSTANT} = {self.scale} at {s.where}" if s else f"batch size set to {SCALE_CONSTANT} = {self.scale} (the DataLoader default was 1)") for loader, s in zip(loaders, batch)]
        fixes += [(optimizer, "AM611", f"learning rate multiplied by {SCALE_CONSTANT} = {self.scale} at {s.where} (linear scaling rule)") for optimizer, s in zip(optimizers, rates)]
        # All or nothing: a suppressed fix leaves the others undone too.
        if any(self.is_suppressed(node, code) for node, code, _ in fixes):
            return
        for node, code, message in fixes:
            self.fix(node, code, message)
        for loader, scaling in zip(loaders, batch):
            if scaling is None:
                self._missing_batch_size.add(loader)
            else:
                self._scaled.add(scaling.node)
        self._scaled.update(scaling.node for scaling in rates)
        if self.scale > WARM_UP_ABOVE:
            self.report(optimizers[0], "AM613", f"the learning rate grows {self.scale}-fold (more than {WARM_UP_ABOVE}): warm it up linearly from its old value over the first epochs, or training may diverge early")

    def _training_targets(self, script: ScriptModel) -> Union[tuple[list[cst.Call], list[cst.Call]], Problem]:
        """(the training DataLoader calls, the optimizer constructor calls): those
        of the loops holding a backward() when the model traces each to one
        constructor call, else the file's only DataLoader and optimizer."""
        loaders, optimizers = self._traced_targets(script)
        all_calls = _calls(script)
        all_loaders = [c for c in all_calls if script.is_dataloader(c)]
        all_optimizers = [c for c in all_calls if script.makes_optimizer(c)]
        loaders = loaders or _only(all_loaders)
        optimizers = optimizers or _only(all_optimizers)
        if not loaders and all_loaders:
            return Problem(all_loaders[0], "AM612", "cannot tell which DataLoader the training loop iterates over: scale its batch size and the learning rate by hand")
        if not optimizers and all_optimizers:
            return Problem(all_optimizers[0], "AM612", "cannot tell which optimizer the training loop steps: scale the batch size and its learning rate by hand")
        if not loaders or not optimizers:
            first = (all_loaders or all_optimizers or [None])[0]
            return Problem(first, "AM612", "no torch DataLoader and optimizer of a training loop found in this file: scale the batch size and the learning rate by hand") if first is not None else ([], [])
        return loaders, optimizers

    def _traced_targets(self, script: ScriptModel) -> tuple[list[cst.Call], list[cst.Call]]:
        """The constructor calls of the training loops' loaders and of the
        optimizers their steps update; a list is empty when one of its
        references cannot be traced to a single call."""
        reader = LoopReader(script)
        loaders: list = []
        optimizers: list = []
        for loop, steps in _training_loops(script).items():
            source = reader.loader_of(loop)
            if not isinstance(source, Problem):
                loaders.append(made_by_call(script, source[0], "loader", lambda c: script.is_dataloader(c)))
            for step in (s for training in steps for s in training.optimizer_steps):
                stepped = positional_args(step.call)[0].value if step.through_scaler else step.call.func.value
                optimizers.append(made_by_call(script, stepped, "optimizer", lambda c: script.makes_optimizer(c)))
        return _distinct_or_none(loaders), _distinct_or_none(optimizers)

    def _batch_scaling(self, loader: cst.Call, tracer: ValueTracer) -> Union[Scaling, Problem, None]:
        """Where to scale the loader's batch size; None: not given (1), add it."""
        if keyword_arg(loader, "batch_sampler") is not None:
            return Problem(loader, "AM612", "the DataLoader takes a batch_sampler: scale the batch size in the sampler by hand")
        given = keyword_arg(loader, "batch_size")
        positional = positional_args(loader)
        value = given.value if given is not None else (positional[1].value if len(positional) > 1 else None)
        if value is None:
            if has_star_args(loader):
                return Problem(loader, "AM612", "the DataLoader's batch size comes through *args or **kwargs: scale it by hand")
            return None
        if isinstance(value, cst.Name) and value.value == "None":
            return Problem(loader, "AM612", "batch_size=None (the dataset yields batches): scale the batch size by hand")
        return tracer.trace(value, "the batch size")

    def _rate_scaling(self, optimizer: cst.Call, tracer: ValueTracer) -> Union[Scaling, Problem]:
        given = keyword_arg(optimizer, "lr")
        positional = positional_args(optimizer)
        value = given.value if given is not None else (positional[1].value if len(positional) > 1 else None)
        if positional and isinstance(positional[0].value, (cst.List, cst.Tuple)) and any(
            isinstance(element.value, cst.Dict) for element in positional[0].value.elements
        ):
            return Problem(optimizer, "AM612", "the optimizer has parameter groups (they may set their own learning rates): scale them by hand")
        if value is None:
            return Problem(optimizer, "AM612", "the optimizer uses its default learning rate: pass lr=<default> * BATCH_SCALE by hand")
        return tracer.trace(value, "the learning rate")

    # -- the rewrite --------------------------------------------------------------------

    def on_leave(self, original_node, updated_node):
        updated = super().on_leave(original_node, updated_node)
        if original_node in self._scaled and isinstance(updated, cst.BaseExpression):
            return times_or_divided(updated, cst.Multiply(), SCALE_CONSTANT)
        return updated

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self._missing_batch_size:
            return updated_node
        return append_keyword_args(updated_node, [("batch_size", cst.Name(SCALE_CONSTANT))])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not (self._scaled or self._missing_batch_size):
            return updated_node
        constant = constant_statement(SCALE_CONSTANT, self.scale, "training batch size and learning rate multiplier (linear scaling rule)")
        return insert_module_statement(updated_node, constant)


def _only(calls: list[cst.Call]) -> list[cst.Call]:
    return calls[:1] if len(calls) == 1 else []


def _distinct_or_none(calls: list) -> list[cst.Call]:
    """The calls, each once, in order; none at all when one is missing (None)."""
    return [] if None in calls else list({id(c): c for c in calls}.values())


def _training_loops(script: ScriptModel) -> dict:
    """`for` loop -> the training steps whose backward() it repeats itself."""
    loops: dict = {}
    backwards = set(backward_calls(script))
    for step in script.training_steps:
        if step.backward in backwards and step.loops and isinstance(step.loops[0].node, cst.For):
            loops.setdefault(step.loops[0].node, []).append(step)
    return loops


__all__ = ["BatchScale"]
