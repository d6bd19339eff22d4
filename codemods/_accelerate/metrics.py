"""Evaluation loaders sharded, their metrics computed from
`accelerator.gather_for_metrics`: each process evaluates its slice of every
batch, and the loop then reads the whole batch, in order, as the original did.

Why the gathered batch is the original's (accelerate 1.x, with the
Accelerator the codemod writes, `DataLoaderConfiguration(split_batches=True)`):
every process reads the loader's batch and keeps its slice, in rank order
(BatchSamplerShard._iter_with_split; dispatched, rank 0 sends the slices),
so the slices concatenated by `gather` are the batch. The last batch, when
the batch size does not divide the data set, is completed with the first
samples (even_batches); `gather_for_metrics` cuts it back to
`len(dataset) % batch_size` samples (the `remainder` the prepared loader
records), so the padding never reaches a metric. `len(loader)` stays the
number of batches and `loader.dataset` the original data set.

What is sharded: a `for` over an unshuffled DataLoader made in the entry
point (no sampler), in a loop that does not train, in the entry point after
the training objects are prepared, or in a flat script's function that
module-level code calls after them (`accelerator` is then a global).
The loop must read whole: plain-name targets (`for x, y in loader`,
`for i, (x, y) in enumerate(loader)`), each moved to the device before the
forward (so a tensor: `gather` takes tensors, `gather_object` would flatten
a tuple of lists; dispatched batches must be tensors too), then
`out = model(x)` of a prepared model in eval mode, on one input (as a
statement of the loop body, or of a `with torch.no_grad():` there), and no
`break`, `return` or `yield` (the prepared loader must reach its end for
the padding to be cut). The batch names and the output read after the
forward, in the loop or after it, are gathered. A file with a sequence-first
layer (an RNN or Transformer without `batch_first=True`) keeps every loader
whole: `gather` concatenates along the first dimension. A literal odd batch
size stays whole (`prepare` refuses a split batch the processes do not
divide). Anything else stays whole: every process evaluates the full set,
as before.
"""

from __future__ import annotations

import libcst as cst

from .._base import has_star_args, keyword_arg
from ..script import vocabulary as v
from .common import ACCELERATOR, statement

ENUMERATE = frozenset({"builtins.enumerate"})
# Layers whose outputs put the sequence first unless `batch_first=True`: `gather` concatenates along
# the first dimension, which must be the batch's.
SEQUENCE_FIRST = frozenset(f"torch.nn.{name}" for name in (
    "RNN", "LSTM", "GRU", "Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer", "MultiheadAttention"))
MOVES = frozenset({"to", "cuda"})


