"""The registry of codemods: `--to` word -> codemod class, presets and order.

Every module of this package whose name does not start with `_` is a codemod
module; each defines one `Codemod` subclass. Subpackages (`script/`, the model
of a training script that every codemod reads) are not codemods. The engine knows no codemod by
name: it asks this registry.

What the registry says of a codemod (word, codes, notes, summary, requires,
triggers, options) is read from `_manifest.py`, generated from the classes,
so that a command whose files never reach LibCST imports neither LibCST nor
any codemod: `infos()` and `resolve_infos()`. `all_codemods()` and
`resolve()` import the classes.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

from . import _options
from ._finding import Finding

if TYPE_CHECKING:
    from ._base import Codemod

# The fixed order in which codemods run, whatever the order of the --to words,
# so that any combination gives the same result. A word missing here runs last.
ORDER = (
    "modernize",
    "main-guard",
    "workers",
    "item",
    "empty-cache",
    "device",
    "channels-last",
    "amp",
    "ddp",
    "sync-bn",
    "fsdp",  # after ddp, so that choosing both is refused (AM767); before compile and fused-optim
    "accelerate",  # a library target in place of device, amp and ddp
    "fabric",  # the other library target (Lightning Fabric): never with accelerate
    "accumulate",
    "batch-scale",
    # The speed words: channels-last converts the model before ddp wraps it
    # (DDP's gradient buckets take the parameters' layout); fused-optim and
    # compile come after ddp and sync-bn (torch recommends compiling the
    # DistributedDataParallel module); the settings made once at the start,
    # and safe-load, read the file as the others leave it.
    "fused-optim",
    "compile",
    "tf32",
    "cudnn-benchmark",
    "safe-load",
)

# What `apply` does without --to: the rewrites that never change the arithmetic
# (modernize makes pre-0.4 code run at all on today's torch).
DEFAULT_WORDS = ("modernize", "workers", "item", "empty-cache")

# Words that stand for several codemods. `checklist`: the classic speed
# checklist that is safe on any script: the defaults, one device chosen at
# run time, and mixed precision (which a CPU run computes in float32). It
# leaves out what changes how the script is launched or what a step
# computes (ddp, sync-bn, accumulate, batch-scale), and main-guard, which
# workers brings in where it is needed. `fast`: the checklist and today's
# speed codemods, each gated at run time to the GPUs where it pays, with
# safe-load (torch.load of state dicts without unpickling code).
PRESETS = {
    "checklist": ("modernize", "workers", "item", "empty-cache", "device", "amp"),
}
PRESETS["fast"] = (*PRESETS["checklist"], "channels-last", "fused-optim", "compile", "tf32", "cudnn-benchmark", "safe-load")


class UnknownCodemod(ValueError):
    """A --to word that names no codemod, or options that a codemod rejects."""


def _in_running_order(words: Iterable[str]) -> list[str]:
    rank = {word: i for i, word in enumerate(ORDER)}
    return sorted(words, key=lambda w: (rank.get(w, len(ORDER)), w))


def _codemod_modules() -> list[str]:
    """The codemod modules of this package: its modules not starting with `_`."""
    folder = os.path.dirname(__file__)
    return sorted(
        name[:-3] for name in os.listdir(folder)
        if name.endswith(".py") and not name.startswith("_") and name[:-3].isidentifier()
    )


@functools.lru_cache(maxsize=None)
def all_codemods() -> Mapping[str, "type[Codemod]"]:
    """Every codemod class, by word, in running order (imports them, and LibCST)."""
    from ._base import Codemod

    found: dict[str, type[Codemod]] = {}
    for name in _codemod_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Codemod) and value.__module__ == module.__name__:
                found[value.word] = value
    return {word: found[word] for word in _in_running_order(found)}


class CodemodInfo:
    """A codemod as the manifest describes it: what the class says, without the class."""

    def __init__(self, word: str, entry: Mapping) -> None:
        self.word = word
        self.module, self.name = entry["module"], entry["name"]
        self.summary: str = entry["summary"]
        self.requires: Sequence[str] = tuple(entry["requires"])
        self.excludes: Sequence[str] = tuple(entry["excludes"])
        self.triggers: Sequence[str] = tuple(entry["triggers"])
        self.codes: Mapping[str, str] = dict(entry["codes"])
        self.notes = frozenset(entry["notes"])
        self.reads_handoffs = bool(entry.get("reads_handoffs", False))
        self.handed_to: Mapping[str, Sequence[str]] = dict(entry.get("handed_to", {}))
        self.needs_torch: tuple[int, int] = tuple(entry["needs_torch"])

    def check_options(self, options: Mapping[str, str]) -> None:
        _options.check(self.word, options)

    def wants(self, source: str) -> bool:
        return any(trigger in source for trigger in self.triggers)

    def load(self) -> "type[Codemod]":
        """Its class, importing its own module only (a check of three words
        need not import the other seventeen)."""
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.name)

    def __repr__(self) -> str:
        return f"<CodemodInfo {self.word}>"


@functools.lru_cache(maxsize=None)
def _manifest_infos() -> Optional[Mapping[str, CodemodInfo]]:
    """The manifest's codemods, or None when it does not list every codemod
    module here (a module added since it was generated: the classes answer)."""
    from ._manifest import CODEMODS

    if {entry["module"] for entry in CODEMODS.values()} != set(_codemod_modules()):
        return None
    return {word: CodemodInfo(word, CODEMODS[word]) for word in _in_running_order(CODEMODS)}


def infos() -> Mapping[str, object]:
    """Every codemod by word, in running order, as `CodemodInfo` (word,
    codes, notes, summary, requires, triggers, check_options, wants) read
    from the manifest; the classes themselves once they are imported (they
    have the same attributes, and are the truth)."""
    if all_codemods.cache_info().currsize:
        return all_codemods()
    manifest = _manifest_infos()
    return manifest if manifest is not None else all_codemods()


def load(codemod) -> "type[Codemod]":
    """The class of a codemod given by its class or its `CodemodInfo`."""
    return codemod.load() if isinstance(codemod, CodemodInfo) else codemod


def words_without_values() -> list[str]:
    """The codemods that run without a `=value` (what `check` runs by default)."""
    usable = []
    for word, cls in infos().items():
        try:
            cls.check_options({})
        except ValueError:
            continue
        usable.append(word)
    return usable


def parse_words(spec: Iterable[str]) -> dict[str, dict[str, str]]:
    """`["ddp", "accumulate=16"]` or `"ddp,accumulate=16"` -> {word: options}.
    A `word=value` gives that codemod the option `value`; a preset word
    (`checklist`, `fast`) stands for its codemods."""
    if isinstance(spec, str):
        spec = [spec]
    selected: dict[str, dict[str, str]] = {}
    for chunk in spec:
        for item in str(chunk).split(","):
            item = item.strip()
            if not item:
                continue
            word, _, value = item.partition("=")
            word = word.strip()
            if word in PRESETS:
                if value:
                    raise UnknownCodemod(f"the preset {word!r} takes no value")
                for member in PRESETS[word]:
                    selected.setdefault(member, {})
                continue
            options = selected.setdefault(word, {})
            if value:
                options["value"] = value.strip()
    return selected


def resolve_infos(
    selected: Mapping[str, Mapping[str, str]],
    extra_options: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> list[tuple[object, dict[str, str]]]:
    """The codemods to run for the chosen words, with the ones they require,
    in running order, each with its options (`extra_options` from the config
    first, then those given with the word), as `infos()` gives them: no
    codemod is imported."""
    registry = infos()
    if any(word not in registry for word in selected):
        registry = all_codemods()  # a word the manifest does not know: ask the classes before refusing it
    wanted: dict[str, dict[str, str]] = {}

    def add(word: str, options: Mapping[str, str]) -> None:
        if word not in registry:
            from accelmigrate.engine.config import close_match

            known = ", ".join(registry)
            raise UnknownCodemod(f"unknown codemod {word!r}{close_match(word, [*registry, *PRESETS])} (known: {known})")
        merged = {**(extra_options or {}).get(word, {}), **wanted.get(word, {}), **options}
        wanted[word] = merged
        for needed in registry[word].requires:
            if needed not in wanted:
                add(needed, {})

    for word, options in selected.items():
        add(word, options)
    for word, options in wanted.items():
        try:
            registry[word].check_options(options)
        except ValueError as error:
            raise UnknownCodemod(f"{word}: {error}") from None
    return [(cls, wanted[word]) for word, cls in registry.items() if word in wanted]


def check_exclusions(resolved: Sequence[tuple[object, Mapping[str, str]]]) -> None:
    """UnknownCodemod where two words of a plan would both take charge of the
    same part of a script (a codemod's `excludes`): the user asked for
    something no run can give, which is never answered by one of them
    silently changing nothing."""
    words = [cls.word for cls, _ in resolved]
    for cls, _ in resolved:
        clashing = [other for other in cls.excludes if other in words]
        if clashing:
            raise UnknownCodemod(
                f"{cls.word} cannot run with {', '.join(clashing)} (asked for, or needed by a word asked for): they would "
                f"both take charge of the same part of the script (its device, precision, processes or data loading); run "
                f"{cls.word} alone, or the others without it"
            )


def resolve(
    selected: Mapping[str, Mapping[str, str]],
    extra_options: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> "list[tuple[type[Codemod], dict[str, str]]]":
    """`resolve_infos`, with each codemod's class (imports them)."""
    return [(load(cls), options) for cls, options in resolve_infos(selected, extra_options)]


def find(code_or_word: str) -> "Optional[type[Codemod]]":
    """The codemod class with this word or finding code."""
    info = find_info(code_or_word)
    return None if info is None else load(info)


def find_info(code_or_word: str):
    """The codemod (as `infos()` gives it) with this word or finding code."""
    registry = infos()
    if code_or_word in registry:
        return registry[code_or_word]
    for cls in registry.values():
        if code_or_word.upper() in cls.codes:
            return cls
    return None


def __getattr__(name: str):
    if name == "Codemod":  # the base class, with LibCST, only when asked for
        from ._base import Codemod

        return Codemod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Codemod", "CodemodInfo", "DEFAULT_WORDS", "Finding", "ORDER", "PRESETS", "UnknownCodemod", "all_codemods",
    "find", "find_info", "infos", "load", "parse_words", "resolve", "resolve_infos", "words_without_values",
]
