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

Arguments in a dict
    A loader that gets its arguments as `**train_kwargs` gets the settings in
    that dict, where the code shows every key it may hold: the variable is
    assigned once, in this file, a dict literal with string keys,
    `dict(key=value, ...)`, or `{...} if cuda else {...}`; and it is
    otherwise only changed by `train_kwargs.update(...)` (of keywords, a
    literal, or another such dict) or `train_kwargs["key"] = value`, and
    given only to DataLoaders that can all take workers. The settings go into
    the literal (each literal of an `if ... else`), so a later
    `.update(cuda_kwargs)` still overrides them with the user's own values::

        train_kwargs = {
            "batch_size": args.batch_size,
            "num_workers": default_num_workers(),
            "pin_memory": torch.cuda.is_available(),
        }
        if use_cuda:
            train_kwargs.update({"num_workers": 1, "pin_memory": True})
        loader = DataLoader(train_set, **train_kwargs)

    A literal that already sets `num_workers` (not to 0) is the user's
    choice and stays as it is, as does a dict whose `num_workers` is set by
    a change that always runs.

Left alone (with a finding that says what to do)
    - AM102: a call with `*args`, or with `**kwargs` whose keys the code does
      not show (see "Arguments in a dict" in `explain workers`).
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
    - AM107 (a note, shown by `check --show-notes`): a dataset of tensors
      already in memory (`TensorDataset`, or a class of the file whose
      `__getitem__` only indexes, slices and converts what it holds: no
      file read, decoding, transform or method of its own), where workers
      only add their start at every epoch and copies between processes
      (iterating one is several times slower with two workers than
      without). Silencing it with `skip[AM107]` keeps the loader
      as it is; set `num_workers` by hand to have workers anyway.
    - AM108: a dataset class of this file that puts tensors on the GPU,
      which worker processes cannot do.

    AM104 and AM105 are also reported for a loader whose `num_workers` the
    user set, since its workers meet the same problem. Marking a call with
    `# accelmigrate: skip[AM10x]` for one of AM103-AM106 or AM108 says "I
    checked, it is fine": the call is then rewritten. An explicit `num_workers` other
    than 0 (e.g. `num_workers=args.workers`) and explicit `pin_memory` or
    `persistent_workers` values always stay; the codemod never touches a
    class of the user's that is merely named `DataLoader`, nor subclasses of
    torch's DataLoader. A dataset whose class it cannot see (a library's, or
    one passed in as an argument) is taken to be a map-style dataset.

"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from ._base import append_keyword_args, has_star_args
from ._options import workers_cap_argument, workers_persistent
from ._workers.hazards import LoaderHazards, loader_argument
from .script.workers_facts import KwargsDict

RUNTIME_MODULE = "accelmigrate.runtime.data"
HELPER = "default_num_workers"


