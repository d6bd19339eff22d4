"""The documentation `explain` and `list` show, and SARIF's rule help: a
codemod's page (its module docstring) and one finding code's entry."""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Optional

from accelmigrate.codemods import DEFAULT_WORDS, all_codemods, find, parse_words
from accelmigrate.engine.migrate import (
    CODEMOD_FAILED, ENGINE_CODES, NEEDS_NEWER_TORCH, NOT_IN_NOTEBOOK, PINNED_TORCH_TOO_OLD, TRAINER_LOOP, TRAINING_ELSEWHERE,
    UNKNOWN_CODE_IN_CONFIG, UNKNOWN_CODE_IN_MARK, UNPARSED_CELL, UNUSED_MARK,
)

if False:  # for the annotations only: importing the base class imports LibCST
    from accelmigrate.codemods import Codemod

FAILED_TITLE = "a codemod failed on this file and changed nothing there"
FAILED_ADVICE = (
    "The codemod met a file it did not expect (its message names the error); the other codemods still ran. "
    "Please report it with the smallest file that shows it; until then, migrate that part by hand."
)
# The engine's own codes: (severity, what to do). Their titles: engine.ENGINE_CODES.
ENGINE_ADVICE = {
    CODEMOD_FAILED: ("error", FAILED_ADVICE),
    NOT_IN_NOTEBOOK: (
        "note",
        "Nothing: this is information (a note). main-guard and ddp (and the codemods that need them) restructure "
        "a script's entry point, which a notebook does not have; move the training code into a .py script to "
        "migrate it with them.",
    ),
    UNKNOWN_CODE_IN_MARK: (
        "warning",
        "A `# accelmigrate: skip[CODES]` or `skip-file[CODES]` comment names a code that no codemod has, so it "
        "silences nothing: correct the code (`accelmigrate list` lists them) or remove it.",
    ),
    UNKNOWN_CODE_IN_CONFIG: (
        "warning",
        "`select`, `ignore` or `per-file-ignores` in [tool.accelmigrate] (or --select/--ignore) names a code, or "
        "a prefix, that no codemod has: correct it (`accelmigrate list` lists the codes) or remove it.",
    ),
    UNUSED_MARK: (
        "warning",
        "A code-specific skip mark (`# accelmigrate: skip[AM101]`) silenced no finding on its line (or, for "
        "`skip-file[...]`, in the file) in this run of its codemod: the code it guarded against is gone. Remove "
        "the code from the mark, or the whole mark. Only the codes of the codemods that ran are checked.",
    ),
    TRAINING_ELSEWHERE: (
        "warning",
        "A word that acts on a training step (amp, ddp, accelerate, fabric, accumulate, fsdp) found none in this "
        "file: it builds things and hands them to a module of the project (a `Solver`, an `engine.train_one_epoch`) "
        "that trains. Nothing here was changed for that word. Run the same words on the module named (`accelmigrate "
        "check --to WORDS MODULE.py`) and migrate the training there, keeping in mind what this file hands it.",
    ),
    TRAINER_LOOP: (
        "warning",
        "A word that acts on a training step found none in this file: a third-party library's trainer (Lightning's "
        "`Trainer.fit`, the Hugging Face `Trainer`, Ignite, fastai, ...) runs the loop, where no codemod can reach. "
        "Nothing here was changed for that word. That library has its own switches for mixed precision, several "
        "GPUs and data loading; the finding names them.",
    ),
    UNPARSED_CELL: (
        "error",
        "A code cell of the notebook does not parse on its own (Jupyter runs each cell alone, so a block or a "
        "bracket that the next cell completes fails there too). The cell was left exactly as written and the "
        "codemods migrated the other cells without seeing it: what it defines (a model, a loader) was unknown to "
        "them. Fix the cell and run again.",
    ),
    NEEDS_NEWER_TORCH: (
        "warning",
        "The project's requirements confine it to a torch older than the code these words write needs (a pin, "
        "`torch==1.13.1`, or a range with an upper bound; a bare `torch>=1.8` confines nothing), or, where they "
        "name no such line, the installed torch is that old. Those words changed nothing in the file; the others "
        "ran. Raise the project's torch (the finding names the file and the requirement) and run again.",
    ),
    PINNED_TORCH_TOO_OLD: (
        "note",
        "The project's requirements pin a torch older than any the migrated code runs on (a 2018 `torch==0.4.1`, "
        "which no current Python installs): it was migrated for a current torch, as the torch the project trains "
        "with today must be. Raise the requirement the note names to the version it gives.",
    ),
}


def page(cls: type[Codemod]) -> str:
    """The codemod's whole documentation: its module docstring."""
    return inspect.getdoc(sys.modules[cls.__module__]) or cls.summary


