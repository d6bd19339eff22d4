"""The deprecated `torch.cuda.amp` / `torch.cpu.amp` API replaced by torch.amp:
on the runtime's precision policy when every old autocast and GradScaler
has a device in reach, else on the device it named, as written."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._base import code_of
from .plan import CPU, NO_SPACE_EQUAL, Problem, Ref, without_parens

# Deprecated spelling -> (its torch.amp replacement, the device it hard-coded).
DEPRECATED = {
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
    "torch.cuda.amp.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cpu.amp.GradScaler": ("amp.GradScaler", "cpu"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cpu"),
    "torch.cuda.amp.custom_fwd": ("amp.custom_fwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("amp.custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("amp.custom_bwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("amp.custom_bwd", "cuda"),
}
# The old autocast took (enabled, dtype, cache_enabled) positionally, the old
# GradScaler (init_scale, growth_factor, backoff_factor, growth_interval,
# enabled); their replacements take the device first: positional arguments
# become keywords.
OLD_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
OLD_SCALER_POSITIONAL = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
# The dtype the old autocast defaulted to; naming it asks for nothing the
# runtime's choice does not give (float16 where bfloat16 is not computed).
HALF = {"torch.float16", "torch.half"}


class DeprecatedApi:
    """Mixed into the codemod."""

    def plan_deprecated(self) -> None:
        calls = []
        for call in self.facts.calls:
            names = self.qualified_names(call.func) & DEPRECATED.keys()
            if names:
                calls.append((call, min(names)))
        devices, reason = self.policy_devices(calls)
        for call, name in calls:
            if call in devices:
                self.plan_on_policy(call, name, devices[call])
            else:
                self.plan_deprecated_call(call, name, reason)
        for function in self.script.functions:
            for decorator in function.node.decorators:
                bare = decorator.decorator
                names = self.qualified_names(bare) & DEPRECATED.keys() if isinstance(bare, (cst.Name, cst.Attribute)) else set()
                if names:
                    self.plan_bare_decorator(bare, min(names))

    def policy_devices(self, calls: list) -> tuple:
        """The device binding of each old autocast and GradScaler, when all of
        them can move onto the runtime's policy (`amp_dtype`, `grad_scaler`);
        else none, and why. All or none: an autocast on the policy (bfloat16
        where supported) with a scaler left as written costs only speed, but
        a float16 autocast left as written with a scaler on the policy (off
        unless float16) would train float16 without loss scaling."""
        devices: dict = {}
        for call, name in calls:
            replacement, _ = DEPRECATED[name]
            if replacement not in ("autocast", "amp.GradScaler"):
                continue
            device = self.device_at(call)
            if device is None or device.kind == CPU:  # torch.cpu.amp on a CPU script: its bfloat16 is the user's choice
                return {}, "no device binding in reach of every old autocast and GradScaler"
            if any(a.star for a in call.args) or self.is_suppressed(call, "AM404"):
                return {}, f"`{code_of(call)}` stays as it is"
            dtype = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "dtype") if replacement == "autocast" else None
            if dtype is not None and not self.is_qualified(dtype, HALF):
                return {}, f"an old autocast names dtype={code_of(dtype)}"
            try:
                self.dtype_text(device, call)
            except Problem as problem:
                return {}, problem.message
            devices[call] = device
        return devices, ""

    @staticmethod
    def old_argument(call: cst.Call, positional: Sequence[str], name: str) -> Optional[cst.BaseExpression]:
        """The argument `name` of an old API call, passed by position or keyword."""
        for index, arg in enumerate(call.args):
            keyword = arg.keyword.value if arg.keyword is not None else (positional[index] if index < len(positional) else None)
            if keyword == name:
                return arg.value
        return None

    def plan_on_policy(self, call: cst.Call, name: str, device: Ref) -> None:
        """`autocast(...)` -> `torch.autocast(device_type=device.type, dtype=amp_dtype, ...)`,
        `GradScaler(...)` -> `grad_scaler(device, amp_dtype, ...)`."""
        replacement, _ = DEPRECATED[name]
        dtype = self.dtype_text(device, call)
        if replacement == "autocast":
            enabled = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "enabled")
            text = self.autocast_text(device, call, self.user_condition(enabled))
            cache = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "cache_enabled")
            text = text[:-1] + (f", cache_enabled={code_of(cache)})" if cache is not None else ")")
            message = f"deprecated {name}(...) replaced by torch.autocast on {self.device_text(device, call)}.type in the runtime's precision ({dtype}: bfloat16 on GPUs that compute it, else float16; float32 on a CPU; ACCELMIGRATE_PRECISION overrides)"
        else:
            options = [
                f"{keyword}={code_of(value)}"
                for keyword, value in self.old_keywords(call, OLD_SCALER_POSITIONAL)
                if not (keyword == "enabled" and isinstance(value, cst.Name) and value.value == "True")
            ]
            text = f"{self.runtime_name('grad_scaler')}({', '.join([self.device_text(device, call), dtype, *options])})"
            message = f"deprecated {name}(...) replaced by grad_scaler(device, {dtype}): it scales the loss only when {dtype} is float16, as the runtime's precision asks"
        if not self.fix(call, "AM404", message):
            return
        expression = cst.parse_expression(text)
        self.edits.replace[call] = lambda updated: expression
        self.use_dtype(device)
        item = self.parent(call)
        if replacement == "autocast" and isinstance(item, cst.WithItem):
            self.autocast_spans.append(self.parent(item))  # its precision may now be bfloat16
        if replacement != "autocast":
            self.import_runtime("grad_scaler")
        self.forget_import_of(call.func)

    @staticmethod
    def old_keywords(call: cst.Call, positional: Sequence[str]) -> list:
        return [
            (arg.keyword.value if arg.keyword is not None else positional[index], arg.value)
            for index, arg in enumerate(call.args)
            if arg.keyword is not None or index < len(positional)
        ]

    @staticmethod
    def user_condition(enabled: Optional[cst.BaseExpression]) -> Optional[str]:
        """The user's `enabled=` as the left side of `... and amp_dtype != torch.float32`
        (None for a literal True, which adds nothing)."""
        if enabled is None or (isinstance(enabled, cst.Name) and enabled.value == "True"):
            return None
        text = code_of(without_parens(enabled))
        atom = isinstance(enabled, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.BaseNumber, cst.BaseString))
        return text if atom else f"({text})"

    def plan_deprecated_call(self, call: cst.Call, name: str, reason: str = "") -> None:
        """Off the policy: torch.amp on the device the old API named, so the
        precision stays exactly what it was."""
        replacement, device_type = DEPRECATED[name]
        if any(a.star for a in call.args):
            self.report(call, "AM404", f"replace the deprecated {name} by torch.{replacement} by hand (arguments passed with * or **)")
            return
        where = f'"{device_type}"'
        note = f" ({reason}: precision as written, on {device_type}; ACCELMIGRATE_PRECISION does not apply)" if reason and replacement in ("autocast", "amp.GradScaler") else ""
        if not self.fix(call, "AM404", f"deprecated {name}(...) replaced by torch.{replacement}({where}, ...){note}"):
            return
        func = f"{self.torch}.{replacement}"

        def rewrite(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            if replacement == "autocast":
                args = [self.keyword_for_position(arg, i) for i, arg in enumerate(args)]
            if replacement.startswith("amp.custom_"):
                args = self.appended(args, cst.Arg(cst.SimpleString(f'"{device_type}"'), keyword=cst.Name("device_type"), equal=NO_SPACE_EQUAL))
            else:
                first = cst.Arg(cst.parse_expression(where), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if args else cst.MaybeSentinel.DEFAULT)
                args = [first, *args]
            return updated.with_changes(func=cst.parse_expression(func), args=args)

        self.edits.replace[call] = rewrite
        self.forget_import_of(call.func)

    def plan_bare_decorator(self, node: cst.BaseExpression, name: str) -> None:
        replacement, device_type = DEPRECATED[name]
        if not replacement.startswith("amp.custom_"):
            return
        text = f'{self.torch}.{replacement}(device_type="{device_type}")'
        if self.fix(node, "AM404", f'deprecated {name} replaced by torch.{replacement}(device_type="{device_type}")'):
            self.edits.replace[node] = lambda updated: cst.parse_expression(text)
            self.forget_import_of(node)

    def forget_import_of(self, node: cst.CSTNode) -> None:
        """Drop the import of the deprecated name once nothing uses it."""
        self.remove_import_of(node)
        self.need_torch()

    @staticmethod
    def keyword_for_position(arg: cst.Arg, index: int) -> cst.Arg:
        if arg.keyword is not None or index >= len(OLD_AUTOCAST_POSITIONAL):
            return arg
        return arg.with_changes(keyword=cst.Name(OLD_AUTOCAST_POSITIONAL[index]), equal=NO_SPACE_EQUAL)

    @staticmethod
    def appended(args: list, new: cst.Arg) -> list:
        if args and not isinstance(args[-1].comma, cst.Comma):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return [*args, new]

