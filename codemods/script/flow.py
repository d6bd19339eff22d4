"""Functions, their call sites in the file, and the entry point.

What a function receives (its parameters) and where it is called from
(with the argument each parameter gets there) is what lets an analysis
follow a model, an optimizer or a device from where it is made into
`def train(args, model, device, train_loader, optimizer, epoch)`. The entry
point says how the script runs: under `if __name__ == "__main__":`, or as
flat module-level code, and which of its functions that code calls.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

import libcst as cst

from .._syntax import code_of, dotted_name, is_docstring, is_main_guard, walk
from .plain_helpers import carried_definition
from .positions import Lines
from .scopes import Index, Scope, parameter_names, positional_parameters


@dataclasses.dataclass(eq=False)
class CallSite:
    """One call of a function of this file: `arguments` maps each parameter
    the call sets to the expression it passes (`*args`/`**kwargs` make it
    incomplete)."""

    call: cst.Call = dataclasses.field(repr=False)
    caller: Scope = dataclasses.field(repr=False)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    arguments: dict = dataclasses.field(default_factory=dict, repr=False)  # parameter -> expression
    complete: bool = True

    @property
    def line(self) -> int:
        return self.lines(self.call)

    def __repr__(self) -> str:
        passed = ", ".join(f"{p}={code_of(e)}" for p, e in self.arguments.items())
        return f"CallSite(line {self.line} in {self.caller.name}: {passed}{'' if self.complete else ', ...'})"


@dataclasses.dataclass(eq=False)
class Function:
    """A function or method of the file: what it receives, who calls it."""

    name: str  # qualified: "train", "Trainer.fit"
    node: cst.FunctionDef = dataclasses.field(repr=False)
    scope: Scope = dataclasses.field(repr=False)
    parameters: list
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    owner: Optional[str] = None  # the class of a method
    callers: list = dataclasses.field(default_factory=list)

    @property
    def line(self) -> int:
        return self.lines(self.node)

    @property
    def is_method(self) -> bool:
        """Called on an instance: the first parameter is the instance."""
        return self.owner is not None and not _is_static(self)


@dataclasses.dataclass(eq=False)
class EntryPoint:
    """How the script runs. `main_guard`: the module-level
    `if __name__ == "__main__":`; `flat`: the module-level statements that do
    work when the file is imported (calls, loops, `with`; not imports,
    definitions, docstrings, or assignments that call nothing); `runs_at_import`:
    the file's functions and classes that module-level code calls, directly
    or through one another."""

    main_guard: Optional[cst.If] = dataclasses.field(repr=False)
    flat: list = dataclasses.field(repr=False)
    called_from_guard: list  # names of the file's functions called under the guard
    runs_at_import: list  # names of the file's functions run when the module is imported
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked

    @property
    def guard_line(self) -> Optional[int]:
        return self.lines(self.main_guard) if self.main_guard is not None else None

    @property
    def flat_lines(self) -> list[int]:
        return [self.lines(s) for s in self.flat]

    def __repr__(self) -> str:
        return (
            f"EntryPoint(guard_line={self.guard_line}, flat_lines={self.flat_lines}, "
            f"called_from_guard={self.called_from_guard}, runs_at_import={self.runs_at_import})"
        )

    @property
    def is_flat(self) -> bool:
        """No main guard, and module-level code that does work."""
        return self.main_guard is None and bool(self.flat)


class Flow:
    """Functions and call sites, computed from the index."""

    def __init__(self, index: Index, lines: Lines) -> None:
        self.index = index
        self.lines = lines
        self.functions: dict[cst.FunctionDef, Function] = {}
        self._instance_classes: dict[tuple[str, Scope], Optional[cst.ClassDef]] = {}
        # The runtime's helpers written into the file are the runtime's, not the file's own code.
        own = [scope for scope in index.scopes if not _in_a_carried_definition(scope)]
        for scope in own:
            if scope.kind == "function":
                owner = scope.enclosing_class
                function = Function(
                    scope.name, scope.node, scope, parameter_names(scope.node), lines, owner.name if owner else None
                )
                self.functions[scope.node] = function
        for scope in own:
            for call in scope.calls:
                self._record_call(call, scope)

    # -- resolving callees -------------------------------------------------------------

    def callee(self, call: cst.Call, scope: Scope) -> Optional[tuple[Function, bool]]:
        """The function of this file that `call` runs, and whether it is called
        bound to an instance (a method through `self.`, a class's __init__)."""
        func = call.func
        if isinstance(func, cst.Name):
            for binding in self._reached_definitions(func.value, call, scope):
                if binding.kind == "def" and binding.node in self.functions:
                    return self.functions[binding.node], False
                if binding.kind == "class":
                    init = self.method(binding.node, "__init__")
                    if init is not None:
                        return init, True
            return None
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            klass = self.class_of_instance(func.value, scope)
            if klass is not None:
                found = self.method(klass, func.attr.value)
                return (found, True) if found is not None else None
        return None

    def call_in_callees(self, call: cst.Call, wanted, depth: int = 4) -> Optional[cst.Call]:
        """The first call for which `wanted(call)` holds in the body of the
        function of this file that `call` runs, or of one that function
        calls in turn (`depth` functions deep): a random draw inside the
        gradient penalty a training step calls."""
        return self._call_in_callees(call, wanted, depth, set())

    def _call_in_callees(self, call: cst.Call, wanted, depth: int, seen: set) -> Optional[cst.Call]:
        found = self.callee(call, self.index.scope_of(call))
        if found is None or found[0].node in seen or len(seen) >= depth:
            return None
        seen.add(found[0].node)
        calls = [n for n in walk(found[0].node.body, into_definitions=False) if isinstance(n, cst.Call)]
        hit = next((c for c in calls if wanted(c)), None)
        return hit if hit is not None else next(filter(None, (self._call_in_callees(c, wanted, depth, seen) for c in calls)), None)

    def _reached_definitions(self, name: str, call: cst.Call, scope: Scope) -> list:
        """The definitions of `name` that `call` may run, the one it runs first.
        A name defined twice (a notebook redefines `eval_model`): a call in
        the defining scope runs the latest definition above it; a call from a
        function body, run later, the last one."""
        definitions = self.index.definitions_of(name, scope)
        if len(definitions) < 2:
            return definitions
        order = self.index.order
        above = [d for d in definitions if d.scope is scope and order.get(d.node, 0) < order.get(call, 0)]
        reached = above[-1] if above else definitions[-1] if definitions[-1].scope is not scope else definitions[0]
        return [reached, *(d for d in definitions if d is not reached)]

    def class_of_instance(self, name: cst.Name, scope: Scope) -> Optional[cst.ClassDef]:
        """The file's class that `name` is an instance of: `self` in a method,
        or a name assigned `Cls(...)` (once per name and scope)."""
        key = (name.value, scope)
        if key not in self._instance_classes:
            self._instance_classes[key] = self._find_class_of_instance(name.value, scope)
        return self._instance_classes[key]

    def _find_class_of_instance(self, name: str, scope: Scope) -> Optional[cst.ClassDef]:
        if scope.kind == "function" and scope.enclosing_class is not None:
            params = positional_parameters(scope.node)
            if params and params[0] == name and not _is_static(self.functions[scope.node]):
                return scope.enclosing_class.node
        for binding in self.index.bindings_of(name, scope):
            value = binding.value
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                for made in self.index.definitions_of(value.func.value, binding.scope):
                    if made.kind == "class":
                        return made.node
        return None

    def method(self, klass: cst.ClassDef, name: str) -> Optional[Function]:
        scope = self.index.scope_by_node.get(klass)
        if scope is None:
            return None
        for binding in scope.bindings.get(name, ()):
            if binding.kind == "def":
                return self.functions.get(binding.node)
        return None

    def _record_call(self, call: cst.Call, scope: Scope) -> None:
        found = self.callee(call, scope)
        if found is None:
            return
        function, bound = found
        arguments, complete = _arguments(call, function, bound)
        function.callers.append(CallSite(call, scope, self.lines, arguments, complete))

    def function_of(self, scope: Scope) -> Optional[Function]:
        """The function whose body `scope` is (or is nested in, for lambdas and comprehensions)."""
        current: Optional[Scope] = scope
        while current is not None and current.kind in ("lambda", "comprehension"):
            current = current.parent
        return self.functions.get(current.node) if current is not None and current.kind == "function" else None

    # -- the entry point -------------------------------------------------------------------

    def entry_point(self) -> EntryPoint:
        module = self.index.module
        guard = next((s for s in module.body if isinstance(s, cst.If) and is_main_guard(s.test)), None)
        flat = [s for s in module.body if s is not guard and _does_work(s)]
        from_guard = self.called_functions([guard] if guard is not None else [])
        return EntryPoint(guard, flat, [f.name for f in from_guard], [f.name for f in self.called_functions(flat)], self.lines)

    def called_functions(self, roots: list) -> list[Function]:
        """The file's functions that code in `roots` calls, directly or through
        one another (a class called runs its __init__)."""
        reached: dict[Function, None] = {}
        pending = [(root, self.index.module_scope) for root in roots]
        while pending:
            node, scope = pending.pop()
            for call in walk(node):
                if not isinstance(call, cst.Call):
                    continue
                found = self.callee(call, self.index.scope_of(call))
                if found is not None and found[0] not in reached:
                    reached[found[0]] = None
                    pending.append((found[0].node.body, found[0].scope))
        return list(reached)


def _arguments(call: cst.Call, function: Function, bound: bool) -> tuple[dict, bool]:
    positional = positional_parameters(function.node)
    if bound and positional:
        positional = positional[1:]
    names = set(parameter_names(function.node))
    arguments: dict = {}
    complete = True
    index = 0
    for arg in call.args:
        if arg.star:
            complete = False
        elif arg.keyword is not None:
            if arg.keyword.value in names:
                arguments[arg.keyword.value] = arg.value
        elif index < len(positional):
            arguments[positional[index]] = arg.value
            index += 1
    return arguments, complete


def _is_static(function: Function) -> bool:
    return any(dotted_name(d.decorator) in ("staticmethod", "classmethod") for d in function.node.decorators)


def _does_work(statement: cst.CSTNode) -> bool:
    """A module-level statement that runs something when the file is imported."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or is_docstring(statement):
        return False
    if isinstance(statement, cst.SimpleStatementLine):
        if all(isinstance(s, (cst.Import, cst.ImportFrom, cst.Pass)) for s in statement.body):
            return False
        if all(isinstance(s, (cst.Assign, cst.AnnAssign, cst.Import, cst.ImportFrom)) for s in statement.body):
            return any(isinstance(n, cst.Call) for n in walk(statement))
        return True
    if isinstance(statement, cst.Try) and only_imports(statement):
        return False  # `try: import apex / except ImportError: ...`
    return True


def only_imports(statement: cst.Try) -> bool:
    body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
    return bool(body) and all(
        isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)
        for line in body
    )


def calls_in(node: cst.CSTNode) -> Iterator[cst.Call]:
    return (n for n in walk(node, into_definitions=False) if isinstance(n, cst.Call))


__all__ = ["CallSite", "EntryPoint", "Flow", "Function", "calls_in", "only_imports"]


def _in_a_carried_definition(scope: Scope) -> bool:
    """Whether `scope` is (or is inside) a plain definition of the runtime's
    helpers that the file carries (codemods/script/plain_helpers.py)."""
    while scope.parent is not None and scope.parent.kind != "module":
        scope = scope.parent
    return scope.kind != "module" and carried_definition(scope.node) is not None
