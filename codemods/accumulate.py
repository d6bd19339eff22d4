"""accumulate=N: gradient accumulation over N micro-batches per optimizer step.

What it does
    Rewrites a training loop so that each optimizer step uses the gradient of
    N consecutive batches of the loader (micro-batches):

    - the loss is divided by the number of micro-batches in its group before
      `backward()`; the `loss` variable itself is untouched, so what the loop
      logs keeps meaning the per-batch loss;
    - `optimizer.step()`, gradient clipping, `scaler.unscale_()`,
      `scaler.step()`, `scaler.update()`, a learning-rate scheduler stepped
      inside the loop and a `zero_grad()` written after `backward()` run at
      the last micro-batch of each group; a `zero_grad()` written before
      `backward()` runs at the first. The last batch of the epoch always ends
      a group, so no gradient is dropped or carried into the next epoch;
    - under `DistributedDataParallel` (the `ddp` codemod's output, or the
      user's own), the forward and backward of a micro-batch that does not
      end its group run inside `model.no_sync()`, so gradients are
      all-reduced once per group instead of once per micro-batch.

    The loop counts micro-batches with `enumerate` (reusing an index the loop
    already has) and finds the epoch's last one with `len(loader)`.
    `ACCUMULATION_STEPS = N` is defined once, after the imports.

Why
    The effective batch grows N-fold while the activations held at once stay
    those of one micro-batch: a batch that does not fit in device memory can
    still be trained on, with the same arithmetic. Under DDP, skipping the
    all-reduce of the non-final micro-batches saves N - 1 gradient exchanges
    per step.

    The epoch's last group. A mean-reduced loss over a big batch is the mean
    of its samples; accumulation averages the means of the group's
    micro-batches. Dividing by the number of micro-batches actually in the
    group (`group_size`, which is N except for the last, shorter group of an
    epoch) keeps that an average. The two agree exactly when every
    micro-batch of the group holds the same number of samples: always, except
    when the data set size is not a multiple of the micro-batch size and the
    epoch's last group holds more than one micro-batch; then the short last
    micro-batch weighs as much as a full one (as it does in a run without
    accumulation at that batch size).

Example
    Before::

        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(loss.item())

    After (`--to accumulate=4`)::

        ACCUMULATION_STEPS = 4  # micro-batches per optimizer step (gradient accumulation)
        ...
        for epoch in range(epochs):
            for batch_idx, (x, y) in enumerate(loader):
                # This micro-batch's accumulation group (the epoch's last may be shorter).
                group_start = batch_idx - batch_idx % ACCUMULATION_STEPS
                group_size = min(ACCUMULATION_STEPS, len(loader) - group_start)
                end_of_group = batch_idx + 1 == group_start + group_size
                if batch_idx == group_start:
                    optimizer.zero_grad()
                loss = criterion(model(x), y)
                (loss / group_size).backward()
                if end_of_group:
                    optimizer.step()
                print(loss.item())

    With DDP, the statements from the forward to `backward()` are wrapped in
    `with no_sync_unless(end_of_group, model):` (from
    `accelmigrate.runtime.batch`): `model.no_sync()` unless the micro-batch
    ends its group, and nothing for a model that is not wrapped (a plain
    `python train.py` run of a script that wraps only under a launcher).
    After `amp`, the backward is `scaler.scale(loss / group_size).backward()`
    and `scaler.unscale_()`, clipping, `scaler.step()` and `scaler.update()`
    move under `if end_of_group:` together.

Left alone
    Only loops whose shape is proven are rewritten; the others get a finding
    that says what to do by hand:

    - AM601: the loop's length cannot be known: a `while` loop, an
      `IterableDataset` (defined in the file), `zip(...)`, a generator, or a
      loader built in the `for` statement. A loader the file cannot see is
      assumed to have a length: `len(loader)` fails loudly at the first
      batch if it has none.
    - AM602: a shape that accumulation would change: the optimizer step is
      already conditional (the loop may accumulate already), `break`,
      `continue` or `return` in the loop (a group would end early), no
      `zero_grad()` in the loop, a `.step()` on an object that cannot be told
      apart as an optimizer or a scheduler, the enumerate index reassigned or
      started at a number other than 0, a value computed by a gated statement
      and read on every micro-batch.
    - AM603: several backward passes or several optimizers in one loop (GANs,
      multi-task with separate optimizers).
    - AM604: `backward()` or the optimizer step in a function with no loop
      (a helper called from the training loop), or a loop with `backward()`
      but no optimizer step.
    - AM605 (after a rewrite): a learning-rate scheduler stepped per batch
      now steps once per group: divide the step counts it was built with.
    - AM606: the no_sync part under DDP (fixed, or what to do by hand).
    An epoch-level scheduler (stepped outside the batch loop) and evaluation
    loops (no `backward()`) are not touched. `# accelmigrate: skip` on the
    `for` line leaves its loop alone.

    Worth knowing: BatchNorm normalises each micro-batch with its own
    statistics, so a model with BatchNorm layers computes something close to,
    not equal to, the big batch (use GroupNorm/LayerNorm, or SyncBatchNorm
    statistics over larger per-device batches, when it matters).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterator, Mapping, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import PositionProvider

from ._base import CLIP_GRAD_FUNCTIONS, Codemod, code_of, is_docstring, times_or_divided

STEPS_CONSTANT = "ACCUMULATION_STEPS"
RUNTIME_BATCH = "accelmigrate.runtime.batch"

DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
ITERABLE_DATASET = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
GRAD_SCALER = {
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler",
    "accelmigrate.runtime.precision.grad_scaler",  # what the amp codemod writes
}
ENUMERATE = {"builtins.enumerate"}
PROGRESS_BARS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.rich.tqdm"}
OPTIMIZER_PACKAGES = ("torch.optim.", "torch.distributed.optim.", "apex.optimizers.", "bitsandbytes.optim.")
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")



# -- small shared helpers (batch_scale uses them too) ---------------------------


def parse_factor(options: Mapping[str, str], word: str, meaning: str) -> int:
    """The N of `word=N`: a whole number of at least 2. A missing or invalid
    value is a usage error, raised as ValueError before anything runs."""
    raw = options.get("value")
    if raw is None or not str(raw).strip():
        raise ValueError(f"{word} needs a value: --to {word}=N, N being {meaning}")
    try:
        factor = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{word}={raw}: N must be a whole number (N is {meaning})") from None
    if factor < 2:
        raise ValueError(f"{word}={raw}: N must be at least 2 (N is {meaning})")
    return factor


def target_key(node: cst.CSTNode) -> Optional[str]:
    """`name` or `self.attr` (a dotted chain of names): something a value can be
    bound to and found again by its spelling."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute) and target_key(node.value) is not None:
        return code_of(node)
    return None


