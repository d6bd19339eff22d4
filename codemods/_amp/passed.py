"""Devices and optimizers that a training function receives as arguments:
`def train(args, model, device, train_loader, optimizer, epoch)`, called in
the file by code that binds the device and the optimizer.

The autocast dtype is bound at the top of such a function from the device
it receives. The scaler is bound in the caller, next to the optimizer, and
handed in as a new `scaler` argument: one scaler for the whole run, so that
its loss scale carries over from one call (one epoch) to the next.
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst

from .._base import append_keyword_args, is_docstring, walk
from .plan import NO_SPACE_EQUAL, SCALER_NAMES, Binding, Problem, Ref, StepPlan

FOLLOW_DEPTH = 4  # how many calls deep an argument is followed
Resolver = Callable[[cst.BaseExpression, cst.CSTNode, int], Optional[Ref]]


class Passed:
    """Mixed into the codemod."""

    def passed_in(self, name: str, site: cst.CSTNode, resolve: Resolver, depth: int, spelled: Optional[str] = None, optional: bool = False) -> Optional[Ref]:
        """A Ref of kind "param" when `name` at `site` is only a parameter of
        its function, and every call of that function in the file passes an
        argument for it that `resolve` traces in the caller. `spelled` names
        the Ref when the device is an attribute of the parameter (`args.device`).
        A call that leaves the parameter out passes its default (`device:
        torch.device = device`), traced where the function is defined.
        With `optional`, a call may leave out a parameter that defaults to
        None (`run_epoch(model, val_loader, criterion)` evaluates: no optimizer)."""
        function = self.facts.function_at(site)
        bindings = self.facts.bindings_of(name, site)
        if function is None or depth > FOLLOW_DEPTH or len(bindings) != 1 or bindings[0].kind != "param":
            return None
        if bindings[0].scope is not function.scope or not function.callers:
            return None
        sources = []
        for call_site in function.callers:
            argument, default = call_site.arguments.get(name), bindings[0].value
            if argument is None and optional and call_site.complete and _is_none(default):
                continue  # the parameter is None there: see scaler_passed
            if argument is None and call_site.complete and default is not None and not _is_none(default):
                source = resolve(default, default, depth + 1)  # `device: torch.device = device`, read where the function is defined
            else:
                source = resolve(argument, call_site.call, depth + 1) if argument is not None and call_site.complete else None
            if source is None:
                return None
            sources.append((call_site.call, source))
        if not sources:
            return None
        ref = Ref("param", spelled or name, function.scope, [])
        self.passed[ref.key] = (function, sources)
        return ref

    def passed_from_elsewhere(self, name: str, site: cst.CSTNode) -> Optional[Ref]:
        """A Ref of kind "param" when `name` is a parameter of a module-level
        function this file never calls, and every call in the project's other
        files passes it a device (the project's facts). What they pass may be
        a string: its type is read as `torch.device(name).type`."""
        function = self.facts.function_at(site)
        bindings = self.facts.bindings_of(name, site)
        if function is None or function.callers or len(bindings) != 1 or bindings[0].kind != "param":
            return None
        if bindings[0].scope is not function.scope or function.node not in self.script.module.body:
            return None
        if f"{function.name}.{name}" not in self.script.project.device_parameters:
            return None
        return Ref("param", name, function.scope, [])

    def device_passed(self, expression: cst.BaseExpression, site: cst.CSTNode, depth: int = 0) -> Optional[Ref]:
        if not isinstance(expression, cst.Name):
            return None
        ref = self.device_named(expression.value, site, depth)
        return self.devices.setdefault(ref.key, ref) if ref is not None else None

    def optimizer_passed(self, expression: cst.BaseExpression, site: cst.CSTNode, depth: int = 0) -> Optional[Ref]:
        ref = self.resolve_ref(expression, site, ("optimizer",), ("apex",))
        if ref is None and isinstance(expression, cst.Name):
            ref = self.passed_in(expression.value, site, self.optimizer_passed, depth, optional=True)
        return ref

    def device_parameter_at(self, site: cst.CSTNode) -> Optional[Ref]:
        """A device parameter of the function around `site` that every caller passes a device to."""
        function = self.facts.function_at(site)
        if function is None:
            return None
        for device in self.script.devices:
            if device.kind == "parameter" and device.scope is function.scope:
                ref = self.device_passed(cst.Name(device.name), site)
                if ref is not None:
                    return ref
        return None

    # -- the bindings -------------------------------------------------------------------

    def dtype_at_top(self, device: Ref) -> Binding:
        """`amp_dtype = autocast_dtype(device)` as the first statement of the
        function that receives the device (after its docstring)."""
        body = list(device.home.node.body.body)
        first = body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]
        name = self.free_name(device, ("amp_dtype", "autocast_dtype_"), [first])
        return Binding("name", name, first, None, f"{self.runtime_name('autocast_dtype')}({device.name})", before=True)

    def scaler_passed(self, group: list) -> Binding:
        """A new parameter of the training function, and a scaler bound in
        each caller next to the optimizer it passes."""
        ref = group[0].optimizers[0]
        function, sources = self.passed[ref.key]
        params = function.node.params
        if params.posonly_params or params.kwonly_params or isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
            raise Problem(group[0].site, "AM414", f"{function.name}() receives the optimizer and has starred or keyword-only parameters: add a `scaler` parameter and pass it a `grad_scaler(device, amp_dtype)` bound next to the optimizer by hand")
        if len(sources) < len(function.callers):
            self.check_scaled_only_when_stepped(group, function)
        name = next((n for n in SCALER_NAMES if not self.bound_within(n, function.scope)), None)
        if name is None or any(a.keyword is not None and a.keyword.value == name for call, _ in sources for a in call.args):
            raise Problem(group[0].site, "AM414", f"the names {', '.join(SCALER_NAMES)} are taken in {function.name}(): pass it a GradScaler by hand")
        binding = Binding("param", name, function.node, None, "", optional=any(p.default is not None for p in params.params))
        devices = [self.device_at(call) for call, _ in sources]
        for (call, _), device in zip(sources, devices):
            if device is None:
                raise Problem(call, "AM413", f"no device binding in reach of this call of {function.name}(): bind a GradScaler for the optimizer it passes by hand")
        for (call, source), device in zip(sources, devices):
            home = (source.kind, id(source.home))
            if self.shared_scaler(home, [call]) is None:
                caller = StepPlan([], device, [source], [], [], [], None, call)
                self.scaler_bindings[home] = self.scaler_binding([caller])
            self.caller_devices.setdefault(home, device)
            binding.passed.append((call, home, source))
        return binding

    def check_scaled_only_when_stepped(self, group: list, function) -> None:
        """Some calls leave the optimizer out (None), and so the scaler: each
        backward must be followed, in its own block and with nothing that
        leaves it in between, by a step of the optimizer, so that a call
        without one never reaches the scaler (the original would fail at
        that step too)."""
        for plan in group:
            for backward in plan.backwards:
                block = self.parent(backward.statement)
                body = list(block.body)
                start = body.index(backward.statement)
                followed = False
                for line in body[start + 1:]:
                    if any(isinstance(n, (cst.Return, cst.Break, cst.Continue, cst.Raise)) for n in _walk(line)):
                        break
                    if any(self.own_line(call) is line for call, _ in plan.steps):
                        followed = True
                        break
                if not followed:
                    raise Problem(backward.call or backward.statement, "AM414", f"{function.name}() is called without its optimizer (None) and may run this backward then: pass it a `scaler` only where an optimizer steps, by hand")

    def commit_passed(self, binding: Binding) -> None:
        """The parameter added to the function, the argument to each call, and
        the callers' scalers (and their dtypes) bound."""
        name = binding.name
        optional = binding.optional
        self.edits.replace[binding.after] = lambda updated: updated.with_changes(params=_with_parameter(updated.params, name, optional))
        for call, home, _ in binding.passed:
            caller = self.scaler_bindings[home]
            text = caller.text(self.owner_at(call))
            self.edits.replace[call] = lambda updated, text=text: append_keyword_args(updated, [(name, cst.Name(text) if "." not in text else cst.parse_expression(text))])
            caller.used = True
            if caller.kind == "param":
                self.commit_passed(caller)
            else:
                self.dtype_binding(self.caller_devices[home]).used = True


def _with_parameter(params: cst.Parameters, name: str, optional: bool = False) -> cst.Parameters:
    existing = list(params.params)
    if existing and not isinstance(existing[-1].comma, cst.Comma):
        existing[-1] = existing[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    default = dict(default=cst.Name("None"), equal=NO_SPACE_EQUAL) if optional else {}
    return params.with_changes(params=[*existing, cst.Param(cst.Name(name), **default)])


def _is_none(value: Optional[cst.BaseExpression]) -> bool:
    return isinstance(value, cst.Name) and value.value == "None"


def _walk(line: cst.CSTNode):
    return walk(line, into_definitions=False)