class Workers(LoaderHazards):
    word = "workers"
    needs_torch = (1, 7)  # persistent_workers=
    summary = "DataLoader: worker processes sized to this process's cores, pinned memory"
    codes = {
        "AM101": "DataLoader without worker processes or pinned memory",
        "AM102": "DataLoader with *args or **kwargs whose worker settings cannot be seen",
        "AM103": "IterableDataset that does not split its stream among workers",
        "AM104": "DataLoader built while the script runs, without an `if __name__ == \"__main__\":` guard",
        "AM105": "collate_fn or worker_init_fn that worker processes cannot receive (lambda, local function)",
        "AM106": "dataset changed after its DataLoader is built",
        "AM107": "dataset of in-memory tensors: left without workers",
        "AM108": "dataset class that puts its tensors on the GPU, which worker processes cannot do",
    }
    # Said for information only: nothing to act on.
    notes = frozenset({"AM107"})
    triggers = ("DataLoader",)
    # A flat script gets its main guard first, so that spawned workers can
    # import it; where main-guard refuses, AM104 says what to do by hand.
    requires = ("main-guard",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._helper_call = f"{HELPER}({workers_cap_argument(self.options)})"  # the code of the worker count expression

    # -- the rewrite ---------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> bool:
        # A loader's `**name` dict is written where it is made, which the
        # traversal meets before the loader: decide those loaders first.
        self._edits: dict[cst.CSTNode, tuple[dict[str, str], str]] = {}  # dict literal or dict() -> (entries, quote)
        self._zeros: set[cst.CSTNode] = set()  # `0` values of num_workers in those dicts
        self._decided: set[cst.Call] = set()
        self._dicts: dict[cst.Call, KwargsDict] = {}
        self._unseen: dict[cst.Call, str] = {}  # loader -> why its `**name` cannot be followed
        self._plan_kwargs_dicts()
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        updated = super().on_leave(original_node, updated_node)
        if original_node in self._zeros:
            return cst.parse_expression(self._helper_call)
        edit = self._edits.get(original_node)
        if edit is None:
            return updated
        entries, quote = edit
        values = [(key, cst.parse_expression(code)) for key, code in entries.items()]
        if isinstance(updated, cst.Call):
            return append_keyword_args(updated, values)
        return _append_dict_entries(updated, values, quote)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node in self._decided or not self._is_dataloader(original_node):
            return updated_node
        if has_star_args(original_node) and not _sets_workers(original_node):
            why = self._unseen.get(original_node, "what they hold cannot be seen")
            self.report(original_node, "AM102", _STAR_ARGS_MESSAGE.format(why=why, helper=self._helper_call))
            return updated_node
        if _sets_workers(original_node):
            self._report_spawn_hazards(original_node)  # the user's own workers meet them too
            return updated_node
        if not self._report_blockers(original_node):
            return updated_node
        settings = self._settings(original_node)
        if not self.fix(original_node, "AM101", _fix_message(settings)):
            return updated_node
        return self._with_settings(updated_node, settings)

    def _report_blockers(self, call: cst.Call) -> bool:
        """Report every reason not to add workers to this call; True when
        none holds. A silenced note still holds: it only goes unsaid."""
        held = [self.report(call, code, message) or code in self.notes for code, message in self._blockers(call)]
        return not any(held)

    def _blockers(self, call: cst.Call) -> list[tuple[str, str]]:
        """(code, message) for every reason not to add workers to this call."""
        found = self._spawn_hazards(call)
        for dataset in self._passed(call, "dataset"):
            found += self._dataset_problems(call, dataset)
        return found

    # -- a loader's arguments in a dict: `DataLoader(data, **train_kwargs)` ----------

    def _plan_kwargs_dicts(self) -> None:
        dicts: dict[cst.CSTNode, KwargsDict] = {}
        calls = (call for scope in self.script.scopes for call in scope.calls)
        for call in calls:
            if not has_star_args(call) or _sets_workers(call) or not self._is_dataloader(call):
                continue
            found = self.facts.kwargs_dict(call, self._is_dataloader)
            if isinstance(found, str):
                self._unseen[call] = found
            else:
                dicts.setdefault(found.statement, found)
        for found in dicts.values():
            self._settle_kwargs_dict(found)

    def _settle_kwargs_dict(self, found: KwargsDict) -> None:
        """Add the settings to the dict where every loader it reaches can take
        them; else each loader says why not."""
        for loader in found.loaders:
            self._dicts[loader] = found
        if self._dict_sets_workers(found):
            for loader in found.loaders:
                self._decided.add(loader)
                self._report_spawn_hazards(loader)
            return
        own = [loader for loader in found.loaders if loader_argument(loader, "num_workers") is not None]
        if own:
            line = self.script.line(own[0])
            for loader in found.loaders:
                self._unseen[loader] = (
                    f"`{found.name}` also reaches the DataLoader at line {line}, which sets num_workers itself"
                )
            return
        self._decided.update(found.loaders)
        ready = [self._report_blockers(loader) and not self.is_suppressed(loader, "AM101") for loader in found.loaders]
        if not all(ready):
            held = self.script.line(found.loaders[ready.index(False)])
            for loader, ok in zip(found.loaders, ready):
                if ok:
                    why = f"`{found.name}` also reaches the DataLoader at line {held}, which stays without workers"
                    self.report(loader, "AM102", _STAR_ARGS_MESSAGE.format(why=why, helper=self._helper_call))
            return
        plan = self._dict_settings(found)
        settings = {"num_workers": self._helper_call}
        for added in plan.values():
            settings.update(added)
        where = f"`{found.name}` (line {self.script.line(found.statement)})"
        for loader in found.loaders:
            self.fix(loader, "AM101", f"{_fix_message(settings)}, in the dict {where}")
        self._schedule(found, plan)

    def _dict_sets_workers(self, found: KwargsDict) -> bool:
        """The user's own num_workers reaches every loader: each dict it may
        start as sets it, or a change that always runs does (not as `0`)."""
        def own(entry) -> bool:
            return entry.key == "num_workers" and not _is_zero(entry.value)

        if any(own(e) and e.always for e in found.entries):
            return True
        return all(any(own(e) and e.start is start for e in found.entries) for start in found.starts)

    def _dict_settings(self, found: KwargsDict) -> dict[cst.CSTNode, dict[str, str]]:
        """For each dict the variable may start as, the entries to add to it."""
        given = {name for name in ("pin_memory", "persistent_workers") for call in found.loaders if loader_argument(call, name)}
        # a change that always sets num_workers=0 gets the helper instead: no need to add it too
        zeroed = any(e.always and e.key == "num_workers" for e in found.entries)
        plan = {}
        for start in found.starts:
            if any(e.start is start and e.key == "num_workers" and not _is_zero(e.value) for e in found.entries):
                continue  # the user's workers in this case
            has_workers = zeroed or found.start_has(start, "num_workers")
            settings = {} if has_workers else {"num_workers": self._helper_call}
            if not found.start_has(start, "pin_memory") and "pin_memory" not in given:
                settings["pin_memory"] = f"{self.facts.torch_alias or 'torch'}.cuda.is_available()"
            persistent = workers_persistent(self.options) and "persistent_workers" not in given
            if persistent and not found.start_has(start, "persistent_workers"):
                settings["persistent_workers"] = "True"
            plan[start] = settings
        return plan

    def _schedule(self, found: KwargsDict, plan: dict[cst.CSTNode, dict[str, str]]) -> None:
        quote = _quote_of(found)
        for start, settings in plan.items():
            if settings:
                self._edits[start] = (settings, quote)
        self._zeros.update(
            e.value
            for e in found.entries
            if e.key == "num_workers" and _is_zero(e.value) and (e.start is None or e.start in plan)
        )
        self.add_import(RUNTIME_MODULE, HELPER)
        if any("pin_memory" in settings for settings in plan.values()) and self.facts.torch_alias is None:
            self.add_import("torch")

    def _settings(self, call: cst.Call) -> dict[str, str]:
        """The arguments to set, as code: num_workers always, the others
        unless the call already sets them."""
        settings = {"num_workers": self._helper_call}
        if loader_argument(call, "pin_memory") is None:
            settings["pin_memory"] = f"{self.facts.torch_alias or 'torch'}.cuda.is_available()"
        if workers_persistent(self.options) and loader_argument(call, "persistent_workers") is None:
            settings["persistent_workers"] = "True"
        return settings

    def _with_settings(self, call: cst.Call, settings: dict[str, str]) -> cst.Call:
        self.add_import(RUNTIME_MODULE, HELPER)
        if "pin_memory" in settings and self.facts.torch_alias is None:
            self.add_import("torch")
        values = {name: cst.parse_expression(code) for name, code in settings.items()}
        existing = loader_argument(call, "num_workers")
        if existing is not None:  # num_workers=0, by keyword or by position
            args = [a.with_changes(value=values.pop("num_workers")) if a is existing else a for a in call.args]
            call = call.with_changes(args=args)
        return append_keyword_args(call, list(values.items())) if values else call

    # -- matching ------------------------------------------------------------

    def _is_dataloader(self, call: cst.Call) -> bool:
        return self.script.is_dataloader(call)

def _fix_message(settings: dict[str, str]) -> str:
    given = ", ".join(f"{name}={code}" for name, code in settings.items())
    return f"DataLoader now prepares batches in worker processes (this process's share of the CPU cores): {given}"


_STAR_ARGS_MESSAGE = (
    "DataLoader gets *args or **kwargs that may set num_workers or pin_memory, and {why}: where those "
    "arguments are built, add num_workers={helper} and pin_memory=torch.cuda.is_available() unless they set them "
    "(from accelmigrate.runtime.data import default_num_workers)"
)


# -- helpers over syntax (no metadata needed) ---------------------------------


def _sets_workers(call: cst.Call) -> bool:
    """num_workers is given, and not as a literal 0."""
    argument = loader_argument(call, "num_workers")
    return argument is not None and not _is_zero(argument.value)


def _is_zero(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 0


def _quote_of(found: KwargsDict) -> str:
    """The quote of the dict's own string keys (double quotes where it has none)."""
    for start in found.starts:
        for element in getattr(start, "elements", ()):
            if isinstance(element.key, cst.SimpleString):
                return element.key.quote
    return '"'


def _append_dict_entries(
    literal: cst.Dict, entries: Sequence[tuple[str, cst.BaseExpression]], quote: str
) -> cst.Dict:
    """Add `"key": value` entries after the last one, laid out as
    `append_keyword_args` lays out a call's arguments: the literal goes
    through it as a stand-in call whose arguments are its values (a call
    keeps the line break before `)` after its last comma, a dict before `}`)."""
    elements = list(literal.elements)
    if not elements:  # `{ }`: no space is kept inside
        literal = literal.with_changes(lbrace=cst.LeftCurlyBrace(), rbrace=cst.RightCurlyBrace())
    keys = [element.key for element in elements] + [cst.SimpleString(f"{quote}{key}{quote}") for key, _ in entries]
    args = [cst.Arg(value=element.value, comma=element.comma) for element in elements]
    closing = literal.rbrace.whitespace_before
    if args and isinstance(args[-1].comma, cst.Comma):
        args[-1] = args[-1].with_changes(comma=args[-1].comma.with_changes(whitespace_after=closing))
    elif args:
        args[-1] = args[-1].with_changes(whitespace_after_arg=closing)
    stand_in = cst.Call(func=cst.Name("dict"), args=args, whitespace_before_args=literal.lbrace.whitespace_after)
    laid_out = list(append_keyword_args(stand_in, list(entries)).args)
    last = laid_out[-1]
    closing = last.whitespace_after_arg
    if isinstance(last.comma, cst.Comma):
        closing = last.comma.whitespace_after
        laid_out[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=cst.SimpleWhitespace("")))
    new_elements = [
        (elements[i] if i < len(elements) else cst.DictElement(key=key, value=arg.value)).with_changes(comma=arg.comma)
        for i, (key, arg) in enumerate(zip(keys, laid_out))
    ]
    return literal.with_changes(elements=new_elements, rbrace=literal.rbrace.with_changes(whitespace_before=closing))