def mentions(node: cst.CSTNode, key: str) -> bool:
    """Does `key` (as `target_key` spells it) occur inside `node`?"""
    return key in spellings(node)


def spellings(node: cst.CSTNode) -> set[str]:
    """The names and attribute chains read or written inside `node` (not the
    `attr` of an attribute, nor an argument's keyword)."""
    found, stack = set(), [node]
    while stack:
        current = stack.pop()
        key = target_key(current) if isinstance(current, (cst.Name, cst.Attribute)) else None
        if key is not None:
            found.add(key)
        if isinstance(current, cst.Attribute):
            stack.append(current.value)
        elif isinstance(current, cst.Arg):
            stack.append(current.value)
        else:
            stack.extend(current.children)
    return found


def walk(node: cst.CSTNode, wanted, stop=lambda n: False) -> Iterator[cst.CSTNode]:
    """Every descendant of `node` (itself included) that `wanted` accepts,
    not descending below nodes that `stop` accepts."""
    stack = [node]
    while stack:
        current = stack.pop()
        if wanted(current):
            yield current
        if current is node or not stop(current):
            stack.extend(reversed(current.children))


def new_scope(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))


def is_method_call(node: cst.CSTNode, method: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method


def receiver(call: cst.Call) -> cst.BaseExpression:
    return call.func.value  # type: ignore[union-attr]


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


def is_optimizer_class(qualified: str) -> bool:
    last = qualified.rsplit(".", 1)[-1]
    return qualified.startswith(OPTIMIZER_PACKAGES) and not qualified.startswith(NOT_OPTIMIZERS) and last[:1].isupper()


def is_scheduler_factory(qualified: str) -> bool:
    last = qualified.rsplit(".", 1)[-1]
    if qualified.startswith(("torch.optim.lr_scheduler.", "torch.optim.swa_utils.SWALR")):
        return last[:1].isupper()
    return qualified.startswith("transformers.") and last.startswith("get_") and "schedule" in last


def fresh_name(base: str, taken: set[str]) -> str:
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def module_constant_insertion_index(module: cst.Module) -> int:
    """Where a new module constant goes: after the docstring and the imports
    that open the module (so that imports added later still come first)."""
    index = 0
    for i, statement in enumerate(module.body):
        if i == 0 and is_docstring(statement):
            index = 1
        elif _is_import_line(statement):
            index = i + 1
        else:
            break
    return index


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def insert_module_statement(module: cst.Module, statement: cst.SimpleStatementLine) -> cst.Module:
    """`module` with `statement` after its opening docstring and imports, set
    apart by a blank line when something comes before it."""
    position = module_constant_insertion_index(module)
    if position > 0:
        statement = statement.with_changes(leading_lines=[cst.EmptyLine()])
    body = list(module.body)
    return module.with_changes(body=[*body[:position], statement, *body[position:]])


def module_constant(module: cst.Module, name: str) -> Optional[cst.Assign]:
    """The module-level `NAME = ...` assignment, if there is one."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                ):
                    return small
    return None


def constant_statement(name: str, value: int, comment: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"{name} = {value}  # {comment}\n")


STEPS_MEANING = "the number of micro-batches per optimizer step"


# -- what the module binds, calls and names --------------------------------------


class ModuleFacts(cst.CSTVisitor):
    """One pass over the original tree: bindings by spelling, calls, and every
    identifier in use. Qualified names come from the codemod's metadata.

    `bindings[key]` lists the values bound to a name or attribute chain, with
    None for a binding of another kind (a parameter, a loop target, an
    import, an augmented assignment...)."""

    def __init__(self, codemod: Codemod) -> None:
        super().__init__()
        self.codemod = codemod
        self.bindings: dict[str, list[Optional[cst.BaseExpression]]] = collections.defaultdict(list)
        self.calls: list[cst.Call] = []
        self.identifiers: set[str] = set()
        self.classes: dict[str, cst.ClassDef] = {}
        self.attribute_uses: collections.Counter[str] = collections.Counter()
        self.name_uses: collections.Counter[str] = collections.Counter()
        self.string_uses: collections.Counter[str] = collections.Counter()
        self.subscript_uses: collections.Counter[str] = collections.Counter()  # `name[...]`
        self._skip_names: set[int] = set()  # ids of Names that are attributes or keywords

    @classmethod
    def of(cls, codemod: Codemod, module: cst.Module) -> "ModuleFacts":
        facts = cls(codemod)
        module.visit(facts)
        return facts

    # -- bindings -------------------------------------------------------------

    def _bind(self, target: cst.CSTNode, value: Optional[cst.BaseExpression] = None) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
            return
        if isinstance(target, cst.StarredElement):
            self._bind(target.value)
            return
        key = target_key(target)
        if key is not None:
            self.bindings[key].append(value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value if len(node.targets) == 1 else None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        bound = node.asname.name if node.asname is not None else node.name
        while isinstance(bound, cst.Attribute):  # `import a.b` binds `a`
            bound = bound.value
        self._bind(bound)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes[node.name.value] = node
        self._bind(node.name)

    # -- uses -----------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)
        self._count_string_arguments(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip_names.add(id(node.attr))
        self.attribute_uses[node.attr.value] += 1

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip_names.add(id(node.keyword))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._skip_names:
            self.identifiers.add(node.value)
            self.name_uses[node.value] += 1

    # String keys that may name a value by its key: dict literal keys,
    # `name["key"]`, `name.get("key")`, getattr(obj, "key") and its kin.

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if isinstance(node.value, cst.Name):
            self.subscript_uses[node.value.value] += 1
            for element in node.slice:
                if isinstance(element.slice, cst.Index):
                    self._count_string(element.slice.value)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        self._count_string(node.key)

    def _count_string_arguments(self, node: cst.Call) -> None:
        positional = positional_args(node)
        if isinstance(node.func, cst.Name) and node.func.value in ("getattr", "setattr", "hasattr", "delattr") and len(positional) > 1:
            self._count_string(positional[1].value)
        elif is_method_call(node, "get") and isinstance(receiver(node), cst.Name) and positional:
            self._count_string(positional[0].value)

    def _count_string(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
            self.string_uses[node.evaluated_value] += 1

    # -- questions --------------------------------------------------------------

    def values(self, key: str) -> list[cst.BaseExpression]:
        return [value for value in self.bindings.get(key, ()) if value is not None]

    def kind(self, key: Optional[str]) -> Optional[str]:
        """What `key` holds, when every value bound to it is of one kind:
        optimizer, scheduler, scaler, ddp, loader (else None)."""
        if key is None:
            return None
        kinds = {self.kind_of_value(value) for value in self.values(key)}
        return kinds.pop() if len(kinds) == 1 else None

    def kind_of_value(self, value: cst.BaseExpression) -> Optional[str]:
        if not isinstance(value, cst.Call):
            return None
        names = self.codemod.qualified_names(value.func)
        if any(is_optimizer_class(name) for name in names):
            return "optimizer"
        if any(is_scheduler_factory(name) for name in names):
            return "scheduler"
        if not names.isdisjoint(GRAD_SCALER):
            return "scaler"
        if not names.isdisjoint(DDP):
            return "ddp"
        if not names.isdisjoint(DATALOADER):
            return "loader"
        return None

    def ddp_models(self) -> set[str]:
        """The spellings of the models wrapped in DistributedDataParallel:
        `X = DistributedDataParallel(...)`, under a condition or not, or
        `X = DistributedDataParallel(...) if ... else X`."""
        return {key for key in self.bindings if any(self._wraps_in_ddp(value) for value in self.values(key))}

    def _wraps_in_ddp(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.IfExp):
            return self._wraps_in_ddp(value.body) or self._wraps_in_ddp(value.orelse)
        return self.kind_of_value(value) == "ddp"

    def is_iterable_dataset_class(self, name: str, seen: frozenset = frozenset()) -> bool:
        """A class of this file that derives from torch's IterableDataset."""
        class_def = self.classes.get(name)
        if class_def is None or name in seen:
            return False
        for base in class_def.bases:
            if self.codemod.is_qualified(base.value, ITERABLE_DATASET):
                return True
            if isinstance(base.value, cst.Name) and self.is_iterable_dataset_class(base.value.value, seen | {name}):
                return True
        return False


# -- a training loop and the calls it makes ----------------------------------------


@dataclasses.dataclass
class Problem:
    node: cst.CSTNode
    code: str
    message: str


@dataclasses.dataclass
class UpdateCall:
    """A call that must run once per optimizer step."""

    call: cst.Call
    role: str  # zero_grad, optimizer_step, scaler_step, scaler_update, unscale, clip, scheduler_step, unknown_step
    optimizer: Optional[str] = None  # the optimizer it steps, for the step roles


@dataclasses.dataclass
class LoopShape:
    """A training loop as the codemods understand it."""

    loop: cst.For
    loader: cst.BaseExpression  # what `len()` counts
    index: Optional[str]  # the enumerate index the loop already has
    backward: cst.Call
    backward_index: int  # position in the loop body of the statement holding it
    optimizers: list[str]
    updates: list[UpdateCall]


class LoopReader:
    """Reads training loops: the loops holding `backward()` or an optimizer
    step, their loader, and the calls that must run once per step."""

    def __init__(self, codemod: Codemod, facts: ModuleFacts) -> None:
        self.codemod = codemod
        self.facts = facts

    # -- where the training happens --------------------------------------------

    def anchors(self) -> tuple[dict[cst.CSTNode, list[cst.Call]], dict[cst.CSTNode, list[cst.Call]]]:
        """Backward calls and optimizer steps, grouped by their innermost loop;
        those outside any loop grouped by their function (or the module)."""
        in_loops: dict[cst.CSTNode, list[cst.Call]] = collections.defaultdict(list)
        loose: dict[cst.CSTNode, list[cst.Call]] = collections.defaultdict(list)
        for call in self.facts.calls:
            if not (is_method_call(call, "backward") or self._is_known_optimizer_step(call)):
                continue
            loop = self.codemod.innermost_loop(call)
            if loop is not None:
                in_loops[loop].append(call)
            else:
                loose[self._enclosing_function(call)].append(call)
        return in_loops, loose

    def _enclosing_function(self, node: cst.CSTNode) -> cst.CSTNode:
        for ancestor in self.codemod.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return ancestor
        return node

    def _is_known_optimizer_step(self, call: cst.Call) -> bool:
        if not is_method_call(call, "step"):
            return False
        owner = self.facts.kind(target_key(receiver(call)))
        return owner == "optimizer" or (owner == "scaler" and len(positional_args(call)) == 1)

    # -- one loop ----------------------------------------------------------------

    def read(self, loop: Union[cst.For, cst.While]) -> Union[LoopShape, Problem]:
        if not isinstance(loop, cst.For) or loop.asynchronous is not None:
            return Problem(loop, "AM601", "the training loop is not a `for` loop over a data loader: its last batch cannot be known; accumulate by hand")
        source = self.loader_of(loop)
        if isinstance(source, Problem):
            return source
        loader, index = source
        if not isinstance(loop.body, cst.IndentedBlock):
            return Problem(loop, "AM602", "the loop body shares the `for` line: put it on its own lines first")
        exits = self._early_exits(loop)
        if exits is not None:
            return exits
        backwards = [c for c in self._own_calls(loop) if is_method_call(c, "backward")]
        if len(backwards) > 1:
            return Problem(loop, "AM603", f"{len(backwards)} backward passes in one loop (a GAN or multi-loss loop?): accumulate each model's gradients by hand")
        if backwards and self.codemod.is_qualified(backwards[0].func, {"torch.autograd.backward"}):
            return Problem(backwards[0], "AM602", "torch.autograd.backward(): divide the losses by the group's size and gate the optimizer step by hand")
        updates = self.update_calls(loop, backwards[0] if backwards else None)
        if isinstance(updates, Problem):
            return updates
        optimizers = sorted({u.optimizer for u in updates if u.optimizer is not None})
        if not backwards:
            return Problem(loop, "AM604", "the optimizer steps in this loop but backward() runs elsewhere (in a helper?): accumulate by hand")
        if not optimizers:
            return Problem(loop, "AM604", "backward() runs in this loop but no optimizer steps in it (in a helper?): accumulate by hand")
        if len(optimizers) > 1:
            return Problem(loop, "AM603", f"several optimizers step in this loop ({', '.join(optimizers)}): accumulate by hand")
        position = self._top_level_index(loop, backwards[0])
        if position is None:
            return Problem(backwards[0], "AM602", "backward() runs conditionally (inside an if, try or nested block): accumulate by hand")
        return LoopShape(loop, loader, index, backwards[0], position, optimizers, updates)

    def loader_of(self, loop: cst.For) -> Union[tuple[cst.BaseExpression, Optional[str]], Problem]:
        """(the loader whose len() counts the batches, the existing enumerate index)."""
        iterable, index = loop.iter, None
        if self.codemod.is_call_to(iterable, ENUMERATE):
            start = _enumerate_start(iterable)
            if start != 0:
                return Problem(loop, "AM602", "enumerate() starts at a number other than 0: make it start at 0, then migrate")
            first = positional_args(iterable)
            elements = loop.target.elements if isinstance(loop.target, (cst.Tuple, cst.List)) else ()
            if len(first) < 1 or len(elements) != 2 or not isinstance(elements[0].value, cst.Name):
                return Problem(loop, "AM602", "the loop's enumerate() index is not a plain name: accumulate by hand")
            iterable, index = first[0].value, elements[0].value.value
        if self.codemod.is_call_to(iterable, PROGRESS_BARS) and positional_args(iterable):
            iterable = positional_args(iterable)[0].value
        if target_key(iterable) is None:
            return Problem(loop, "AM601", f"the loop iterates over `{code_of(iterable)}`, not a named data loader: its last batch cannot be known; accumulate by hand")
        if self._has_no_length(target_key(iterable)):
            return Problem(loop, "AM601", f"`{code_of(iterable)}` has no length (IterableDataset or generator): the epoch's last batch cannot be known; accumulate by hand")
        return iterable, index

    def stepped_optimizers(self, loop: cst.For) -> Union[list[str], Problem]:
        """The optimizers that the loop steps (directly or through a scaler)."""
        backwards = [c for c in self._own_calls(loop) if is_method_call(c, "backward")]
        updates = self.update_calls(loop, backwards[0] if backwards else None)
        if isinstance(updates, Problem):
            return updates
        return sorted({u.optimizer for u in updates if u.optimizer is not None})

    def _has_no_length(self, key: str) -> bool:
        for value in self.facts.values(key):
            if isinstance(value, cst.GeneratorExp):
                return True
            if isinstance(value, cst.Call) and self.codemod.is_qualified(value.func, {"builtins.iter", "builtins.map", "builtins.zip", "builtins.filter"}):
                return True
            if isinstance(value, cst.Call) and self.codemod.is_call_to(value, DATALOADER) and value.args:
                dataset = value.args[0].value
                if self._dataset_has_no_length(dataset):
                    return True
        return False

    def _dataset_has_no_length(self, dataset: cst.BaseExpression) -> bool:
        candidates = [dataset]
        if target_key(dataset) is not None:
            candidates += self.facts.values(target_key(dataset))
        return any(
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and self.facts.is_iterable_dataset_class(value.func.value)
            for value in candidates
        )

    def _early_exits(self, loop: cst.For) -> Optional[Problem]:
        """A break, continue or return would end a group before its step."""

        def inner_loop(node: cst.CSTNode) -> bool:
            return isinstance(node, (cst.For, cst.While)) and node is not loop

        for node in walk(loop.body, lambda n: isinstance(n, (cst.Break, cst.Continue)), stop=lambda n: new_scope(n) or inner_loop(n)):
            keyword = "break" if isinstance(node, cst.Break) else "continue"
            return Problem(node, "AM602", f"`{keyword}` in the training loop can end a group of micro-batches before its optimizer step: accumulate by hand")
        for node in walk(loop.body, lambda n: isinstance(n, cst.Return), stop=new_scope):
            return Problem(node, "AM602", "`return` in the training loop can end a group of micro-batches before its optimizer step: accumulate by hand")
        return None

    def _own_calls(self, loop: cst.For) -> list[cst.Call]:
        """Calls that the loop runs itself, once per iteration or less (not in a
        nested loop, function or class)."""
        return [
            node
            for node in walk(loop.body, lambda n: isinstance(n, cst.Call), stop=lambda n: new_scope(n) or isinstance(n, (cst.For, cst.While)))
        ]

    def update_calls(self, loop: cst.For, backward: Optional[cst.Call]) -> Union[list[UpdateCall], Problem]:
        calls = self._own_calls(loop)
        zeroed = {target_key(receiver(c)) for c in calls if is_method_call(c, "zero_grad")}
        scaled = self._scalers_of(backward)
        updates = []
        for call in calls:
            role = self._role(call, zeroed, scaled)
            if role is None:
                continue
            if role.role == "unknown_step":
                return Problem(call, "AM602", f"cannot tell whether `{code_of(receiver(call))}` is an optimizer or a learning-rate scheduler: accumulate by hand")
            if role.role == "optimizer_step" and call.args:
                return Problem(call, "AM602", "the optimizer step takes a closure (LBFGS-style): accumulate by hand")
            updates.append(role)
        return updates

    def _scalers_of(self, backward: Optional[cst.Call]) -> set[str]:
        """`scaler` when the backward reads `scaler.scale(loss).backward()`."""
        if backward is None:
            return set()
        scaled = receiver(backward)
        if is_method_call(scaled, "scale") and target_key(receiver(scaled)) is not None:
            return {target_key(receiver(scaled))}
        return set()

    def _role(self, call: cst.Call, zeroed: set[Optional[str]], scalers: set[str]) -> Optional[UpdateCall]:
        if self.codemod.is_call_to(call, CLIP_GRAD_FUNCTIONS):
            return UpdateCall(call, "clip")
        if not isinstance(call.func, cst.Attribute):
            return None
        method, owner = call.func.attr.value, target_key(receiver(call))
        kind = self.facts.kind(owner)
        is_scaler = kind == "scaler" or owner in scalers
        if method == "zero_grad":
            return UpdateCall(call, "zero_grad")
        if is_scaler and method == "step" and len(positional_args(call)) >= 1:
            return UpdateCall(call, "scaler_step", code_of(positional_args(call)[0].value))
        if is_scaler and method == "update":
            return UpdateCall(call, "scaler_update")
        if is_scaler and method == "unscale_":
            return UpdateCall(call, "unscale")
        if method != "step" or owner is None:
            return None
        if kind == "optimizer":
            return UpdateCall(call, "optimizer_step", owner)
        if kind == "scheduler":
            return UpdateCall(call, "scheduler_step")
        if owner in zeroed and kind is None:
            return UpdateCall(call, "optimizer_step", owner)  # it steps and zeroes gradients: an optimizer
        return UpdateCall(call, "unknown_step")

    def _top_level_index(self, loop: cst.For, node: cst.CSTNode) -> Optional[int]:
        """The index, in the loop body, of the statement holding `node`, when
        only `with` blocks (autocast, apex's scale_loss) stand between them."""
        body = loop.body.body  # type: ignore[union-attr]
        child = node
        for ancestor in self.codemod.ancestors(node):
            if ancestor is loop.body:
                return body.index(child) if child in body else None
            if isinstance(ancestor, (cst.If, cst.Else, cst.Try, cst.ExceptHandler, cst.Finally, cst.For, cst.While)):
                return None
            child = ancestor
        return None


def _enumerate_start(call: cst.Call) -> Optional[int]:
    positional = positional_args(call)
    start = positional[1].value if len(positional) > 1 else None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "start":
            start = arg.value
    if start is None:
        return 0
    if isinstance(start, cst.Integer):
        return int(start.value, 0)
    return None


# -- the rewrite of one loop ---------------------------------------------------------


@dataclasses.dataclass
class LoopPlan:
    index: str
    enumerate_added: bool
    loader: cst.BaseExpression
    group_start: str
    group_size: str
    end_of_group: str
    at_group_start: set[int]  # body positions of zero_grad() statements before backward()
    at_group_end: set[int]  # body positions of the statements gated to the group's end
    no_sync: Optional[tuple[int, int, str]] = None  # (first, last) body positions, model


def _statement_leading(statement: cst.CSTNode) -> Sequence[cst.EmptyLine]:
    return getattr(statement, "leading_lines", ())


def wrap_block(header: str, statements: Sequence[cst.BaseStatement]) -> cst.BaseCompoundStatement:
    """`header:` (an `if` or `with` line) over `statements`; the comments above the
    first statement move above the new header."""
    compound = cst.parse_statement(f"{header}:\n    pass\n")
    first, rest = statements[0], list(statements[1:])
    leading = _statement_leading(first)
    if leading:
        first = first.with_changes(leading_lines=[])
    return compound.with_changes(body=compound.body.with_changes(body=[first, *rest]), leading_lines=leading)


class Accumulate(Codemod):
    word = "accumulate"
    summary = "accumulate gradients over N micro-batches per optimizer step (--to accumulate=N)"
    codes = {
        "AM600": "training loop rewritten to accumulate gradients over N micro-batches",
        "AM601": "the training loop's length cannot be known: accumulate by hand",
        "AM602": "the training loop's shape cannot be proven: accumulate by hand",
        "AM603": "several backward passes or optimizers in one loop: accumulate by hand",
        "AM604": "backward() or the optimizer step outside the training loop: accumulate by hand",
        "AM605": "a per-batch learning-rate scheduler now steps once per group: rescale its step counts",
        "AM606": "DDP: micro-batches that do not end a group skip the gradient all-reduce (model.no_sync())",
    }
    triggers = ("backward", "step")

    @classmethod
    def check_options(cls, options) -> None:
        parse_factor(options, cls.word, STEPS_MEANING)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps = parse_factor(self.options, self.word, STEPS_MEANING)
        self._plans: dict[cst.For, LoopPlan] = {}
        self._backwards: dict[cst.Call, str] = {}  # backward call -> group size name
        self._define_constant = False
        self._name_taken = False  # STEPS_CONSTANT is used, but not as a module constant

    # -- suppression: a loop is silenced by a comment on its `for` line(s) only --

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        if not isinstance(node, cst.For):
            return super().is_suppressed(node, code)
        header_end = self.get_metadata(PositionProvider, node.iter).end.line
        start = self.get_metadata(PositionProvider, node).start.line
        for line in range(start, header_end + 1):
            codes = self.suppressions.get(line, frozenset())
            if codes is None or code in codes:
                return True
        return False

    # -- analysis ---------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        facts = ModuleFacts.of(self, node)
        reader = LoopReader(self, facts)
        constant = module_constant(node, STEPS_CONSTANT)
        if constant is not None and not _is_integer(constant.value, self.steps):
            self.report(constant, "AM602", f"{STEPS_CONSTANT} is already {code_of(constant.value)}: set it to {self.steps} by hand")
            return
        self._name_taken = constant is None and STEPS_CONSTANT in facts.identifiers
        in_loops, loose = reader.anchors()
        for function, calls in loose.items():
            where = f"`{function.name.value}`" if isinstance(function, cst.FunctionDef) else "this module"
            self.report(calls[0], "AM604", f"backward() or the optimizer step runs in {where} outside any loop (a helper called from the training loop?): accumulate at that loop by hand")
        for loop in in_loops:
            self._plan(loop, reader, facts)
        self._define_constant = bool(self._plans) and constant is None

    def _plan(self, loop: Union[cst.For, cst.While], reader: LoopReader, facts: ModuleFacts) -> None:
        if self._name_taken:
            self.report(loop, "AM602", f"the name {STEPS_CONSTANT} is already used in this file (not as a module constant): rename it, then migrate")
            return
        if mentions(loop.body, STEPS_CONSTANT):
            return  # accumulates already (a previous run)
        shape = reader.read(loop)
        if isinstance(shape, Problem):
            self.report(shape.node, shape.code, shape.message)
            return
        plan = self._plan_shape(shape, facts)
        if isinstance(plan, Problem):
            self.report(plan.node, plan.code, plan.message)
            return
        if not self.fix(loop, "AM600", self._fixed_message(shape)):
            return
        self._plans[loop] = plan
        self._backwards[shape.backward] = plan.group_size
        self._add_no_sync(shape, plan, facts)
        for update in shape.updates:
            if update.role == "scheduler_step":
                self.report(update.call, "AM605", f"`{code_of(update.call)}` now runs once per {self.steps} micro-batches: divide the step counts the scheduler was built with (total_steps, steps_per_epoch, T_max, warm-up steps...) by {STEPS_CONSTANT}")

    def _fixed_message(self, shape: LoopShape) -> str:
        return (
            f"accumulates gradients over {self.steps} micro-batches of `{code_of(shape.loader)}`: the loss is divided by the "
            f"group's size before backward(), and {shape.optimizers[0]} steps once per group and at the epoch's last batch"
        )

    def _plan_shape(self, shape: LoopShape, facts: ModuleFacts) -> Union[LoopPlan, Problem]:
        body = list(shape.loop.body.body)  # type: ignore[union-attr]
        roles = {id(u.call): u for u in shape.updates}
        at_start, at_end = set(), set()
        for position, statement in enumerate(body):
            kind = self._statement_kind(statement, roles, shape)
            if isinstance(kind, Problem):
                return kind
            if kind == "zero_grad" and position < shape.backward_index:
                at_start.add(position)
            elif kind in ("zero_grad", "update") and position > shape.backward_index:
                at_end.add(position)
            elif kind == "update":
                return Problem(statement, "AM602", "an optimizer, scaler or scheduler step runs before backward() in the loop: accumulate by hand")
        if not any(update.role == "zero_grad" for update in shape.updates):
            return Problem(shape.loop, "AM602", "no zero_grad() in the training loop (gradients cleared elsewhere?): accumulate by hand")
        stale = self._read_while_stale(body, at_end)
        if stale is not None:
            return stale
        if shape.index is not None and self._reassigned(shape.loop, shape.index):
            return Problem(shape.loop, "AM602", f"the loop index `{shape.index}` is reassigned in the loop: accumulate by hand")
        taken = facts.identifiers | {STEPS_CONSTANT}
        return LoopPlan(
            index=shape.index or fresh_name("batch_idx", taken),
            enumerate_added=shape.index is None,
            loader=shape.loader,
            group_start=fresh_name("group_start", taken),
            group_size=fresh_name("group_size", taken),
            end_of_group=fresh_name("end_of_group", taken),
            at_group_start=at_start,
            at_group_end=at_end,
        )

    def _statement_kind(self, statement: cst.CSTNode, roles: Mapping[int, UpdateCall], shape: LoopShape) -> Union[str, Problem, None]:
        """"zero_grad" or "update" when the statement does nothing but such calls,
        None when it holds none, a Problem when it mixes them with other code."""
        inside = [roles[id(c)] for c in walk(statement, lambda n: isinstance(n, cst.Call)) if id(c) in roles]
        if not inside:
            return None
        if isinstance(statement, cst.SimpleStatementLine) and all(self._is_update_small(s, roles) for s in statement.body):
            return "zero_grad" if all(u.role == "zero_grad" for u in inside) else "update"
        stepping = [u for u in inside if u.role in ("optimizer_step", "scaler_step")]
        if isinstance(statement, cst.If) and not stepping and self._is_guarded_update(statement, roles, shape):
            return "zero_grad" if all(u.role == "zero_grad" for u in inside) else "update"
        if stepping and isinstance(statement, cst.If):
            return Problem(stepping[0].call, "AM602", "the optimizer step is already conditional (does the loop accumulate already?): left alone")
        first = inside[0].call
        return Problem(first, "AM602", f"`{code_of(first.func)}()` runs inside a compound statement or shares its line with other code: accumulate by hand")

    def _is_update_small(self, small: cst.BaseSmallStatement, roles: Mapping[int, UpdateCall]) -> bool:
        if isinstance(small, cst.Expr):
            return isinstance(small.value, cst.Call) and id(small.value) in roles
        if isinstance(small, (cst.Assign, cst.AnnAssign)):
            return isinstance(small.value, cst.Call) and id(small.value) in roles and roles[id(small.value)].role == "clip"
        return False

    def _is_guarded_update(self, statement: cst.If, roles: Mapping[int, UpdateCall], shape: LoopShape) -> bool:
        """`if args.clip: clip_grad_norm_(...)`: an if with no else whose body only
        updates, on a condition that does not count batches."""
        if statement.orelse is not None or not isinstance(statement.body, cst.IndentedBlock):
            return False
        if shape.index is not None and mentions(statement.test, shape.index):
            return False
        return all(
            isinstance(line, cst.SimpleStatementLine) and all(self._is_update_small(s, roles) for s in line.body)
            for line in statement.body.body
        )

    def _read_while_stale(self, body: Sequence[cst.CSTNode], gated: set[int]) -> Optional[Problem]:
        """A name set by a gated statement (`norm = clip_grad_norm_(...)`) and
        read by the others would be stale on most micro-batches."""
        assigned = {
            name.value
            for position in gated
            for target in walk(body[position], lambda n: isinstance(n, cst.AssignTarget))
            for name in walk(target, lambda n: isinstance(n, cst.Name))
        }
        for position, statement in enumerate(body):
            if position in gated:
                continue
            for name in sorted(assigned):
                if mentions(statement, name):
                    return Problem(statement, "AM602", f"`{name}` is set only when the optimizer steps but read on every micro-batch: accumulate by hand")
        return None

    def _reassigned(self, loop: cst.For, name: str) -> bool:
        targets = walk(loop.body, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.AsName)))
        for node in targets:
            bound = node.target if not isinstance(node, cst.AsName) else node.name
            if mentions(bound, name):
                return True
        return False

    def _add_no_sync(self, shape: LoopShape, plan: LoopPlan, facts: ModuleFacts) -> None:
        """Under DDP, the forward and backward of a micro-batch that does not end
        its group skip the all-reduce: from the first statement that uses the
        model to the one holding backward()."""
        models = sorted(facts.ddp_models())
        if not models:
            return
        body = shape.loop.body.body  # type: ignore[union-attr]
        used = [
            position
            for position in range(shape.backward_index + 1)
            if position not in plan.at_group_start and any(mentions(body[position], model) for model in models)
        ]
        in_loop = [model for model in models if any(mentions(body[p], model) for p in used)]
        if len(in_loop) != 1:
            model = " or ".join(f"`{m}`" for m in models)
            self.report(shape.backward, "AM606", f"the model is wrapped in DistributedDataParallel ({model}) but its forward in this loop cannot be found: run the forward and backward of micro-batches that do not end a group under `model.no_sync()` by hand (it saves an all-reduce each)")
            return
        (model,) = in_loop
        if self.fix(body[used[0]], "AM606", f"the forward and backward of micro-batches that do not end a group run under `{model}.no_sync()` (when it is wrapped in DistributedDataParallel): one gradient all-reduce per group"):
            plan.no_sync = (used[0], shape.backward_index, model)
            self.add_import(RUNTIME_BATCH, "no_sync_unless")

    # -- the rewrite -------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        size = self._backwards.get(original_node)
        if size is None:
            return updated_node
        scaled = updated_node.func.value  # type: ignore[union-attr]
        if is_method_call(scaled, "scale") and len(scaled.args) == 1 and scaled.args[0].keyword is None:
            argument = scaled.args[0]
            new_receiver = scaled.with_changes(args=[argument.with_changes(value=times_or_divided(argument.value, cst.Divide(), size))])
        else:
            new_receiver = times_or_divided(scaled, cst.Divide(), size).with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node.with_changes(func=updated_node.func.with_changes(value=new_receiver))  # type: ignore[union-attr]

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        plan = self._plans.get(original_node)
        if plan is None:
            return updated_node
        body = self._group_statements(plan, list(updated_node.body.body))  # type: ignore[union-attr]
        block = updated_node.body.with_changes(body=[*self._group_lines(plan), *body])
        loop = updated_node.with_changes(body=block)
        if plan.enumerate_added:
            loop = self._enumerated(loop, plan.index)
        return loop

    def _group_lines(self, plan: LoopPlan) -> list[cst.SimpleStatementLine]:
        n, index = STEPS_CONSTANT, plan.index
        lines = [
            f"{plan.group_start} = {index} - {index} % {n}",
            f"{plan.group_size} = min({n}, len({code_of(plan.loader)}) - {plan.group_start})",
            f"{plan.end_of_group} = {index} + 1 == {plan.group_start} + {plan.group_size}",
        ]
        statements = [cst.parse_statement(line + "\n") for line in lines]
        comment = cst.EmptyLine(indent=True, comment=cst.Comment("# This micro-batch's accumulation group (the epoch's last may be shorter)."))
        statements[0] = statements[0].with_changes(leading_lines=[comment])
        return statements

    def _group_statements(self, plan: LoopPlan, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The body with the gated runs of statements under their `if`, and the
        forward-to-backward statements under no_sync when the model is DDP."""
        pieces: list[tuple[int, int, cst.BaseStatement]] = []  # (first, last) original positions
        position = 0
        while position < len(body):
            for gated, header in ((plan.at_group_start, f"if {plan.index} == {plan.group_start}"), (plan.at_group_end, f"if {plan.end_of_group}")):
                if position in gated:
                    end = position
                    while end + 1 in gated:
                        end += 1
                    pieces.append((position, end, wrap_block(header, body[position : end + 1])))
                    position = end + 1
                    break
            else:
                pieces.append((position, position, body[position]))
                position += 1
        if plan.no_sync is None:
            return [statement for _, _, statement in pieces]
        first, last, model = plan.no_sync
        inside = [statement for start, end, statement in pieces if first <= start and end <= last]
        before = [statement for start, _, statement in pieces if start < first]
        after = [statement for _, end, statement in pieces if end > last]
        header = f"with no_sync_unless({plan.end_of_group}, {model})"
        return [*before, wrap_block(header, inside), *after]

    def _enumerated(self, loop: cst.For, index: str) -> cst.For:
        target = loop.target
        if isinstance(target, cst.Tuple) and not target.lpar:
            target = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        new_target = cst.Tuple(
            elements=[cst.Element(cst.Name(index), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Element(target)],
            lpar=[],
            rpar=[],
        )
        new_iter = cst.Call(func=cst.Name("enumerate"), args=[cst.Arg(loop.iter)])
        return loop.with_changes(target=new_target, iter=new_iter)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._define_constant:
            return updated_node
        constant = constant_statement(STEPS_CONSTANT, self.steps, "micro-batches per optimizer step (gradient accumulation)")
        return insert_module_statement(updated_node, constant)


def _is_integer(node: cst.BaseExpression, value: int) -> bool:
    return isinstance(node, cst.Integer) and int(node.value, 0) == value


__all__ = ["Accumulate", "LoopReader", "ModuleFacts", "code_of", "parse_factor"]