def sections(cls: type[Codemod]) -> dict[str, str]:
    """The page's sections by heading ("What it does", "Why", "Left alone"...):
    a heading is a line at the left margin, its text the indented lines below."""
    found: dict[str, list[str]] = {}
    heading = None
    for line in page(cls).splitlines()[1:]:
        if line and not line[0].isspace():
            heading = line.strip()
            found[heading] = []
        elif heading is not None:
            found[heading].append(line)
    return {name: inspect.cleandoc("\n".join(lines)) for name, lines in found.items()}


def paragraphs_naming(cls: type[Codemod], code: str) -> list[str]:
    """The paragraphs and list items of the page that name `code`."""
    text = "\n\n".join(sections(cls).values())
    return [chunk for chunk in _chunks(text) if code in chunk]


def _chunks(text: str) -> list[str]:
    """Paragraphs, with each `- ` list item a chunk of its own."""
    chunks: list[list[str]] = []
    for line in text.splitlines():
        starts_item = line.lstrip().startswith("- ")
        if not line.strip():
            chunks.append([])
        elif starts_item or not chunks:
            chunks.append([line])
        else:
            chunks[-1].append(line)
    return [textwrap.dedent("\n".join(chunk)).strip() for chunk in chunks if chunk]


def resolve_name(name: str) -> tuple[Optional[type[Codemod]], Optional[str]]:
    """The codemod and, when `name` is a finding code, the code: for a word
    (`workers`, `accumulate=4`) or a code (`AM101`, `am101`)."""
    if name.strip().upper() in ENGINE_CODES:
        return None, name.strip().upper()
    words = list(parse_words(name)) if "=" in name else [name.strip()]
    cls = find(words[0]) if len(words) == 1 else None
    if cls is None:
        return None, None
    code = name.strip().upper()
    return cls, (code if code in cls.codes else None)


def apply_command(cls: type[Codemod]) -> str:
    return f"accelmigrate apply --to {cls.word}" + ("=N" if _needs_value(cls) else "")


def _needs_value(cls: type[Codemod]) -> bool:
    try:
        cls.check_options({})
    except ValueError:
        return True
    return False


def code_entry(cls: Optional[type[Codemod]], code: str) -> dict:
    """One code's entry: title, severity, what to do, the codemod it belongs to."""
    if cls is None:  # the engine's own (AM000: a codemod failed)
        severity, advice = ENGINE_ADVICE[code]
        title = FAILED_TITLE if code == CODEMOD_FAILED else ENGINE_CODES[code]
        return {"code": code, "title": title, "severity": severity, "codemod": None, "what_to_do": advice, "details": []}
    note = code in cls.notes
    if note:
        what = "Nothing: this is information (a note). `check` shows it only with --show-notes, and it never fails a check."
    else:
        what = (
            f"Where `check` marks it fixable ([*]), `{apply_command(cls)}` makes the change; otherwise the "
            "finding's message says the manual step."
        )
    what += f" `# accelmigrate: skip[{code}]` on the line silences this code there."
    return {
        "code": code,
        "title": cls.codes[code],
        "severity": "note" if note else "warning",
        "codemod": cls.word,
        "summary": cls.summary,
        "what_to_do": what,
        "details": paragraphs_naming(cls, code),
        "why": sections(cls).get("Why", ""),
    }


def entry_text(entry: dict) -> str:
    """An entry as `explain` prints it (and SARIF gives as a rule's help)."""
    lines = [f"{entry['code']}  {entry['title']}"]
    if entry["codemod"]:
        lines.append(f"codemod: {entry['codemod']} ({entry['summary']}); severity: {entry['severity']}")
    lines += ["", "What to do", _indent(entry["what_to_do"])]
    if entry["details"]:
        lines += ["", "Details", *(_indent(p) + "\n" for p in entry["details"])]
        lines[-1] = lines[-1].rstrip("\n")
    if entry.get("why"):
        lines += ["", "Why", _indent(entry["why"])]
    if entry["codemod"]:
        lines += ["", f"The whole page: accelmigrate explain {entry['codemod']}"]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line else line for line in text.splitlines())


def codemod_entry(cls: type[Codemod]) -> dict:
    """A codemod as `list --format json` describes it."""
    return {
        "word": cls.word,
        "summary": cls.summary,
        "codes": dict(cls.codes),
        "notes": sorted(cls.notes),
        "requires": list(cls.requires),
        "default": cls.word in DEFAULT_WORDS,
        "needs_value": _needs_value(cls),
    }


def presets() -> dict[str, tuple[str, ...]]:
    """Named sets of words, where the registry defines them."""
    import accelmigrate.codemods as registry

    return dict(getattr(registry, "PRESETS", {}))


def all_entries() -> list[dict]:
    return [codemod_entry(cls) for cls in all_codemods().values()]
