"""The project around a script: the first-party modules it reaches through
its imports (files beside it or in a folder above it, packages, relative
imports; never an installed package), read with `ast` only.

Real training code is a project: `train.py` builds the model and hands it to
`engine.train_one_epoch`, its loaders come from `data.get_loaders(...)`, its
helpers from `utils/`. A careful engineer migrating `train.py` by hand opens
those modules and edits them too; so does the tool: `apply train.py` and
`check train.py` take in each module of the project that the script reaches
and that uses torch (`training_path`), and write the script and its modules
all together or not at all (`ProjectFiles.groups`).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import os
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from accelmigrate.codemods.script.precheck import SourceFacts, facts_of
from accelmigrate.codemods.script.project_facts import NO_FACTS, ProjectFacts
from accelmigrate.codemods.script.vocabulary import DEVICE_PARAMETER_NAMES, LOG_LEVELS, OPTIMIZER_BASES, makes_optimizer
from accelmigrate.files.notebook import NotebookError, is_notebook, parse_notebook
from accelmigrate.files.sources import excluded
from accelmigrate.project.training_loops import (
    evaluating_functions, file_writers, handed_loader_classes, handed_loops as handed_loops_in, iterated_by_own_loops,
    loader_classes, loader_source, loop_functions, loop_precision, pads_time_first, returned_loader,
)

# Folders above the script searched for an imported module's file: a script
# in `tools/` or `src/pkg/` imports from the project's root.
PARENT_LEVELS = 3
# How far through the project's imports modules are followed, and how many
# of them are read at most (each costs one `ast.parse`).
MAX_DEPTH = 4
MAX_MODULES = 80
# A module is read only if it is of a size a hand-written module has.
MAX_MODULE_BYTES = 2 * 2**20
# torch's gradient clipping, by the last part of its name.
CLIPPING = frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"})


@dataclasses.dataclass(frozen=True)
class Reached:
    """A module of the project, reached from the script through `via` (an
    import statement of the script) and `depth` imports in all."""

    file: Path
    tree: ast.Module
    facts: SourceFacts
    via: ast.stmt
    module: str  # as the script's import names it (`engine`, `.data`)
    depth: int

    @property
    def trains(self) -> bool:
        """Holds a training step (a backward call) of its own."""
        return bool(self.facts.backward_calls)


def reached_modules(
    tree: ast.Module, script: Path, follow: Callable[[Reached], bool] = lambda _: True, read: Optional[dict] = None
) -> Iterator[Reached]:
    """The modules of the project that `tree` (the code of the file `script`)
    imports, nearest first, then what they import where `follow` says so.
    A module that cannot be read or parsed is left out: it is no evidence.
    `read` keeps the modules read, for the next script of the same run."""
    read = {} if read is None else read
    start = script.resolve()
    seen = {start}
    queue = collections.deque((node, module, file, 1) for node, module, file in _imported_files(tree, start.parent, read))
    while queue and len(seen) < MAX_MODULES:
        node, module, file, depth = queue.popleft()
        if file in seen:
            continue
        seen.add(file)
        parsed = _read_once(file, read)
        if parsed is None:
            continue
        reached = Reached(file, *parsed, node, module, depth)
        yield reached
        if depth < MAX_DEPTH and follow(reached):
            queue.extend((node, module, deeper, depth + 1) for _, _, deeper in _imported_files(reached.tree, file.parent, read))


def facts_of_project(
    path: Path, read: dict, devices: frozenset = frozenset(), trees: Optional[dict] = None, imported: bool = False,
    paired: Optional[dict] = None,
) -> ProjectFacts:
    """What the modules `path` imports tell about it (codemods/script/project_facts.py),
    with `devices`, its device parameters, whether a script of the run
    imports it, and what pairs it with another file of the run (`handoffs`);
    `read` keeps the modules read, for the other files of the run."""
    tree = _script_tree(path, trees)
    if tree is None:
        return NO_FACTS
    gradients, gpu_datasets, evaluating, loggers, optimizers, star_names, reexports = set(), set(), set(), set(), set(), {}, {}
    for node, module, file in _imported_files(tree, path.resolve().parent, read):
        gradients.update(f"{module}.{name}" for name in _names_once(file, read, _gradient_functions))
        loggers.update(_joined(module, name) for name in _names_once(file, read, logger_names))
        gpu_datasets.update(f"{module}.{name}" for name in _names_once(file, read, _gpu_datasets))
        evaluating.update(f"{module}.{name}" for name in _names_once(file, read, evaluating_functions))
        optimizers.update(_joined(module, name) for name in _names_once(file, read, optimizer_classes))
        if _imports_star(node):
            star_names.update(_star_bindings(module, file, read))
        elif isinstance(node, ast.ImportFrom) and module == "." * node.level + (node.module or ""):
            bound = _star_bindings(module, file, read, exported_only=False)
            reexports.update(
                (_joined(module, alias.name), bound[alias.name]) for alias in node.names
                if bound.get(alias.name, "").split(".")[0] not in ("", module.split(".")[0])
            )
    return ProjectFacts(
        gradient_functions=frozenset(gradients), device_parameters=devices, star_names=frozenset(star_names.items()),
        reexports=frozenset(reexports.items()), loggers=frozenset(loggers),
        imported_by_a_script=imported, gpu_datasets=frozenset(gpu_datasets),
        evaluating_functions=frozenset(evaluating), optimizer_classes=frozenset(optimizers), **(paired or {}),
    )


def _writers_in(path: Path, libraries: set, read: dict, trees: Optional[dict]) -> frozenset:
    """The file-writing functions and classes of the helper modules (`libraries`,
    resolved) that `path` imports, as it names them."""
    tree = _script_tree(path, trees)
    return frozenset(
        f"{module}.{name}" for _, module, file in _imported_files(tree, path.resolve().parent, read) if _key(str(file)) in libraries
        for name in _names_once(file, read, file_writers)
    )


def handoffs(files: Sequence[str], read: dict, trees: Optional[dict] = None) -> dict[str, dict[str, frozenset]]:
    """For each file of the run (resolved path), the facts that pair it with
    another (accelmigrate/project/training_loops.py reads them): the loop functions
    of the modules it imports that it hands its trained model and a loader
    (`training_loops`), its own functions a file of the run hands them to
    (`received_loops`), the functions of the project whose DataLoader it
    hands such a loop (`sharded_loaders`), its own functions that build
    that DataLoader (`built_loaders`), and the classes that train on a
    DataLoader it builds and hands them (`loader_classes`, and
    `received_loader_classes` for the class's module)."""
    found: dict[str, dict[str, set]] = collections.defaultdict(lambda: collections.defaultdict(set))
    run = {_key(path) for path in files}  # a module left out of the run is no partner: it stays as it is
    for path in files:
        tree = _script_tree(Path(path), trees)
        modules = {
            module: file for _, module, file in _imported_files(tree, Path(path).resolve().parent, read) if _key(str(file)) in run
        }
        functions = {
            f"{module}.{function[0]}": (*function, file)
            for module, file in modules.items() for function in _names_once(file, read, loop_functions)
        }
        loaders = list(iterated_by_own_loops(tree)) if tree is not None else []  # a loop here, over a loader made there
        for own, fact, loader in handed_loops_in(tree, {name: entry[:4] for name, entry in functions.items()}) if functions else ():
            fact = dataclasses.replace(fact, mixed_precision=loop_precision(_module_tree(functions[fact.name][4], read), own))
            found[_key(path)]["training_loops"].add(fact)
            found[_key(str(functions[fact.name][4]))]["received_loops"].add(dataclasses.replace(fact, name=own))
            loaders.append(loader)
        for loader in loaders:
            source = loader_source(tree, loader)
            module, _, function = source[0].rpartition(".") if source is not None else ("", "", "")
            provider = _module_tree(modules[module], read) if module in modules else None
            if provider is not None and returned_loader(provider, function, source[1]):
                found[_key(path)]["sharded_loaders"].add(source)
                found[_key(str(modules[module]))]["built_loaders"].add((function, source[1]))
                if pads_time_first(provider, function, source[1]):
                    found[_key(path)]["time_first_loaders"].add(source)
        classes = {
            f"{module}.{klass[0]}": (*klass, file)
            for module, file in modules.items() for klass in _names_once(file, read, loader_classes)
        }
        for own, fact in handed_loader_classes(tree, {name: entry[:4] for name, entry in classes.items()}) if classes else ():
            found[_key(path)]["loader_classes"].add(fact)
            found[_key(str(classes[fact.name][4]))]["received_loader_classes"].add(dataclasses.replace(fact, name=own))
    return {key: {name: frozenset(values) for name, values in facts.items()} for key, facts in found.items()}


def device_parameters(files: Sequence[str], read: dict, trees: Optional[dict] = None) -> dict[str, frozenset]:
    """For each module (resolved path) of the project, its functions'
    parameters named as a device (`fit.device`) that every call in `files`
    passes a device, as the calling file's script model reads it."""
    verdicts: dict[tuple[str, str], list[bool]] = collections.defaultdict(list)
    for path in files:
        tree = _script_tree(Path(path), trees)
        candidates = _device_taking_functions(tree, Path(path), read) if tree is not None else {}
        called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "") for node in ast.walk(tree) if isinstance(node, ast.Call)} if candidates else set()
        if any(name.rpartition(".")[2] in called for name in candidates):
            for key, passed in _devices_passed(Path(path), candidates):
                verdicts[key].append(passed)
    found: dict[str, set] = collections.defaultdict(set)
    for (file, parameter), passed in verdicts.items():
        if all(passed):
            found[file].add(parameter)
    return {file: frozenset(parameters) for file, parameters in found.items()}