class ShardedEvaluation:
    """Reads the planner's script for evaluation loops that can be sharded;
    `plan()` writes their gathers and returns the loaders to prepare."""

    def __init__(self, planner, model_names, first_training: int) -> None:
        self.planner = planner
        self.script = planner.script
        self.codemod = planner.codemod
        self.uses = planner.uses
        self.model_names = set(model_names)
        self.first_training = first_training
        self.training_loaders = {loader.name for loader in planner.training_loaders}

    def plan(self) -> list[str]:
        if any(self._sequence_first(call) for call in self.uses.calls):
            return []
        gathers_by_loader: dict = {}
        rejected = set()
        for node in self.script.index.nodes_of(cst.For):
            loop = self._loop(node)
            if loop is None or loop.loader is None or self.uses.trains(node):
                continue
            loader = loop.loader
            gather = self._gather(node, loader)
            if gather is None:
                rejected.add(loader.binding)
            else:
                gathers_by_loader.setdefault(loader.binding, []).append(gather)
        names = []
        for binding, gathers in gathers_by_loader.items():
            if binding in rejected or not self._loader_can_shard(binding, [g[0] for g in gathers]):
                continue
            if any(self.codemod.is_suppressed(forward, "AM813") for _, forward, _ in gathers):
                continue  # `# accelmigrate: skip[AM813]` on the forward: the loader stays whole
            for loop, forward, gathered in gathers:
                listed = ", ".join(gathered)
                value = f"({listed})" if len(gathered) > 1 else listed
                self.planner.plan.after.setdefault(forward, []).append(
                    statement(f"{listed} = {ACCELERATOR}.gather_for_metrics({value})", self.planner.config)
                )
                self.planner.plan.fixes.append((forward, "AM813", (
                    f"`{listed} = {ACCELERATOR}.gather_for_metrics({value})`: each process evaluates its slice of "
                    f"every batch of `{binding.name}`, and what is computed from them reads the whole batch, "
                    f"the last one's padding dropped"
                )))
            names.append(binding.name)
        return names

    def _sequence_first(self, call: cst.Call) -> bool:
        if not self.codemod.is_call_to(call, SEQUENCE_FIRST):
            return False
        batch_first = keyword_arg(call, "batch_first")
        return not (batch_first is not None and isinstance(batch_first.value, cst.Name) and batch_first.value.value == "True")

    def _loop(self, node: cst.For):
        if not node.body.body:
            return None
        loops = self.script.loops_around(node.body.body[0])
        return loops[0] if loops and loops[0].node is node else None

    # -- the loop ---------------------------------------------------------------------------

    def _gather(self, node: cst.For, loader):
        """(loop, forward statement, names to gather) or None: the loop stays whole."""
        if not self._where_accelerator_runs(node, loader):
            return None
        targets = self._targets(node)
        if targets is None:
            return None
        index, batch = targets
        if any(isinstance(n, (cst.Break, cst.Return, cst.Yield)) for n in self._nodes(node.body)):
            return None
        found = self._forward(node.body.body, set(batch), node)
        if found is None:
            return None
        forward, output, after = found
        read = {n.value for s in after for n in self._nodes(s) if isinstance(n, cst.Name) and self.uses.is_read(n)}
        read |= self._read_after_loop(node)  # the last batch, read once the loop is done
        gathered = [name for name in dict.fromkeys([output, *batch]) if name in read]
        if not gathered:
            return None
        return node, forward, gathered

    def _read_after_loop(self, node: cst.For) -> set:
        order, scope = self.script.index.order, self.script.scope_of(node)
        end = max(order[n] for n in self._nodes(node) if n in order)
        return {
            name for name, reads in self.uses.names.items() for read in reads
            if order[read] > end and self.script.scope_of(read) is scope and self.uses.is_read(read)
        }

    def _where_accelerator_runs(self, node: cst.For, loader) -> bool:
        """In the entry point after `prepare`, or in a flat script's function
        that only module-level code after `prepare` calls."""
        planner = self.planner
        if loader.scope is not planner.entry or loader.name in self.training_loaders or "." in loader.name:
            return False
        scope = self.script.scope_of(node)
        if scope is planner.entry:
            return self._after_training(node)
        if planner.entry.kind != "module" or scope.kind != "function" or scope.parent is not planner.entry:
            return False
        function = self.script.function_at(node)
        if function is None or self.codemod.parent(function.node) is not self.script.module or not function.callers:
            return False
        return all(site.caller is planner.entry and self._after_training(site.call) for site in function.callers)

    def _after_training(self, node: cst.CSTNode) -> bool:
        top = self.planner.top_statement(node)
        return top is not None and self.planner.body.index(top) >= self.first_training

    def _targets(self, node: cst.For):
        """(index name or None, batch names) for `for x, y in loader` and
        `for i, (x, y) in enumerate(loader)`."""
        iterable, target, index = node.iter, node.target, None
        if isinstance(iterable, cst.Call):
            if not self.codemod.is_call_to(iterable, ENUMERATE) or len(iterable.args) != 1 or iterable.args[0].keyword is not None:
                return None
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2 and isinstance(target.elements[0].value, cst.Name)):
                return None
            index, target = target.elements[0].value.value, target.elements[1].value
            iterable = iterable.args[0].value
        if not isinstance(iterable, cst.Name):
            return None
        names = _plain_names(target)
        if names is None or index in names:
            return None
        return index, names

    def _forward(self, body, batch: set, node: cst.For):
        """(forward statement, output name, statements after it) when the
        statements before it only move the batch's names to the device."""
        moved: set = set()
        for position, line in enumerate(body):
            if isinstance(line, cst.With) and len(line.items) == 1 and self._no_grad(line.items[0].item):
                inner = line.body.body
                for inner_position, inner_line in enumerate(inner):
                    output = self._forward_output(inner_line, batch, node)
                    if output is not None:
                        return (inner_line, output, [*inner[inner_position + 1:], *body[position + 1:]]) if moved == batch else None
                    if not self._moves(inner_line, batch, moved):
                        return None
                return None
            output = self._forward_output(line, batch, node)
            if output is not None:
                return (line, output, list(body[position + 1:])) if moved == batch else None
            if not self._moves(line, batch, moved):
                return None
        return None

    def _no_grad(self, item: cst.BaseExpression) -> bool:
        return isinstance(item, cst.Call) and self.codemod.is_call_to(item, v.NO_GRAD)

    def _forward_output(self, line, batch: set, node: cst.For):
        """`out = model(x)` of a prepared model in eval mode: the name `out`."""
        assign = _single_assign(line)
        if assign is None or not isinstance(assign.targets[0].target, cst.Name):
            return None
        call = assign.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in self.model_names):
            return None
        if self.script.index.home_of(call.func.value, self.script.scope_of(call)) is not self.planner.entry:
            return None
        # One input, a name of the batch: `model(x, y)` may return a loss, which is no batch to gather.
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            return None
        if not (isinstance(call.args[0].value, cst.Name) and call.args[0].value.value in batch):
            return None
        return assign.targets[0].target.value if self._in_eval_mode(call.func.value, node) else None

    def _in_eval_mode(self, model: str, node: cst.For) -> bool:
        """The model is in eval mode at the loop: a shard's batch norm in train mode would use its
        own statistics. The last `model.eval()` / `model.train()` before it in its scope, or, in a
        function that says neither, before each of its calls."""
        scope = self.script.scope_of(node)
        mode = self._last_mode(model, scope, node)
        if mode is None and scope is not self.planner.entry:
            sites = self.script.function_at(node).callers
            return all(self._last_mode(model, site.caller, site.call) == "eval" for site in sites)
        return mode == "eval"

    def _last_mode(self, model: str, scope, before: cst.CSTNode):
        order = self.script.index.order
        last = None
        for call in self.uses.calls:
            if order[call] >= order[before]:
                break
            func = call.func
            if (isinstance(func, cst.Attribute) and func.attr.value in ("eval", "train") and isinstance(func.value, cst.Name)
                    and func.value.value == model and self.script.scope_of(call) is scope):
                last = func.attr.value
        return last

    def _moves(self, line, batch: set, moved: set) -> bool:
        """`x = x.to(device)` or `x, y = x.to(device), y.cuda()`: each name of the batch onto the device."""
        assign = _single_assign(line)
        if assign is None:
            return False
        target, value = assign.targets[0].target, assign.value
        pairs = [(target, value)]
        if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
            pairs = [(t.value, e.value) for t, e in zip(target.elements, value.elements)]
        for name, move in pairs:
            if not (isinstance(name, cst.Name) and name.value in batch and isinstance(move, cst.Call)
                    and isinstance(move.func, cst.Attribute) and move.func.attr.value in MOVES
                    and isinstance(move.func.value, cst.Name) and move.func.value.value == name.value):
                return False
            moved.add(name.value)
        return True

    # -- the loader -----------------------------------------------------------------------

    def _loader_can_shard(self, binding, loops) -> bool:
        """Made once before the training by an unshuffled DataLoader(...) of a batch the processes can
        split, and read only by the sharded loops, `len(loader)` and `loader.dataset`."""
        planner = self.planner
        if len(planner.entry.bindings.get(binding.name, ())) != 1:
            return False
        top = planner.top_statement(binding.node)
        # A line of the entry point's own body: bound whatever runs, before the training.
        if not isinstance(top, cst.SimpleStatementLine) or planner.body.index(top) >= self.first_training:
            return False
        call = binding.value
        if not isinstance(call, cst.Call) or not self.script.is_dataloader(call) or has_star_args(call):
            return False
        if keyword_arg(call, "sampler") is not None or keyword_arg(call, "batch_sampler") is not None:
            return False
        if self.script.time_first_padding(call) is not None:
            return False  # a dispatched batch would be cut along its time steps
        shuffle = keyword_arg(call, "shuffle")
        if shuffle is not None and not (isinstance(shuffle.value, cst.Name) and shuffle.value.value == "False"):
            return False
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) > 2:
            return False  # shuffle or a sampler given by position
        size = keyword_arg(call, "batch_size") or (positional[1] if len(positional) == 2 else None)
        # `prepare` refuses a split batch that the processes do not divide; an odd one stays whole.
        if size is None or isinstance(size.value, cst.Integer) and int(size.value.value) % 2:
            return False
        iterables = {_loader_name(loop) for loop in loops}
        for read in self.uses.reads(binding.name, planner.entry):
            if read in iterables or self._len_or_dataset(read):
                continue
            return False
        return True

    def _len_or_dataset(self, read: cst.Name) -> bool:
        parent = self.codemod.parent(read)
        if isinstance(parent, cst.Attribute) and parent.value is read:
            return parent.attr.value == "dataset"
        call = self.codemod.parent(parent) if isinstance(parent, cst.Arg) else None
        return isinstance(call, cst.Call) and len(call.args) == 1 and self.codemod.is_call_to(call, {"builtins.len"})

    def _nodes(self, node: cst.CSTNode):
        """`node` and everything under it, but the code of nested functions and classes."""
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            if current is not node and isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            stack.extend(current.children)


def _single_assign(line) -> cst.Assign | None:
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign):
        assign = line.body[0]
        return assign if len(assign.targets) == 1 else None
    return None


def _plain_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) and not isinstance(e, cst.StarredElement) for e in target.elements):
        names = [e.value.value for e in target.elements]
        return names if len(set(names)) == len(names) else None
    return None


def _loader_name(loop: cst.For) -> cst.Name:
    iterable = loop.iter
    return iterable.args[0].value if isinstance(iterable, cst.Call) else iterable
