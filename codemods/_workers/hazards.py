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
        if names & TENSOR_DATASET:
            return ("AM107", (
                "left without workers: the dataset is tensors already in memory (TensorDataset), so worker "
                "processes would only add copies between processes"
            ))
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
