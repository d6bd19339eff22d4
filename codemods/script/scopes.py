"""Scopes, bindings and qualified names, from one linear walk of a LibCST module.

LibCST's ScopeProvider answers the same questions, but its cost grows faster
than the file (each use of a name scans every assignment of it), which makes
a 5 MB file run for half an hour. This walk visits every node once, records
for each scope the names it binds (imports, assignments, parameters, loop
and `with` targets, functions, classes), and resolves a name by looking it up
in its scope and the enclosing ones: a dictionary look-up per scope level.

Qualified names follow LibCST's: `nn.Linear` after `import torch.nn as nn`
is `torch.nn.Linear`; a name bound in the file is its own name (`Net`,
`Trainer.fit`, `main.<locals>.step`); an unbound builtin is `builtins.print`.
Unlike LibCST, a star import is not resolved (neither resolves it).
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
from typing import Iterator, Optional, Union

import libcst as cst

from .._syntax import children, dotted_name
from .plain_helpers import runtime_name_of

BUILTINS = frozenset(dir(builtins))
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
Definition = Union[cst.FunctionDef, cst.ClassDef, cst.Lambda]


@dataclasses.dataclass(eq=False)
class Scope:
    """A module, function, class, lambda or comprehension, and what it binds."""

    kind: str  # "module", "function", "class", "lambda", "comprehension"
    name: str  # "<module>", "train", "Trainer.fit", "main.<locals>.step"
    node: cst.CSTNode = dataclasses.field(repr=False)
    parent: Optional["Scope"] = dataclasses.field(default=None, repr=False)
    bindings: dict = dataclasses.field(default_factory=dict, repr=False)  # name -> [Binding]
    declared_global: set = dataclasses.field(default_factory=set, repr=False)
    calls: list = dataclasses.field(default_factory=list, repr=False)  # the calls its own code makes

    def bind(self, binding: "Binding") -> None:
        self.bindings.setdefault(binding.name, []).append(binding)

    def __repr__(self) -> str:
        return f"Scope({self.kind} {self.name}: {', '.join(sorted(self.bindings))})"

    @property
    def function(self) -> Optional[cst.FunctionDef]:
        return self.node if isinstance(self.node, cst.FunctionDef) else None

    @property
    def enclosing_class(self) -> Optional["Scope"]:
        """The class whose method this function scope is."""
        return self.parent if self.kind == "function" and self.parent is not None and self.parent.kind == "class" else None


@dataclasses.dataclass(eq=False)
class Binding:
    """One place a name gets a value. `value` is the expression assigned by a
    plain `name = value` (or `with value as name`, a parameter's default);
    None for unpacking, loop targets and definitions. Attribute targets
    (`self.model = ...`, `args.device = ...`) are bindings too, under their
    dotted spelling, in the scope that assigns them."""

    name: str
    kind: str  # "import", "assign", "augassign", "param", "def", "class", "for", "with", "named", "except"
    node: cst.CSTNode = dataclasses.field(repr=False)  # the target, the definition, the Param or the ImportAlias
    scope: Scope = dataclasses.field(repr=False)
    value: Optional[cst.BaseExpression] = dataclasses.field(default=None, repr=False)
    statement: Optional[cst.CSTNode] = dataclasses.field(default=None, repr=False)
    qualified: Optional[str] = None  # imports: the module path it binds

    def __repr__(self) -> str:
        extra = f" -> {self.qualified}" if self.qualified else ""
        return f"Binding({self.kind} {self.name} in {self.scope.name}{extra})"


class Index:
    """The walk's results: parents, scopes and bindings; name resolution."""

    def __init__(self, module: cst.Module, star_names: Optional[dict] = None, reexports: Optional[dict] = None) -> None:
        self.module = module
        # When the project is known: what `from <project module> import *` binds (name -> qualified
        # name), and the qualified names of what a project module imports and this file imports from it.
        self.star_names: dict = star_names or {}
        self.reexports: dict = reexports or {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.scope_of_node: dict[cst.CSTNode, Scope] = {}  # names, calls, statements, definitions
        self.scopes: list[Scope] = []
        self.scope_by_node: dict[cst.CSTNode, Scope] = {}  # definition -> the scope it opens
        self.star_imports: list[str] = []
        self.imports: list[Union[cst.Import, cst.ImportFrom]] = []  # every import statement, in source order
        self.order: dict[cst.CSTNode, int] = {}  # source order of names, attributes, calls, parameters, statements
        self.nodes: list[cst.CSTNode] = []  # every node, in source order
        self._of_type: dict[tuple[type, ...], list[cst.CSTNode]] = {}
        self.module_scope = self._new_scope("module", "<module>", module, None)
        self._memo: dict[tuple[int, str], frozenset] = {}
        # id(node) -> (node, its qualified names): codemods ask again and again
        # (the node is kept, so its id is never another's)
        self._qualified: dict[int, tuple[cst.CSTNode, frozenset]] = {}
        self._definitions: dict[tuple[str, Scope], list[Binding]] = {}
        _Walker(self).run()

    # -- structure ----------------------------------------------------------------------

    def _new_scope(self, kind: str, name: str, node: cst.CSTNode, parent: Optional[Scope]) -> Scope:
        scope = Scope(kind, name, node, parent)
        self.scopes.append(scope)
        self.scope_by_node[node] = scope
        return scope

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parents.get(node)

    def nodes_of(self, *types: type) -> list[cst.CSTNode]:
        """Every node of these types in the module, in source order (a walk
        of a large module costs seconds; this list is kept). Whitespace,
        comments and punctuation are not indexed: asking for them (cst.Comma)
        gives an empty list."""
        if types not in self._of_type:
            self._of_type[types] = [node for node in self.nodes if isinstance(node, types)]
        return self._of_type[types]

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parents.get(node)
        while current is not None:
            yield current
            current = self.parents.get(current)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The scope whose code holds `node`."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            found = self.scope_of_node.get(current)
            if found is not None:
                return found
            current = self.parents.get(current)
        return self.module_scope

    # -- names ------------------------------------------------------------------------------

    def home_of(self, name: str, scope: Scope) -> Optional[Scope]:
        """The scope whose binding of `name` a use in `scope` reads (Python's
        rule: the innermost binding scope, skipping enclosing class bodies)."""
        if name in scope.declared_global:
            return self.module_scope if name in self.module_scope.bindings else None
        current: Optional[Scope] = scope
        while current is not None:
            if name in current.bindings and (current is scope or current.kind != "class"):
                return current
            current = current.parent
        return None

    def bindings_of(self, name: str, scope: Scope) -> list[Binding]:
        home = self.home_of(name, scope)
        return home.bindings[name] if home is not None else []

    def definitions_of(self, name: str, scope: Scope) -> list[Binding]:
        """The `def` and `class` bindings among `bindings_of(name, scope)`:
        what a call of `name` may run, without a pass over a name's other
        bindings at every call (a flat script rebinds `model` thousands of times).
        A runtime helper written into the file is none: it is the runtime's
        function (`names_of` says so), not code of the script to follow."""
        home = self.home_of(name, scope)
        if home is None:
            return []
        key = (name, home)
        found = self._definitions.get(key)
        if found is None:
            found = self._definitions[key] = [
                b for b in home.bindings[name] if b.kind in ("def", "class") and not (home.kind == "module" and runtime_name_of(b.node))
            ]
        return found

    def names_of(self, name: str, scope: Scope) -> frozenset:
        """The qualified names a use of `name` in `scope` may have."""
        key = (id(scope), name)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._resolve(name, scope)
        return found

    def _resolve(self, name: str, scope: Scope) -> frozenset:
        home = self.home_of(name, scope)
        if home is None and name in self.star_names:
            return frozenset({self.star_names[name]})
        if home is None:
            return frozenset({f"builtins.{name}"}) if name in BUILTINS else frozenset()
        found = set()
        for binding in home.bindings[name]:
            if binding.kind == "import":
                found.add(self.reexports.get(binding.qualified, binding.qualified))
            else:
                found.add(name if home.kind == "module" else f"{_prefix(home)}{name}")
                helper = runtime_name_of(binding.node) if binding.kind == "def" and home.kind == "module" else None
                if helper is not None:  # a runtime helper written into the file: known as the runtime's
                    found.add(helper)
        return frozenset(found)

    def qualified_names(self, node: cst.CSTNode) -> frozenset:
        """For a Name or a chain of attributes on a name (`torch.optim.SGD`):
        its qualified names, as LibCST's QualifiedNameProvider gives them. As
        LibCST does, the chain runs through calls and subscripts
        (`nn.Linear(2, 2).cuda` is `torch.nn.Linear.cuda`), and a chain on a
        builtin is the builtin (`dict.fromkeys` is `builtins.dict`)."""
        known = self._qualified.get(id(node))
        if known is not None:
            return known[1]
        found = self._qualified_names(node)
        self._qualified[id(node)] = (node, found)
        return found

    def _qualified_names(self, node: cst.CSTNode) -> frozenset:
        parts: list[str] = []
        current = node
        while isinstance(current, (cst.Attribute, cst.Call, cst.Subscript)):
            if isinstance(current, cst.Attribute):
                parts.append(current.attr.value)
                current = current.value
            else:
                current = current.func if isinstance(current, cst.Call) else current.value
        if not isinstance(current, cst.Name):
            return frozenset()
        rest = "".join("." + p for p in reversed(parts))
        return frozenset(
            q if q.startswith("builtins.") else q + rest for q in self.names_of(current.value, self.scope_of(current))
        )

    def is_qualified(self, node: cst.CSTNode, names) -> bool:
        return not self.qualified_names(node).isdisjoint(names)

    def is_call_to(self, node: cst.CSTNode, names) -> bool:
        return isinstance(node, cst.Call) and self.is_qualified(node.func, names)


_ORDERED = (cst.Name, cst.Attribute, cst.Call, cst.Param, cst.BaseSmallStatement, cst.BaseCompoundStatement)
_SCOPED = (cst.Name, cst.Call, cst.BaseSmallStatement, cst.BaseCompoundStatement)
# The nodes `_Walker._visit` acts on: definitions, scopes and bindings.
_BINDING = (
    cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Param, *COMPREHENSIONS, cst.Assign, cst.AnnAssign, cst.AugAssign,
    cst.For, cst.CompFor, cst.WithItem, cst.NamedExpr, cst.ExceptHandler, cst.Global, cst.Nonlocal, cst.Import, cst.ImportFrom,
)  # fmt: skip


@functools.lru_cache(maxsize=None)
def _roles(node_type: type) -> tuple[bool, bool, bool, bool]:
    """(kept in source order, scope recorded, a call, may bind): asked once a
    node type, since several of these are abstract classes, slow to test."""
    return (
        issubclass(node_type, _ORDERED),
        issubclass(node_type, _SCOPED),
        issubclass(node_type, cst.Call),
        issubclass(node_type, _BINDING),
    )


def _prefix(scope: Scope) -> str:
    """How LibCST prefixes names bound in `scope`: `f.<locals>.`, `Cls.`."""
    if scope.kind == "class":
        return f"{scope.name}."
    return f"{scope.name}.<locals>."


class _Walker:
    """The single walk: an explicit stack of (node, scope), children pushed in
    reverse so that nodes come in source order."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self.stack: list[tuple[cst.CSTNode, Scope]] = []

    def run(self) -> None:
        index = self.index
        self.stack.append((index.module, index.module_scope))
        parents, nodes = index.parents, index.nodes
        while self.stack:
            node, scope = self.stack.pop()
            nodes.append(node)
            ordered, scoped, is_call, binds = _roles(type(node))
            if ordered:
                index.order[node] = len(index.order)
            if scoped:
                index.scope_of_node[node] = scope
                if is_call:
                    scope.calls.append(node)
            kids = [child for child in children(node) if not _is_layout(type(child))]
            for child in kids:
                parents[child] = node
            inner = self._visit(node, scope) if binds else None
            if inner is None:
                self.stack.extend((child, scope) for child in reversed(kids))
            else:
                for child, child_scope in inner:
                    if child_scope is not scope:  # a body, parameters: `scope_of` finds them from any node inside
                        index.scope_of_node[child] = child_scope
                self.stack.extend(reversed(inner))

    def _visit(self, node: cst.CSTNode, scope: Scope) -> Optional[list]:
        """Record the bindings `node` makes; return its children with the scope
        each runs in, where that is not `scope` for all of them."""
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return self._definition(node, scope)
        if isinstance(node, cst.Lambda):
            inner = self.index._new_scope("lambda", f"{_prefix(scope)}<lambda>", node, scope)
            self._parameters(node.params, inner)
            return _split(node, inner, scope, (node.params, node.body))
        if isinstance(node, cst.Param) and scope.parent is not None:
            # the name is the function's; the default and annotation are evaluated outside it
            return _split(node, scope, scope.parent, (node.name,))
        if isinstance(node, COMPREHENSIONS):
            inner = self.index._new_scope("comprehension", f"{_prefix(scope)}<comprehension>", node, scope)
            return [(child, inner) for child in children(node)]
        if isinstance(node, cst.Assign):
            for target in node.targets:
                self._target(target.target, scope, "assign", node.value, node)
        elif isinstance(node, cst.AnnAssign):
            self._target(node.target, scope, "assign", node.value, node)
        elif isinstance(node, cst.AugAssign):
            self._target(node.target, scope, "augassign", None, node)
        elif isinstance(node, (cst.For, cst.CompFor)):
            self._target(node.target, scope, "for", None, node)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            self._target(node.asname.name, scope, "with", node.item, node)
        elif isinstance(node, cst.NamedExpr):
            self._target(node.target, scope, "named", node.value, node)
        elif isinstance(node, cst.ExceptHandler) and node.name is not None:
            self._target(node.name.name, scope, "except", None, node)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            scope.declared_global.update(item.name.value for item in node.names if isinstance(node, cst.Global))
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            self._import(node, scope)
        return None

    def _definition(self, node: Union[cst.FunctionDef, cst.ClassDef], scope: Scope) -> list:
        """The body (and a function's parameters) run in the new scope; the
        name, decorators, bases and annotations in the enclosing one."""
        is_class = isinstance(node, cst.ClassDef)
        name = node.name.value
        scope.bind(Binding(name, "class" if is_class else "def", node, scope, statement=node))
        qualified = name if scope.kind == "module" else f"{_prefix(scope)}{name}"
        inner = self.index._new_scope("class" if is_class else "function", qualified, node, scope)
        if not is_class:
            self._parameters(node.params, inner)
        return _split(node, inner, scope, (node.body, None if is_class else node.params))

    def _parameters(self, params: cst.Parameters, inner: Scope) -> None:
        for param in all_params(params):
            inner.bind(Binding(param.name.value, "param", param, inner, value=param.default, statement=param))

    def _target(self, target: cst.CSTNode, scope: Scope, kind: str, value, statement: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            scope.bind(Binding(target.value, kind, target, scope, value=value, statement=statement))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._target(element.value, scope, kind, None, statement)
        elif isinstance(target, cst.StarredElement):
            self._target(target.value, scope, kind, None, statement)
        elif isinstance(target, cst.Attribute):
            spelled = dotted_name(target)
            if spelled:
                scope.bind(Binding(spelled, kind, target, scope, value=value, statement=statement))

    def _import(self, node: Union[cst.Import, cst.ImportFrom], scope: Scope) -> None:
        self.index.imports.append(node)
        if isinstance(node, cst.Import):
            for alias in node.names:
                path = dotted_name(alias.name)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    scope.bind(Binding(alias.asname.name.value, "import", alias, scope, statement=node, qualified=path))
                else:
                    root = path.split(".")[0]
                    scope.bind(Binding(root, "import", alias, scope, statement=node, qualified=root))
            return
        module = "." * len(node.relative) + (dotted_name(node.module) if node.module is not None else "")
        if isinstance(node.names, cst.ImportStar):
            self.index.star_imports.append(module)
            return
        for alias in node.names:
            name = dotted_name(alias.name)
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
            qualified = f"{module}{name}" if module.endswith(".") or not module else f"{module}.{name}"
            scope.bind(Binding(local, "import", alias, scope, statement=node, qualified=qualified))


def _split(node: cst.CSTNode, inner: Scope, outer: Scope, inside: tuple) -> list:
    """`node`'s children, those in `inside` with the `inner` scope."""
    return [(child, inner if any(child is i for i in inside) else outer) for child in children(node)]


# Whitespace, comments and punctuation: most of a module's nodes, and none of
# them names, binds or calls anything. The index leaves them out (they have no
# parent, scope or order there).
_LAYOUT = (
    cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.Newline, cst.EmptyLine, cst.Comment,
    cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual, cst.LeftParen, cst.RightParen,
    cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace,
)  # fmt: skip
_layout_types: dict[type, bool] = {}


def _is_layout(kind: type) -> bool:
    known = _layout_types.get(kind)
    if known is None:
        known = _layout_types[kind] = issubclass(kind, _LAYOUT)
    return known


def all_params(params: cst.Parameters) -> list[cst.Param]:
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            found.append(star)
    return found


def parameter_names(function: cst.FunctionDef) -> list[str]:
    """The names a function receives, in order (`*args`, `**kwargs` included)."""
    return [p.name.value for p in all_params(function.params)]


def positional_parameters(function: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*function.params.posonly_params, *function.params.params)]


__all__ = ["BUILTINS", "Binding", "Index", "Scope", "all_params", "children", "parameter_names", "positional_parameters"]
