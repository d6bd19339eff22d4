"""Where a placement gets its device: a device variable of the script in
reach and certainly assigned by then, else the binding the codemod adds."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of

from .literals import AUTOCAST, CUDA, RUNTIME, Definition, method_name
from .syntax import first_param, is_static_or_class_method


class Placement:
    """Mixed into the codemod: reads `self.script`, `self.facts` and the definitions."""

    def _existing_device(self, site: cst.CSTNode) -> Optional[str]:
        in_function = False
        child = site
        for ancestor in self.ancestors(site):
            class_body_seen_from_method = in_function and isinstance(self.parent(ancestor), cst.ClassDef)
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and not class_body_seen_from_method:
                found = self._defined_before(ancestor, child, in_function, site)
                if found is not None:
                    return found
            inside = isinstance(ancestor, (cst.FunctionDef, cst.Lambda)) and child is ancestor.body
            if inside and isinstance(ancestor, cst.FunctionDef):
                found = self._from_function(ancestor, site)
                if found is not None:
                    return found
            in_function = in_function or inside  # a parameter default runs outside
            child = ancestor
        return None

    def _from_function(self, function: cst.FunctionDef, site: cst.CSTNode) -> Optional[str]:
        """A `device` parameter, or `self.<name>` set in `__init__` of the class
        of this method."""
        for param in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params):
            if param.name.value == "device" and self._name_resolves_to_devices(site, "device"):
                return "device"
        return self._attribute_from_init(function)

    def _attribute_from_init(self, method: cst.FunctionDef) -> Optional[str]:
        owner = self.parent(self.parent(method))
        if not isinstance(owner, cst.ClassDef) or method.name.value == "__init__" or is_static_or_class_method(method):
            return None
        self_name = first_param(method)
        if self_name is None:
            return None
        for statement in owner.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
                init_self = first_param(statement)
                for line in statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ():
                    target = self._device_target_of(line)
                    if (
                        isinstance(target, cst.Attribute)
                        and isinstance(target.value, cst.Name)
                        and target.value.value == init_self
                    ):
                        return f"{self_name}.{target.attr.value}"
        return None

    def _defined_before(self, block, child, in_function: bool, site) -> Optional[str]:
        """A usable device definition that has run by the time `child` (a
        statement of `block`) runs."""
        body = list(block.body)
        position = next((i for i, s in enumerate(body) if s is child), None)
        if position is None:
            return None
        module_level_seen_from_function = isinstance(block, cst.Module) and in_function
        candidates = body if module_level_seen_from_function else body[:position]
        for statement in reversed(candidates):
            target = self._device_target_of(statement)
            if target is None:
                continue
            if isinstance(target, cst.Name):
                if self._name_resolves_to_devices(site, target.value):
                    return target.value
            elif not in_function or not isinstance(block, cst.Module):
                return code_of(target)
        return None

    def _device_target_of(self, statement: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """The target that `statement` certainly binds to a usable device: an
        assignment, or an if/else that assigns the same target in every branch
        (the CPU in some of them, a usable device in at least one)."""
        found = self._branch_target(statement)
        return found[0] if found is not None and found[1] else None

    def _branch_target(self, statement: cst.CSTNode) -> Optional[tuple[cst.BaseExpression, bool]]:
        """(target, whether some branch binds a usable device, not the CPU)."""
        if isinstance(statement, cst.SimpleStatementLine):
            for small in reversed(statement.body):
                definition = self._definition_of.get(small)
                if definition is not None and (definition.usable or definition.cpu_branch):
                    return definition.target, definition.usable
            return None
        if isinstance(statement, cst.If) and statement.orelse is not None:
            first = self._block_branch_target(statement.body)
            other = statement.orelse
            second = self._branch_target(other) if isinstance(other, cst.If) else self._block_branch_target(other.body)
            if first is not None and second is not None and first[0].deep_equals(second[0]):
                return first[0], first[1] or second[1]
        return None

    def _block_branch_target(self, block: cst.BaseSuite) -> Optional[tuple[cst.BaseExpression, bool]]:
        if not isinstance(block, cst.IndentedBlock):
            return None
        for statement in reversed(block.body):
            found = self._branch_target(statement)
            if found is not None:
                return found
        return None

    def _name_resolves_to_devices(self, site: cst.CSTNode, name: str) -> bool:
        bindings = self.script.bindings_of(name, site)
        return bool(bindings) and all(self._is_device_binding(b) for b in bindings)

    def _module_name_reaches(self, site: cst.CSTNode, name: str) -> bool:
        """Would `name` at `site` read the module-level binding? Not when a
        function around it binds the same name (even later: it is local)."""
        return all(
            b.scope is self.script.module_scope and self._is_device_binding(b) for b in self.script.bindings_of(name, site)
        )

    def _names_a_parameter(self, placement: str, site: cst.CSTNode) -> bool:
        if "." in placement:
            return False  # `self.device`, set in `__init__`
        return any(b.kind == "param" for b in self.script.bindings_of(placement, site))

    def _is_device_binding(self, binding) -> bool:
        """Is this binding a usable device definition (or a `device` parameter),
        or the CPU branch of an if/else that defines one?"""
        node = binding.node
        if isinstance(node, cst.Param):
            return node.name.value == "device" and self._default_is_a_gpu(node)
        definition = self._definition_of.get(self.facts.assignment_of.get(node))
        if definition is None or definition.target is not node:
            return False
        return definition.usable or (definition.cpu_branch and self._in_device_choice(definition))

    def _default_is_a_gpu(self, param: cst.Param) -> bool:
        """A `device` parameter with no default, or one that means the GPU:
        `.to(device)` then does what `.cuda()` did. `device=None` would make it
        a no-op, `device="cpu"` would move elsewhere."""
        if param.default is None:
            return True
        value = self._device_value(param.default)
        return value is not None and value.kind in (CUDA, RUNTIME)

    def _in_device_choice(self, definition: Definition) -> bool:
        """`definition` is a branch of an if/else that certainly binds its target
        to a usable device in some branch (`if gpu: d = cuda else: d = cpu`)."""
        line = self.parent(definition.statement)
        for ancestor in self.ancestors(line):
            if isinstance(ancestor, cst.If):
                top = ancestor
                while isinstance(self.parent(top), cst.If):  # an elif chain
                    top = self.parent(top)
                return self._device_target_of(top) is not None
            if not isinstance(ancestor, (cst.IndentedBlock, cst.Else)):
                return False
        return False

    # How a string device is read.

    def _string_uses(self, definition: Definition) -> Optional[list]:
        """How each read of a string device uses it (see `_use_kind`); None when
        the reads cannot be seen. It may become a torch.device only when it is
        passed on as a device somewhere, and elsewhere at most printed."""
        if not isinstance(definition.target, cst.Name):
            reads = self._instance_attribute_reads(definition)
            if reads is None:
                return None  # who reads `args.device` cannot be seen
            return [self._compare_use(read, definition) or self._use_kind(read) for read in reads]
        scope = self.script.scope_of(definition.statement)
        if scope.kind == "class":
            return None  # read as `Config.device`: cannot be seen either
        reads = self.facts.uses.reads(definition.target.value, scope)
        return [self._compare_use(read, definition) or self._use_kind(read) for read in reads]

    def _instance_attribute_reads(self, definition: Definition) -> Optional[list]:
        """The reads of `self.device` in its class, when the class binds it
        once and the file reads it on no instance (`trainer.device`): then
        every read is in view."""
        target = definition.target
        if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"):
            return None
        klass = next((a for a in self.ancestors(target) if isinstance(a, cst.ClassDef)), None)
        if klass is None or len(self.script._entities.attribute_bindings(klass, target.attr.value)) != 1:
            return None
        instances = {
            b.name for s in self.script.scopes for bs in s.bindings.values() for b in bs
            if isinstance(b.value, cst.Call) and isinstance(b.value.func, cst.Name) and b.value.func.value == klass.name.value
        }
        for node in self.script.index.nodes:
            if isinstance(node, cst.Attribute) and node.attr.value == target.attr.value and isinstance(node.value, cst.Name) and node.value.value in instances:
                return None
        return self.facts.uses.self_attribute_reads(klass, target.attr.value)

    def _parameter_uses(self, param: cst.Param) -> Optional[list]:
        scope = self.script.index.scope_by_node.get(self.parent(self.parent(param)))
        if scope is None:
            return None
        return [self._use_kind(read) for read in self.facts.uses.reads(param.name.value, scope)]

    def _use_kind(self, node: cst.CSTNode) -> Optional[str]:
        """How a string device is read: "device" (`.to(d)`, `device=d`,
        `torch.device(d)`), "text" (printed, in an f-string), "type" (autocast's
        `device_type`, a type name by contract), or None (anything else, where
        a torch.device would not behave like the string)."""
        parent = self.parent(node)
        if isinstance(parent, (cst.FormattedStringExpression, cst.Expr)):
            return "text"  # an expression statement: a notebook cell shows it
        if isinstance(parent, cst.Param) and parent.default is node:
            return self._use_as_default(parent)
        if not isinstance(parent, cst.Arg) or parent.star:
            return None
        call = self.parent(parent)
        if not isinstance(call, cst.Call):
            return None
        if parent.keyword is not None:
            if parent.keyword.value == "device_type":
                return "type"
            return "device" if parent.keyword.value in ("device", "map_location") else None
        if self.is_call_to(call, {"builtins.print"}):
            return "text"
        if self.is_call_to(call, {"torch.device"}) or (method_name(call) == "to" and call.args[0] is parent):
            return "device"
        if self.is_call_to(call, AUTOCAST) and call.args[0] is parent:
            return "type"
        return self._use_in_callee(call, node)

    def _use_as_default(self, param: cst.Param) -> Optional[str]:
        """`def train_step(..., device: torch.device = device)`: how the function reads its parameter."""
        return self._read_as_device(self.parent(self.parent(param)), param)

    def _use_in_callee(self, call: cst.Call, node: cst.CSTNode) -> Optional[str]:
        """`f(model, device)` of a function `f` of this file: how `f` reads the
        parameter that receives it."""
        found = self.script.flow.callee(call, self.script.scope_of(call))
        site = next((c for c in found[0].callers if c.call is call), None) if found is not None else None
        if site is None or not site.complete:
            return None
        name = next((p for p, value in site.arguments.items() if value is node), None)
        function = found[0].node
        params = function.params
        param = next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == name), None)
        return self._read_as_device(function, param) if param is not None else None

    def _read_as_device(self, function: cst.CSTNode, param: cst.Param) -> Optional[str]:
        """"device" when `function` reads `param` only as a device (and at
        most prints it), so a torch.device in its place behaves the same; else None."""
        if param in self._followed_params:
            return None  # recursion: its reads are being decided
        scope = self.script.index.scope_by_node.get(function)
        if scope is None or any(b.kind != "param" for b in scope.bindings.get(param.name.value, ())):
            return None  # rebound inside: its reads are not all of the passed value
        self._followed_params.add(param)
        try:
            uses = self._parameter_uses(param)
        finally:
            self._followed_params.discard(param)
        return "device" if uses is not None and set(uses) <= {"device", "text"} and "device" in uses else None
