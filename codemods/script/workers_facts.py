"""What the `workers` codemod reads from a script beyond the shared model:
the name a module-level `import torch` binds, whether `DataLoader` may come
from a star import of torch's data package, which definitions run when the
file is imported (for a file without a main guard), what a name may stand
for, a class with its bases defined in the file, the first change made
to a dataset after its loader is built, and the dict a loader gets as
`**name` with every key the code may put in it (`kwargs_dict`).

`workers_facts(model)` computes the module-wide facts once per model, from
the model's scopes and entry point (no walk of the whole tree).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional, Union

import libcst as cst

from .._syntax import dotted_name
from .._item.syntax import first_line
from .model import ScriptModel
from .uses import uses_of


def workers_facts(model: ScriptModel) -> "WorkersFacts":
    return model.derived(WorkersFacts)


@dataclasses.dataclass(eq=False)
class Entry:
    """One key the dict may hold: from the literal it starts as (`start` is
    that literal), or put in later (`start` None) by `.update(...)` or
    `name[key] = value`; `always`: a later change in the block that makes
    the dict, so it runs whenever the dict exists."""

    key: str
    value: cst.BaseExpression
    start: Optional[cst.CSTNode] = None
    always: bool = False


@dataclasses.dataclass(eq=False)
class KwargsDict:
    """A dict passed as `**name` to DataLoader calls whose every key the code
    shows: made once (`statement`) as one of `starts` (dict literals or
    `dict(key=value)` calls; two for `{...} if c else {...}`), and otherwise
    only read by `**name` in those calls and changed by `.update(...)` or
    `name["key"] = value`."""

    name: str
    statement: cst.CSTNode
    starts: list
    entries: list
    loaders: list

    def values_of(self, key: str) -> list:
        return [e.value for e in self.entries if e.key == key]

    def start_has(self, start: cst.CSTNode, key: str) -> bool:
        return any(e.start is start and e.key == key for e in self.entries)


class WorkersFacts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.torch_alias = _torch_alias(model)
        # None: the file has a main guard, so nothing it defines runs when a worker imports it
        self.run_at_import: Optional[set] = None if model.entry.main_guard is not None else _run_at_import(model)

    def stands_for(self, name: cst.Name) -> list[cst.CSTNode]:
        """What `name` may stand for where it is used: the class or function it
        defines, or the values plainly assigned to it (`x = y = value` too)."""
        found: list[cst.CSTNode] = []
        for binding in self.model.bindings_of(name.value, name):
            if binding.kind in ("def", "class"):
                found.append(binding.node)
            elif binding.kind == "assign" and binding.value is not None and isinstance(binding.node, cst.Name):
                found.append(binding.value)
        return found

    def classes_of(self, func: cst.BaseExpression) -> list[cst.ClassDef]:
        if not isinstance(func, cst.Name):
            return []
        return [b for b in self.stands_for(func) if isinstance(b, cst.ClassDef)]

    def functions_of(self, func: cst.BaseExpression) -> list[cst.FunctionDef]:
        if not isinstance(func, cst.Name):
            return []
        return [b for b in self.stands_for(func) if isinstance(b, cst.FunctionDef)]

    def class_family(self, klass: cst.ClassDef, seen: Optional[set] = None) -> Iterator[cst.ClassDef]:
        """The class and its base classes defined in this file."""
        seen = seen if seen is not None else set()
        if klass in seen:
            return
        seen.add(klass)
        yield klass
        for base in klass.bases:
            for parent in self.classes_of(base.value):
                yield from self.class_family(parent, seen)

    # -- AM106: the dataset changed after its loader is built -----------------------------

    def change_after(self, loader: cst.Call, dataset: cst.BaseExpression) -> Optional[cst.CSTNode]:
        """The first method call on, or attribute set of, the dataset that may
        run after the loader is built: through the expression that names it, or
        through `loader.dataset`."""
        uses = list(self._later_occurrences(dataset, loader))
        for target in self._loader_targets(loader):
            for occurrence in self._later_occurrences(target, loader):
                attribute = self.model.parent(occurrence)
                if (
                    isinstance(attribute, cst.Attribute)
                    and attribute.attr.value == "dataset"
                    and attribute.value is occurrence
                ):
                    uses.append(attribute)
        order = self.model.index.order  # a change starts where its use does
        changes = [(order[use], change) for use in uses for change in [self._changing_use(use)] if change is not None]
        return min(changes, key=lambda pair: pair[0])[1] if changes else None

    def _later_occurrences(self, expression: cst.BaseExpression, loader: cst.Call) -> Iterator[cst.CSTNode]:
        """Where `expression` (a name, or an attribute chain such as
        `self.train_set`) occurs again, after the loader is built or in
        another function (a method of the class may run at any time)."""
        if isinstance(expression, cst.Name):
            index = self.model.index
            home = index.home_of(expression.value, index.scope_of(expression))
            if home is not None:
                yield from (n for n in uses_of(self.model).reads(expression.value, home) if self._after(n, loader))
        elif isinstance(expression, cst.Attribute) and dotted_name(expression):
            home = self._function_of(loader)
            for occurrence in self._occurrences_of_chain(expression, self._search_area(expression, loader)):
                if self._function_of(occurrence) is not home or self._after(occurrence, loader):
                    yield occurrence

    def _occurrences_of_chain(self, chain: cst.Attribute, area: Optional[cst.ClassDef]) -> Iterator[cst.Attribute]:
        """The attribute chains spelled like `chain` in `area` (None: the module)."""
        root, depth = chain, 0
        while isinstance(root, cst.Attribute):
            root, depth = root.value, depth + 1
        for name in uses_of(self.model).names.get(root.value, ()):
            occurrence = name
            for _ in range(depth):
                parent = self.model.parent(occurrence)
                occurrence = parent if isinstance(parent, cst.Attribute) and parent.value is occurrence else None
                if occurrence is None:
                    break
            if (
                occurrence is not None
                and occurrence.deep_equals(chain)
                and (area is None or any(a is area for a in self.model.ancestors(occurrence)))
            ):
                yield occurrence

    def _after(self, node: cst.CSTNode, loader: cst.Call) -> bool:
        """Does `node` come after the whole loader call in the source?"""
        order = self.model.index.order
        return order[node] > order[loader] and not any(a is loader for a in self.model.ancestors(node))

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        return next((a for a in self.model.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def _search_area(self, chain: cst.Attribute, loader: cst.Call) -> Optional[cst.ClassDef]:
        """Where the same attribute chain means the same object: the class for
        `self.x` in a method, else (None) the whole module."""
        root = chain
        while isinstance(root, cst.Attribute):
            root = root.value
        function = self._function_of(loader)
        if function is not None and function.params.params and root.deep_equals(function.params.params[0].name):
            owner = self.model.parent(self.model.parent(function))  # FunctionDef -> IndentedBlock -> ClassDef
            if isinstance(owner, cst.ClassDef):
                return owner
        return None

    def _loader_targets(self, loader: cst.Call) -> list[cst.BaseExpression]:
        """`loader` in `loader = DataLoader(...)`, `self.loader` in `self.loader = DataLoader(...)`."""
        assign = self.model.parent(loader)
        if isinstance(assign, cst.Assign) and assign.value is loader:
            return [t.target for t in assign.targets if isinstance(t.target, (cst.Name, cst.Attribute))]
        return []

    def _changing_use(self, use: cst.BaseExpression) -> Optional[cst.CSTNode]:
        """The change, if `use` is the start of one: a method call
        (`use.set_epoch(e)`, `use.items.append(x)`) or an assignment
        (`use.flag = x`, `use.items[0] = x`). An item read (`use[0].to(device)`)
        is not a change of the dataset."""
        node, parent = use, self.model.parent(use)
        through_item = False
        while isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node:
            through_item = through_item or isinstance(parent, cst.Subscript)
            node, parent = parent, self.model.parent(parent)
        if node is use:
            return None
        if isinstance(parent, cst.Call) and parent.func is node and not through_item:
            return parent
        return node if self._is_assigned(node) else None

    def _is_assigned(self, target: cst.CSTNode) -> bool:
        node, parent = target, self.model.parent(target)
        while isinstance(parent, (cst.Element, cst.Tuple, cst.List, cst.StarredElement)):
            node, parent = parent, self.model.parent(parent)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            return parent.target is node
        return isinstance(parent, cst.Del)


    # -- the dict a loader gets as `**name` ---------------------------------------------

    def kwargs_dict(self, call: cst.Call, is_loader: Callable[[cst.Call], bool]) -> Union[KwargsDict, str]:
        """The dict `call` gets as its only star argument `**name`, or why its
        keys cannot all be seen."""
        stars = [a for a in call.args if a.star]
        if len(stars) != 1 or stars[0].star != "**" or not isinstance(stars[0].value, cst.Name):
            return "what they hold cannot be seen"
        found = self._dict_of(stars[0].value, is_loader, set())
        if isinstance(found, str):
            return found
        if not found.loaders:
            return f"`{found.name}` is used where it cannot be followed"
        return found

    def _dict_of(self, name: cst.Name, is_loader, seen: set) -> Union[KwargsDict, str]:
        index = self.model.index
        home = index.home_of(name.value, index.scope_of(name))
        bindings = home.bindings.get(name.value, []) if home is not None else []
        if any(b.kind == "param" for b in bindings):
            return f"`{name.value}` is an argument, which the callers fill"
        if len(bindings) != 1 or bindings[0].kind != "assign" or not isinstance(bindings[0].node, cst.Name):
            return f"`{name.value}` is not assigned once, as a plain name"
        binding = bindings[0]
        statement = binding.statement
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1 or binding.node in seen:
            return f"`{name.value}` is assigned in `{first_line(statement)}`"
        if any(isinstance(self.model.parent(n), cst.NameItem) for n in uses_of(self.model).names.get(name.value, ())):
            return f"`{name.value}` is declared global or nonlocal"
        seen.add(binding.node)
        starts = self._starts(binding.value)
        if starts is None:
            return f"`{name.value}` is assigned `{first_line(binding.value)}`, whose keys cannot be seen"
        found = KwargsDict(name.value, statement, starts, [], [])
        for start in starts:
            entries = _literal_entries(start)
            if entries is None:
                return f"`{name.value}` is assigned a dict whose keys cannot all be seen"
            found.entries.extend(Entry(key, value, start) for key, value in entries)
        for read in uses_of(self.model).reads(name.value, home):
            problem = self._take_read(found, read, is_loader, seen)
            if problem:
                return problem
        return found

    def _starts(self, value: Optional[cst.BaseExpression]) -> Optional[list]:
        """The dict literals (or `dict(...)` calls) a value is one of."""
        if isinstance(value, cst.Dict) or (
            isinstance(value, cst.Call) and self.model.is_call_to(value, {"builtins.dict"})
        ):
            return [value]
        if isinstance(value, cst.IfExp):
            body, orelse = self._starts(value.body), self._starts(value.orelse)
            return body + orelse if body is not None and orelse is not None else None
        return None

    def _take_read(self, found: KwargsDict, read: cst.Name, is_loader, seen: set) -> Optional[str]:
        """Record what one read of the dict does; a problem when it is not
        `**name` in a DataLoader call, a change whose keys show, or the
        argument of another dict's `.update(name)`."""
        parent = self.model.parent(read)
        holder = self.model.parent(parent)
        if isinstance(parent, cst.Arg) and parent.star == "**" and isinstance(holder, cst.Call) and is_loader(holder):
            found.loaders.append(holder)
            return None
        if isinstance(parent, cst.Arg) and not parent.star and parent.keyword is None and _is_update(holder):
            if len(holder.args) == 1 and isinstance(self.model.parent(holder), cst.Expr):
                return None  # merged into another dict, unchanged itself
        if isinstance(parent, cst.Attribute) and parent.attr.value == "update" and _is_update(holder):
            if holder.func is parent and isinstance(self.model.parent(holder), cst.Expr):
                return self._take_update(found, holder, is_loader, seen)
        if isinstance(parent, cst.Subscript) and parent.value is read and isinstance(holder, cst.AssignTarget):
            key = _string_index(parent)
            assign = self.model.parent(holder)
            if key is not None and len(assign.targets) == 1:
                found.entries.append(Entry(key, assign.value, always=self._always(found, assign)))
                return None
        statement = first_line(_statement(self.model, read))
        return f"`{found.name}` is also used in `{statement}` (line {self.model.line(read)})"

    def _take_update(self, found: KwargsDict, update: cst.Call, is_loader, seen: set) -> Optional[str]:
        always = self._always(found, update)
        for arg in update.args:
            if arg.star:
                return f"`{found.name}.update(...)` gets a star argument"
            if arg.keyword is not None:
                found.entries.append(Entry(arg.keyword.value, arg.value, always=always))
                continue
            if isinstance(arg.value, cst.Dict):
                entries = _literal_entries(arg.value)
                if entries is None:
                    return f"`{found.name}.update(...)` gets a dict whose keys cannot all be seen"
                found.entries.extend(Entry(key, value, always=always) for key, value in entries)
            elif isinstance(arg.value, cst.Name):
                source = self._dict_of(arg.value, is_loader, seen)
                if isinstance(source, str):
                    return source
                if source.loaders:
                    return f"`{arg.value.value}` is both merged into `{found.name}` and given to a DataLoader"
                found.entries.extend(
                    Entry(e.key, e.value, always=always and e.start is not None) for e in source.entries
                )
            else:
                return f"`{found.name}.update(...)` gets `{first_line(arg.value)}`, whose keys cannot be seen"
        return None

    def _always(self, found: KwargsDict, change: cst.CSTNode) -> bool:
        """Is the change a statement of the block that makes the dict (so it
        runs whenever the dict exists)?"""
        def line_of(node):
            while node is not None and not isinstance(node, cst.SimpleStatementLine):
                node = self.model.parent(node)
            return node

        made, changed = line_of(found.statement), line_of(change)
        return made is not None and changed is not None and self.model.parent(made) is self.model.parent(changed)


