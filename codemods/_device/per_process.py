"""GPU indices that each process computes (`.cuda(rank)` in an `mp.spawn`
worker, `torch.device("cuda", i)`, `f"cuda:{i}"`), and placements in a file
that selects its GPU itself (`torch.cuda.set_device(rank)`), where plain
"cuda" means that GPU: they become the runtime's `device_at(index)`, the same
GPU wherever CUDA is available and the runtime's device elsewhere. Their
meaning per process is kept; they are never collapsed onto one device.

And `DistributedDataParallel(model, device_ids=[rank])`: a model on the CPU
refuses GPU `device_ids`, so they follow the model's own device."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, is_docstring, keyword_arg, walk
from .literals import (
    COMPUTED_ADVICE, DEVICE_AT, TORCH_DEVICE, formatted_index, last_name, positional, string_verdict,
)

DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
DDP_DEVICE_IDS = "accelmigrate.runtime.distributed.ddp_device_ids"
DEVICE_IDS_FOR = "accelmigrate.runtime.device.device_ids_for"


class PerProcessPlans:
    """Mixed into the codemod."""

    def _device_at(self, site: cst.CSTNode, index: Optional[cst.BaseExpression]) -> str:
        """The code of `device_at(index)` for `site`; "" when that name means
        something else there, or in a library that no script of the run
        imports. It chooses and sets nothing: with CUDA it is the GPU that
        `index` or plain "cuda" names, the one that the importing script
        made current for plain "cuda"."""
        if not (self._chooses_device(site) or self.script.project.imported_by_a_script):
            return ""
        if not self._runtime_name_free(site, "device_at", DEVICE_AT):
            return ""
        if index is not None and (_places_itself(index) or self.script.holds_device(index, site)):
            return ""  # its text is copied into `device_at(...)`: a placement in it would be left unmigrated
        self._device_at_sites[site] = code_of(index) if index is not None else ""
        return f"device_at({self._device_at_sites[site]})"

    def _computed_index(self, node: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """The index of `torch.device("cuda", i)`, `torch.device(f"cuda:{i}")`
        or `f"cuda:{i}"` (and its `.format` / `%` spellings)."""
        if isinstance(node, cst.Call) and self.is_call_to(node, TORCH_DEVICE):
            args = positional(node)
            kind = args[0] if args else keyword_arg(node, "type")
            index = args[1] if len(args) > 1 else keyword_arg(node, "index")
            if index is not None:
                return index.value
            return formatted_index(kind.value) if kind is not None else None
        return formatted_index(node)

    def _plan_computed(self, node: cst.BaseExpression, subject: str) -> None:
        """`node` names a GPU computed at run time: -> `device_at(index)`."""
        index = self._computed_index(node)
        placement = self._device_at(node, index) if index is not None else ""
        if not placement:
            self.report(node, "AM313", f"{subject}: {COMPUTED_ADVICE}")
            return
        if self.fix(node, "AM313", f"{subject} -> `{placement}`: the same GPU per process with CUDA, the runtime's device without"):
            expression = self._use_placement(node, placement)
            self._edits[node] = lambda updated: expression.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _plan_computed_definition(self, definition) -> None:
        if definition.device.is_string:
            verdict = string_verdict(self._string_uses(definition), last_name(definition.target))
            if verdict != "rewrite":
                if verdict == "report":
                    self.report(definition.value, "AM313", COMPUTED_ADVICE)
                return
        self._plan_computed(definition.value, "device of a GPU index computed at run time")

    # One binding per function (or per flat script).

    def _plan_device_bindings(self) -> None:
        """A function whose placements all name the same GPU (its own parameter
        `def worker(rank, ...)`, a local bound once `local_rank = setup()`, or
        the current one), or a flat script whose placements all name
        `args.gpu`, binds `device = device_at(<index>)` once (at the top, or
        right after the index is bound) and places with `device`, as code
        written by hand would (and as the `amp` codemod needs)."""
        by_scope: dict = {}
        for site in self._placed_at:
            owner = next((a for a in self.ancestors(site) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
            by_scope.setdefault(owner, set()).add(self._device_at_sites[site])
        for owner, indices in by_scope.items():
            index = next(iter(indices))
            if len(indices) != 1 or isinstance(owner, cst.Lambda):
                continue
            owner = self._module if owner is None else owner
            after = self._binding_point(owner, index)
            if after is not None:
                self._device_bound_in[owner] = index
                if after is not owner:
                    self._bind_after[after] = f"device = device_at({index})\n"

    def _binding_point(self, owner, index: str):
        """Where `device = device_at(index)` may go in `owner` (a function or the
        module): `owner` itself for its top, a statement of its body to go
        right after, or None when it may not be bound once."""
        if any(isinstance(owner, cst.Module) or owner in self.ancestors(site) for site in self._fallback_sites):
            return None  # those sites read the added module-level `device`
        if any(isinstance(node, cst.Name) and node.value == "device" and not self._names_a_field(node) for node in walk(owner)):
            return None
        if not index:
            return owner if isinstance(owner, cst.FunctionDef) else None
        root = _root_name(cst.parse_expression(index))
        if root is None:
            return None  # a computed index (`rank % 8`)
        scope = self.script.index.scope_by_node.get(owner)
        bindings = scope.bindings.get(root, ()) if scope is not None else ()
        if index == root and bindings and all(b.kind == "param" for b in bindings) and isinstance(owner, cst.FunctionDef):
            return owner
        field = index[len(root):]  # `.gpu` of `args.gpu`: never assigned, under any name
        if field and any(name.endswith(field) for s in self.script.index.scopes for name in s.bindings):
            return None
        if len(bindings) != 1 or bindings[0].kind != "assign":
            return None
        return self._statement_before_sites(owner, bindings[0].node, index)

    def _statement_before_sites(self, owner, target: cst.CSTNode, index: str):
        """The statement of `owner`'s body that binds `target`, when every
        placement with `index` in `owner` lies in a later statement of that body
        (straight-line code: the binding has run by then, and runs once)."""
        body = list(owner.body) if isinstance(owner, cst.Module) else list(owner.body.body)
        binding = self._top_statement(target, body)
        sites = [s for s in self._placed_at if self._device_at_sites[s] == index and self._in_scope_of(s, owner)]
        guard = self.script.entry.main_guard
        if binding is not None and binding is guard and all(guard in self.ancestors(s) for s in sites):
            body = list(guard.body.body)  # flat code under the main guard: bound inside it
            binding = self._top_statement(target, body)
        if binding is None:
            return None
        position = body.index(binding)
        later = all((top := self._top_statement(s, body)) is not None and body.index(top) > position for s in sites)
        return binding if later else None

    def _top_statement(self, node: cst.CSTNode, body: list):
        for ancestor in (node, *self.ancestors(node)):
            if any(ancestor is statement for statement in body):
                return ancestor
        return None

    def _in_scope_of(self, site: cst.CSTNode, owner) -> bool:
        function = next((a for a in self.ancestors(site) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
        return function is owner or (function is None and isinstance(owner, cst.Module))

    def _names_a_field(self, name: cst.Name) -> bool:
        """`x.device` or `f(device=...)`: the word, not the variable."""
        parent = self.parent(name)
        return (isinstance(parent, cst.Attribute) and parent.attr is name) or (isinstance(parent, cst.Arg) and parent.keyword is name)

    def _bind_device(self, owner, index: str):
        """`device` at the placements with `device_at(index)` of `owner`, and
        `device = device_at(index)` at the top of a function that binds it there
        (elsewhere `_rewrite_body` put it after the index's binding)."""
        if isinstance(owner, cst.Module):
            return owner.visit(_DeviceAtCalls(index))
        body = owner.body.visit(_DeviceAtCalls(index))
        if any(isinstance(statement, cst.SimpleStatementLine) and _binds_device(statement) for statement in body.body):
            return owner.with_changes(body=body)
        statements = list(body.body)
        at = 1 if statements and is_docstring(statements[0]) else 0
        if at < len(statements) and _initializes_the_base(statements[at]):
            at += 1  # a module's constructor starts with its base's, as one writes it
        line = cst.parse_statement(f"device = device_at({index})\n")
        return owner.with_changes(body=body.with_changes(body=[*statements[:at], line, *statements[at:]]))

    # DistributedDataParallel's device_ids.

    def _plan_ddp_device_ids(self, call: cst.Call) -> None:
        """`DistributedDataParallel(model, device_ids=[i], output_device=i)` ->
        `DistributedDataParallel(model, device_ids=ddp_device_ids(model))`: the
        model's GPU where it is on one ([i] once it is placed on GPU i), None
        on the CPU. `output_device` defaults to that GPU."""
        if not self.is_call_to(call, DDP):
            return
        ids = keyword_arg(call, "device_ids")
        args = positional(call)
        if ids is None or not isinstance(ids.value, cst.List) or len(ids.value.elements) != 1 or len(args) != 1:
            return
        model = args[0].value
        output = keyword_arg(call, "output_device")
        only = ids.value.elements[0].value
        if self._placed_here_at(model, only) and (output is None or output.value.deep_equals(only)):
            self._plan_ids_of_placement(call, ids.value, only, output)
            return
        if not isinstance(model, (cst.Name, cst.Attribute)) or (output is not None and not output.value.deep_equals(only)):
            self.report(ids.value, "AM316", DDP_IDS_ADVICE)
            return
        if not self._runtime_name_free(call, "ddp_device_ids", DDP_DEVICE_IDS):
            self.report(ids.value, "AM316", DDP_IDS_ADVICE + " (`ddp_device_ids` means something else here)")
            return
        if self.fix(ids.value, "AM316", f"`device_ids=[{code_of(only)}]` -> `device_ids=ddp_device_ids({code_of(model)})`: the model's GPU, None on the CPU"):
            self.add_import("accelmigrate.runtime.distributed", "ddp_device_ids")
            replacement = cst.parse_expression(f"ddp_device_ids({code_of(model)})")
            self._edits[ids.value] = lambda updated: replacement
            if output is not None:
                self._edits[call] = lambda updated: updated.with_changes(args=without_keyword(updated.args, "output_device"))


    def _placed_here_at(self, model: cst.BaseExpression, index: cst.BaseExpression) -> bool:
        """`DistributedDataParallel(<module>.cuda(i), device_ids=[i])`: the
        module is moved, in the call itself, to `device_at(i)`."""
        return model in self._placed_at and self._device_at_sites[model] == code_of(index)

    def _plan_ids_of_placement(self, call: cst.Call, ids: cst.List, index: cst.BaseExpression, output) -> None:
        """`device_ids=[i]` -> `device_ids=device_ids_for(device_at(i))`: the GPU
        that the module was just moved to, None off CUDA."""
        if not self._runtime_name_free(call, "device_ids_for", DEVICE_IDS_FOR):
            self.report(ids, "AM316", DDP_IDS_ADVICE + " (`device_ids_for` means something else here)")
            return
        replacement = cst.parse_expression(f"device_ids_for(device_at({code_of(index)}))")
        if self.fix(ids, "AM316", f"`device_ids=[{code_of(index)}]` -> `device_ids=device_ids_for(device_at({code_of(index)}))`: the GPU the module is moved to, None off CUDA"):
            self.add_import("accelmigrate.runtime.device", "device_ids_for")
            self._edits[ids] = lambda updated: replacement
            if output is not None:
                self._edits[call] = lambda updated: updated.with_changes(args=without_keyword(updated.args, "output_device"))


DDP_IDS_ADVICE = (
    "DistributedDataParallel with GPU `device_ids`, which a model on the CPU refuses: pass "
    "`device_ids=[device.index] if device.type == \"cuda\" else None` and drop `output_device` by hand"
)


class _DeviceAtCalls(cst.CSTTransformer):
    """`device_at(<index>)`, which the codemod wrote, -> `device`."""

    def __init__(self, index: str) -> None:
        super().__init__()
        self.index = index

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function may name another index by the same name

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Assign(self, node: cst.Assign) -> bool:
        return not _assigns_device(node)  # the binding itself

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if isinstance(func, cst.Name) and func.value == "device_at" and code_of_args(updated_node) == self.index:
            return cst.Name("device", lpar=updated_node.lpar, rpar=updated_node.rpar)
        return updated_node


def _root_name(index: cst.BaseExpression):
    """`rank` of `rank`, `args` of `args.gpu`; None for a computed index."""
    if isinstance(index, cst.Name):
        return index.value
    if isinstance(index, cst.Attribute):
        return _root_name(index.value)
    return None


def _assigns_device(node: cst.Assign) -> bool:
    return len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and node.targets[0].target.value == "device"


def _binds_device(line: cst.SimpleStatementLine) -> bool:
    return any(isinstance(small, cst.Assign) and _assigns_device(small) for small in line.body)


def code_of_args(call: cst.Call) -> str:
    return ", ".join(code_of(arg.value) for arg in call.args)


def without_keyword(args, name: str) -> list:
    """`args` without the keyword argument `name`; a new last argument takes
    the removed one's comma (none, or a trailing one) and the space after it."""
    kept = [arg for arg in args if arg.keyword is None or arg.keyword.value != name]
    if kept and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma, whitespace_after_arg=args[-1].whitespace_after_arg)
    return kept


def _initializes_the_base(statement: cst.CSTNode) -> bool:
    """`super().__init__(...)` (or `super(Net, self).__init__(...)`) on a line of its own."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    call = statement.body[0].value if isinstance(statement.body[0], cst.Expr) else None
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "__init__"
        and isinstance(call.func.value, cst.Call)
        and isinstance(call.func.value.func, cst.Name)
        and call.func.value.func.value == "super"
    )


def _places_itself(index: cst.BaseExpression) -> bool:
    """The index holds a placement of its own (`.cuda(...)`, `.to(...)`, a `torch.device(...)`), which this
    codemod rewrites (into a `device_at(...)`, which stays one on the next run)."""
    return any(
        isinstance(n, cst.Call) and (
            (isinstance(n.func, cst.Attribute) and n.func.attr.value in ("cuda", "to", "device"))
            or (isinstance(n.func, cst.Name) and n.func.value in ("device", "device_at"))
        )
        for n in walk(index)
    )