def _device_taking_functions(tree: ast.Module, path: Path, read: dict) -> dict[str, tuple[str, list[str]]]:
    """`module.function` as this file names it -> (the module's file, the
    function's positional parameters), for the functions of the modules it
    imports that take a parameter named as a device."""
    found = {}
    for _, module, file in _imported_files(tree, path.resolve().parent, read):
        for node in getattr(_module_tree(file, read), "body", ()):
            if isinstance(node, ast.FunctionDef):
                parameters = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
                if DEVICE_PARAMETER_NAMES & {*parameters, *(a.arg for a in node.args.kwonlyargs)}:
                    found[f"{module}.{node.name}"] = (str(file), parameters)
    return found


def _devices_passed(path: Path, candidates: dict) -> Iterator[tuple[tuple[str, str], bool]]:
    """((module file, `function.parameter`), whether a device is passed) for
    each device parameter at each call of a candidate in the file."""
    import libcst as cst  # only for a file that calls such a function

    from accelmigrate.codemods._syntax import has_star_args, walk
    from accelmigrate.codemods.script import ScriptModel

    try:
        text = path.read_text(encoding="utf-8-sig")
        script = ScriptModel.of(cst.parse_module(parse_notebook(text, str(path)).source if is_notebook(str(path)) else text))
    except Exception:  # a file LibCST cannot read: its calls are no evidence either way
        return
    for call in walk(script.module):
        if not isinstance(call, cst.Call):
            continue
        for name in script.qualified_names(call.func) & candidates.keys():
            file, parameters = candidates[name]
            function = name.rpartition(".")[2]
            keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            for parameter in DEVICE_PARAMETER_NAMES & {*parameters, *keywords}:
                index = parameters.index(parameter) if parameter in parameters else len(positional)
                value = keywords.get(parameter, positional[index] if index < len(positional) else None)
                passed = value is not None and not has_star_args(call) and script.holds_device(value, call)
                yield (file, f"{function}.{parameter}"), passed


