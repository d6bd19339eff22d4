"""The registry of codemods: `--to` word -> codemod class, presets and order.

Every module of this package whose name does not start with `_` is a codemod
module; each defines one `Codemod` subclass. Subpackages (`script/`, the model
of a training script that every codemod reads) are not codemods. The engine knows no codemod by
name: it asks this registry.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Iterable, Mapping, Optional

from ._base import Codemod, Finding

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


@functools.lru_cache(maxsize=None)
def all_codemods() -> Mapping[str, type[Codemod]]:
    """Every codemod, by word, in running order."""
    found: dict[str, type[Codemod]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("_") or module_info.ispkg:
            continue  # helpers and subpackages (the script model) are no codemods
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Codemod) and value.__module__ == module.__name__:
                found[value.word] = value
    rank = {word: i for i, word in enumerate(ORDER)}
    return {word: found[word] for word in sorted(found, key=lambda w: (rank.get(w, len(ORDER)), w))}


def words_without_values() -> list[str]:
    """The codemods that run without a `=value` (what `check` runs by default)."""
    usable = []
    for word, cls in all_codemods().items():
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


def resolve(
    selected: Mapping[str, Mapping[str, str]],
    extra_options: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> list[tuple[type[Codemod], dict[str, str]]]:
    """The codemods to run for the chosen words, with the ones they require,
    in running order, each with its options (`extra_options` from the config
    first, then those given with the word)."""
    registry = all_codemods()
    wanted: dict[str, dict[str, str]] = {}

    def add(word: str, options: Mapping[str, str]) -> None:
        if word not in registry:
            known = ", ".join(registry)
            raise UnknownCodemod(f"unknown codemod {word!r} (known: {known})")
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


def find(code_or_word: str) -> Optional[type[Codemod]]:
    """The codemod with this word or finding code."""
    registry = all_codemods()
    if code_or_word in registry:
        return registry[code_or_word]
    for cls in registry.values():
        if code_or_word.upper() in cls.codes:
            return cls
    return None


__all__ = ["Codemod", "DEFAULT_WORDS", "Finding", "ORDER", "PRESETS", "UnknownCodemod", "all_codemods", "find", "parse_words", "resolve", "words_without_values"]
