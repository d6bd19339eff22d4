"""fused-optim: `fused=` for Adam, AdamW and SGD, True where the parameters are on CUDA.

What it does
    Adds `fused=fused_on_cuda(model)` to `torch.optim.Adam(...)`,
    `torch.optim.AdamW(...)` and `torch.optim.SGD(...)`, naming the modules
    whose `.parameters()` the optimizer is given (`model`, or
    `model.backbone, model.head` for parameter groups).

Why
    The default ("foreach") optimizers launch a few CUDA kernels per group of
    tensors and step; the fused ones update every parameter in one kernel
    launch, which shortens the optimizer step of a model with many small
    tensors severalfold. Fused steps work with GradScaler (they skip the step
    on inf/NaN themselves).

Run-time gate
    `fused_on_cuda(*modules)` (accelmigrate.runtime.speed) is True only when
    every parameter of those modules is a floating-point CUDA tensor when
    the optimizer is built; on a CPU the script keeps the default
    implementation and its numbers. ACCELMIGRATE_FUSED=0 turns it off. An
    optimizer built before the model is moved to the GPU gets False: build
    it after the move to gain.

Example
    Before::

        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    After::

        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused_on_cuda(model))

Left alone
    Optimizers given `fused=` already, or `foreach=` or `differentiable=`,
    which exclude it (AM742); parameters that are not only modules'
    `.parameters()` at the call (a list built earlier, a tensor of their
    own: AM741);
    SGD in a file with sparse embeddings (fused SGD takes no sparse
    gradients: a note, AM743). AM740 is the fix. SGD's `fused` needs
    torch 2.3 or later.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._base import Codemod, append_keyword_args, code_of, keyword_arg
from ._speed import RUNTIME
from ._speed.models import parameter_owners
from .script.uses import uses_of

ADAM = frozenset({"torch.optim.Adam", "torch.optim.adam.Adam", "torch.optim.AdamW", "torch.optim.adamw.AdamW"})
SGD = frozenset({"torch.optim.SGD", "torch.optim.sgd.SGD"})
EXCLUSIVE = ("fused", "foreach", "differentiable")


class FusedOptim(Codemod):
    word = "fused-optim"
    needs_torch = (2, 3)  # fused= for SGD
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "fused=True for Adam, AdamW and SGD where the parameters are on CUDA (fused_on_cuda)"
    codes = {
        "AM740": "Adam, AdamW or SGD without the fused CUDA implementation",
        "AM741": "optimizer whose parameters cannot be traced to modules here: pass `fused=` by hand",
        "AM742": "optimizer given `foreach=` or `differentiable=`, which exclude `fused=`",
        "AM743": "SGD left unfused: the file makes sparse embedding gradients, which fused SGD does not take",
    }
    notes = frozenset({"AM743"})
    triggers = ("Adam", "SGD")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fused: dict[cst.Call, str] = {}  # optimizer call -> the gate's arguments

    def visit_Module(self, node: cst.Module) -> None:
        sparse = self._sparse_embeddings()
        for call in uses_of(self.script).calls:
            is_sgd = self.is_call_to(call, SGD)
            if not (is_sgd or self.is_call_to(call, ADAM)):
                continue
            if any(keyword_arg(call, k) is not None for k in EXCLUSIVE):
                if keyword_arg(call, "fused") is None:
                    self.report(call, "AM742", "`foreach=` or `differentiable=` given: drop it and pass `fused=fused_on_cuda(model)` by hand if the fused kernel suits")
                continue
            if is_sgd and sparse:
                self.report(call, "AM743", "the file makes sparse embedding gradients, which fused SGD does not take: left as it is")
                continue
            modules = self._modules_of(call)
            if modules is None:
                self.report(call, "AM741", "the parameters are not only modules' `.parameters()` at this call: pass `fused=` by hand, True where every one of them is on CUDA")
                continue
            gate = ", ".join(modules)
            if self.fix(call, "AM740", f"`fused=fused_on_cuda({gate})`: one kernel for the whole optimizer step on CUDA, the default implementation elsewhere"):
                self._fused[call] = gate
                self.add_import(RUNTIME, "fused_on_cuda")

    def _modules_of(self, call: cst.Call) -> Optional[list[str]]:
        owners = parameter_owners(self.script, call)
        return [code_of(owner) for owner in owners] if owners else None

    def _sparse_embeddings(self) -> bool:
        """`nn.Embedding(..., sparse=True)` (or EmbeddingBag) anywhere in the file."""
        for call in uses_of(self.script).calls:
            sparse = keyword_arg(call, "sparse")
            if sparse is not None and not (isinstance(sparse.value, cst.Name) and sparse.value.value == "False"):
                if any(q.startswith("torch.nn.") and "Embedding" in q for q in self.qualified_names(call.func)):
                    return True
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        gate = self._fused.get(original_node)
        if gate is None:
            return updated_node
        return append_keyword_args(updated_node, [("fused", cst.parse_expression(f"fused_on_cuda({gate})"))])


__all__ = ["FusedOptim"]
