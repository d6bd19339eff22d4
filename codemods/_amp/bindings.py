"""Where the codemod binds `amp_dtype = autocast_dtype(device)` and
`scaler = grad_scaler(device, amp_dtype)`, and how they are spelled at a
place that reads them."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._base import is_docstring
from .passed import FOLLOW_DEPTH
from .received import RECEIVED
from .plan import AUTOCAST_DTYPE, CPU, CPU_TEXT, DTYPE_NAMES, GRAD_SCALER_FACTORY, SCALER_NAMES, Binding, Problem, Ref, StepPlan, is_import_line, statement


class Bindings:
    """Mixed into the codemod."""

    def plan_scalers(self, plans: list) -> list:
        """One scaler per place its optimizers are bound (a scope, or a class),
        right after the last of them (and after the dtype binding it needs)."""
        by_home: dict = {}
        for plan in plans:
            homes = {(ref.kind, id(ref.home)) for ref in plan.optimizers}
            if len(homes) != 1:
                self.report(plan.backwards[0].call or plan.site, "AM414", "the optimizers of this step are bound in different scopes: bind one `scaler = grad_scaler(device, amp_dtype)` in reach of all of them by hand")
                continue
            by_home.setdefault(homes.pop(), []).append(plan)
        kept = []
        for home, group in by_home.items():
            try:
                self.scaler_bindings[home] = self.shared_scaler(home, [p.site for p in group]) or self.scaler_binding(group)
                kept.extend(group)
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)
        return sorted(kept, key=lambda p: self.order(p.site))

    def scaler_binding(self, group: list) -> Binding:
        ref = group[0].optimizers[0]
        if ref.kind == "param":
            try:
                return self.scaler_passed(group)
            except Problem as problem:
                if problem.code != "AM413":
                    raise
            return self.scaler_received(group)  # a caller has no device in reach: the function takes its optimizer's own scaler
        if ref.kind == RECEIVED:
            return self.scaler_received(group)
        lines = sorted({id(line): line for plan in group for r in plan.optimizers for line in r.bindings}.values(), key=self.order)
        existing = self.existing_binding(ref, GRAD_SCALER_FACTORY)
        if existing is not None:
            return existing
        _, anchors = self.common_block(lines)
        site = group[0].site
        uses = self.scaler_uses(ref, group)
        after = self.last_before(anchors, uses)
        if ref.kind == "attr" and self.method_owner(after) is None:
            raise Problem(site, "AM414", "the optimizer attributes are bound in different methods: bind `self.scaler = grad_scaler(self.device, self.amp_dtype)` after them by hand")
        device = group[0].device
        dtype = self.dtype_binding(device)
        same_scope = self.facts.scope_of(dtype.after) is self.facts.scope_of(after)
        if same_scope and self.order(after) < self.order(dtype.after):
            after = dtype.after  # the device is bound after the optimizer: the scaler follows the dtype
        elif not (same_scope and device.kind == "attr") and not self.same_device(self.device_at(after), device):
            raise Problem(site, "AM413", "the device binding is out of reach where the optimizer is built: bind `scaler = grad_scaler(device, amp_dtype)` next to the optimizer by hand")
        after = self.dominating(after, uses)
        for use in uses:
            if not self.ends_before(after, use):
                raise Problem(site, "AM414", "the optimizer is bound after a training loop that uses it: bind `scaler = grad_scaler(device, amp_dtype)` before that loop by hand")
        owner = self.owner_at(after) if ref.kind == "attr" else None
        name = self.free_name(ref, SCALER_NAMES, [p.site for p in group] + [after])
        return Binding(ref.kind, name, after, owner, f"{self.runtime_name('grad_scaler')}({self.device_text(device, after)}, {dtype.text(self.owner_at(after))})")

    def same_device(self, here: Optional[Ref], device: Ref) -> bool:
        """`here` is `device`, or a parameter that every call in the file
        passes `device` itself (`Trainer(model, optimizer, device)` builds
        the optimizer's scaler in `__init__`, the step reads the global)."""
        if here is device:
            return True
        passed = self.passed.get(here.key) if here is not None and here.kind == "param" else None
        return passed is not None and bool(passed[1]) and all(source is device for _, source in passed[1])

    def scaler_uses(self, ref: Ref, group: list) -> list:
        """Where the code of `ref`'s scope first needs the scaler: each place
        the steps read it, or, in a function, each call of that function (in
        the order the file's statements, or a notebook's cells, run)."""
        nodes = []
        for plan in group:
            nodes += [plan.site, *(b.statement for b in plan.backwards), *(call for call, _ in plan.steps), *(anchor for anchor, _, _ in plan.unscales)]
            nodes += [plan.update_after] if plan.update_after is not None else []
        if ref.kind == "attr":  # read in the methods, once an instance exists
            return [n for n in nodes if self.facts.scope_of(n) is self.facts.scope_of(ref.bindings[0])]
        return [point for node in nodes for point in self.points_in(node, ref.home)]

    def points_in(self, node: cst.CSTNode, home, depth: int = 0) -> list:
        """`node` if it runs in scope `home`'s own code, else the calls in
        `home` that run the function holding it (none: called from elsewhere)."""
        if self.facts.scope_of(node) is home:
            return [node]
        function = self.facts.function_at(node)
        if function is None or depth > FOLLOW_DEPTH:
            return []
        return [point for site in function.callers for point in self.points_in(site.call, home, depth + 1)]

    def last_before(self, anchors: list, uses: list) -> cst.CSTNode:
        """The last of the optimizers' bindings that comes before every use of
        the scaler (a notebook rebinds the optimizer after a first run)."""
        fitting = [a for a in anchors if all(self.ends_before(a, use) for use in uses)]
        return max(fitting or anchors, key=self.order)

    def dominating(self, after: cst.CSTNode, uses: list) -> cst.CSTNode:
        """Where a binding placed after `after` runs on every path to `uses`:
        after the statement around it (an `if args.use_optimizer:`) that
        shares a block with every use."""
        if not uses:
            return after
        _, holders = self.common_block([after, *uses])
        if holders[0] is not after and any(holders[0] is u or holders[0] in self.ancestors(u) for u in uses):
            raise Problem(uses[0], "AM414", "the scaler is read both inside and after the block that builds the optimizer: bind `scaler = grad_scaler(device, amp_dtype)` before that block by hand")
        return holders[0]

    def shared_scaler(self, home: tuple, sites: list) -> Optional[Binding]:
        """The scaler already planned where these optimizers live (for a call
        that passes one of them in), when every site is in its reach."""
        binding = self.scaler_bindings.get(home)
        if binding is not None and binding.kind == "name" and not all(self.name_visible(binding, site) for site in sites):
            raise Problem(sites[0], "AM414", "a GradScaler planned for this optimizer is bound after this point: bind `scaler = grad_scaler(device, amp_dtype)` before its first use by hand")
        return binding

    def existing_binding(self, ref: Ref, factory: str) -> Optional[Binding]:
        """The binding of `factory(...)` that a previous run left where `ref` lives."""
        found = [
            b for b in self.bindings_where(ref)
            if isinstance(b.statement, cst.Assign) and len(b.statement.targets) == 1 and self.is_call_to(b.statement.value, {factory})
        ]
        if not found:
            return None
        first = min(found, key=lambda b: self.order(b.node))
        line = self.parent(first.statement)
        if ref.kind != "attr":
            return Binding("name", first.name, line, None, "", exists=True)
        owner, _, attribute = first.name.partition(".")
        return Binding("attr", attribute, line, owner, "", exists=True)

    def bindings_where(self, ref: Ref) -> list:
        """The names bound where `ref` lives: its scope, or the `self.x` of its class's methods."""
        if ref.kind != "attr":
            return [b for bs in ref.home.bindings.values() for b in bs if isinstance(b.node, cst.Name)]
        found = []
        for method in self.facts.methods(ref.home):
            instance = self.facts.instance_parameter(method)
            if instance is not None:
                found += [b for name, bs in method.scope.bindings.items() if name.startswith(instance + ".") and name.count(".") == 1 for b in bs]
        return found

    def free_name(self, ref: Ref, candidates: Sequence[str], sites: list) -> str:
        for name in candidates:
            if ref.kind == "attr":
                if not self.facts.self_attribute(ref.home, name):
                    return name
            elif not self.bound_within(name, ref.home) and not any(self.facts.bindings_of(name, site) for site in sites):
                return name
        raise Problem(sites[0], "AM414", f"the names {', '.join(candidates)} are taken: bind the autocast dtype and the GradScaler by hand")

    def dtype_binding(self, device: Ref) -> Binding:
        """`amp_dtype = autocast_dtype(device)`, right after the device binding."""
        if device.key not in self.dtype_bindings:
            binding = self.existing_binding(device, AUTOCAST_DTYPE)
            if binding is None and device.kind == "param":
                binding = self.dtype_at_top(device)
            if binding is None and device.kind == CPU:
                binding = self.dtype_after_imports(device)
            if binding is None and device.key in self.model_devices:
                anchor, _, before = self.model_devices[device.key]
                name = self.free_name(device, DTYPE_NAMES, [anchor])
                binding = Binding("name", name, anchor, None, f"{self.runtime_name('autocast_dtype')}({device.name})", before=before)
            if binding is None:
                _, anchors = self.common_block(device.bindings)
                after = max(anchors, key=self.order)
                owner = self.owner_at(after) if device.kind == "attr" else None
                name = self.free_name(device, DTYPE_NAMES, [after])
                binding = Binding(device.kind, name, after, owner, f"{self.runtime_name('autocast_dtype')}({self.device_text(device, after)})")
            self.dtype_bindings[device.key] = binding
        return self.dtype_bindings[device.key]

    def dtype_after_imports(self, device: Ref) -> Binding:
        """`amp_dtype = autocast_dtype("cpu")` before the first module-level
        statement that is not the docstring or an import: in reach of all
        the code of a script that computes on the CPU only."""
        body = list(self.tree.body)
        position = next((i for i, s in enumerate(body) if not (is_docstring(s) or is_import_line(s))), len(body) - 1)
        name = self.free_name(device, DTYPE_NAMES, [body[position]])
        value = f"{self.runtime_name('autocast_dtype')}({CPU_TEXT})"
        if position > 0 and is_import_line(body[position - 1]):
            return Binding("name", name, body[position - 1], None, value, spaced=True)  # a blank line after the imports
        return Binding("name", name, body[position], None, value, before=True)

    def device_text(self, device: Ref, site: cst.CSTNode) -> str:
        if device.kind == CPU:
            return CPU_TEXT
        return f"{self.owner_at(site)}.{device.name}" if device.kind == "attr" else device.name

    def device_type_text(self, device: Ref, site: cst.CSTNode) -> str:
        """What autocast's `device_type=` reads: `device.type`, or "cpu"."""
        if device.kind == CPU:
            return CPU_TEXT
        if self.is_string_device(device) or not self.is_device_object(device):
            return f"{self.torch}.device({self.device_text(device, site)}).type"
        return f"{self.device_text(device, site)}.type"

    def dtype_text(self, device: Ref, site: cst.CSTNode) -> str:
        """`amp_dtype` (or `self.amp_dtype`) as read at `site`; a Problem when
        its binding (after the device's) does not come first."""
        binding = self.dtype_binding(device)
        if not binding.before and self.facts.scope_of(binding.after) is self.facts.scope_of(site) and not self.ends_before(binding.after, site):
            raise Problem(site, "AM415", "the device is bound after this point (or in a loop around it): bind it once before the training and evaluation code, then run again")
        return binding.text(self.owner_at(site))

    def autocast_text(self, device: Ref, site: cst.CSTNode, enabled: Optional[str] = None) -> str:
        """The autocast header; `enabled` is the user's own condition, if any."""
        dtype = self.dtype_text(device, site)
        condition = f"{dtype} != {self.torch}.float32"
        if enabled is not None:
            condition = f"{enabled} and {condition}"
        return f"{self.torch}.autocast(device_type={self.device_type_text(device, site)}, dtype={dtype}, enabled={condition})"

    def scaler_of(self, plan: StepPlan) -> Binding:
        return self.scaler_bindings[(plan.optimizers[0].kind, id(plan.optimizers[0].home))]

    def name_visible(self, binding: Binding, site: cst.CSTNode) -> bool:
        """A variable bound right after `binding.after` is in reach of `site`."""
        home, scope = self.facts.scope_of(binding.after), self.facts.scope_of(site)
        if scope is home:
            return self.ends_before(binding.after, site)
        while scope is not None and scope.parent is not scope:
            scope = scope.parent
            if scope is home:
                return True
        return False

    def use_dtype(self, device: Ref) -> None:
        self.dtype_binding(device).used = True
        self.import_runtime("autocast_dtype")
        self.need_torch()

    def commit_bindings(self) -> None:
        """Insert the dtype bindings first: a scaler placed at the same spot needs its dtype."""
        for binding in list(self.scaler_bindings.values()):
            if binding.used and binding.kind == "param":
                self.commit_passed(binding)
        for key, (anchor, text, before) in self.model_devices.items():
            if key in self.dtype_bindings and self.dtype_bindings[key].used:  # goes before the dtype that reads it
                (self.edits.insert_before if before else self.edits.insert_after)(anchor, statement(text))
        for binding in [*self.dtype_bindings.values(), *self.scaler_bindings.values()]:
            if binding.used and not binding.exists and binding.kind != "param":
                insert = self.edits.insert_before if binding.before else self.edits.insert_after
                line = statement(f"{binding.text(binding.owner)} = {binding.value}")
                insert(binding.after, line.with_changes(leading_lines=[cst.EmptyLine()]) if binding.spaced else line)

