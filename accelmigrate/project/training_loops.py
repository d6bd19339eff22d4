"""The training loops a script hands its model and its loader to, across the
modules of a project, read with `ast` (accelmigrate/project/modules.py reads the
modules): `train.py` builds the model, its optimizer and the training
DataLoader and calls `engine.train_one_epoch(model, train_loader, optimizer,
device)`, whose loop iterates the loader and calls the model before each
backward.

A careful engineer making that project distributed edits both files: the
model is wrapped and the loader sharded in `train.py`, where they are built,
and the loop's output made rank 0's in `engine.py`. These facts let the ddp
codemod do the same: `training_loops` for the script (the call it may treat
as its training step), `received_loops` for the module (the function whose
model arrives wrapped and whose loader arrives sharded).
"""

from __future__ import annotations

import ast
import collections
from typing import Iterator, Optional

from accelmigrate.codemods.script.project_facts import LoaderClass, LoopFunction, argument_of

# Calls that write a file, by their last name (`torch.save`, `np.savez`, `plt.savefig`).
SAVES = frozenset({"save", "savez", "savez_compressed", "savetxt", "savefig"})
# Calls that hand a loop the loader's batches unchanged.
PASS_THROUGH = frozenset({"enumerate", "tqdm", "iter"})
# An autocast's `dtype=torch.<name>`, as the Accelerator's mixed precision.
AUTOCAST_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def loop_functions(tree: ast.Module) -> Iterator[tuple[str, list[str], dict[str, int], str]]:
    """(name, positional parameters, the parameters called as a function in
    the training loop -> their position, the loader parameter) for each
    module-level function whose loop over a parameter calls `backward()`,
    or that hands its own parameters on to such a function of the module
    (`train(model, train_loader, ...)` calling `train_step(model, train_loader, ...)`
    in its epoch loop)."""
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    found = {}
    for node in functions:
        parameters = _parameters(node)
        for loop in ast.walk(node):
            if not (isinstance(loop, ast.For) and _calls_backward(loop)):
                continue
            loader = _iterated_parameter(loop.iter, node, parameters)
            called = {
                call.func.id: parameters.index(call.func.id)
                for call in ast.walk(loop) if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name) and call.func.id in parameters
            }
            if loader is not None and called:
                found[node.name] = (node.name, parameters, called, loader)
                break
    for _ in range(2):  # a function that hands its parameters on, and one that hands them to that one
        for node in functions:
            if node.name not in found:
                delegated = _handed_on(node, found)
                if delegated is not None:
                    found[node.name] = delegated
    yield from found.values()


def loop_precision(tree: ast.Module, name: str) -> str:
    """The mixed precision that the loop function `name` of `tree`, and the
    module's functions it calls, train in, as their autocast blocks say
    ("fp16", "bf16"; "?" where a dtype cannot be read or two differ; "" for none)."""
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    seen, pending, found = set(), [name], set()
    while pending:
        current = pending.pop()
        if current in seen or current not in functions:
            continue
        seen.add(current)
        for call in ast.walk(functions[current]):
            if not isinstance(call, ast.Call):
                continue
            if getattr(call.func, "attr", getattr(call.func, "id", "")) == "autocast":
                dtype = next((k.value for k in call.keywords if k.arg == "dtype"), None)
                found.add("fp16" if dtype is None else AUTOCAST_DTYPES.get(getattr(dtype, "attr", ""), "?"))
            elif isinstance(call.func, ast.Name):
                pending.append(call.func.id)
    return found.pop() if len(found) == 1 else ("?" if found else "")


def _parameters(function: ast.FunctionDef) -> list[str]:
    return [a.arg for a in [*function.args.posonlyargs, *function.args.args]]


