"""What a finding asks of a person, whatever the output format: its
severity, the words to show, and the command that fixes it.

A finding that `apply` can make (fixed in check mode) is shown by its code's
title, in the present, with the command that fixes it; one that needs a
manual step by its own message, which says the step. Codes that a codemod
lists in `notes` need no action: they are hidden unless asked for, and never
fail a check.

Which codes count is the configuration's (`select`, `ignore`,
`per-file-ignores`, and --select/--ignore on the command line): `reported`
applies it, with the notes' visibility, for the CLI and the language server.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

from accelmigrate.codemods import Finding, infos
from accelmigrate.engine.migrate import CODEMOD_FAILED, ENGINE_CODES, NOTES as ENGINE_NOTES, FileResult

ERROR, WARNING, NOTE = "error", "warning", "note"


def codemod_of(finding: Finding):
    """The codemod (class, or its manifest entry) that made `finding`."""
    return infos().get(finding.word)


def is_note(finding: Finding) -> bool:
    if finding.code in ENGINE_NOTES:  # the engine's own, e.g. codemods a notebook skips
        return True
    cls = codemod_of(finding)
    return cls is not None and finding.code in cls.notes


def severity(finding: Finding) -> str:
    """"error" for a codemod that failed, "note" for information, else "warning"."""
    if finding.code == CODEMOD_FAILED:
        return ERROR
    return NOTE if is_note(finding) else WARNING


def title(finding: Finding) -> str:
    """The code's one-line title (the message, for a code no codemod declares)."""
    cls = codemod_of(finding)
    if cls is None:
        return ENGINE_CODES.get(finding.code, finding.message)
    return cls.codes.get(finding.code, finding.message)


def word_spec(word: str, plan: Sequence[tuple[str, Mapping[str, str]]]) -> str:
    """`word`, or `word=value` when the plan gave it a value (`accumulate=4`)."""
    for planned, options in plan:
        if planned == word and options.get("value"):
            return f"{word}={options['value']}"
    return word


def fix_command(finding: Finding, plan: Sequence[tuple[str, Mapping[str, str]]]) -> str:
    return f"accelmigrate apply --to {word_spec(finding.word, plan)}"


def check_message(finding: Finding, plan: Sequence[tuple[str, Mapping[str, str]]]) -> str:
    """What `check` says: a fixable finding by its title and the command
    that fixes it; any other by its message (the manual step)."""
    if finding.fixed:
        return f"{title(finding)} (fixable with `{fix_command(finding, plan)}`)"
    return finding.message


def located_message(finding: Finding, plan: Sequence[tuple[str, Mapping[str, str]]]) -> str:
    """`check_message`, led by the cell and line where the finding is in a
    notebook: formats that point at lines of a file (GitHub, SARIF) cannot
    point into a notebook's cells."""
    cell = getattr(finding, "cell", None)
    where = "" if cell is None else f"cell {cell}, line {finding.line}: "
    return where + check_message(finding, plan)


def in_notebook(finding: Finding) -> bool:
    return getattr(finding, "cell", None) is not None


def visible(findings: Iterable[Finding], *, show_notes: bool, unfixed_only: bool = False) -> list[Finding]:
    """The findings to show: notes only when asked for; with `unfixed_only`
    (what `apply` leaves), only those that still need a manual step."""
    return [f for f in findings if (show_notes or not is_note(f)) and not (unfixed_only and f.fixed)]


def reported(
    findings: Iterable[Finding], *, path: str, config, show_notes: bool = False, unfixed_only: bool = False
) -> list[Finding]:
    """The findings of `path` to report: `visible`, and of the codes the
    configuration counts there (`config`: a Config, with --select/--ignore
    already merged in). A failed codemod (AM000) is always reported."""
    codes = config.codes()
    ignored = codes.ignored_for(path)
    return [
        f for f in visible(findings, show_notes=show_notes, unfixed_only=unfixed_only)
        if f.code == CODEMOD_FAILED or codes.decides(f.code, ignored)
    ]


def hidden_notes(results: Iterable[FileResult]) -> int:
    return sum(1 for r in results for f in r.findings if is_note(f))


def failing(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that fail a check: every one but notes."""
    return [f for f in findings if not is_note(f)]


def words_that_changed(result: FileResult) -> list[str]:
    """The codemods that changed this file, in running order: those that
    recorded a fix (a codemod changes a file only where it records one)."""
    fixed = {f.word for f in result.findings if f.fixed}
    return [word for word in infos() if word in fixed]
