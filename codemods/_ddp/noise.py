"""Random draws sized by the batch in a loop that trains (a GAN's noise,
`torch.randn(batch, latent)` with `batch = real.size(0)`): every rank is
seeded alike, so each would draw the same noise for its share of the batch,
and the global batch of fakes would hold each sample once per rank. Each
becomes `draw_rank_share(torch.randn, batch, latent)`: the draw the original
made for its whole batch, made alike on every rank, and this rank's rows of
it, those of the samples its sampler gives it. A draw of a fixed size stays:
alike on every rank, it is the original's draw, and so are the gradients
averaged across the ranks.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import walk
from .common import RUNTIME, keyword_of
from .local_batch import LocalBatchSize

DRAWS = frozenset({"torch.randn", "torch.rand"})
SHARED_DRAW = frozenset({f"{RUNTIME}.draw_rank_share"})
# Methods that return the same samples (moved, cast, reshaped): still the batch.
SIZE_METHODS = frozenset({"size"})


class BatchReading:
    """What in a loop over batches holds this step's samples and their number,
    and the sizes a draw is given (shared with the accelerate codemod's draws)."""

    def _batch_names(self, loop: cst.For) -> tuple[set[str], set[str]]:
        """Names in the loop body that hold this step's samples (the loop's
        target, `real = data[0].to(device)`, `fake = netG(noise)`) and names
        that hold their number (`batch = real.size(0)`)."""
        tensors = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
        sizes: set[str] = set()
        assigns = [a for a in walk(loop.body) if isinstance(a, cst.Assign) and len(a.targets) == 1]
        for _ in range(len(assigns) + 1):  # until nothing new is found
            before = len(tensors) + len(sizes)
            for assign in assigns:
                targets = {n.value for n in walk(assign.targets[0].target) if isinstance(n, cst.Name)}
                if self._is_batch_size(assign.value, tensors, sizes) and isinstance(assign.targets[0].target, cst.Name):
                    sizes |= targets
                elif any(isinstance(n, cst.Name) and n.value in tensors for n in walk(assign.value)):
                    tensors |= targets
            if len(tensors) + len(sizes) == before:
                break
        return tensors - sizes, sizes

    def _is_batch_size(self, node: cst.BaseExpression, tensors: set[str], sizes: set[str]) -> bool:
        """`n` (a size name), `x.size(0)`, `x.size()[0]`, `x.shape[0]` or `len(x)` of a batch tensor `x`."""
        if isinstance(node, cst.Name):
            return node.value in sizes
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value == "len" and len(node.args) == 1:
                return self._holds_batch(node.args[0].value, tensors)
            func = node.func
            return (
                isinstance(func, cst.Attribute) and func.attr.value in SIZE_METHODS and len(node.args) == 1
                and _is_zero(node.args[0].value) and self._holds_batch(func.value, tensors)
            )
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            if not _is_zero(node.slice[0].slice.value):
                return False
            value = node.value
            if isinstance(value, cst.Attribute) and value.attr.value == "shape":
                return self._holds_batch(value.value, tensors)
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size" and not value.args:
                return self._holds_batch(value.func.value, tensors)
        return False

    def _holds_batch(self, node: cst.BaseExpression, tensors: set[str]) -> bool:
        """`x`, `x.to(device)`, `data[0]`, `batch["image"]` for a batch tensor `x`, `data`, `batch`."""
        while True:
            if isinstance(node, cst.Name):
                return node.value in tensors
            if isinstance(node, cst.Subscript):
                node = node.value
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                node = node.func.value
            else:
                return False

    def _draw_dims(self, call: cst.Call) -> Optional[list[cst.BaseExpression]]:
        """The sizes of `torch.randn(b, n, ...)` or `torch.randn((b, n), ...)`
        (None: a form the rewrite does not take, `size=` or `*dims`)."""
        positional = [a for a in call.args if a.keyword is None]
        if not positional or any(a.star for a in call.args) or any(keyword_of(a) == "size" for a in call.args):
            return None
        first = positional[0].value
        if len(positional) == 1 and isinstance(first, (cst.Tuple, cst.List)):
            if not first.elements or any(isinstance(e, cst.StarredElement) for e in first.elements):
                return None
            return [e.value for e in first.elements]
        return [a.value for a in positional]


class RankNoise(BatchReading, LocalBatchSize):
    """Plans `draw_rank_share(...)` for the batch-sized draws of a training loop."""

    def _plan_batch_draws(self, loop: cst.CSTNode, batch: Optional[cst.BaseExpression]) -> None:
        """`batch`: the loader's batch size (`torch.randn(batch_size, latent)` is sized by the batch too;
        None for a loader handed in, whose batch size this file does not see)."""
        if not isinstance(loop, cst.For):
            return
        tensors, sizes = self._batch_names(loop)
        for node in walk(loop.body):
            if isinstance(node, cst.Call) and self.is_call_to(node, DRAWS) and self.innermost_loop(node) is not None:
                dims = self._draw_dims(node)
                if dims and (
                    self._is_batch_size(dims[0], tensors, sizes)
                    or batch is not None and self._reads_loader_batch(dims[0], batch, loop)
                ):
                    self._plan_shared_draw(node, dims)

    def _plan_shared_draw(self, call: cst.Call, dims: list[cst.BaseExpression]) -> None:
        self._rank_shared_draws.add(call)
        if any(self._clashes(n) for n in self._uses.names.get("draw_rank_share", ())):
            self.report(
                call, "AM532",
                "a random draw sized by the batch, alike on every rank (each rank draws the same noise): "
                "`draw_rank_share` is taken here; draw the whole batch's noise on every rank and keep this rank's rows "
                "(`[global_rank()::world_size()]`) by hand",
            )
            return
        keywords = [a for a in call.args if a.keyword is not None]
        draw = self._code(call.func)

        def apply() -> None:
            self._use("draw_rank_share")
            self._edits[call] = lambda updated: cst.Call(
                func=cst.Name("draw_rank_share"),
                args=[cst.Arg(updated.func), *(cst.Arg(d) for d in _dims_of(updated, len(dims))), *_keywords_of(updated)],
            )

        self._step(
            call, "AM532",
            f"`draw_rank_share({draw}, {', '.join(self._code(d) for d in dims)}{''.join(', ' + self._code(k).rstrip(',') for k in keywords)})`: "
            f"each rank draws the noise of its own samples (the rows of the original's draw for the whole batch), "
            f"not the same noise as every other rank",
            apply,
        )


def _dims_of(call: cst.Call, count: int) -> list[cst.BaseExpression]:
    positional = [a for a in call.args if a.keyword is None]
    first = positional[0].value
    if len(positional) == 1 and isinstance(first, (cst.Tuple, cst.List)) and count == len(first.elements):
        return [e.value for e in first.elements]
    return [a.value for a in positional]


def _keywords_of(call: cst.Call) -> list[cst.Arg]:
    kept = [a for a in call.args if a.keyword is not None]
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in kept]


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.evaluated_value == 0