def _handed_on(function: ast.FunctionDef, loops: dict) -> Optional[tuple[str, list[str], dict[str, int], str]]:
    """`function` as a loop function, where it calls one of `loops` with its
    own parameters (never rebound) as that one's model and loader."""
    parameters = _parameters(function)
    stored = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for call in ast.walk(function):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in loops):
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        _, inner, called, loader = loops[call.func.id]
        passed = [(None, a) for a in call.args] + [(k.arg, k.value) for k in call.keywords]
        handed = {}  # each parameter called in the loop that this function hands one of its own (the model, the criterion)
        for model, index in called.items():
            fact = LoopFunction(call.func.id, model, index, loader, inner.index(loader))
            model_arg, loader_arg = fact.argument(passed, "model"), fact.argument(passed, "loader")
            names = [getattr(model_arg, "id", None), getattr(loader_arg, "id", None)]
            if all(name in parameters and name not in stored for name in names):
                handed[names[0]] = (parameters.index(names[0]), names[1])
        if handed:
            return function.name, parameters, {name: index for name, (index, _) in handed.items()}, next(iter(handed.values()))[1]
    return None


def loader_classes(tree: ast.Module) -> Iterator[tuple[str, list[str], str, str]]:
    """(class, its constructor's parameters after `self`, the loader
    parameter, the attribute that keeps it) for each module-level class
    whose method loops over `self.<attribute>` (directly, or through
    `enumerate`/`tqdm`) calling `backward()`, the attribute bound once, in
    `__init__`, to a parameter."""
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        parameters = _parameters(init)[1:] if init is not None else []
        kept = _attributes_bound(node)
        for loop in ast.walk(node):
            if not (isinstance(loop, ast.For) and _calls_backward(loop)):
                continue
            attribute = _iterated_attribute(loop.iter)
            parameter = kept.get(attribute)
            if parameter in parameters:
                yield node.name, parameters, parameter, attribute
                break


def _attributes_bound(klass: ast.ClassDef) -> dict[str, str]:
    """`self.<attribute>` -> the `__init__` parameter it is bound to, for the
    attributes the class binds once, there, to a parameter."""
    stores = collections.Counter(
        node.attr for node in ast.walk(klass)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", "") == "self"
    )
    init = next((f for f in klass.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    return {
        node.targets[0].attr: node.value.id for node in (init.body if init is not None else ())
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
        and getattr(node.targets[0].value, "id", "") == "self" and isinstance(node.value, ast.Name)
        and stores[node.targets[0].attr] == 1
    }


def _iterated_attribute(iterable: ast.expr) -> Optional[str]:
    while isinstance(iterable, ast.Call) and getattr(iterable.func, "id", getattr(iterable.func, "attr", "")) in PASS_THROUGH and iterable.args:
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Attribute) and getattr(iterable.value, "id", "") == "self":
        return iterable.attr
    return None


def handed_loader_classes(tree: ast.Module, classes: dict[str, tuple]) -> Iterator[tuple[str, LoaderClass]]:
    """(the class's own name, the fact as this file names it) for each call
    in `tree` of one of `classes` (`module.Class` as this file names it ->
    `loader_classes`' entry) that hands it a name bound here, once, to a
    `DataLoader(...)`."""
    for name, passed in _calls_of(tree, classes):
        own, parameters, loader, attribute = classes[name]
        fact = LoaderClass(name, loader, parameters.index(loader), attribute)
        argument = argument_of(passed, loader, fact.loader_index)
        if isinstance(argument, ast.Name) and _bound_to_a_loader(tree, argument.id):
            yield own, fact


def _calls_of(tree: ast.Module, known: dict) -> Iterator[tuple[str, list]]:
    """(the name as `tree` names it, its (keyword or None, value) arguments)
    for each call in `tree` of one of `known`, without `*`/`**` arguments."""
    names = _imported_names(tree)
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        name = _resolved(call.func, names)
        if name in known:
            yield name, [(None, a) for a in call.args] + [(k.arg, k.value) for k in call.keywords]


def _bound_to_a_loader(tree: ast.Module, name: str) -> bool:
    values = [
        n.value for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
    ]
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)]
    return len(values) == len(stores) == 1 and _makes_loader(values[0])


