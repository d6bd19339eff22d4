"""main-guard: the code a flat script runs moves under `if __name__ == "__main__":`.

What it does
    In a script that trains, starts processes or goes through a DataLoader
    while the file is being imported (flat module-level code, or a bare
    `main()` call at the bottom), every module-level statement that runs the
    script moves under `if __name__ == "__main__":`. What a process that
    imports the file needs stays at module level:

    - imports, functions, classes, the docstring, `try: import ...` blocks;
    - constants: names bound to a value that is cheap to compute and changes
      nothing (literals and their containers, arithmetic and conditions over
      constants, names of imports, functions, classes and other constants,
      `lambda`, and calls of a short list of functions that only compute a
      value: `torch.device`, `torch.cuda.is_available`, torchvision
      transforms, `os.path.*`, `os.environ.get`, `pathlib.Path`,
      `functools.partial`, `logging.getLogger`, builtins such as `int`,
      `range`, `dict`), and `if`/`try` blocks of such definitions.
      `device = torch.device("cuda" if torch.cuda.is_available() else
      "cpu")` is a constant; so is a value read from `sys.argv` or the
      environment, which spawned processes inherit. A model, a dataset, an
      optimizer, a file or a writer, `args = parser.parse_args()`, a random
      draw, and anything computed from them are not;
    - process set-up that later imports (and spawned processes) depend on:
      `sys.path` changes, `os.environ` writes, `warnings` filters,
      `matplotlib.use(...)`.

    The guard is a module-level `if`, not a `main()` function, so the names
    it binds stay module globals that the script's functions keep reading.

Order
    `python script.py` runs the same statements in the same order as before.
    A definition that comes after moved code goes above it when neither
    depends on the other (it reads, at import, nothing the moved code sets;
    the moved code neither reads nor sets the name it binds; an import is
    not moved across code that changes `sys.path`, `os.environ`, the working
    folder or warning filters); the usual script then reads: imports and
    definitions, then one guard at the bottom. Where a definition must stay
    after the code above it, that code gets a guard of its own where it
    stands, and the code after the definition another. Set-up statements
    never move. Comments move with the statement below them; moved lines are
    only re-indented (with tabs in a file indented with tabs).

Why
    DataLoader worker processes that are spawned rather than forked (macOS,
    Windows, and Linux from Python 3.14, whose default is forkserver), the
    processes of `mp.spawn` and multiprocessing pools import the main file
    again. Without the guard each of them re-runs the training, or fails
    starting processes of its own while it is still starting. The `workers`
    codemod adds worker processes only to a file with a guard (else AM104).

Example
    Before::

        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        model = Net()

        def train(epoch):
            for x, y in loader:
                ...

        for epoch in range(10):
            train(epoch)

    After::

        import torch
        from torch.utils.data import DataLoader

        def train(epoch):
            for x, y in loader:
                ...

        if __name__ == "__main__":
            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            model = Net()

            for epoch in range(10):
                train(epoch)

Left alone
    - A file whose import only defines things, or only builds loaders
      without going through them (a data module others import with
      `from data import train_loader`: moving the loader would break them).
    - A file that has a guard already. When module-level code outside it
      still trains, starts processes or goes through a loader: AM123, move
      that code into the guard by hand.
    - AM121: a definition that reads, while the file is imported (a default
      argument, a decorator, a base class, a class body, an annotation), a
      name that only the moved code sets: importing the file would fail.
      The file stays unchanged; make the definition read it at call time
      (e.g. a default of None resolved in the function) and migrate again.
    - AM122: a dataset class, or a function handed to a DataLoader or a
      dataset (`collate_fn`, a transform), that reads a module variable only
      the moved code sets, or that is defined inside such code: worker
      processes would not find it. Pass the value in (e.g. to the dataset's
      constructor), then migrate again.
    `# accelmigrate: skip[AM120]` on the first statement to move keeps the
    file as it is.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Iterator, Optional, Sequence

import libcst as cst

from ._base import Codemod, dotted_name, is_main_guard, walk
from .script import ScriptModel
from .script import vocabulary as v
from .script.scopes import Binding, children

# Calls that start processes which import the main file again.
PROCESS_STARTERS = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
        "torch.multiprocessing.spawn.start_processes",
        "torch.multiprocessing.Process",
        "torch.multiprocessing.Pool",
        "torch.multiprocessing.get_context",
        "multiprocessing.Process",
        "multiprocessing.Pool",
        "multiprocessing.get_context",
        "multiprocessing.pool.Pool",
        "multiprocessing.context.Process",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
    }
)

# Calls that only compute a value from their arguments, cheaply: a constant
# made with them may stay at module level.
PURE_CALLS = frozenset(
    {
        "torch.device",
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.backends.mps.is_available",
        "torch.Size",
        "os.getenv",
        "os.environ.get",
        "os.getcwd",
        "os.cpu_count",
        "pathlib.Path",
        "pathlib.PurePath",
        "functools.partial",
        "collections.namedtuple",
        "typing.NamedTuple",
        "typing.TypeVar",
        "logging.getLogger",
        "re.compile",
        "dataclasses.field",
    }
    | {
        f"builtins.{name}"
        for name in (
            "int", "float", "str", "bool", "bytes", "complex", "tuple", "list", "dict", "set", "frozenset", "len",
            "range", "min", "max", "abs", "round", "sorted", "reversed", "zip", "enumerate", "sum", "any", "all",
            "isinstance", "issubclass", "slice", "divmod", "pow", "chr", "ord", "repr", "format", "object",
        )
    }
)  # fmt: skip
# Those of them whose result cannot be changed in place.
IMMUTABLE_RESULTS = frozenset(
    {
        "torch.device", "torch.cuda.is_available", "torch.cuda.device_count", "torch.backends.mps.is_available",
        "torch.Size", "os.getenv", "os.environ.get", "os.getcwd", "os.cpu_count", "pathlib.Path", "pathlib.PurePath",
    }
    | {
        f"builtins.{name}"
        for name in ("int", "float", "str", "bool", "bytes", "complex", "tuple", "frozenset", "len", "range", "abs",
                     "round", "sum", "chr", "ord", "repr", "format", "isinstance", "issubclass", "any", "all")
    }
)  # fmt: skip
PURE_CALL_PREFIXES = ("torchvision.transforms.", "os.path.", "math.")
# Methods that only compute a value from a constant (`Path(__file__).resolve()`, `"{}".format(n)`).
PURE_METHODS = frozenset(
    {
        "resolve", "absolute", "expanduser", "joinpath", "with_suffix", "with_name", "format", "join", "upper",
        "lower", "strip", "split", "replace", "startswith", "endswith", "get", "keys", "values", "items", "copy",
    }
)  # fmt: skip
# Process set-up that later imports (and spawned workers, which import the file) depend on.
SETUP_CALLS = frozenset(
    {
        "sys.path.append",
        "sys.path.insert",
        "sys.path.extend",
        "os.environ.setdefault",
        "os.environ.update",
        "os.putenv",
        "warnings.filterwarnings",
        "warnings.simplefilter",
        "matplotlib.use",
    }
)
# Process state that imports read, or that set-up changes: an import is not
# moved across code that touches it, nor code that reads it across set-up.
PROCESS_STATE = ("sys.path", "sys.modules", "sys.meta_path", "os.environ", "os.chdir", "os.getenv", "os.putenv",
                 "os.getcwd", "importlib", "site.", "warnings.", "matplotlib.use", "matplotlib.rcParams")  # fmt: skip
# Classes whose instances DataLoader workers use (datasets, samplers).
DATA_PREFIXES = ("torch.utils.data.", "torchvision.datasets.", "torchtext.datasets.", "torchaudio.datasets.")
# Calls whose arguments may end up running in the workers (a transform, a collate_fn).
SENT_TO_WORKERS_PREFIXES = (*DATA_PREFIXES, "torchvision.transforms.")
MODULE_DUNDERS = frozenset({"__file__", "__name__", "__doc__", "__spec__", "__package__", "__builtins__"})
LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)
_MAIN_TEST = cst.parse_expression('__name__ == "__main__"')

# Kinds of module-level statements.
DEFINITION = "definition"  # import, def, class, docstring: stays
CONSTANT = "constant"  # a cheap value bound to names: stays
SETUP = "setup"  # process set-up: stays, never moves across other code
RUNS = "runs"  # the script's work: goes under the guard


@dataclasses.dataclass(eq=False)
class Statement:
    """A module-level statement: what kind it is, and the module names it
    binds, mentions, and reads while the file is imported."""

    node: cst.BaseStatement
    kind: str
    binds: frozenset
    mentions: frozenset  # every module name it names, in nested functions too
    reads_at_import: frozenset  # for a definition: decorators, defaults, bases, class body, annotations
    state: frozenset  # the process state it touches (PROCESS_STATE entries)
    imports: bool
    calls: bool


@dataclasses.dataclass
class _Run:
    """Running statements waiting for their guard, and what they do together."""

    statements: list = dataclasses.field(default_factory=list)
    mentions: set = dataclasses.field(default_factory=set)
    changes: set = dataclasses.field(default_factory=set)  # what they bind or may change
    state: set = dataclasses.field(default_factory=set)
    imports: bool = False
    calls: bool = False

    def add(self, statement: Statement, changes: frozenset) -> None:
        self.statements.append(statement)
        self.mentions |= statement.mentions
        self.changes |= changes
        self.state |= statement.state
        self.imports = self.imports or statement.imports
        self.calls = self.calls or statement.calls


class MainGuard(Codemod):
    word = "main-guard"
    summary = 'flat scripts: the code that runs at import goes under `if __name__ == "__main__":` (spawned workers re-import the file)'
    codes = {
        "AM120": 'code that runs the script moved under `if __name__ == "__main__":`',
        "AM121": "a definition reads, while the file is imported, a name that only the script's code sets",
        "AM122": "code that DataLoader workers run reads a module variable that only the script's code sets",
        "AM123": 'code outside the `if __name__ == "__main__":` block trains, starts processes or goes through a loader',
    }
    triggers = ("DataLoader", "backward", "spawn", "Process", "Pool", "start_processes")
    METADATA_DEPENDENCIES = ()  # the script model resolves the names

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._body: Optional[list[cst.BaseStatement]] = None

    def visit_Module(self, node: cst.Module) -> bool:
        self._body = self._migrated_body(FlatScript(node, ScriptModel.of(self.context.wrapper)))
        return False  # nothing below the module is rewritten on its own

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node if self._body is None else updated_node.with_changes(body=self._body)

    def _migrated_body(self, script: "FlatScript") -> Optional[list[cst.BaseStatement]]:
        work = [(s, script.work_of(s)) for s in script.statements if s.kind == RUNS]
        work = [(s, what) for s, what in work if what]
        if not work:
            return None
        if script.guards:
            first, what = work[0]
            self.report(first.node, "AM123", (
                f"this module-level code runs outside the `if __name__ == \"__main__\":` block ({what}): processes "
                "that import the file (spawned DataLoader workers, mp.spawn) would run it again; move it into the "
                "block by hand"
            ))
            return None
        problems = [*script.import_time_problems(), *script.worker_problems()]
        for node, code, message in problems:
            self.report(node, code, message)
        first = next(s for s in script.statements if s.kind == RUNS)
        if problems or not self.fix(first.node, "AM120", _fix_message(work[0][1])):
            return None
        return script.guarded_body()


def _fix_message(what: str) -> str:
    return (
        f"the code that runs the script now runs under `if __name__ == \"__main__\":` ({what}); imports, "
        "functions, classes and constants stay at module level, so processes that import the file (spawned "
        "DataLoader workers, mp.spawn) no longer run it"
    )


class FlatScript:
    """The module-level statements of a file, sorted into what stays and what
    runs the script, and the guarded layout."""

    def __init__(self, module: cst.Module, script: ScriptModel) -> None:
        self.module = module
        self.script = script
        self.index = script.index
        self.guards = [s for s in module.body if isinstance(s, cst.If) and is_main_guard(s.test)]
        self._top: dict[cst.CSTNode, cst.CSTNode] = {}  # a node's module-level statement, memoised
        self._binders = self._module_binders()
        self._bound_by: dict[cst.CSTNode, set[str]] = {}
        for name, binders in self._binders.items():
            for top, _ in binders:
                self._bound_by.setdefault(top, set()).add(name)
        self._postponed_annotations = _postpones_annotations(module)
        kinds = self._kinds()
        self.statements = [self._statement(s, kinds[s]) for s in module.body if s not in self.guards]
        self._by_node = {s.node: s for s in self.statements}
        self._position = {node: i for i, node in enumerate(module.body)}

    # -- what each statement is ------------------------------------------------------

    def _module_binders(self) -> dict[str, list[tuple[cst.CSTNode, Binding]]]:
        """name -> (module-level statement, binding) for every module-level binding of it."""
        found: dict[str, list] = {}
        for name, bindings in self.index.module_scope.bindings.items():
            if "." not in name:
                found[name] = [(self.top_statement(b.node), b) for b in bindings]
        return found

    def top_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The module-level statement that holds `node`."""
        if node in self._top:
            return self._top[node]
        path = [node]
        current = node
        while (parent := self.index.parent(current)) is not None and not isinstance(parent, cst.Module):
            if parent in self._top:
                current = self._top[parent]
                break
            current = parent
            path.append(current)
        for step in path:
            self._top[step] = current
        return current

    def _kinds(self) -> dict[cst.CSTNode, str]:
        """The kind of every statement. A constant or set-up statement that
        computes something other than a constant becomes RUNS, and so, in
        turn, do those that read what it binds."""
        kinds = {s: self._kind(s) for s in self.module.body if s not in self.guards}
        changed = True
        while changed:
            changed = False
            for statement, kind in kinds.items():
                if kind in (CONSTANT, SETUP) and not all(self._is_constant(e, kinds) for e in self._evaluated(statement)):
                    kinds[statement] = RUNS
                    changed = True
        return kinds

    def _kind(self, statement: cst.CSTNode) -> str:
        """The kind of a statement, if the values it computes are constants."""
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            return DEFINITION
        if isinstance(statement, cst.SimpleStatementLine):
            kinds = {self._small_kind(s) for s in statement.body}
            return next((k for k in (RUNS, SETUP, CONSTANT) if k in kinds), DEFINITION)
        if isinstance(statement, cst.Try) and _only_imports(statement.body):
            return DEFINITION  # `try: import apex / except ImportError: ...`
        if isinstance(statement, (cst.If, cst.Try)):
            inner = {self._kind(s) for suite in _suites_of(statement) for s in _statements_in(suite)}
            return RUNS if inner & {RUNS, SETUP} else CONSTANT
        return RUNS

    def _small_kind(self, small: cst.BaseSmallStatement) -> str:
        if isinstance(small, (cst.Import, cst.ImportFrom, cst.Pass, cst.Global, cst.Nonlocal)):
            return DEFINITION
        if isinstance(small, cst.Expr):
            if isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis)):
                return DEFINITION
            return SETUP if self.index.is_call_to(small.value, SETUP_CALLS) else RUNS
        if isinstance(small, cst.Assign):
            if all(_names_only(t.target) for t in small.targets):
                return CONSTANT
            return SETUP if len(small.targets) == 1 and self._is_environ_item(small.targets[0].target) else RUNS
        if isinstance(small, cst.AnnAssign):
            return CONSTANT if _names_only(small.target) else RUNS
        if isinstance(small, cst.Raise):
            return CONSTANT  # inside a kept `if` or `try`: it stops the import either way
        return RUNS

    def _is_environ_item(self, target: cst.BaseExpression) -> bool:
        return isinstance(target, cst.Subscript) and self.index.is_qualified(target.value, {"os.environ"})

    def _evaluated(self, statement: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """What a constant or set-up statement computes: assigned values, the
        arguments of set-up calls, conditions."""
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    yield small.value
                    for target in (t.target for t in small.targets if self._is_environ_item(t.target)):
                        yield from target.slice
                elif isinstance(small, cst.AnnAssign) and small.value is not None:
                    yield small.value
                elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    yield from (a.value for a in small.value.args)
                elif isinstance(small, cst.Raise) and small.exc is not None:
                    yield small.exc
        elif isinstance(statement, (cst.If, cst.Try)):
            yield from _tests_of(statement)
            for suite in _suites_of(statement):
                for inner in _statements_in(suite):
                    yield from self._evaluated(inner)

    def _is_constant(self, node: cst.CSTNode, kinds: dict) -> bool:
        """A cheap expression that changes nothing, over names no running code binds."""
        if isinstance(node, cst.Name):
            return self._names_a_constant(node, kinds)
        if isinstance(node, cst.Call):
            return self._is_pure_call(node, kinds)
        if isinstance(node, (cst.Attribute, cst.Arg)):
            return self._is_constant(node.value, kinds)
        if isinstance(node, cst.Lambda):
            return all(self._is_constant(p.default, kinds) for p in _parameters(node.params) if p.default is not None)
        if isinstance(node, (cst.Await, cst.Yield, cst.NamedExpr)):
            return False
        return all(self._is_constant(child, kinds) for child in children(node))

    def _names_a_constant(self, name: cst.Name, kinds: dict) -> bool:
        home = self.index.home_of(name.value, self.index.scope_of(name))
        if home is None:
            return name.value in MODULE_DUNDERS or self.index.qualified_names(name) != frozenset()
        if home is not self.index.module_scope:
            return True  # a comprehension's or lambda's own variable
        return all(kinds.get(top) != RUNS for top, _ in self._binders.get(name.value, ()))

    def _is_pure_call(self, call: cst.Call, kinds: dict) -> bool:
        names = self.index.qualified_names(call.func)
        pure = bool(names) and all(n in PURE_CALLS or n.startswith(PURE_CALL_PREFIXES) for n in names)
        if not pure and isinstance(call.func, cst.Attribute) and call.func.attr.value in PURE_METHODS:
            pure = self._is_constant(call.func.value, kinds) and not self._on_own_object(call.func)
        return pure and all(self._is_constant(arg.value, kinds) for arg in call.args)

    def _on_own_object(self, func: cst.Attribute) -> bool:
        """`x.get(...)` where `x` is the file's own object: its method may do anything."""
        root = func
        while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
            root = root.value if not isinstance(root, cst.Call) else root.func
        if not isinstance(root, cst.Name):
            return False
        return any(b.kind in ("def", "class") for _, b in self._binders.get(root.value, ()))

    def _statement(self, node: cst.BaseStatement, kind: str) -> Statement:
        mentions = frozenset(self._module_names(self._names_in(node, at_import=False)))
        return Statement(
            node=node,
            kind=kind,
            binds=frozenset(self._bound_by.get(node, ())),
            mentions=mentions,
            reads_at_import=frozenset(self._module_names(self._names_in(node, at_import=True))),
            state=frozenset(self._state_touched(node)),  # what runs at import: not function bodies
            imports=any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in walk(node, into_definitions=False)),
            calls=any(isinstance(n, cst.Call) for n in walk(node)),
        )

    def _names_in(self, node: cst.CSTNode, at_import: bool) -> Iterator[cst.Name]:
        return _read_names(node, at_import, self._postponed_annotations)

    def _module_names(self, names: Iterable[cst.Name]) -> Iterator[str]:
        module = self.index.module_scope
        for name in names:
            if self.index.home_of(name.value, self.index.scope_of(name)) is module:
                yield name.value

    def _state_touched(self, node: cst.CSTNode) -> Iterator[str]:
        for part in walk(node, into_definitions=False):
            if isinstance(part, (cst.Name, cst.Attribute)):
                for qualified in self.index.qualified_names(part):
                    yield from (state for state in PROCESS_STATE if qualified.startswith(state))

    # -- does the file need a guard? -----------------------------------------------------

    def work_of(self, statement: Statement) -> str:
        """What `statement` (with the file's functions it calls) does that a
        process importing the file must not repeat; "" for nothing."""
        places: list[cst.CSTNode] = [statement.node]
        places += [f.node.body for f in self.script.flow.called_functions([statement.node])]
        found = ""
        for place in places:
            for node in walk(place):
                if not isinstance(node, cst.Call):
                    continue
                if _is_backward(node) or self.index.is_call_to(node, v.AUTOGRAD_BACKWARD):
                    return "it calls `.backward()`"
                if self.index.is_call_to(node, PROCESS_STARTERS):
                    return "it starts processes"
                if not found and self._is_dataloader(node) and self._goes_through(node, statement):
                    found = "it goes through a DataLoader"
        return found

    def _is_dataloader(self, call: cst.Call) -> bool:
        if self.index.is_call_to(call, v.DATALOADER):
            return True
        return (
            isinstance(call.func, cst.Name)
            and call.func.value == "DataLoader"
            and self.index.home_of("DataLoader", self.index.scope_of(call)) is None
            and not v.DATALOADER_MODULES.isdisjoint(self.index.star_imports)
        )

    def _goes_through(self, loader: cst.Call, statement: Statement) -> bool:
        """Is the loader used while the script runs? One built in a function the
        script calls, or used where it is built (`for x in DataLoader(...)`),
        is; one bound to module-level names is when running code reads them.
        (A data module that only builds loaders for others to import is not.)"""
        if self.top_statement(loader) is not statement.node:
            return True
        targets = _assigned_names(statement.node, loader)
        if targets is None:
            return True
        readers = [s for s in self.statements if s.kind == RUNS and s is not statement]
        return any(t in s.mentions for s in readers for t in targets) or not self._read_by_running_functions.isdisjoint(targets)

    @functools.cached_property
    def _read_by_running_functions(self) -> frozenset:
        """The module names that the file's functions called by running code read."""
        functions = self.script.flow.called_functions([s.node for s in self.statements if s.kind == RUNS])
        return frozenset(name for f in functions for name in self._module_names(self._names_in(f.node.body, at_import=False)))

    # -- what would break --------------------------------------------------------------------

    def import_time_problems(self) -> Iterator[tuple[cst.CSTNode, str, str]]:
        """AM121: a statement that stays reads, at import, a name that code
        before it, which moves, sets."""
        moving_before: dict[str, cst.CSTNode] = {}
        for statement in self.statements:
            if statement.kind == RUNS:
                for name in statement.binds:
                    moving_before.setdefault(name, statement.node)
                continue
            needed = sorted(name for name in statement.reads_at_import if name in moving_before)
            if needed:
                name = needed[0]
                yield statement.node, "AM121", (
                    f"{_describe(statement.node)} reads `{name}` while the file is imported (a default argument, "
                    f"decorator, base class, class body or value), and `{name}` is set by code that runs the script "
                    f"(line {self.script.line(moving_before[name])}): under `if __name__ == \"__main__\":` that code "
                    f"would not run when a process imports the file, and the import would fail. Make it read "
                    f"`{name}` when it is called (e.g. a default of None, resolved inside), or pass it in; then "
                    "migrate again"
                )

    def worker_problems(self) -> Iterator[tuple[cst.CSTNode, str, str]]:
        """AM122: code that DataLoader workers run depends on what moves."""
        for definition in self._worker_code():
            top = self._by_node.get(self.top_statement(definition))
            name = definition.name.value
            if top is not None and top.kind == RUNS:
                yield definition, "AM122", (
                    f"`{name}` runs in DataLoader worker processes but is defined inside code that runs the script "
                    f"(line {self.script.line(top.node)}): workers that import the file would not find it once "
                    "that code is under the main guard; define it at module level, then migrate again"
                )
                continue
            for read in sorted(set(self._module_names(self._names_in(definition, at_import=False)))):
                setter = next((t for t, _ in self._binders.get(read, ()) if self._by_node.get(t) and self._by_node[t].kind == RUNS), None)
                if setter is not None:
                    yield definition, "AM122", (
                        f"`{name}` runs in DataLoader worker processes and reads the module variable `{read}`, set "
                        f"by code that runs the script (line {self.script.line(setter)}): under the main guard "
                        f"workers that import the file would not have it; pass `{read}` in (e.g. to the "
                        "constructor) instead, then migrate again"
                    )
                    break

    def _worker_code(self) -> list[cst.CSTNode]:
        """The file's classes and functions that may run in DataLoader
        workers: dataset and sampler classes, what is handed to a loader,
        a dataset or a transform, and what those call."""
        classes = [s.node for s in self.index.scopes if s.kind == "class"]
        found: dict[cst.CSTNode, None] = {}
        changed = True
        while changed:
            changed = False
            for cls in classes:
                if cls not in found and any(self._is_data_base(base.value, found) for base in cls.bases):
                    found[cls] = None
                    changed = True
        for scope in self.index.scopes:
            for call in scope.calls:
                if self._sends_to_workers(call, found):
                    for arg in call.args:
                        found.update(dict.fromkeys(self._definitions_handed_over(arg.value)))
        pending = list(found)
        while pending:
            for call in (n for n in walk(pending.pop()) if isinstance(n, cst.Call)):
                callee = self.script.flow.callee(call, self.index.scope_of(call))
                if callee is not None and callee[0].node not in found:
                    found[callee[0].node] = None
                    pending.append(callee[0].node)
        return sorted(found, key=lambda d: self.index.order.get(d, 0))

    def _is_data_base(self, base: cst.BaseExpression, data_classes: dict) -> bool:
        if any(q.startswith(DATA_PREFIXES) for q in self.index.qualified_names(base)):
            return True
        return any(d in data_classes for d in self._definitions_named(base))

    def _sends_to_workers(self, call: cst.Call, data_classes: dict) -> bool:
        if self._is_dataloader(call):
            return True
        if any(q.startswith(SENT_TO_WORKERS_PREFIXES) for q in self.index.qualified_names(call.func)):
            return True
        return any(d in data_classes for d in self._definitions_named(call.func))

    def _definitions_handed_over(self, value: cst.BaseExpression) -> Iterator[cst.CSTNode]:
        """The file's functions and classes an argument hands over: named
        (`collate_fn=pad`), instantiated (`MyData(...)`), or bound to the name
        passed (`train_set = MyData(...)`)."""
        for name in self._names_in(value, at_import=True):
            yield from self._definitions_named(name)
            for binding in self.index.bindings_of(name.value, self.index.scope_of(name)):
                if isinstance(binding.value, cst.Call):
                    yield from (d for d in self._definitions_named(binding.value.func) if isinstance(d, cst.ClassDef))

    def _definitions_named(self, expression: cst.BaseExpression) -> list[cst.CSTNode]:
        if not isinstance(expression, cst.Name):
            return []
        bindings = self.index.bindings_of(expression.value, self.index.scope_of(expression))
        return [b.node for b in bindings if b.kind in ("def", "class")]

    # -- the new layout ------------------------------------------------------------------------

    def guarded_body(self) -> list[cst.BaseStatement]:
        """The module body with the running statements under guards: a
        statement that stays goes above the running code before it when the
        two are independent; else that code is guarded where it stands."""
        body: list[cst.BaseStatement] = []
        pending = _Run()
        for statement in self.statements:
            if statement.kind == RUNS:
                pending.add(statement, self._may_change(statement))
                continue
            moved_up = bool(pending.statements)
            if moved_up and (statement.kind == SETUP or not self._independent(statement, pending)):
                body.append(_guard(pending.statements, body[-1] if body else None))
                pending = _Run()
            body.append(_spaced(statement.node, body[-1]) if moved_up and body else statement.node)
        if pending.statements:
            body.append(_guard(pending.statements, body[-1] if body else None))
        return body

    def _independent(self, staying: Statement, running: "_Run") -> bool:
        """Can `staying` run before the running code, which came first, with the same effect?"""
        if staying.reads_at_import & running.changes:
            return False
        for name in staying.binds:
            if self._same_import_again(name, staying):
                continue
            # A name bound before may be read by the functions the running code calls.
            if name in running.mentions or name in running.changes or (running.calls and self._bound_before(name, staying)):
                return False
        if staying.state & running.state or (staying.imports and running.state) or (running.imports and staying.state):
            return False
        return True

    def _may_change(self, running: Statement) -> frozenset:
        """The module names whose value `running` may change: those it binds,
        the mutable ones whose objects it may change (see `_changed_roots`);
        with a call, those the file's functions assign as globals."""
        changed = set(running.binds)
        for name in self._module_names(_changed_roots(running.node)):
            binders = self._binders.get(name, ())
            if binders and not all(self._is_unchangeable(b) for _, b in binders):
                changed.add(name)
        if running.calls:
            changed |= self._assigned_as_globals
        return frozenset(changed)

    def _is_unchangeable(self, binding: Binding) -> bool:
        """Bound by an import, a def or a class, or to an immutable value:
        using it cannot change it (only binding it again can)."""
        if binding.kind in ("import", "def", "class"):
            return True
        return binding.kind == "assign" and binding.value is not None and self._is_immutable(binding.value)

    def _is_immutable(self, value: cst.BaseExpression) -> bool:
        """A number, string, bool, None, torch.device, path ... or a tuple,
        operation or condition over them; an attribute of a module."""
        if isinstance(value, (*LITERALS, cst.ConcatenatedString, cst.FormattedString)):
            return True
        if isinstance(value, cst.Name):
            return value.value in ("True", "False", "None")
        if isinstance(value, cst.Attribute):
            root = next(_root_name(value), None)
            return root is not None and all(b.kind == "import" for b in self.index.bindings_of(root.value, self.index.scope_of(root)))
        if isinstance(value, cst.Call):
            names = self.index.qualified_names(value.func)
            return bool(names) and all(n in IMMUTABLE_RESULTS or n.startswith(("os.path.", "math.")) for n in names)
        if isinstance(value, cst.Tuple):
            return all(self._is_immutable(e.value) for e in value.elements)
        if isinstance(value, cst.IfExp):
            return self._is_immutable(value.body) and self._is_immutable(value.orelse)
        if isinstance(value, cst.BinaryOperation):
            return self._is_immutable(value.left) and self._is_immutable(value.right)
        if isinstance(value, cst.UnaryOperation):
            return self._is_immutable(value.expression)
        if isinstance(value, cst.BooleanOperation):  # one of its operands
            return self._is_immutable(value.left) and self._is_immutable(value.right)
        return isinstance(value, cst.Comparison)

    @functools.cached_property
    def _assigned_as_globals(self) -> frozenset:
        return frozenset(name for scope in self.index.scopes if scope.kind == "function" for name in scope.declared_global)

    def _bound_before(self, name: str, statement: Statement) -> bool:
        position = self._position[statement.node]
        return any(self._position.get(top, position) < position for top, _ in self._binders.get(name, ()))

    def _same_import_again(self, name: str, staying: Statement) -> bool:
        """`import numpy as np` when np already names numpy: binding it again changes nothing."""
        binders = self._binders.get(name, ())
        mine = [b for top, b in binders if top is staying.node]
        return bool(mine) and all(b.kind == "import" for _, b in binders) and len({b.qualified for _, b in binders}) == 1


