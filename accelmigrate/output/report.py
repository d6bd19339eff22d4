"""Showing results: diffs (coloured on a terminal, plain when piped), findings,
errors, summaries; JSON, GitHub workflow annotations and SARIF for machines.

rich is imported only for a terminal (colours, a progress bar) or a table:
piped output, as a hook or an editor reads it, is written plainly.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from typing import Iterable, Mapping, Optional, Sequence

from accelmigrate.codemods import Finding
from accelmigrate.engine.migrate import FileResult, Plan
from accelmigrate.files.notebook import finding_position
from accelmigrate.output import lint


def lines_with_ends(text: str) -> list[str]:
    """The lines as Python and `patch` see them: broken at "\n" only (a form
    feed or another Unicode line separator inside a line stays there)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def shown_path(path: str) -> str:
    """A file name as text output may show it: as is, or, when it holds a
    character a terminal would obey or hide (an escape sequence, a line
    break, a bidirectional override, an undecodable byte), quoted with those
    characters escaped (`'x\\x1b[2J.py'`), so one name cannot forge or erase
    lines of output."""
    return path if path.isprintable() else repr(path)


def printable(text: str) -> str:
    """TEXT with every unprintable character escaped (`\\x1b`, `\\t`)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def unified_diff(result: FileResult, *, quoted: bool = False) -> str:
    """The unified diff of a changed file; `quoted`: its headers' names as
    `shown_path` shows them (for text output; JSON keeps the real name)."""
    before = lines_with_ends(result.original or "")
    after = lines_with_ends(result.migrated or "")
    names = [f"{side}/{result.path}" for side in "ab"]
    lines = difflib.unified_diff(before, after, *(map(shown_path, names) if quoted else names))
    return "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines)


def finding_line(path: str, finding: Finding, *, check: bool, plan: Plan = ()) -> str:
    """`path:line:col: CODE message`. In `check`, a fixable finding reads
    `CODE [*] title (fixable with ...)` and a note `CODE note: message`."""
    where = f"{shown_path(path)}:{finding_position(finding)}: {finding.code}"
    if check and finding.fixed:
        return f"{where} [*] {printable(lint.check_message(finding, plan))}"
    if lint.is_note(finding):
        return f"{where} note: {printable(finding.message)}"
    return f"{where} {printable(finding.message)}"


def github_escape(text: str, *, property_value: bool = False) -> str:
    """A workflow command's data (or property value) escaped as GitHub reads it."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


GITHUB_COMMANDS = {lint.ERROR: "error", lint.WARNING: "warning", lint.NOTE: "notice"}


def github_annotation(path: str, finding: Finding, plan: Plan) -> str:
    """`::warning file=...,line=...,col=...,title=CODE::message` (the file's
    real name: GitHub links the annotation to it; the message printable, as
    the log shows it)."""
    where = (("file", path),) if lint.in_notebook(finding) else (("file", path), ("line", finding.line), ("col", finding.column))
    properties = ",".join(
        f"{key}={github_escape(str(value), property_value=True)}" for key, value in (*where, ("title", finding.code))
    )
    return f"::{GITHUB_COMMANDS[lint.severity(finding)]} {properties}::{github_escape(printable(lint.located_message(finding, plan)))}"


def result_payload(result: FileResult, shown: Sequence[Finding], check_plan: Optional[Plan] = None) -> dict:
    """One file in `--format json`: what happened to it, which codemods
    changed it, the findings shown (each with its severity and title), and
    the unified diff when it changed. For `check` (`check_plan`, the words
    checked), a finding's message is what `check` says (`lint.check_message`:
    what to do, in the present), not what `apply` did."""
    return {
        "path": result.path,
        "changed": result.changed,
        "written": result.written,
        "error": result.error,
        "codemods": lint.words_that_changed(result) if result.changed else [],
        "findings": [
            {
                **f.as_dict(), "severity": lint.severity(f), "title": lint.title(f),
                **({"message": lint.check_message(f, check_plan)} if check_plan is not None else {}),
            }
            for f in shown
        ],
        "diff": unified_diff(result) if result.changed else None,
    }