def evaluating_functions(tree: ast.Module) -> Iterator[str]:
    """The module-level functions that call no `backward()`, nor call a
    function of the module that does."""
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    training = {name for name, node in functions.items() if _calls_backward(node)}
    for _ in range(len(functions)):
        more = {name for name, node in functions.items() if name not in training and _calls_any(node, training)}
        if not more:
            break
        training |= more
    yield from (name for name in functions if name not in training)


def file_writers(tree: ast.Module) -> Iterator[str]:
    """The module-level functions and classes that write a file: a
    `torch.save`/`numpy.save`/`savefig`, or an `open(...)` to write."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and any(_writes(call) for call in ast.walk(node)):
            yield node.name


def _writes(call: ast.AST) -> bool:
    if not isinstance(call, ast.Call):
        return False
    name = getattr(call.func, "attr", getattr(call.func, "id", ""))
    if name in SAVES:
        return True
    if name != "open":
        return False
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax"))


def _calls_any(function: ast.AST, names: set) -> bool:
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names for call in ast.walk(function))


def _calls_backward(loop: ast.AST) -> bool:
    return any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "backward"
        for statement in loop.body for call in ast.walk(statement)
    )


def _iterated_parameter(iterable: ast.expr, function: ast.FunctionDef, parameters: list[str], depth: int = 0) -> Optional[str]:
    """The parameter whose batches `iterable` yields: itself, through
    `enumerate`/`tqdm`, or a name the function binds once to such a call."""
    if depth > 3:
        return None
    if isinstance(iterable, ast.Call) and getattr(iterable.func, "id", getattr(iterable.func, "attr", "")) in PASS_THROUGH and iterable.args:
        return _iterated_parameter(iterable.args[0], function, parameters, depth + 1)
    if not isinstance(iterable, ast.Name):
        return None
    if iterable.id in parameters:
        rebound = any(
            isinstance(n, ast.Name) and n.id == iterable.id and isinstance(n.ctx, ast.Store) for n in ast.walk(function)
        )
        return None if rebound else iterable.id
    values = [
        n.value for n in ast.walk(function)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == iterable.id
    ]
    return _iterated_parameter(values[0], function, parameters, depth + 1) if len(values) == 1 else None


def handed_loops(tree: ast.Module, functions: dict[str, tuple]) -> Iterator[tuple[str, LoopFunction, ast.expr]]:
    """(the module function's own name, the fact as this file names it, the
    loader argument) for each call in `tree` of one of `functions`
    (`module.function` as this file names it -> `loop_functions`' entry)
    that passes a model whose parameters this file trains
    (`model.parameters()` read here) and a loader for the loop's loader
    parameter."""
    trained = {
        node.func.value.id for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("parameters", "named_parameters") and isinstance(node.func.value, ast.Name)
    }
    for name, passed in _calls_of(tree, functions):
        own, parameters, called, loader = functions[name]
        for model, index in called.items():
            fact = LoopFunction(name, model, index, loader, parameters.index(loader))
            argument, loader_argument = fact.argument(passed, "model"), fact.argument(passed, "loader")
            if isinstance(argument, ast.Name) and argument.id in trained and loader_argument is not None:
                yield own, fact, loader_argument
                break


def iterated_by_own_loops(tree: ast.Module) -> Iterator[ast.Name]:
    """The plain names that the file's own training loops iterate (a `for` whose body calls a backward), through
    `enumerate`/`tqdm`: `for x, y in train_loader:` of a loader another module's function returns."""
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _calls_backward(node):
            iterable = node.iter
            while isinstance(iterable, ast.Call) and getattr(iterable.func, "id", getattr(iterable.func, "attr", "")) in PASS_THROUGH and iterable.args:
                iterable = iterable.args[0]
            if isinstance(iterable, ast.Name):
                yield iterable


def loader_source(tree: ast.Module, loader: ast.expr) -> Optional[tuple[str, int]]:
    """(the function as this file names it, the position of its result) that
    the name `loader` is bound to, once, in `tree`: `train_loader, val_loader
    = data.get_loaders(...)` gives (`data.get_loaders`, 0); a single result is
    position -1."""
    if not isinstance(loader, ast.Name):
        return None
    found, stores = [], 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == loader.id:
                found.append((node.value, -1))
            elif isinstance(target, ast.Tuple):
                found += [(node.value, i) for i, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == loader.id]
        elif isinstance(node, ast.Name) and node.id == loader.id and isinstance(node.ctx, ast.Store):
            stores += 1  # bound otherwise too (a loop, a `with`), the assignment says too little
    names = _imported_names(tree)
    if len(found) != 1 or stores != 1:
        return None
    call, index = found[0]
    name = _resolved(call.func, names)
    return (name, index) if name is not None else None


def returned_loader(tree: ast.Module, function: str, index: int) -> bool:
    """`function` of the module returns, at `index` of every return (-1: the
    whole value), a name it binds once to a `DataLoader(...)`."""
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return)] if node is not None else []
    if not returns:
        return False
    for value in returns:
        if index >= 0:
            value = value.elts[index] if isinstance(value, ast.Tuple) and index < len(value.elts) else None
        if not isinstance(value, ast.Name):
            return False
        bound = [
            n.value for n in ast.walk(node)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == value.id
        ]
        stored = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == value.id and isinstance(n.ctx, ast.Store)]
        if len(bound) != 1 or len(stored) != 1 or not _makes_loader(bound[0]):
            return False
    return True