# -- statements, by their syntax ------------------------------------------------------------------


def _names_only(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.Name):
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(_names_only(e.value) for e in target.elements)
    return False


def _suites_of(statement: cst.CSTNode) -> list[cst.BaseSuite]:
    """Every branch of an `if` (with its `elif`s and `else`) or a `try`."""
    if isinstance(statement, cst.If):
        suites = [statement.body]
        orelse = statement.orelse
        while orelse is not None:
            suites.append(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
        return suites
    parts = [statement.orelse, statement.finalbody] if isinstance(statement, cst.Try) else []
    return [statement.body, *(h.body for h in statement.handlers), *(p.body for p in parts if p is not None)]


def _statements_in(suite: cst.BaseSuite) -> list[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    return [cst.SimpleStatementLine(body=list(suite.body))]  # `if x: a = 1` on one line


def _tests_of(statement: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """The conditions an `if` evaluates, and the exception types a `try` names."""
    if isinstance(statement, cst.If):
        current: Optional[cst.CSTNode] = statement
        while isinstance(current, cst.If):
            yield current.test
            current = current.orelse
    elif isinstance(statement, cst.Try):
        yield from (h.type for h in statement.handlers if h.type is not None)


def _only_imports(suite: cst.BaseSuite) -> bool:
    lines = suite.body if isinstance(suite, cst.IndentedBlock) else ()
    return bool(lines) and all(
        isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)
        for line in lines
    )


def _assigned_names(statement: cst.CSTNode, value: cst.CSTNode) -> Optional[list[str]]:
    """The names a one-line assignment binds when `value` is in what it assigns; else None."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and all(_names_only(t.target) for t in small.targets):
        targets = [t.target for t in small.targets]
    elif isinstance(small, cst.AnnAssign) and small.value is not None and _names_only(small.target):
        targets = [small.target]
    else:
        return None
    if not any(node is value for node in walk(small.value)):
        return None
    return [n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)]


def _changed_roots(node: cst.CSTNode) -> Iterator[cst.Name]:
    """The names whose objects code may change: a method's receiver
    (`losses.append(x)`), what is passed to a call, assigned into
    (`cfg.lr = x`, `table[k] = x`), deleted, iterated or entered (`with x:`)."""
    for part in walk(node):
        if isinstance(part, cst.Call):
            if isinstance(part.func, cst.Attribute):
                yield from _root_name(part.func.value)
            for arg in part.args:
                yield from _root_name(arg.value)
        elif isinstance(part, cst.AssignTarget) or isinstance(part, (cst.AugAssign, cst.AnnAssign)):
            if isinstance(part.target, (cst.Attribute, cst.Subscript)):
                yield from _root_name(part.target)
        elif isinstance(part, cst.Del):
            yield from _root_name(part.target)
        elif isinstance(part, (cst.For, cst.CompFor)):
            yield from _root_name(part.iter)
        elif isinstance(part, cst.WithItem):
            yield from _root_name(part.item)


def _root_name(expression: cst.BaseExpression) -> Iterator[cst.Name]:
    """`x` of `x`, `x.a.b`, `x[0]`, `x.f()`."""
    while isinstance(expression, (cst.Attribute, cst.Subscript, cst.Call)):
        expression = expression.func if isinstance(expression, cst.Call) else expression.value
    if isinstance(expression, cst.Name):
        yield expression
    elif isinstance(expression, (cst.Tuple, cst.List)):
        for element in expression.elements:
            yield from _root_name(element.value)


def _is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _postpones_annotations(module: cst.Module) -> bool:
    """`from __future__ import annotations`: annotations are not evaluated."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if (
                    isinstance(small, cst.ImportFrom)
                    and small.module is not None
                    and dotted_name(small.module) == "__future__"
                    and not isinstance(small.names, cst.ImportStar)
                    and any(dotted_name(a.name) == "annotations" for a in small.names)
                ):
                    return True
    return False


def _describe(node: cst.CSTNode) -> str:
    if isinstance(node, cst.FunctionDef):
        return f"function `{node.name.value}`"
    if isinstance(node, cst.ClassDef):
        return f"class `{node.name.value}`"
    return "this statement"


def _guard(statements: Sequence[Statement], above: Optional[cst.CSTNode]) -> cst.If:
    """`if __name__ == "__main__":` around `statements`. The blank lines above
    the first one go above the `if` (at least one, two after a function or
    class); its comments stay with it, inside."""
    first = statements[0].node
    leading = list(first.leading_lines)
    blanks = 0
    while blanks < len(leading) and leading[blanks].comment is None:
        blanks += 1
    body = [_without_indented_blank_lines(first.with_changes(leading_lines=leading[blanks:]))]
    body += [_without_indented_blank_lines(s.node) for s in statements[1:]]
    if above is not None:
        blanks = max(blanks, 2 if isinstance(above, (cst.FunctionDef, cst.ClassDef)) else 1)
    return cst.If(test=_MAIN_TEST, body=cst.IndentedBlock(body=body), leading_lines=[cst.EmptyLine()] * blanks)


def _spaced(statement: cst.BaseStatement, above: cst.CSTNode) -> cst.BaseStatement:
    """A statement that now follows a function or class gets the two blank
    lines that separate top-level definitions; one that follows a guard, one."""
    if isinstance(above, (cst.FunctionDef, cst.ClassDef)):
        wanted = 2
    elif isinstance(above, cst.If) and above.test is _MAIN_TEST:
        wanted = 1
    else:
        return statement
    leading = list(statement.leading_lines)
    blanks = next((i for i, line in enumerate(leading) if line.comment is not None), len(leading))
    return statement.with_changes(leading_lines=[cst.EmptyLine()] * max(0, wanted - blanks) + leading)


def _without_indented_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """A module-level statement's blank lines inside the guard: empty (LibCST
    would give them the block's indentation), and one where there were
    several (two blank lines part top-level definitions, not lines of a block)."""
    lines: list[cst.EmptyLine] = []
    for line in statement.leading_lines:
        if line.comment is not None:
            lines.append(line)
        elif not lines or lines[-1].comment is not None:
            lines.append(line.with_changes(indent=False, whitespace=cst.SimpleWhitespace("")))
    return statement.with_changes(leading_lines=lines)


def _read_names(node: cst.CSTNode, at_import: bool, postponed: bool) -> Iterator[cst.Name]:
    """The names `node` reads (and assigns: harmless here). With `at_import`,
    only those evaluated when the statement itself runs: a function's
    decorators, defaults and annotations, a class's bases and body; not the
    bodies of functions and lambdas."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            yield current
            continue
        if isinstance(current, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            continue
        stack.extend(reversed(_read_children(current, at_import, postponed)))


def _read_children(node: cst.CSTNode, at_import: bool, postponed: bool) -> list[cst.CSTNode]:
    if isinstance(node, cst.Attribute):
        return [node.value]
    if isinstance(node, cst.Arg):
        return [node.value]
    if isinstance(node, cst.Param):
        parts = [node.default]
        if not postponed:
            parts.append(node.annotation)
        return [p for p in parts if p is not None]
    if isinstance(node, cst.FunctionDef):
        parts: list = [d.decorator for d in node.decorators]
        parts.append(node.params)
        if node.returns is not None and not postponed:
            parts.append(node.returns)
        if not at_import:
            parts.append(node.body)
        return parts
    if isinstance(node, cst.ClassDef):
        return [*(d.decorator for d in node.decorators), *(a.value for a in (*node.bases, *node.keywords)), node.body]
    if isinstance(node, cst.Lambda):
        return [node.params] if at_import else [node.params, node.body]
    if isinstance(node, cst.Annotation) and postponed:
        return []
    return children(node)


def _parameters(params: cst.Parameters) -> list[cst.Param]:
    stars = [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return [*params.posonly_params, *params.params, *params.kwonly_params, *stars]