def _module_tree(file: Path, read: dict) -> Optional[ast.Module]:
    parsed = _read_once(file, read)
    return parsed[0] if parsed is not None else None


def _read_once(file: Path, read: dict) -> Optional[tuple[ast.Module, SourceFacts]]:
    """`_read(file)`, once per run: `read` keeps what was read."""
    if file not in read:
        read[file] = _read(file)
    return read[file]


def _names_once(file: Path, read: dict, finder: Callable[[ast.Module], Iterator[str]]) -> tuple[str, ...]:
    """The names `finder` yields for the module `file`, once per run."""
    key = (finder.__name__, file)
    if key not in read:
        tree = _module_tree(file, read)
        read[key] = tuple(finder(tree)) if tree is not None else ()
    return read[key]


def _imports_star(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)


def module_bindings(tree: ast.Module) -> Iterator[str]:
    """The names a module binds at its top level, as "name=qualified name":
    its absolute imports (`nn=torch.nn`) and, as "name=", its own definitions."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update((alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names if alias.name != "*")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = ""
        elif isinstance(node, ast.Assign):
            found.update((t.id, "") for t in node.targets if isinstance(t, ast.Name))
    yield from (f"{name}={qualified}" for name, qualified in found.items())


def listed_in_all(tree: ast.Module) -> Iterator[str]:
    """The names of a literal `__all__`; "*" (every public name) without one."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                yield from (e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
                return
    yield "*"


