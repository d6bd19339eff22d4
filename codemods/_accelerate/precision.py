"""Mixed precision onto Accelerate's: CUDA autocast blocks and a GradScaler
become `Accelerator(mixed_precision=...)`, which autocasts the prepared
model's forward and scales the loss in `accelerator.backward`.

What is migrated: `with autocast(...):` blocks on CUDA (`torch.cuda.amp.autocast`,
`torch.autocast("cuda")`, `torch.amp.autocast("cuda")`, fp16 or bf16),
unwrapped to their body, and one GradScaler bound in the entry point and
used only as `scaler.scale(loss).backward()` (the backward planner drops
the `scale`), `scaler.step(optimizer)` -> `optimizer.step()`,
`scaler.update()` and `scaler.unscale_(optimizer)` removed
(`accelerator.clip_grad_norm_` unscales). On a machine without CUDA the
original's CUDA autocast was off, so the migrated script asks for "no" there.
NVIDIA apex's amp is moved onto the same setting (apex.py). Everything
else (CPU autocast, `enabled=`, a scaler saved or read) is refused with AM821.
"""

from __future__ import annotations

import libcst as cst

from .._base import code_of, dotted_name, keyword_arg
from ..script import vocabulary as v
from ..script.entities import GRAD_SCALER
from .apex import ApexAmp
from .common import ACCELERATOR, CannotMigrate

CUDA_ONLY = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
DTYPES = {"torch.float16": "fp16", "torch.half": "fp16", "torch.bfloat16": "bf16"}
SCALER_METHODS = frozenset({"scale", "step", "update", "unscale_"})
MANUAL_STEP = (
    "remove the autocast blocks and the scaler (`scaler.scale(loss).backward()` -> `loss.backward()`, "
    "`scaler.step(opt)` -> `opt.step()`, no `scaler.update()`), run accelerate again, then pass "
    "`mixed_precision=\"fp16\"` (or \"bf16\") to `Accelerator(...)`"
)


def mixed_precision(dtype: str) -> str:
    """The Accelerator's `mixed_precision=` for CUDA mixed precision of `dtype`:
    without CUDA the original's CUDA autocast was off, and "no" keeps its fp32
    numbers there."""
    return f'"{dtype}" if torch.cuda.is_available() else "no"'


def refuse(node: cst.CSTNode, why: str) -> CannotMigrate:
    return CannotMigrate(node, "AM821", f"{why}: accelerate changed nothing; {MANUAL_STEP}")