class PlainConsole:
    """What the reporter asks of rich's Console, for a stream that is no
    terminal: each text on a line of its own, as given."""

    is_terminal = False

    def __init__(self, *, stderr: bool = False) -> None:
        self.stderr = stderr

    @property
    def file(self):
        return sys.stderr if self.stderr else sys.stdout  # as rich does: the stream of the moment

    def print(self, *objects, markup=None, style=None, **_) -> None:
        self.file.write(" ".join(str(o) for o in objects) + "\n")


def _wants_rich(stream) -> bool:
    """rich's own test, without rich: a terminal, or colours forced."""
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(*, stderr: bool = False):
    """rich's Console for a terminal, else a PlainConsole."""
    if not _wants_rich(sys.stderr if stderr else sys.stdout):
        return PlainConsole(stderr=stderr)
    return rich_console(stderr=stderr)


def rich_console(*, stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


class Reporter:
    """Writes to stdout (diffs, findings, machine formats) and stderr (errors, summaries)."""

    def __init__(self) -> None:
        self.out = console()
        self.err = console(stderr=True)

    @property
    def is_terminal(self) -> bool:
        return self.out.is_terminal

    def diff(self, result: FileResult) -> None:
        text = unified_diff(result, quoted=True)
        if self.out.is_terminal:
            from rich.syntax import Syntax

            self.out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
        else:
            self.out.file.write(text)

    def findings(self, shown: Mapping[str, Sequence[Finding]], *, check: bool, plan: Plan = ()) -> None:
        for path, findings in shown.items():
            for finding in findings:
                self.out.print(finding_line(path, finding, check=check, plan=plan), markup=False)

    def changed_files(self, results: Iterable[FileResult], *, verb: str) -> None:
        """`changed train.py: workers, item`: each changed file and the codemods that changed it."""
        for result in results:
            if result.changed:
                self.err.print(f"{verb} {shown_path(result.path)}: {', '.join(lint.words_that_changed(result))}", markup=False)

    def errors(self, results: Iterable[FileResult]) -> int:
        count = 0
        for result in results:
            if result.error:
                self.error(result.error, path=result.path)
                count += 1
        return count

    def error(self, message: str, *, path: str = "") -> None:
        """`error: MESSAGE` on stderr, PATH (named in it) quoted if it must be."""
        if path and not path.isprintable():
            message = message.replace(path, shown_path(path))
        self.err.print(f"error: {printable(message)}", markup=False, style="red" if self.err.is_terminal else None)

    def note(self, text: str) -> None:
        self.err.print(text, markup=False)

    def write(self, text: str) -> None:
        self.out.file.write(text)

    def write_bytes(self, data: bytes) -> None:
        """DATA on stdout as it is (a file's text in its own encoding)."""
        stream = self.out.file
        stream.flush()
        stream.buffer.write(data)
        stream.buffer.flush()

    def json(self, value) -> None:
        self.write(json.dumps(value, indent=2) + "\n")

    def results_json(self, results: Sequence[FileResult], shown: Mapping[str, Sequence[Finding]], check_plan: Optional[Plan] = None) -> None:
        self.json([result_payload(r, shown.get(r.path, ()), check_plan) for r in results])

    def github(self, results: Sequence[FileResult], shown: Mapping[str, Sequence[Finding]], plan: Plan) -> None:
        lines = [github_annotation(path, f, plan) for path, findings in shown.items() for f in findings]
        lines += [
            f"::error file={github_escape(r.path, property_value=True)}::{github_escape(printable(r.error))}" for r in results if r.error
        ]
        self.write("".join(line + "\n" for line in lines))

    def sarif(self, results: Sequence[FileResult], shown: Mapping[str, Sequence[Finding]], plan: Plan) -> None:
        from accelmigrate.output.sarif import sarif_log

        self.json(sarif_log(results, shown, plan))
