"""Showing results: diffs (coloured on a terminal, plain when piped), findings,
errors, summaries, and JSON for machines."""

from __future__ import annotations

import difflib
import json
from typing import Iterable, Sequence

from rich.console import Console
from rich.syntax import Syntax

from accelmigrate.engine import FileResult


def lines_with_ends(text: str) -> list[str]:
    """The lines as Python and `patch` see them: broken at "\n" only (a form
    feed or another Unicode line separator inside a line stays there)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def unified_diff(result: FileResult) -> str:
    before = lines_with_ends(result.original or "")
    after = lines_with_ends(result.migrated or "")
    lines = difflib.unified_diff(before, after, f"a/{result.path}", f"b/{result.path}")
    return "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines)


def finding_line(path: str, finding, *, fixable_hint: bool) -> str:
    line = f"{path}:{finding.line}:{finding.column}: {finding.code} {finding.message}"
    if fixable_hint and finding.fixed:
        line += f" [fixable: --to {finding.word}]"
    return line


class Reporter:
    """Writes to stdout (diffs, findings) and stderr (errors, summaries)."""

    def __init__(self) -> None:
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def is_terminal(self) -> bool:
        return self.out.is_terminal

    def diff(self, result: FileResult) -> None:
        text = unified_diff(result)
        if self.out.is_terminal:
            self.out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
        else:
            self.out.file.write(text)

    def findings(self, results: Iterable[FileResult], *, unfixed_only: bool, fixable_hint: bool) -> int:
        count = 0
        for result in results:
            for finding in result.findings:
                if unfixed_only and finding.fixed:
                    continue
                self.out.print(finding_line(result.path, finding, fixable_hint=fixable_hint), markup=False)
                count += 1
        return count

    def errors(self, results: Iterable[FileResult]) -> int:
        count = 0
        for result in results:
            if result.error:
                self.err.print(f"error: {result.error}", markup=False, style="red" if self.err.is_terminal else None)
                count += 1
        return count

    def note(self, text: str) -> None:
        self.err.print(text, markup=False)

    def json(self, results: Sequence[FileResult]) -> None:
        payload = [
            {
                "path": r.path,
                "changed": r.changed,
                "error": r.error,
                "findings": [f.as_dict() for f in r.findings],
            }
            for r in results
        ]
        self.out.file.write(json.dumps(payload, indent=2) + "\n")