class Precision:
    """Reads the script's mixed precision and plans its removal; `mode` is the
    `mixed_precision=` expression for the Accelerator, or None."""

    def __init__(self, planner) -> None:
        self.planner = planner
        self.codemod = planner.codemod
        self.plan = planner.plan
        self.mode: str | None = None
        self.scaler: str | None = None
        self.apex = ApexAmp(self)

    def _names(self, call: cst.Call) -> frozenset:
        return self.codemod.qualified_names(call.func)

    def plan_mixed_precision(self) -> None:
        autocasts, scalers, apex = [], [], []
        for call in self.planner.uses.calls:
            names = self._names(call)
            if any(n in v.AUTOCAST for n in names):
                autocasts.append(call)
            elif any(n in GRAD_SCALER for n in names):
                scalers.append(call)
            elif self.apex.is_apex(call):
                apex.append(call)
            elif any(n.startswith(v.AMP_PREFIXES) for n in names):
                raise refuse(call, f"`{code_of(call.func)}`, which Accelerate's mixed precision does not replace")
        if apex:
            if autocasts or scalers:
                raise refuse(apex[0], "apex's amp together with torch's autocast or GradScaler")
            dtype = self.apex.plan_apex(apex)
            self.mode = mixed_precision(dtype) if dtype else None
            return
        if not autocasts and not scalers:
            return
        if not autocasts:
            raise refuse(scalers[0], "a GradScaler without autocast")
        dtypes = {self._autocast_dtype(call) for call in autocasts}
        if len(dtypes) > 1:
            raise refuse(autocasts[0], "autocast blocks of different dtypes")
        if len(scalers) > 1:
            raise refuse(scalers[1], "more than one GradScaler")
        for call in scalers:
            self._plan_scaler(call)
        for call in autocasts:
            self._plan_autocast(call)
        (dtype,) = dtypes
        self.mode = mixed_precision(dtype)

    def unscaled(self, operand: cst.BaseExpression) -> cst.BaseExpression:
        """`loss` for `scaler.scale(loss)` of the GradScaler this plan removes, and
        for `scaled_loss` of an apex `scale_loss` block."""
        if self.scaler and isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute) \
                and dotted_name(operand.func.value) == self.scaler and operand.func.attr.value == "scale":
            return operand.args[0].value
        loss = self.apex.unscaled(operand)
        return operand if loss is None else loss

    def _autocast_dtype(self, call: cst.Call) -> str:
        positional = [a for a in call.args if a.keyword is None]
        device = keyword_arg(call, "device_type") or (positional[0] if positional else None)
        cuda_only = bool(self._names(call) & CUDA_ONLY)
        if cuda_only and device is not None or not cuda_only and not (
            device is not None and isinstance(device.value, cst.SimpleString) and device.value.evaluated_value == "cuda"
        ):
            raise refuse(call, f"`{code_of(call)}` on a device other than a literal \"cuda\" (CPU autocast computes in bf16 where accelerate would compute in fp32)")
        others = [a for a in call.args if a is not device and not (a.keyword is not None and a.keyword.value == "dtype")]
        if others:
            raise refuse(call, f"`{code_of(call)}` with arguments accelerate does not take (`enabled=`, `cache_enabled=`)")
        dtype = keyword_arg(call, "dtype")
        if dtype is None:
            return "fp16"
        found = next((DTYPES[n] for n in self.codemod.qualified_names(dtype.value) if n in DTYPES), None)
        if found is None:
            raise refuse(call, f"autocast dtype `{code_of(dtype.value)}` that is not a literal torch.float16 or torch.bfloat16")
        return found

    def _plan_autocast(self, call: cst.Call) -> None:
        item = self.codemod.parent(call)
        block = self.codemod.parent(item) if isinstance(item, cst.WithItem) else None
        if not isinstance(block, cst.With) or len(block.items) != 1 or item.asname is not None or block.asynchronous is not None \
                or not isinstance(self.codemod.parent(block), (cst.IndentedBlock, cst.Module)):
            raise refuse(call, f"`{code_of(call.func)}` not used as a `with` block of its own")
        self.plan.unwrapped.add(block)
        self.plan.fixes.append((call, "AM812", f"autocast block removed: `{ACCELERATOR}.prepare` autocasts the model's forward (`mixed_precision=`)"))
        self.codemod.remove_import_of(call.func)

    def _plan_scaler(self, call: cst.Call) -> None:
        if call.args and not (len(call.args) == 1 and isinstance(call.args[0].value, cst.SimpleString) and call.args[0].value.evaluated_value == "cuda"):
            raise refuse(call, f"`{code_of(call)}` with settings of its own (pass them through `GradScalerKwargs` by hand)")
        assign = self.codemod.parent(call)
        line = self.codemod.parent(assign)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and line in self.planner.body):
            raise refuse(call, "a GradScaler not bound to a plain name in the entry point's own body")
        name = assign.targets[0].target.value
        self.scaler = name
        self.plan.removed.add(line)
        self.codemod.remove_import_of(call.func)
        for node in self.planner.uses.names.get(name, ()):
            if node is assign.targets[0].target:
                continue
            self._plan_scaler_use(node, name)
        self.plan.fixes.append((call, "AM812", f"GradScaler removed: `{ACCELERATOR}.backward` scales the loss and the prepared optimizer steps through the scaler"))

    def _plan_scaler_use(self, node: cst.Name, name: str) -> None:
        attribute = self.codemod.parent(node)
        call = self.codemod.parent(attribute) if isinstance(attribute, cst.Attribute) and attribute.value is node else None
        method = attribute.attr.value if call is not None else None
        if not isinstance(call, cst.Call) or call.func is not attribute or method not in SCALER_METHODS:
            raise refuse(node, f"`{name}` used beyond scale/step/update/unscale_ (a scaler saved, read or printed; Accelerate keeps its own, saved with `{ACCELERATOR}.save_state(...)` and read back with `{ACCELERATOR}.load_state(...)`)")
        positional = [a for a in call.args if a.keyword is None]
        if method in ("step", "unscale_", "scale") and (len(call.args) != 1 or len(positional) != 1) or method == "update" and call.args:
            raise refuse(call, f"`{code_of(call)}` with arguments accelerate does not take")
        if method == "scale":
            outer = self.codemod.parent(call)
            backward = self.codemod.parent(outer)
            if not (isinstance(outer, cst.Attribute) and outer.attr.value == "backward" and isinstance(backward, cst.Call)):
                raise refuse(call, f"`{code_of(call)}` used other than as `{name}.scale(loss).backward()`")
            return  # the backward planner writes `accelerator.backward(loss)`
        if method == "step":
            optimizer = positional[0].value
            self.plan.edit(call, lambda updated: cst.Call(func=cst.Attribute(value=updated.args[0].value, attr=cst.Name("step"))))
            self.plan.fixes.append((call, "AM812", f"`{code_of(optimizer)}.step()`: the prepared optimizer skips the step when the scaled gradients overflow"))
            return
        line = self.codemod.parent(self.codemod.parent(call))
        if not (isinstance(self.codemod.parent(call), cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            raise refuse(call, f"`{code_of(call)}` inside a larger statement")
        block = self.codemod.parent(line)
        if isinstance(block, cst.IndentedBlock) and all(s in self.plan.removed or s is line for s in block.body):
            raise refuse(call, f"`{code_of(call)}` alone in its block")
        self.plan.removed.add(line)
        why = "the prepared optimizer updates the scale" if method == "update" else f"`{ACCELERATOR}.clip_grad_norm_` unscales the gradients"
        self.plan.fixes.append((call, "AM812", f"`{code_of(call)}` removed: {why}"))
