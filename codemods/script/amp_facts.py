"""What the `amp` codemod reads from a script beyond the shared model: every
call in source order, a source-order key for any node, and the names a
statement binds and reads (the autocast region takes in the statements a
loss is computed from).

Built once per model (`amp_facts(model)`), from the model's index: no walk
of the whole tree.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._syntax import dotted_name, walk
from .flow import Function
from .model import ScriptModel
from .scopes import Binding, Scope, children, positional_parameters

# Bindings whose target is a name or `a.b` that the statement stores to.
_STORING = frozenset({"assign", "augassign", "for", "with", "named", "except"})
# Subtrees whose names are neither read nor stored as values.
_NOT_VALUES = (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal, cst.Del)

# What places tensors somewhere other than the CPU, or asks where they are:
# a file that uses none of these computes on the CPU only.
_DEVICE_PREFIXES = (
    "torch.cuda", "torch.mps", "torch.xpu", "torch.backends.mps", "torch.device",
    "torch.set_default_device", "torch.set_default_tensor_type", "torch.nn.DataParallel",
    "torch.nn.parallel", "accelmigrate.runtime.device",
)
# CUDA calls that place nothing: a CPU script may make them.
_NOT_PLACING = frozenset(
    f"torch.cuda.{name}" for name in (
        "is_available", "empty_cache", "manual_seed", "manual_seed_all", "synchronize", "device_count",
        "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
    )
)  # fmt: skip
_PLACING_METHODS = frozenset({"cuda", "to", "mps", "xpu", "npu", "hpu", "ipu"})
_PLACING_KEYWORDS = frozenset({"device", "map_location", "device_ids", "output_device", "device_map"})
_CAST_KEYWORDS = frozenset({"dtype", "non_blocking", "copy", "memory_format"})
_DTYPES = frozenset(
    f"torch.{name}" for name in (
        "float", "float32", "float64", "double", "float16", "half", "bfloat16", "int", "int8", "int16",
        "int32", "int64", "long", "short", "uint8", "bool", "complex64", "complex128",
    )
)  # fmt: skip
_ACCELERATOR_STRINGS = ("cuda", "mps", "xpu")

# Where the code that runs in a loop stops: nested code runs when called.
_DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


class AmpFacts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        index = model.index
        self.calls: list[cst.Call] = sorted((c for s in index.scopes for c in s.calls), key=index.order.__getitem__)
        self.nested: dict[Scope, list[Scope]] = {}  # scope -> its lambdas and comprehensions
        for scope in index.scopes:
            if scope.kind in ("lambda", "comprehension") and scope.parent is not None:
                self.nested.setdefault(scope.parent, []).append(scope)
        self.targets: dict[cst.CSTNode, Binding] = {
            b.node: b for s in index.scopes for bs in s.bindings.values() for b in bs if b.kind in _STORING
        }
        self._names_a_device: Optional[bool] = None
        self._parameter_devices: Optional[set] = None
        self._running_in: Optional[dict] = None

    def calls_in(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls that the code of the function (or module) holding `node`
        makes, its lambdas and comprehensions included, in source order."""
        scope = self.model.index.scope_by_node.get(node) if isinstance(node, cst.FunctionDef) else self.scope_of(node)
        while scope.kind in ("lambda", "comprehension") and scope.parent is not None:
            scope = scope.parent
        found, pending = [], [scope]
        while pending:
            current = pending.pop()
            found.extend(current.calls)
            pending.extend(self.nested.get(current, ()))
        return sorted(found, key=self.model.index.order.__getitem__)

    def calls_running_in(self, unit: cst.CSTNode) -> list[cst.Call]:
        """The calls that run inside `unit` (a loop, a function, a class, a
        lambda or the module) in its own function, in source order: those
        with `unit` among their ancestors up to the first definition."""
        if self._running_in is None:
            self._running_in = self._index_calls_by_unit()
        return self._running_in.get(unit, [])

    def _index_calls_by_unit(self) -> dict:
        """One walk up from each call, so that asking for every training
        loop of a long flat script stays linear in its size."""
        running_in: dict = {}
        for call in self.calls:
            for ancestor in self.model.ancestors(call):
                running_in.setdefault(ancestor, []).append(call)
                if isinstance(ancestor, _DEFINITIONS):
                    break
        return running_in

    def order(self, node: cst.CSTNode) -> int:
        """Where `node` starts, as a rank in source order."""
        order = self.model.index.order
        found = order.get(node)
        while found is None:
            kids = children(node)
            if not kids:
                return -1
            node = kids[0]
            found = order.get(node)
        return found

    def ends_before(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """`first` is over before `second` starts."""
        return self.order(first) < self.order(second) and first not in self.model.ancestors(second) and first is not second

    def names_bound(self, node: cst.CSTNode) -> set:
        """Names and dotted names (`self.loss`) that `node` stores to."""
        return {self.targets[n].name for n in self._values(node) if n in self.targets}

    def names_read(self, node: cst.CSTNode) -> set:
        """Names and dotted names `node` reads (an augmented assignment's target too)."""
        found = set()
        for child in self._values(node):
            binding = self.targets.get(child)
            if binding is None or binding.kind == "augassign":
                found.add(dotted_name(child))
        found.discard("")
        return found

    def stored(self, node: cst.CSTNode) -> bool:
        """`node` is assigned to or deleted (`p.grad = None`, `del p.grad`), not read."""
        parent = self.model.parent(node)
        if isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return node in self.targets
        if isinstance(parent, (cst.AssignTarget, cst.Del)):
            return True
        return isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)) and parent.target is node

    def _values(self, node: cst.CSTNode):
        """The names and attribute chains of `node` that denote values (not
        attribute names, keywords, imports), outside nested definitions."""
        skipped: set = set()
        for child in walk(node, into_definitions=False):
            if child in skipped:
                continue
            if isinstance(child, _NOT_VALUES):
                skipped.update(walk(child))
            elif isinstance(child, cst.Attribute):
                skipped.add(child.attr)
                yield child
            elif isinstance(child, cst.Arg) and child.keyword is not None:
                skipped.add(child.keyword)
            elif isinstance(child, cst.Name):
                yield child

    def is_parameter_device(self, value: Optional[cst.BaseExpression]) -> bool:
        """`next(model.parameters()).device` (or `iter(...)`, `.buffers()`): where the model is."""
        if not (isinstance(value, cst.Attribute) and value.attr.value == "device" and isinstance(value.value, cst.Call)):
            return False
        call = value.value
        if not self.model.is_call_to(call, {"builtins.next"}) or len(call.args) != 1:
            return False
        inner = call.args[0].value
        if self.model.is_call_to(inner, {"builtins.iter"}) and len(inner.args) == 1:
            inner = inner.args[0].value
        return isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("parameters", "buffers") and not inner.args

    def parameter_device_names(self) -> set:
        """The names bound to the device of a model's parameters."""
        if self._parameter_devices is None:
            self._parameter_devices = {
                b.name for s in self.model.index.scopes for bs in s.bindings.values() for b in bs if b.kind == "assign" and self.is_parameter_device(b.value)
            }
        return self._parameter_devices

    def names_a_device(self) -> bool:
        """The file binds, places or asks for a device somewhere (`.to(...)`,
        `.cuda()`, `device=`, `torch.cuda.*`, a "cuda" string, a device
        parameter or flag). A file that does none of this computes on the CPU."""
        if self._names_a_device is None:
            self._names_a_device = bool(self.model.devices) or any(self.places(n) for n in walk(self.model.module))
        return self._names_a_device

    def places(self, node: cst.CSTNode) -> bool:
        """`node` places something on a device, names a device, or asks for one."""
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _PLACING_METHODS:
            return not (node.func.attr.value == "to" and (self._only_casts(node) or _cpu_only_arguments(node)))
        if isinstance(node, cst.Arg):
            # `map_location="cpu"`, `device="cpu"`: names the CPU, places nothing elsewhere
            return node.keyword is not None and node.keyword.value in _PLACING_KEYWORDS and not _is_cpu_string(node.value)
        if isinstance(node, cst.SimpleString):
            text = node.evaluated_value
            return isinstance(text, str) and text.startswith(_ACCELERATOR_STRINGS)
        if isinstance(node, cst.FormattedStringText):
            return node.value.startswith(_ACCELERATOR_STRINGS)
        if isinstance(node, (cst.Name, cst.Attribute)) and not isinstance(self.model.parent(node), cst.Attribute):
            return any(name.startswith(_DEVICE_PREFIXES) and name not in _NOT_PLACING for name in self.model.qualified_names(node))
        return False

    def _only_casts(self, call: cst.Call) -> bool:
        """`x.to(torch.float32)`, `x.to(dtype=...)`: a cast, no placement."""
        return all(
            arg.keyword.value in _CAST_KEYWORDS if arg.keyword is not None else self.model.is_qualified(arg.value, _DTYPES)
            for arg in call.args
        )

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """As the model's, for a line too: a line directly in a function's body
        has no scope of its own recorded, and its nearest recorded ancestor,
        the `def` statement, belongs to the scope around the function."""
        if isinstance(node, cst.SimpleStatementLine) and node.body:
            node = node.body[0]
        return self.model.scope_of(node)

    def function_at(self, node: cst.CSTNode) -> Optional[Function]:
        return self.model.flow.function_of(self.scope_of(node))

    def bindings_of(self, name: str, at: cst.CSTNode) -> list[Binding]:
        return self.model.index.bindings_of(name, self.scope_of(at))

    def self_attribute(self, klass: cst.ClassDef, attribute: str) -> list[Binding]:
        """The bindings of `self.<attribute>` in the methods of `klass`."""
        return self.model._entities.attribute_bindings(klass, attribute)

    def method_owner(self, node: cst.CSTNode) -> Optional[tuple]:
        """(ClassDef, name of the instance parameter) of the method whose code holds `node`."""
        function = self.function_at(node)
        instance = self.instance_parameter(function) if function is not None else None
        return (function.scope.parent.node, instance) if instance else None

    @staticmethod
    def instance_parameter(function: Function) -> Optional[str]:
        """`self` for a method called on an instance, else None."""
        positional = positional_parameters(function.node) if function.is_method else []
        return positional[0] if positional else None

    def methods(self, klass: cst.ClassDef) -> list[Function]:
        """The methods of a class of the file."""
        scope = self.model.index.scope_by_node[klass]
        functions = self.model.flow.functions
        return [functions[b.node] for bs in scope.bindings.values() for b in bs if b.kind == "def" and b.node in functions]


def amp_facts(model: ScriptModel) -> AmpFacts:
    return model.derived(AmpFacts)


__all__ = ["AmpFacts", "amp_facts"]


def _is_cpu_string(value: cst.BaseExpression) -> bool:
    """The literal "cpu": the device a script computes on when it names no other."""
    return isinstance(value, cst.SimpleString) and value.evaluated_value == "cpu"


def _cpu_only_arguments(call: cst.Call) -> bool:
    """`x.to("cpu")`, `x.to("cpu", torch.float32)`: a move to the CPU, and casts."""
    return any(not arg.keyword and _is_cpu_string(arg.value) for arg in call.args[:1]) and all(
        arg.keyword is None or arg.keyword.value in _CAST_KEYWORDS for arg in call.args
    )
