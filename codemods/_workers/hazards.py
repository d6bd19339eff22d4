"""What keeps the workers codemod from giving a DataLoader worker processes,
each a finding: a loader built while the script runs in a file without a
main guard, or a `collate_fn`/`worker_init_fn` the workers cannot receive
(spawned workers re-import the script and unpickle what they are sent:
AM104, AM105); a dataset that is an IterableDataset which does not split
its stream among workers, one of in-memory tensors, one whose class puts
tensors on the GPU, or one changed after its loader is built (AM103, AM107,
AM108, AM106).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import libcst as cst
from libcst.metadata import PositionProvider

from .._base import Codemod, dotted_name, keyword_arg, walk
from ..script.vocabulary import ITERABLE_DATASET_BASES
from ..script.workers_facts import KwargsDict, workers_facts

ITERABLE_BASES = ITERABLE_DATASET_BASES | {
    "torch.utils.data.IterDataPipe",
    "torch.utils.data.datapipes.datapipe.IterDataPipe",
}
# Iterable datasets made by libraries, which do not split their stream among
# workers unless told to.
ITERABLE_FACTORIES = {"torch.utils.data.ChainDataset", "torch.utils.data.dataset.ChainDataset"}
ITERABLE_FACTORY_PREFIXES = ("torch.utils.data.datapipes.", "torchdata.datapipes.", "torchtext.datasets.")
TENSOR_DATASET = {"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"}
# What an item computed from data held in memory may call: Python's, torch's,
# numpy's and math's functions, but none that reads a file; tensor and array
# methods of arithmetic, shape and conversion.
IN_MEMORY_MODULES = ("builtins.", "torch.", "numpy.", "math.")
READERS = frozenset({"open", "load", "loadtxt", "genfromtxt", "fromfile", "memmap", "read_file", "decode_image", "read_image", "input"})
TENSOR_METHODS = frozenset(
    {"long", "float", "int", "double", "bool", "half", "clone", "copy", "view", "reshape", "unsqueeze", "squeeze", "flatten",
     "permute", "transpose", "contiguous", "item", "tolist", "astype", "numpy", "sum", "mean", "abs", "exp", "log", "sin", "cos",
     "sqrt", "pow", "clamp", "flip", "roll", "split", "chunk", "index_select", "masked_select", "type", "to", "cpu"}
)  # fmt: skip
FOLLOW_DEPTH = 4  # names, parameters and functions followed back to where a dataset is made
LAZY_STORES = ("h5py.", "lmdb.", "zarr.", "tables.")  # files whose items are read as they are indexed
# Datasets made of the parts of others (held where those are).
SPLITS = frozenset(
    f"torch.utils.data{module}.{name}" for module in ("", ".dataset") for name in ("random_split", "Subset", "ConcatDataset")
)
GET_WORKER_INFO = {"torch.utils.data.get_worker_info", "torch.utils.data._utils.worker.get_worker_info"}

# DataLoader's parameters that may be passed by position, in order.
POSITIONAL = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)
# Functions that DataLoader sends to each worker process.
SENT_TO_WORKERS = ("collate_fn", "worker_init_fn")
SPAWNED = (
    "where worker processes are not forked (macOS, Windows, and Linux from Python 3.14, whose default is forkserver)"
)


class LoaderHazards(Codemod):
    """The workers codemod's checks of a loader, its functions and its dataset."""

    _dicts: dict[cst.Call, KwargsDict]  # loader -> the `**name` dict it is given (set by the codemod)

    @property
    def facts(self):
        """The module's facts (torch's alias, star imports, what runs at import), from the script model."""
        return workers_facts(self.script)

    def _passed(self, call: cst.Call, name: str) -> list[cst.BaseExpression]:
        """What the call may give DataLoader's parameter `name`: its own
        argument, or the values its `**name` dict may hold under that key."""
        argument = loader_argument(call, name)
        if argument is not None:
            return [argument.value]
        found = self._dicts.get(call)
        return found.values_of(name) if found is not None else []

    # -- spawned workers: AM104, AM105 ----------------------------------------

    def _report_spawn_hazards(self, call: cst.Call) -> None:
        for code, message in self._spawn_hazards(call):
            self.report(call, code, message)

    def _spawn_hazards(self, call: cst.Call) -> list[tuple[str, str]]:
        found = []
        if self._built_while_script_runs(call):
            found.append(("AM104", (
                "this loader is built while the script runs and the file has no `if __name__ == \"__main__\":` "
                f"guard: {SPAWNED} each worker re-imports the script, runs it again and fails; put the code that "
                "runs the script under that guard (e.g. in a main() called there), then migrate again"
            )))
        for name in SENT_TO_WORKERS:
            for value in self._passed(call, name):
                why = self._unpicklable(value)
                if not why:
                    continue
                found.append(("AM105", (
                    f"{name} is {why}: {SPAWNED} it cannot be sent to the worker processes (it cannot be pickled); "
                    "define it with `def` at module level"
                )))
        return found

    def _built_while_script_runs(self, call: cst.Call) -> bool:
        run_at_import = self.facts.run_at_import
        if run_at_import is None:
            return False
        definitions = [a for a in self.ancestors(call) if isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda))]
        return not definitions or any(d in run_at_import for d in definitions)

    def _unpicklable(self, value: cst.BaseExpression) -> Optional[str]:
        if isinstance(value, cst.Lambda):
            return "a lambda"
        if not isinstance(value, cst.Name):
            return None
        for binding in self.script.bindings_of(value.value, value):
            if binding.kind == "def" and binding.scope.kind != "module":
                return f"`{value.value}`, a function defined inside another function"
            if binding.kind == "assign" and isinstance(binding.value, cst.Lambda):
                return f"`{value.value}`, a lambda"
        return None

    # -- the dataset: AM103, AM106, AM107, AM108 --------------------------------

    def _dataset_problems(self, call: cst.Call, dataset: cst.BaseExpression) -> list[tuple[str, str]]:
        found = []
        for made_by in self._constructors(dataset):
            problem = self._constructor_problem(call, made_by)
            if problem and problem not in found:
                found.append(problem)
        in_memory = self._held_in_memory(dataset) if not found else None
        if in_memory is not None:
            found.append(("AM107", (
                f"left without workers: {in_memory}, so a batch costs less than starting worker processes at every "
                f"epoch and copying their batches back"
            )))
        changed = self.facts.change_after(call, dataset)
        if changed is not None:
            line = self.get_metadata(PositionProvider, changed).start.line
            found.append(("AM106", (
                f"the dataset is changed after this loader is built (line {line}: `{_change_code(changed)}`): "
                "worker processes work on their own copy and would not see it; if that only reads the dataset, "
                "mark this call `# accelmigrate: skip[AM106]` and migrate again, else add num_workers by hand "
                "(without persistent_workers when the dataset changes between epochs)"
            )))
        return found

    def _constructor_problem(self, loader: cst.Call, made_by: cst.Call) -> Optional[tuple[str, str]]:
        names = self.qualified_names(made_by.func)
        if names & ITERABLE_FACTORIES or any(n.startswith(ITERABLE_FACTORY_PREFIXES) for n in names):
            return ("AM103", _iterable_message(_short_code(made_by.func)))
        for cls in self.facts.classes_of(made_by.func):
            family = list(self.facts.class_family(cls))
            if self._is_iterable(family) and not self._shards(family, loader):
                return ("AM103", _iterable_message(cls.name.value))
            gpu_use = next((n for c in family for n in _gpu_uses(c)), None)
            if gpu_use is not None:
                return ("AM108", (
                    f"left without workers: dataset class {cls.name.value} puts tensors on the GPU "
                    f"(`{_short_code(gpu_use)}`), {GPU_DATASET_ADVICE}"
                ))
        elsewhere = sorted(names & self.script.project.gpu_datasets)
        if elsewhere:
            return ("AM108", (
                f"left without workers: dataset class {elsewhere[0]} (in a module of the project) puts tensors on "
                f"the GPU, {GPU_DATASET_ADVICE}"
            ))
        return None

    def _constructors(self, dataset: cst.BaseExpression) -> Iterator[cst.Call]:
        """The calls that may have made the dataset: the argument itself or
        what its name was assigned, and what a function of this file that made
        it returns (`train_set = make_data()`)."""
        calls = []
        if isinstance(dataset, cst.Call):
            calls.append(dataset)
        elif isinstance(dataset, cst.Name):
            calls.extend(b for b in self.facts.stands_for(dataset) if isinstance(b, cst.Call))
        for call in calls:
            yield call
            for function in self.facts.functions_of(call.func):
                yield from (r.value for r in walk(function) if isinstance(r, cst.Return) and isinstance(r.value, cst.Call))

    def _held_in_memory(self, dataset: cst.BaseExpression) -> Optional[str]:
        """What the dataset is, as a phrase, when every value it may hold is
        made in memory: a TensorDataset, or a class of the file whose items
        are computed from what it holds (see `_computes_items_in_memory`).
        None where one of them is not, or cannot be followed."""
        made = self._made_by(dataset, FOLLOW_DEPTH)
        if not made:
            return None
        said = []
        for call in made:
            names = self.qualified_names(call.func)
            if names & TENSOR_DATASET:
                said.append("the dataset is tensors already in memory (TensorDataset)")
                continue
            if names and all(_makes_a_tensor(n) for n in names):
                said.append("the dataset is a tensor already in memory")
                continue
            classes = self.facts.classes_of(call.func)
            family = list(self.facts.class_family(classes[0])) if len(classes) == 1 else []
            if not family or not self._computes_items_in_memory(family):
                return None
            said.append(f"dataset class {classes[0].name.value} computes each item from data it holds in memory")
        return "; ".join(dict.fromkeys(said))

    def _made_by(self, value: cst.BaseExpression, depth: int) -> Optional[list[cst.Call]]:
        """The calls that make every value `value` may hold: followed through
        plain assignments, the file's functions that return it, and a
        parameter to what every call of its function passes (a trainer's
        `fit(self, dataset)`). None where a value cannot be followed."""
        if depth < 0:
            return None
        if isinstance(value, (cst.Integer, cst.Float)):
            return []
        if isinstance(value, cst.BinaryOperation):  # `torch.randn(96, 2) * 0.3 + 2.0`
            return self._all_made_by([value.left, value.right], depth)
        if isinstance(value, cst.Call) and self.qualified_names(value.func) & SPLITS and value.args:
            first = value.args[0].value  # `random_split(TensorDataset(x, y), [200, 40])`: parts of that dataset
            return self._all_made_by([e.value for e in first.elements] if isinstance(first, (cst.List, cst.Tuple)) else [first], depth - 1)
        if isinstance(value, cst.Call):
            functions = self.facts.functions_of(value.func)
            if not functions:
                return [value]
            returns = [r.value for f in functions for r in walk(f) if isinstance(r, cst.Return)]
            return self._all_made_by(returns, depth - 1)
        if not isinstance(value, cst.Name):
            return None
        bindings = self.script.bindings_of(value.value, value)
        values = []
        for binding in bindings:
            if binding.kind == "assign" and binding.value is not None and isinstance(binding.node, cst.Name):
                values.append(binding.value)
            elif binding.kind == "assign" and _unpacks_a_split(binding.statement):  # `train_set, val_set = random_split(...)`
                values.append(binding.statement.value)
            elif binding.kind == "assign" and _paired(binding) is not None:  # `train_set, val_set = Images(1000), Images(100)`
                values.append(_paired(binding))
            elif binding.kind == "param":
                function = self.script.flow.functions.get(binding.scope.node)
                sites = function.callers if function is not None else []
                if not sites or not all(site.complete and binding.name in site.arguments for site in sites):
                    return None
                values += [site.arguments[binding.name] for site in sites]
            else:
                return None
        return self._all_made_by(values, depth - 1) if bindings else None

    def _all_made_by(self, values: list, depth: int) -> Optional[list[cst.Call]]:
        found = [self._made_by(v, depth) if v is not None else None for v in values]
        return None if not found or None in found else [call for calls in found for call in calls]

    def _computes_items_in_memory(self, family: Sequence[cst.ClassDef]) -> bool:
        """The class's own `__getitem__` (the first in its family) reads
        nothing from outside: it calls Python's functions (not `open`),
        torch's, numpy's and math's (not their readers), tensor methods of
        arithmetic and conversion, and functions and methods of the file that
        do the same; no transform, decoder or tokenizer; and the class opens
        no store it reads as it is indexed."""
        getitem = next((f for c in family for f in c.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "__getitem__"), None)
        if getitem is None or self._is_iterable(family) or any(self._opens_lazily(c) for cls in family for c in walk(cls) if isinstance(c, cst.Call)):
            return False
        return self._computes_in_memory(getitem, FOLLOW_DEPTH)

    def _opens_lazily(self, call: cst.Call) -> bool:
        """A store its items are read from as they are indexed: a memory-mapped
        array (`np.memmap`, `np.load(..., mmap_mode="r")`), an HDF5, LMDB or
        zarr file."""
        names = self.qualified_names(call.func)
        return bool(names & {"numpy.memmap"}) or keyword_arg(call, "mmap_mode") is not None or any(n.startswith(LAZY_STORES) for n in names)

    def _computes_in_memory(self, function: cst.FunctionDef, depth: int) -> bool:
        """No loop (work repeated per item: a decoder's, a filter's passes)
        and no call but those above, or of a function of the file that
        computes the same way."""
        for node in walk(function.body):
            if isinstance(node, (cst.For, cst.While, cst.BaseComp)):
                return False
            if isinstance(node, cst.Call) and not self._call_in_memory(node, depth):
                return False
        return True

    def _call_in_memory(self, call: cst.Call, depth: int) -> bool:
        names = self.qualified_names(call.func)
        if names and all(name.startswith(IN_MEMORY_MODULES) and name.rpartition(".")[2] not in READERS for name in names):
            return True
        callee = self.script.flow.callee(call, self.script.scope_of(call)) if depth else None
        if callee is not None:
            return self._computes_in_memory(callee[0].node, depth - 1)
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in TENSOR_METHODS

    def _is_iterable(self, family: Sequence[cst.ClassDef]) -> bool:
        return any(self.qualified_names(base.value) & ITERABLE_BASES for cls in family for base in cls.bases)

    def _shards(self, family: Sequence[cst.ClassDef], loader: cst.Call) -> bool:
        """Does the dataset (or the loader's worker_init_fn) ask which worker it runs in?"""
        places: list[cst.CSTNode] = list(family)
        for init in self._passed(loader, "worker_init_fn"):
            places.append(init)
            if isinstance(init, cst.Name):
                places.extend(self.facts.stands_for(init))
        return any(self.is_call_to(c, GET_WORKER_INFO) for place in places for c in walk(place))


