"""workers: load batches in worker processes, with pinned memory.

What it does
    Gives every `torch.utils.data.DataLoader(...)` call (however it is
    imported or aliased) that has no `num_workers`, or `num_workers=0`
    (by keyword or as the sixth positional argument):

    - `num_workers=default_num_workers()`: the CPU cores this process may run
      on, divided among the processes of the launch on this machine
      (torchrun's LOCAL_WORLD_SIZE), at least 1, at most 8
      (`accelmigrate.runtime.data`). Option `max_workers` (or `workers=N`)
      sets another cap; `max_workers=none` removes it;
    - `pin_memory=torch.cuda.is_available()`, unless the call sets pin_memory.

    Training, evaluation and test loaders alike; at module level, in
    functions and in methods.

    Option `persistent=true` also adds `persistent_workers=True` (unless the
    call sets persistent_workers): see "What persistent workers cost" below.
    It is off by default because it changes a seeded script's results.

Why
    With `num_workers=0` the training loop stops at every batch to read,
    decode and augment its samples on one core while the model waits.
    Worker processes prepare the next batches on the other cores at the same
    time. Pinned (page-locked) host memory lets the copy to the GPU run
    asynchronously and faster.
    Sizing the count from the cores of this process, not the machine, keeps
    it right when the script later runs as several DDP processes per node.

What a seeded script keeps
    The order of the samples, and the numbers drawn in the main process: the
    loader draws its workers' base seed and its sampler's seed from torch's
    global generator (or its `generator=`) once per epoch, at every
    `iter(loader)`, with or without workers, so a script seeded with
    `torch.manual_seed` shuffles the same way in every epoch and draws the
    same dropout masks. (With workers the sampler's seed is drawn at
    `iter(loader)` rather than at the first batch, which matters only to a
    draw made between the two.)
    What changes is randomness inside the dataset (random augmentations in
    `__getitem__` or its transforms): in worker processes it draws from
    per-worker generators seeded from the base seed and the worker's index,
    so those numbers differ from the original run's and depend on the worker
    count (the machine's cores); and as the main process no longer draws
    them, its later draws (the next epoch's shuffle, dropout) shift too. The
    same distribution, not the same numbers: pass a fixed `num_workers` to
    keep such a run repeatable from machine to machine.

What persistent workers cost (option `persistent=true`)
    Persistent workers are started once instead of at every epoch (each
    start makes the processes and copies the dataset into them), which
    saves that start-up time per epoch. But the loader then makes its
    iterator once, so it draws the base seed from torch's global generator
    once instead of once per epoch: from the second epoch on every later
    draw from that generator (the shuffled order, dropout masks) differs
    from the original run's, and a seeded script ends with a different loss
    (from the same distribution). Workers also keep the copy of the dataset
    they started with, so a change the script makes to it between epochs
    never reaches them. Choose it when start-up time matters more than
    repeating earlier runs exactly:

        [tool.accelmigrate.options.workers]
        persistent = true

Example
    Before::

        loader = DataLoader(
            train_set,
            batch_size=64,
            shuffle=True,
        )

    After::

        from accelmigrate.runtime.data import default_num_workers

        loader = DataLoader(
            train_set,
            batch_size=64,
            shuffle=True,
            num_workers=default_num_workers(),
            pin_memory=torch.cuda.is_available(),
        )

Left alone (with a finding that says what to do)
    - AM102: a call with `**kwargs` or `*args`, which may already carry these
      arguments.
    - AM103: an IterableDataset defined in this file (or torch's ChainDataset,
      a DataPipe) that does not call `get_worker_info()`: every worker would
      yield the whole stream, so each item would come once per worker.
    - AM104: a loader built while the script runs (at module level, or in a
      function that module-level code calls) in a file without an
      `if __name__ == "__main__":` guard. Where workers are spawned instead of
      forked (macOS, Windows, and Linux from Python 3.14, whose default is
      forkserver) each worker re-imports the script, re-runs it and fails.
      Add the guard and run the codemod again.
    - AM105: a `collate_fn` or `worker_init_fn` that is a lambda or a
      function defined inside another function: spawned workers cannot
      receive it (it cannot be pickled). Define it with `def` at module level.
    - AM106: a dataset changed after the loader is built (a method call or an
      attribute set on it, e.g. `train_set.set_epoch(epoch)`): workers hold
      their own copy and would not see the change.
    - AM107: a dataset of tensors already in memory (`TensorDataset`), where
      workers only add copies between processes (iterating one is several
      times slower with two workers than without), or a dataset class of
      this file that puts tensors on the GPU, which worker processes cannot
      do.

    AM104 and AM105 are also reported for a loader whose `num_workers` the
    user set, since its workers meet the same problem. Marking a call with
    `# accelmigrate: skip[AM10x]` for one of AM103-AM107 says "I checked,
    it is fine": the call is then rewritten. An explicit `num_workers` other
    than 0 (e.g. `num_workers=args.workers`) and explicit `pin_memory` or
    `persistent_workers` values always stay; the codemod never touches a
    class of the user's that is merely named `DataLoader`, nor subclasses of
    torch's DataLoader. A dataset whose class it cannot see (a library's, or
    one passed in as an argument) is taken to be a map-style dataset.

"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import libcst as cst
from libcst.metadata import PositionProvider

from ._base import Codemod, append_keyword_args, dotted_name, has_star_args, keyword_arg, walk
from .script.vocabulary import DATALOADER, ITERABLE_DATASET_BASES
from .script.workers_facts import workers_facts

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
RUNTIME_MODULE = "accelmigrate.runtime.data"
HELPER = "default_num_workers"
SPAWNED = (
    "where worker processes are not forked (macOS, Windows, and Linux from Python 3.14, whose default is forkserver)"
)


class Workers(Codemod):
    word = "workers"
    summary = "DataLoader: worker processes sized to this process's cores, pinned memory"
    codes = {
        "AM101": "DataLoader given worker processes and pinned memory",
        "AM102": "DataLoader called with *args or **kwargs: its settings cannot be seen",
        "AM103": "IterableDataset that does not split its stream among workers",
        "AM104": "DataLoader built while the script runs, without an `if __name__ == \"__main__\":` guard",
        "AM105": "collate_fn or worker_init_fn that worker processes cannot receive (lambda, local function)",
        "AM106": "dataset changed after its DataLoader is built",
        "AM107": "dataset of in-memory tensors, or of GPU tensors: left without workers",
    }
    triggers = ("DataLoader",)
    # A flat script gets its main guard first, so that spawned workers can
    # import it; where main-guard refuses, AM104 says what to do by hand.
    requires = ("main-guard",)

    @classmethod
    def check_options(cls, options) -> None:
        _cap_argument(options)
        _persistent_option(options)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._helper_call = f"{HELPER}({_cap_argument(self.options)})"  # the code of the worker count expression

    @property
    def facts(self):
        """The module's facts (torch's alias, star imports, what runs at import), from the script model."""
        return workers_facts(self.script)

    # -- the rewrite ---------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self._is_dataloader(original_node):
            return updated_node
        if has_star_args(original_node) and not _sets_workers(original_node):
            self.report(original_node, "AM102", _STAR_ARGS_MESSAGE.format(helper=self._helper_call))
            return updated_node
        if _sets_workers(original_node):
            self._report_spawn_hazards(original_node)  # the user's own workers meet them too
            return updated_node
        blocked = [self.report(original_node, code, message) for code, message in self._blockers(original_node)]
        settings = self._settings(original_node)
        if any(blocked) or not self.fix(original_node, "AM101", _fix_message(settings)):
            return updated_node
        return self._with_settings(updated_node, settings)

    def _blockers(self, call: cst.Call) -> list[tuple[str, str]]:
        """(code, message) for every reason not to add workers to this call."""
        found = self._spawn_hazards(call)
        dataset = _argument(call, "dataset")
        if dataset is not None:
            found += self._dataset_problems(call, dataset.value)
        return found

    def _settings(self, call: cst.Call) -> dict[str, str]:
        """The arguments to set, as code: num_workers always, the others
        unless the call already sets them."""
        settings = {"num_workers": self._helper_call}
        if _argument(call, "pin_memory") is None:
            settings["pin_memory"] = f"{self.facts.torch_alias or 'torch'}.cuda.is_available()"
        if _persistent_option(self.options) and _argument(call, "persistent_workers") is None:
            settings["persistent_workers"] = "True"
        return settings

    def _with_settings(self, call: cst.Call, settings: dict[str, str]) -> cst.Call:
        self.add_import(RUNTIME_MODULE, HELPER)
        if "pin_memory" in settings and self.facts.torch_alias is None:
            self.add_import("torch")
        values = {name: cst.parse_expression(code) for name, code in settings.items()}
        existing = _argument(call, "num_workers")
        if existing is not None:  # num_workers=0, by keyword or by position
            args = [a.with_changes(value=values.pop("num_workers")) if a is existing else a for a in call.args]
            call = call.with_changes(args=args)
        return append_keyword_args(call, list(values.items())) if values else call

    # -- matching ------------------------------------------------------------

    def _is_dataloader(self, call: cst.Call) -> bool:
        if self.is_call_to(call, DATALOADER):
            return True
        # `from torch.utils.data import *` leaves the name unresolved.
        return (
            self.facts.dataloader_from_star
            and isinstance(call.func, cst.Name)
            and call.func.value == "DataLoader"
            and not self.qualified_names(call.func)
        )

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
            argument = _argument(call, name)
            why = self._unpicklable(argument.value) if argument is not None else None
            if why:
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

    # -- the dataset: AM103, AM106, AM107 --------------------------------------

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
                return ("AM107", (
                    f"left without workers: dataset class {cls.name.value} puts tensors on the GPU "
                    f"(`{_short_code(gpu_use)}`), which worker processes cannot do; keep its tensors on the CPU "
                    "and move each batch to the device in the training loop, then migrate again"
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
        init = _argument(loader, "worker_init_fn")
        if init is not None:
            places.append(init.value)
            if isinstance(init.value, cst.Name):
                places.extend(self.facts.stands_for(init.value))
        return any(self.is_call_to(c, GET_WORKER_INFO) for place in places for c in walk(place))


def _fix_message(settings: dict[str, str]) -> str:
    given = ", ".join(f"{name}={code}" for name, code in settings.items())
    return f"DataLoader now prepares batches in worker processes (this process's share of the CPU cores): {given}"


_STAR_ARGS_MESSAGE = (
    "DataLoader gets *args or **kwargs, which may already set num_workers or pin_memory: where those arguments "
    "are built, add num_workers={helper} and pin_memory=torch.cuda.is_available() "
    "(from accelmigrate.runtime.data import default_num_workers)"
)


def _iterable_message(name: str) -> str:
    return (
        f"the dataset ({name}) is an IterableDataset and nothing here splits its stream among workers: with N "
        "workers every item would come N times; make its __iter__ (or a worker_init_fn) yield only this worker's "
        "share, using torch.utils.data.get_worker_info(), then migrate again (or mark this call "
        "`# accelmigrate: skip[AM103]` if it already does)"
    )


# -- helpers over syntax (no metadata needed) ---------------------------------


def _argument(call: cst.Call, name: str) -> Optional[cst.Arg]:
    """The argument that DataLoader receives as parameter `name`, by keyword
    or by position."""
    found = keyword_arg(call, name)
    if found is not None:
        return found
    positional = [a for a in call.args if a.keyword is None and not a.star]
    index = POSITIONAL.index(name) if name in POSITIONAL else len(POSITIONAL)
    return positional[index] if index < len(positional) else None


def _sets_workers(call: cst.Call) -> bool:
    """num_workers is given, and not as a literal 0."""
    argument = _argument(call, "num_workers")
    if argument is None:
        return False
    return not (isinstance(argument.value, cst.Integer) and argument.value.evaluated_value == 0)


def _cap_argument(options) -> str:
    """The arguments of the worker count helper for the `max_workers` option
    (or the word's value, `workers=4`)."""
    raw = options.get("max_workers", options.get("value"))
    if raw is None:
        return ""
    text = str(raw).strip().lower()
    if text == "none":
        return "max_workers=None"
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"max_workers must be a whole number from 1 up, or none; got {raw!r}")
    return f"max_workers={int(text)}"


def _persistent_option(options) -> bool:
    """The `persistent` option: also add persistent_workers=True (off by
    default, as it changes a seeded script's random stream)."""
    raw = options.get("persistent")
    text = str(raw).strip().lower()
    if raw is None or text in ("false", "no", "off", "0"):
        return False
    if text in ("true", "yes", "on", "1"):
        return True
    raise ValueError(f"persistent must be true or false; got {raw!r}")


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
