"""The options each codemod takes (`--to word=value`, `[tool.accelmigrate.options.WORD]`),
checked without importing the codemods (nor LibCST): a command that runs
no codemod on a file still refuses a bad option before reading any.

`check(word, options)` raises ValueError with a message for the user, and
reads every option the word takes (the configuration reports a key that it
never reads as unknown). tests/test_startup_imports.py holds each codemod
class's own `check_options` to the same answers.
"""

from __future__ import annotations

from typing import Callable, Mapping

STEPS_MEANING = "the number of micro-batches per optimizer step"
SCALE_MEANING = "the factor for the batch size and the learning rate"


def parse_factor(options: Mapping[str, str], word: str, meaning: str) -> int:
    """The N of `word=N`: a whole number of at least 2."""
    raw = options.get("value")
    if raw is None or not str(raw).strip():
        raise ValueError(f"{word} needs a value: --to {word}=N, N being {meaning}")
    try:
        factor = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{word}={raw}: N must be a whole number (N is {meaning})") from None
    if factor < 2:
        raise ValueError(f"{word}={raw}: N must be at least 2 (N is {meaning})")
    return factor


def ddp_batch_mode(options: Mapping[str, str]) -> str:
    """`ddp` (the global batch stays) or `ddp=per-process` (each process keeps it)."""
    value = options.get("value", "").strip().lower().replace("_", "-")
    if value not in ("", "global", "per-process"):
        raise ValueError(f"unknown option {value!r} (use ddp=per-process)")
    return value or "global"


def exact_parity(word: str, options: Mapping[str, str]) -> bool:
    """`WORD=parity`: the one-process run's exact numbers on N processes (the
    global batch split, the original's order); without it, the library's
    defaults, as its own guide writes them."""
    value = options.get("value", "").strip().lower()
    if value not in ("", "parity"):
        raise ValueError(f"unknown option {value!r} (use {word}=parity)")
    return value == "parity"


def workers_cap_argument(options: Mapping[str, str]) -> str:
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


def workers_persistent(options: Mapping[str, str]) -> bool:
    """The `persistent` option: also add persistent_workers=True."""
    raw = options.get("persistent")
    text = str(raw).strip().lower()
    if raw is None or text in ("false", "no", "off", "0"):
        return False
    if text in ("true", "yes", "on", "1"):
        return True
    raise ValueError(f"persistent must be true or false; got {raw!r}")


def _workers(options: Mapping[str, str]) -> None:
    workers_cap_argument(options)
    workers_persistent(options)


CHECKS: dict[str, Callable[[Mapping[str, str]], object]] = {
    "accumulate": lambda options: parse_factor(options, "accumulate", STEPS_MEANING),
    "batch-scale": lambda options: parse_factor(options, "batch-scale", SCALE_MEANING),
    "accelerate": lambda options: exact_parity("accelerate", options),
    "ddp": ddp_batch_mode,
    "fabric": lambda options: exact_parity("fabric", options),
    "fsdp": ddp_batch_mode,  # the ddp class's check, which fsdp inherits
    "workers": _workers,
}


def check(word: str, options: Mapping[str, str]) -> None:
    """Raise ValueError when `options` make no sense for `word` (a word
    without options takes none: only the checks above read any)."""
    checker = CHECKS.get(word)
    if checker is not None:
        checker(options)