GPU_DATASET_ADVICE = (
    "which worker processes cannot do; keep its tensors on the CPU and move each batch to the device in the "
    "training loop, then migrate again"
)


def _iterable_message(name: str) -> str:
    return (
        f"the dataset ({name}) is an IterableDataset and nothing here splits its stream among workers: with N "
        "workers every item would come N times; make its __iter__ (or a worker_init_fn) yield only this worker's "
        "share, using torch.utils.data.get_worker_info(), then migrate again (or mark this call "
        "`# accelmigrate: skip[AM103]` if it already does)"
    )


def loader_argument(call: cst.Call, name: str) -> Optional[cst.Arg]:
    """The argument that DataLoader receives as parameter `name`, by keyword
    or by position."""
    found = keyword_arg(call, name)
    if found is not None:
        return found
    positional = [a for a in call.args if a.keyword is None and not a.star]
    index = POSITIONAL.index(name) if name in POSITIONAL else len(POSITIONAL)
    return positional[index] if index < len(positional) else None


def _makes_a_tensor(qualified: str) -> bool:
    """A torch function that makes a tensor in memory: not a reader of files,
    nor torch.utils' (datasets, loaders), nor a device."""
    return (
        qualified.startswith("torch.") and not qualified.startswith("torch.utils.")
        and qualified.rpartition(".")[2] not in READERS and qualified != "torch.device"
    )


