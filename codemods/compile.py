"""compile: `torch.compile` on each trained model, once it is placed and wrapped.

What it does
    After the last statement that builds, places or wraps a model that a
    training step backpropagates through (`model = Net().to(device)`, the
    `ddp` codemod's `if is_distributed(): model = DistributedDataParallel(...)`),
    inserts::

        if should_compile(model):
            model = torch.compile(model)

    and sends the state dict through `unwrap_model(model)` wherever the
    compiled name saves or loads it (`state_dict()`, `load_state_dict()`,
    `named_parameters()` ..., `torch.save(model, ...)`), so checkpoints keep
    the module's own keys, without the `_orig_mod.` prefix of the compiled
    wrapper, and a checkpoint of the original script still loads.

Why
    `torch.compile` fuses the model's elementwise operations into generated
    kernels and removes Python overhead: typically 1.3-2x per training step
    on a GPU, paid for by compile time on the first steps.

Order
    It runs after `ddp`: compiling the DistributedDataParallel module, as
    torch recommends, lets its graph be split at the gradient buckets, so the
    all-reduce of one bucket overlaps the backward of the next.

Run-time gate
    `should_compile(model)` (accelmigrate.runtime.speed) is True when the
    model's parameters are on CUDA and triton is installed; on a CPU the
    migrated script runs uncompiled, as the original did.
    ACCELMIGRATE_COMPILE=1 compiles on a CPU too (inductor needs a C
    compiler there), ACCELMIGRATE_COMPILE=0 never compiles.

Example
    Before::

        model = Net().to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        ...
        torch.save(model.state_dict(), "model.pt")

    After::

        model = Net().to(device)
        if should_compile(model):
            model = torch.compile(model)
        optimizer = torch.optim.AdamW(model.parameters())
        ...
        torch.save(unwrap_model(model).state_dict(), "model.pt")

Left alone
    A file that already calls `torch.compile` or `should_compile`; a model
    still under `nn.DataParallel` (AM702: run `ddp` first: DataParallel
    replicates the module every step, which a compiled module does not
    survive); a model built or moved in a loop, bound by unpacking, or
    passed inline (AM703, to compile by hand).

Findings
    AM701 each model compiled; AM704 once per file, where state dicts are
    saved or loaded through `unwrap_model`.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._base import dotted_name
from ._ddp.references import UNWRAP_API
from ._speed import RUNTIME
from ._speed.models import NotReady, ready_model, trained_models
from ._speed.statements import InsertingCodemod, torch_spelling
from .script import vocabulary as v
from .script.uses import uses_of

TORCH_COMPILE = frozenset({"torch.compile", "torch._dynamo.optimize"})
SHOULD_COMPILE = frozenset({f"{RUNTIME}.should_compile"})
UNWRAP_MODEL = frozenset({"accelmigrate.runtime.distributed.unwrap_model"})
DISTRIBUTED_RUNTIME = "accelmigrate.runtime.distributed"


class Compile(InsertingCodemod):
    word = "compile"
    needs_torch = (2, 0)  # torch.compile
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "torch.compile on each trained model after placement and DDP (on CUDA), checkpoints from the uncompiled module"
    codes = {
        "AM701": "trained model not compiled with torch.compile",
        "AM702": "model under nn.DataParallel: compile after ddp replaces it",
        "AM703": "no single place where the model is ready: compile it by hand",
        "AM704": "state dict of a compiled model carries `_orig_mod.` keys: save and load it through unwrap_model",
    }
    triggers = ("backward",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._unwrap: set[cst.CSTNode] = set()  # references to send through unwrap_model

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        if self._compiles_already():
            return
        compiled = []
        for entity in trained_models(self.script):
            if self._compile(entity):
                compiled.append(entity)
        if compiled:
            self._plan_unwrap(compiled)

    def _compiles_already(self) -> bool:
        return any(self.is_call_to(call, TORCH_COMPILE | SHOULD_COMPILE) for call in uses_of(self.script).calls)

    def _compile(self, entity) -> bool:
        if any(e.made_by in v.DATA_PARALLEL for e in _chain(entity)):
            self.report(entity.at, "AM702", f"`{entity.name}` is wrapped in nn.DataParallel: run the ddp codemod first, then compile")
            return False
        ready = ready_model(self.script, entity)
        if isinstance(ready, NotReady):
            self.report(ready.node, "AM703", f"{ready.reason}: add `{entity.name} = torch.compile({entity.name})` by hand once it is placed")
            return False
        torch = torch_spelling(self.script, ready.anchor, self)
        if torch is None:
            self.report(ready.anchor, "AM703", "no name reads torch here (a local variable shadows it): compile the model by hand")
            return False
        name = ready.name
        if not self.fix(
            ready.anchor, "AM701",
            f"`{name} = {torch}.compile({name})` once it is placed and wrapped, where should_compile says so "
            f"(CUDA with triton; ACCELMIGRATE_COMPILE=0|1 overrides)",
        ):
            return False
        self.inserts.add_after(ready.anchor, f"if should_compile({name}):\n    {name} = {torch}.compile({name})")
        self.add_import(RUNTIME, "should_compile")
        return True

    # -- checkpoints --------------------------------------------------------------------------

    def _plan_unwrap(self, compiled: list) -> None:
        """References to a compiled model that save or load its state: through unwrap_model."""
        origins = {e.origin for e in compiled}
        names = {(id(e.binding.scope), e.name) for e in compiled}
        first: Optional[cst.CSTNode] = None
        for reference in self._state_references():
            entities = self.script.entities_of(reference)
            bindings = self.script.bindings_of_reference(reference)
            if not any(e.origin in origins for e in entities) and not any((id(b.scope), b.name) in names for b in bindings):
                continue
            self._unwrap.add(reference)
            first = first or reference
        if first is not None and self.fix(
            first, "AM704",
            "state dicts saved and loaded through `unwrap_model(...)`: the module's own keys, without `_orig_mod.`",
        ):
            self.add_import(DISTRIBUTED_RUNTIME, "unwrap_model")
        elif first is not None:
            self._unwrap.clear()

    def _state_references(self):
        """`R` of `R.state_dict()`, `R.load_state_dict(...)`, `R.named_parameters()`
        ... and `torch.save(R, ...)`, for plain references R not yet unwrapped."""
        for call in uses_of(self.script).calls:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in UNWRAP_API and dotted_name(func.value):
                yield func.value
            elif self.is_call_to(call, v.TORCH_SAVE) and call.args and call.args[0].keyword is None:
                first = call.args[0].value
                if dotted_name(first):
                    yield first

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._unwrapped(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._unwrapped(original_node, updated_node)

    def _unwrapped(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        if original not in self._unwrap:
            return updated
        return cst.Call(func=cst.Name("unwrap_model"), args=[cst.Arg(updated)])


def _chain(entity):
    """The entity and those it was made from (`model = DataParallel(net)`)."""
    current, seen = entity, set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.via


__all__ = ["Compile"]