def _star_bindings(module: str, file: Path, read: dict, depth: int = 1, exported_only: bool = True) -> dict[str, str]:
    """Name -> qualified name for what `from <module> import *` binds (or,
    not `exported_only`, what `from <module> import <name>` may), through
    the module's own star imports of the project (`network` does `from
    module import *`, which imports `torch.nn as nn`). A name the module
    defines itself is `<module>.<name>`."""
    found: dict[str, str] = {}
    tree = _module_tree(file, read)
    if tree is not None and depth < MAX_DEPTH:
        for node, inner, inner_file in _imported_files(tree, file.parent, read):
            if _imports_star(node) and inner_file != file:
                found.update(_star_bindings(inner, inner_file, read, depth + 1))
    listed = set(_names_once(file, read, listed_in_all))
    for binding in _names_once(file, read, module_bindings):  # its own come later, and win
        name, _, qualified = binding.partition("=")
        if not exported_only or (name in listed if "*" not in listed else not name.startswith("_")):
            found[name] = qualified or _joined(module, name)
    return found


def logger_names(tree: ast.Module) -> Iterator[str]:
    """The names a module binds at its top level to a logger
    (`logger = logging.getLogger(...)`) or to the logging method of one, or
    of the logging module (`print = logger.info`, `log = logging.info`)."""
    loggers = set()
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value, name = node.value, node.targets[0].id
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "getLogger":
            loggers.add(name)
            yield name
        elif isinstance(value, ast.Attribute) and value.attr in LOG_LEVELS and isinstance(value.value, ast.Name):
            if value.value.id in loggers or value.value.id == "logging":
                yield name


def optimizer_classes(tree: ast.Module) -> Iterator[str]:
    """The module-level classes that derive from torch's `Optimizer`, from an
    optimizer class (`torch.optim.SGD`) or from another such class of the
    module: a LARS, a Muon, a vendored BertAdam."""
    imported = dict(binding.partition("=")[::2] for binding in module_bindings(tree))
    own: set = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_is_optimizer_base(base, imported, own) for base in node.bases):
            own.add(node.name)
            yield node.name


def _is_optimizer_base(base: ast.expr, imported: dict, own: set) -> bool:
    parts = []
    while isinstance(base, ast.Attribute):
        parts.insert(0, base.attr)
        base = base.value
    if not isinstance(base, ast.Name):
        return False
    if not parts and base.id in own:
        return True
    qualified = ".".join([imported.get(base.id) or base.id, *parts])
    return qualified in OPTIMIZER_BASES or makes_optimizer(qualified)


def _joined(module: str, name: str) -> str:
    return f"{module}{name}" if module.endswith(".") else f"{module}.{name}"


