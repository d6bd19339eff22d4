"""Values that leave an autocast region for numpy: bfloat16 has no numpy
dtype, so `output.cpu().numpy()` (and numpy, scikit-learn, matplotlib,
pandas or an image writer such as torchvision's `save_image` reading such a
tensor) fails where the original float32 value passed.
The codemod casts them back with the runtime's `full_precision(...)` (a
float16 or bfloat16 tensor as float32; anything else unchanged), only where
a value computed under an autocast it added reaches such a call: followed
through assignments, lists it is appended to, the parameters of the file's
functions it is passed to and the values they return.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import dotted_name, walk
from .plan import PRECISION, method_call, without_parens

FULL_PRECISION = f"{PRECISION}.full_precision"
# Libraries that turn a tensor into a numpy array (`np.asarray`, `__array__`),
# image writers among them (torchvision's `save_image` and `to_pil_image`).
NUMPY_READERS = (
    "numpy.", "sklearn.", "matplotlib.", "scipy.", "pandas.", "seaborn.", "PIL.", "imageio.", "cv2.", "skimage.",
    "torchvision.utils.", "torchvision.transforms.functional.to_pil_image", "torchvision.transforms.v2.functional.to_pil_image",
)
# Transforms whose instances convert a tensor they are called on (`ToPILImage()(x)`).
NUMPY_READER_CLASSES = frozenset({"torchvision.transforms.ToPILImage", "torchvision.transforms.transforms.ToPILImage", "torchvision.transforms.v2.ToPILImage"})
# Calls whose result is no longer a reduced-precision tensor.
CONVERTS = frozenset({"item", "tolist", "numpy", "size", "dim", "numel", "float", "double", "long", "int", "bool", "argmax", "argmin"})
NOT_TENSORS = frozenset({"shape", "dtype", "device", "ndim"})
BUILTIN_CONVERTS = frozenset({"builtins.float", "builtins.int", "builtins.len", "builtins.bool", "builtins.str", "builtins.round"})
COLLECTS = frozenset({"append", "extend", "insert"})
MAX_ROUNDS = 8  # passes over the file's functions until the reduced values settle


class Leaving:
    """Mixed into the codemod: `self.autocast_spans` holds the statements and
    `with` blocks that the committed edits run under autocast."""

    def plan_leaving(self) -> None:
        if not self.autocast_spans:
            return
        for scope, names in self.reduced_names().items():
            for call in self.calls_of(scope):
                self.cast_what_leaves(call, names)
        if self.casts_to_numpy:
            self.import_runtime("full_precision")
            self.fix(min(self.casts_to_numpy, key=self.order), "AM407", f"{len(self.casts_to_numpy)} value(s) computed under autocast cast back to float32 with full_precision() where they reach numpy or an image writer (bfloat16 has no numpy dtype; a no-op in float32)")

    def calls_of(self, scope) -> list:
        """The calls the code of `scope` makes, its lambdas and comprehensions included."""
        calls = self.facts.calls_in(scope.node if scope.kind != "module" else self.tree)
        return [c for c in calls if self._home(self.facts.scope_of(c)) is scope]

    @staticmethod
    def _home(scope):
        while scope.kind in ("lambda", "comprehension") and scope.parent is not None:
            scope = scope.parent
        return scope

    # -- which names hold values computed under autocast ---------------------------------

    def reduced_names(self) -> dict:
        """Scope -> the names that may hold a tensor computed under autocast."""
        reduced: dict = {}
        for span in self.autocast_spans:
            scope = self.facts.scope_of(span)
            reduced.setdefault(scope, set()).update(self.binds(span))
        self.returning: set = {self.facts.scope_of(r) for span in self.autocast_spans for r in walk(span, into_definitions=False) if isinstance(r, cst.Return) and r.value is not None}
        callees = {site.call: function for function in self.script.functions for site in function.callers if site.complete}
        self.callees = callees
        for _ in range(MAX_ROUNDS):
            before = (sum(len(n) for n in reduced.values()), len(self.returning))
            for scope in list(reduced):
                self.spread(scope, reduced[scope], reduced)
            if (sum(len(n) for n in reduced.values()), len(self.returning)) == before:
                break
        return reduced

    def spread(self, scope, names: set, reduced: dict) -> None:
        """Names assigned from reduced values, lists they are appended to, the
        parameters of the file's functions they are passed to, and whether
        this scope returns one."""
        for bindings in scope.bindings.values():
            for binding in bindings:
                value = _assigned(binding.statement)
                if value is not None and self.carries(value, names):
                    names.add(binding.name)
        for call in self.calls_of(scope):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in COLLECTS:
                if any(self.carries(a.value, names) for a in call.args):
                    receiver = dotted_name(call.func.value)
                    if receiver:
                        names.add(receiver)
            function = self.callees.get(call)
            if function is not None:
                site = next(s for s in function.callers if s.call is call)
                passed = {p for p, expression in site.arguments.items() if self.carries(expression, names)}
                if passed:
                    reduced.setdefault(function.scope, set()).update(passed)
        if scope.kind == "function" and scope not in self.returning:
            if any(isinstance(r, cst.Return) and r.value is not None and self.carries(r.value, names) for r in walk(scope.node.body, into_definitions=False)):
                self.returning.add(scope)

    def carries(self, expression: cst.BaseExpression, names: set) -> bool:
        """`expression` may evaluate to (or hold) a tensor read from `names`,
        or returned by a function that returns one."""
        return any(self.is_reduced_value(node, names) for node in self.tensor_reads(expression))

    def is_reduced_value(self, node: cst.CSTNode, names: set) -> bool:
        if isinstance(node, cst.Call):
            function = self.callees.get(node)
            return function is not None and function.scope in self.returning
        return dotted_name(node) in names

    def tensor_reads(self, expression: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The names, `a.b` chains and calls of `expression` whose value it may
        pass on as a tensor (not through `.item()`, `len()`, `.shape`, ...)."""
        if isinstance(expression, cst.Call):
            if isinstance(expression.func, cst.Attribute) and expression.func.attr.value in CONVERTS:
                return
            if self.is_call_to(expression, BUILTIN_CONVERTS | {FULL_PRECISION}):
                return
            yield expression
            for arg in expression.args:
                yield from self.tensor_reads(arg.value)
            if isinstance(expression.func, cst.Attribute):
                yield from self.tensor_reads(expression.func.value)
            return
        if isinstance(expression, cst.Attribute):
            if expression.attr.value in NOT_TENSORS:
                return
            if dotted_name(expression):
                yield expression
            yield from self.tensor_reads(expression.value)
            return
        if isinstance(expression, cst.Name):
            yield expression
            return
        if isinstance(expression, (cst.Lambda, cst.BaseComp)):
            return
        for child in _children(expression):
            yield from self.tensor_reads(child)

    # -- the casts ------------------------------------------------------------------------

    def cast_what_leaves(self, call: cst.Call, names: set) -> None:
        if self.is_suppressed(call, "AM407"):
            return
        if method_call(call, "numpy") and self.carries(call.func.value, names):
            self.edits.replace[call] = lambda updated: updated.with_changes(func=updated.func.with_changes(value=self.full_precision(updated.func.value)))
            self.note_cast(call)
            return
        if self._reads_as_numpy(call):
            positions = [i for i, arg in enumerate(call.args) if not arg.star and self.carries(arg.value, names)]
            if positions:
                self.edits.replace[call] = lambda updated, positions=positions: updated.with_changes(
                    args=[a.with_changes(value=self.full_precision(a.value)) if i in positions else a for i, a in enumerate(updated.args)]
                )
                self.note_cast(call)

    def _reads_as_numpy(self, call: cst.Call) -> bool:
        """A call of a library that reads a tensor as a numpy array, or of a
        converter made in place (`ToPILImage()(sample)`)."""
        if any(name.startswith(NUMPY_READERS) for name in self.qualified_names(call.func)):
            return True
        return isinstance(call.func, cst.Call) and self.is_call_to(call.func, NUMPY_READER_CLASSES)

    def note_cast(self, call: cst.Call) -> None:
        self.casts_to_numpy.append(call)

    def full_precision(self, value: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=cst.Name(self.runtime_name("full_precision")), args=[cst.Arg(without_parens(value))])


def _assigned(statement: Optional[cst.CSTNode]) -> Optional[cst.BaseExpression]:
    if isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        return statement.value
    if isinstance(statement, cst.For):
        return statement.iter
    return None


def _children(node: cst.CSTNode) -> list:
    return [child for child in node.children if isinstance(child, cst.CSTNode)]


__all__ = ["Leaving"]