def pads_time_first(tree: ast.Module, function: str, index: int) -> bool:
    """The DataLoader that `function` of the module returns (at `index`, as `returned_loader` reads it) is given a
    collate function of the module (a def, the closure a factory of the module returns, a lambda) that pads its
    sequences time-first: `pad_sequence(...)` without `batch_first=True`."""
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return)] if node is not None else []
    names = {(v.elts[index] if index >= 0 and isinstance(v, ast.Tuple) and index < len(v.elts) else v) for v in returns}
    loaders = [
        n.value for n in ast.walk(node) if node is not None and isinstance(n, ast.Assign) and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Name) and any(isinstance(name, ast.Name) and name.id == n.targets[0].id for name in names)
        and _makes_loader(n.value)
    ]
    given = [k.value for loader in loaders for k in loader.keywords if k.arg == "collate_fn"]
    defined = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    return any(_pads_time_first(function_node) for value in given for function_node in _functions_behind(value, node, defined))


def _functions_behind(value: ast.expr, within: ast.FunctionDef, defined: dict, depth: int = 0) -> list:
    """The definitions of the module a collate function expression may run: a def (of the module, or nested in
    the function that makes the loader), a lambda, the body of a factory the expression calls."""
    if isinstance(value, ast.Lambda):
        return [value]
    if isinstance(value, ast.Call) and depth < 3:
        return _functions_behind(value.func, within, defined, depth + 1)
    if not isinstance(value, ast.Name) or depth >= 3:
        return []
    nested = [n for n in ast.walk(within) if isinstance(n, ast.FunctionDef) and n.name == value.id and n is not within]
    bound = [n.value for n in ast.walk(within) if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
    found = nested + ([defined[value.id]] if value.id in defined else [])
    return found + [f for b in bound for f in _functions_behind(b, within, defined, depth + 1)]


def _pads_time_first(function: ast.AST) -> bool:
    for call in ast.walk(function):
        if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "pad_sequence":
            flag = next((k.value for k in call.keywords if k.arg == "batch_first"), call.args[1] if len(call.args) > 1 else None)
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                return True
    return False


def _makes_loader(value: ast.expr) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    return getattr(func, "id", getattr(func, "attr", "")) == "DataLoader"


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """The names a file's imports bind -> what they name (`train_one_epoch`
    -> `engine.train_one_epoch`, `E` -> `engine`)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                joined = f"{base}.{alias.name}" if node.module else base + alias.name
                names[alias.asname or alias.name] = joined
    return names


def _resolved(func: ast.expr, names: dict[str, str]) -> Optional[str]:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in names:
        return None
    return ".".join([names[func.id], *reversed(parts)])