def _is_update(call: Optional[cst.CSTNode]) -> bool:
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "update"


def _literal_entries(start: cst.CSTNode) -> Optional[list]:
    """(key, value) of a dict literal with string keys, or of `dict(key=value)`;
    None when a key cannot be seen (`**other`, a computed key)."""
    entries = []
    if isinstance(start, cst.Dict):
        for element in start.elements:
            plain = isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
            key = element.key.evaluated_value if plain else None
            if not isinstance(key, str):
                return None
            entries.append((key, element.value))
        return entries
    for arg in start.args:
        if arg.star or arg.keyword is None:
            return None
        entries.append((arg.keyword.value, arg.value))
    return entries


def _string_index(subscript: cst.Subscript) -> Optional[str]:
    """"key" in `name["key"]`."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    value = subscript.slice[0].slice.value
    key = value.evaluated_value if isinstance(value, cst.SimpleString) else None
    return key if isinstance(key, str) else None


def _statement(model: ScriptModel, node: cst.CSTNode) -> cst.CSTNode:
    """The small statement (or the header's compound statement) around `node`."""
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return ancestor
    return node


def _torch_alias(model: ScriptModel) -> Optional[str]:
    """The name that a module-level `import torch` (or `import torch as th`,
    `import torch.nn`) binds, if any: only a statement of the module's own
    body, which always runs (not one under `if TYPE_CHECKING:` or `try:`)."""
    imports = [
        binding
        for bindings in model.module_scope.bindings.values()
        for binding in bindings
        if binding.kind == "import"
        and binding.qualified == "torch"
        and isinstance(binding.statement, cst.Import)
        and model.parent(model.parent(binding.statement)) is model.module
    ]
    first = min(imports, key=lambda b: model.index.order[b.statement], default=None)
    return first.name if first is not None else None


def _run_at_import(model: ScriptModel) -> set:
    """The functions and classes of the file that module-level code runs,
    directly or through one another. A class that is called counts with every
    method (`Trainer().fit()` runs `fit` too, with or without an `__init__`)."""
    flow = model.flow
    inner: dict = {}  # scope -> the lambdas and comprehensions whose code runs as part of it
    for scope in model.scopes:
        if scope.kind in ("lambda", "comprehension") and scope.parent is not None:
            inner.setdefault(scope.parent, []).append(scope)
    names = set(model.entry.runs_at_import)
    pending: list = [model.module_scope, *(f.scope for f in model.functions if f.name in names)]
    seen: set = set()
    while pending:
        scope = pending.pop()
        if scope in seen:
            continue
        seen.add(scope)
        pending.extend(inner.get(scope, ()))
        if scope.kind == "class":
            pending.extend(
                flow.functions[b.node].scope for bs in scope.bindings.values() for b in bs if b.node in flow.functions
            )
        elif scope.enclosing_class is not None:
            pending.append(scope.enclosing_class)
        for call in scope.calls:
            pending.extend(_called_classes(model, call))
            found = flow.callee(call, scope)
            if found is not None:
                pending.append(found[0].scope)
    return {s.node for s in seen if s.kind in ("function", "class")}


def _called_classes(model: ScriptModel, call: cst.Call) -> list:
    if not isinstance(call.func, cst.Name):
        return []
    return [model.index.scope_by_node[b.node] for b in model.bindings_of(call.func.value, call) if b.kind == "class"]


__all__ = ["Entry", "KwargsDict", "WorkersFacts", "workers_facts"]