def _gradient_functions(tree: ast.Module) -> Iterator[str]:
    """The module-level functions that clip gradients or read a `.grad`
    (other than to clear it or test it against None)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _uses_gradients(node):
            yield node.name


def _uses_gradients(function: ast.AST) -> bool:
    nodes = list(ast.walk(function))
    if not any(isinstance(n, ast.Attribute) and n.attr in ("grad", *CLIPPING) or isinstance(n, ast.Name) and n.id in CLIPPING for n in nodes):
        return False
    parents = {id(child): parent for parent in nodes for child in ast.iter_child_nodes(parent)}
    for node in nodes:
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee in CLIPPING:
                return True
        elif isinstance(node, ast.Attribute) and node.attr == "grad" and isinstance(node.ctx, ast.Load):
            parent = parents.get(id(node))
            clears = isinstance(parent, ast.Attribute) and parent.attr in ("zero_", "detach_", "requires_grad_")
            tested = isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops)
            if not (clears or tested):
                return True
    return False


def _gpu_datasets(tree: ast.Module) -> Iterator[str]:
    """The module-level classes that serve items (`__getitem__`, `__iter__`)
    and put tensors on a GPU somewhere in their code: `.cuda()`, `.to(<a
    device>)`, `device=<a device>` (a "cuda..." string, a name that says
    device, cuda or gpu, or the runtime's `device_at()`/`get_device()`)."""
    for node in tree.body:
        serves = isinstance(node, ast.ClassDef) and any(
            isinstance(f, ast.FunctionDef) and f.name in ("__getitem__", "__iter__") for f in node.body
        )
        if serves and any(isinstance(call, ast.Call) and _places_on_gpu(call) for call in ast.walk(node)):
            yield node.name


def _places_on_gpu(call: ast.Call) -> bool:
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    if method == "cuda":
        return True
    if method == "to" and call.args and _names_a_gpu(call.args[0]):
        return True
    return any(k.arg == "device" and _names_a_gpu(k.value) for k in call.keywords)


def _names_a_gpu(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return isinstance(value.value, str) and value.value.startswith("cuda")
    if isinstance(value, ast.Call):
        value = value.func
    last = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
    return any(word in last.lower() for word in ("device", "cuda", "gpu"))


def _script_tree(script: Path, trees: Optional[dict] = None) -> Optional[ast.Module]:
    """The code of a script or notebook, parsed (once per run with `trees`)."""
    if trees is not None:
        if script not in trees:
            trees[script] = _script_tree(script)
        return trees[script]
    try:
        text = script.read_text(encoding="utf-8-sig")
        return ast.parse(parse_notebook(text, str(script)).source if is_notebook(str(script)) else text)
    except (OSError, UnicodeDecodeError, NotebookError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # reading the script itself reports what is wrong with it


def training_path(script: Path, read: Optional[dict] = None, trees: Optional[dict] = None) -> list[Reached]:
    """The modules of `script`'s project that the migration of `script`
    takes in: those it reaches that use torch (the training loop, the
    loaders, the models, the helpers that save and log), or that place on
    the GPU without importing it (`def to_gpu(*ts): return [t.cuda() for t in ts]`),
    before their migration or after it."""
    tree = _script_tree(script, trees)
    return [m for m in reached_modules(tree, script, read=read) if _computes_with_torch(m.facts)] if tree is not None else []


def _computes_with_torch(facts: SourceFacts) -> bool:
    return (
        facts.imports_torch
        or bool(facts.method_calls.get("cuda"))
        or any(module.startswith("accelmigrate.runtime.") for module in facts.imported_modules)
    )


@dataclasses.dataclass(frozen=True)
class ProjectFiles:
    """The files one run migrates: those named, then the modules of the
    project they reach (each once, however many files reach it)."""

    files: list[str]
    reached_from: dict[str, list[str]]  # a named file -> the modules it brought in
    without_training: frozenset  # the modules brought in that hold no training step
    facts: dict[str, ProjectFacts]  # what the project's other files tell about each file

    @classmethod
    def of(cls, paths: Sequence[str], exclude: Sequence[str] = ()) -> "ProjectFiles":
        known = {_key(path): path for path in paths}
        files, reached_from, without_training = list(paths), {}, set()
        read: dict = {}  # the modules and scripts parsed, each once for the whole run
        trees: dict = {}
        for path in paths:
            if not os.path.isfile(path):
                continue
            for module in training_path(Path(path), read, trees):
                if excluded(module.file, exclude):
                    continue
                shown = known.setdefault(_key(str(module.file)), _shown(module.file))
                reached_from.setdefault(path, []).append(shown)
                if shown not in files:
                    files.append(shown)
                    if not module.trains:
                        without_training.add(shown)
        existing = [path for path in files if os.path.isfile(path)]
        devices = device_parameters(existing, read, trees)
        paired = handoffs(existing, read, trees)
        imported = {_key(module) for modules in reached_from.values() for module in modules}
        libraries = {_key(path) for path in without_training} & imported
        facts = {
            path: facts_of_project(
                Path(path), read, devices.get(_key(path), frozenset()), trees, _key(path) in imported,
                {
                    **paired.get(_key(path), {}), "rank_zero_library": _key(path) in libraries,
                    "rank_zero_writers": _writers_in(Path(path), libraries, read, trees),
                },
            )
            for path in existing
        }
        return cls(files, reached_from, frozenset(without_training), {p: f for p, f in facts.items() if f != NO_FACTS})

    @functools.cached_property
    def covered(self) -> frozenset:
        """The files of the run, resolved."""
        return frozenset(Path(_key(path)) for path in self.files)

    def groups(self) -> list[list[str]]:
        """The files written together or not at all: a named file with the
        modules it reaches, joined where two named files share a module."""
        parent: dict[str, str] = {}

        def root(path: str) -> str:
            while parent.setdefault(path, path) != path:
                path = parent[path]
            return path

        for entry, modules in self.reached_from.items():
            for module in modules:
                parent[root(module)] = root(entry)
        members: dict[str, list[str]] = collections.defaultdict(list)
        for path in self.files:
            members[root(path)].append(path)
        return list(members.values())


def _key(path: str) -> str:
    return os.path.realpath(path)


def _shown(file: Path) -> str:
    """A module's path as the user would write it: relative to the current
    folder where it lies below it."""
    try:
        return str(file.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(file)


def _read(file: Path) -> Optional[tuple[ast.Module, SourceFacts]]:
    try:
        if file.stat().st_size > MAX_MODULE_BYTES:
            return None
        text = file.read_text(encoding="utf-8-sig")
        tree = ast.parse(text)
        return tree, facts_of(tree, text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _imported_files(tree: Optional[ast.Module], folder: Path, read: Optional[dict] = None) -> list[tuple[ast.stmt, str, Path]]:
    """(import statement, module, the module's file) for each import of
    `tree` that names a module of the project; worked out once per tree and
    folder when `read` keeps them."""
    if tree is None:
        return []
    key = ("imports", id(tree), folder)
    if read is not None and key in read:
        return read[key]
    found = []
    for node, module in imports(tree):
        file = _module_file(module, folder) if read is None else _module_file_once(module, folder, read)
        if file is not None:
            found.append((node, module, file))
    if read is not None:
        read[key] = found
    return found


def _module_file_once(module: str, folder: Path, read: dict) -> Optional[Path]:
    key = ("file", module, folder)
    if key not in read:
        read[key] = _module_file(module, folder)
    return read[key]


def imports(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """(statement, module) for each module an import statement names; a
    `from pkg import name` also names `pkg.name`, which may be a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if node.module:
                yield node, base
            for alias in node.names:
                if alias.name != "*":
                    yield node, f"{base}.{alias.name}" if node.module else base + alias.name


def _module_file(module: str, folder: Path) -> Optional[Path]:
    """The file of `module` in the script's project: relative imports from
    the importing file's package, absolute ones from its folder or a folder
    up to PARENT_LEVELS above it, or the `src/` folder of one of those (a
    package laid out under `src/`, put on the path by installing it)."""
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    if not parts:
        return None
    if level:
        ancestors = [folder, *folder.parents]
        bases = [ancestors[level - 1]] if level - 1 < len(ancestors) else []
    else:
        bases = [folder, *list(folder.parents)[:PARENT_LEVELS]]
        bases += [base / "src" for base in bases if base.name != "src"]
    for base in bases:
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file() and not _installed(candidate):
                return candidate.resolve()
    return None


def _installed(file: Path) -> bool:
    """An installed package (a virtual environment beside the script) is not the project."""
    return any(part in ("site-packages", "dist-packages") for part in file.parts)