def _gpu_uses(cls: cst.ClassDef) -> Iterable[cst.Call]:
    """Calls in the class that put a tensor on a GPU: `.cuda()`, `.to("cuda")`,
    `.to(device)`, `device=...` other than the CPU."""
    for call in walk(cls):
        if not isinstance(call, cst.Call):
            continue
        func = call.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        if method == "cuda":
            yield call
        elif method == "to" and call.args and _names_gpu(call.args[0].value):
            yield call
        elif any(a.keyword is not None and a.keyword.value == "device" and _names_gpu(a.value) for a in call.args):
            yield call


def _names_gpu(value: cst.BaseExpression) -> bool:
    """A device that may be a GPU: "cuda...", or a variable named like a device."""
    if isinstance(value, cst.SimpleString):
        return str(value.evaluated_value).startswith("cuda")
    name = dotted_name(value).rsplit(".", 1)[-1].lower()
    return "device" in name or "cuda" in name or "gpu" in name


def _change_code(change: cst.CSTNode) -> str:
    return _short_code(change) + (" = ..." if isinstance(change, (cst.Attribute, cst.Subscript)) else "")


def _short_code(node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(cst.Module([]).code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unpacks_a_split(statement: Optional[cst.CSTNode]) -> bool:
    return (
        isinstance(statement, cst.Assign) and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, (cst.Tuple, cst.List)) and isinstance(statement.value, cst.Call)
    )


def _paired(binding) -> Optional[cst.BaseExpression]:
    """The value a name of `a, b = x, y` is given (`x` for `a`)."""
    statement = binding.statement
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
        return None
    target, value = statement.targets[0].target, statement.value
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and len(target.elements) == len(value.elements)):
        return None
    return next((v.value for t, v in zip(target.elements, value.elements) if t.value is binding.node and not isinstance(v, cst.StarredElement)), None)
