"""What the language server makes of one open document, without LSP types:
the findings `check` reports for its text, and the text `apply --to WORDS`
would write for it.

Each document keeps one entry, keyed by its text and its settings: an edit
recomputes only the document that changed, and asking again for the same
text (a code action after the diagnostics, a save without an edit) costs a
dictionary look-up. The settings (the nearest pyproject.toml, read as the CLI
reads it) are read again on every change, so an edited configuration counts
from the next keystroke.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from accelmigrate.codemods import DEFAULT_WORDS, Finding
from accelmigrate.engine.migrate import FileResult, known_codes, process_text
from accelmigrate.engine.selection import UsageError, config_for, plan_for, with_codes
from accelmigrate.output import lint

# `path:LINE:`, `path:LINE:COL:` or a notebook's `path:cell N:LINE:` at the start of an error.
_ERROR_PLACE = re.compile(r":(?:cell (?P<cell>\d+):)?(?P<line>\d+):(?:(?P<column>\d+):)?")


@dataclasses.dataclass(frozen=True)
class Overrides:
    """The editor's settings (`initializationOptions`, or the `accelmigrate`
    section of `workspace/didChangeConfiguration`), taken as the command
    line's --to, --select and --ignore are: over pyproject.toml's."""

    to: Optional[str] = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: object) -> "Overrides":
        if not isinstance(settings, dict):
            return cls()

        def strings(key: str) -> tuple[str, ...]:
            value = settings.get(key)
            value = [value] if isinstance(value, str) else value
            return tuple(str(item) for item in value) if isinstance(value, list) else ()

        to = settings.get("to")
        to = ",".join(to) if isinstance(to, list) else to
        return cls(str(to) if to else None, strings("select"), strings("ignore"))


@dataclasses.dataclass(frozen=True)
class Settings:
    """The configuration and the words `check` runs for one path, or why there are none."""

    config: object = None
    plan: tuple = ()
    silenced: frozenset = frozenset()  # the codes select/ignore/per-file-ignores leave out here: the codemods leave them alone
    error: Optional[str] = None

    @property
    def key(self) -> str:
        """What, besides the text, decides a result (the cache's other half)."""
        if self.error is not None:
            return self.error
        config = self.config
        return repr((self.plan, config.path, config.black, config.line_length, config.select, config.ignore, sorted(self.silenced)))


@dataclasses.dataclass(frozen=True)
class Checked:
    """`check` on one text: the findings it reports (notes included: an editor
    shows them as information), or the error that stopped it."""

    path: str
    text: str
    settings: Settings
    findings: tuple[Finding, ...] = ()
    error: Optional[str] = None

    @property
    def plan(self) -> tuple:
        return self.settings.plan

    def error_place(self) -> tuple[Optional[int], int, int]:
        """(cell, line, column) that the error names, 1-based; line 1 when it names none."""
        message = self.error or ""
        rest = message.removeprefix(self.path)
        match = _ERROR_PLACE.match(rest)
        if match is None:
            return None, 1, 1
        cell = int(match.group("cell")) if match.group("cell") else None
        return cell, int(match.group("line")), int(match.group("column") or 1)

    def fix_words(self) -> list[str]:
        """The `--to` spec of each codemod with a fixable finding, in running order."""
        fixable = {f.word for f in self.findings if f.fixed}
        return [lint.word_spec(word, self.plan) for word, _ in self.plan if word in fixable]


@dataclasses.dataclass
class _Entry:
    text: str
    key: str
    checked: Checked
    migrated: dict = dataclasses.field(default_factory=dict)  # --to spec (None: the configured words) -> FileResult


class Documents:
    """The results of the open documents, one entry per document."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.checks_run = 0  # how many texts were really checked (not answered from an entry)

    def check(self, uri: str, path: str, text: str, overrides: Overrides = Overrides()) -> Checked:
        settings = settings_for(path, overrides)
        entry = self._entries.get(uri)
        if entry is None or entry.text != text or entry.key != settings.key:
            entry = _Entry(text, settings.key, self._check(path, text, settings))
            self._entries[uri] = entry
        return entry.checked

    def migrated(self, uri: str, path: str, text: str, words: Optional[str], overrides: Overrides = Overrides()) -> FileResult:
        """What `accelmigrate apply --to WORDS` (None: without --to, the
        editor's words or the configured ones) writes for TEXT."""
        checked = self.check(uri, path, text, overrides)
        entry = self._entries[uri]
        if words not in entry.migrated:
            settings = checked.settings
            if settings.error is not None:
                entry.migrated[words] = FileResult(path, original=text, error=settings.error)
            else:
                try:
                    plan = plan_for(words or overrides.to, settings.config, DEFAULT_WORDS)
                except UsageError as error:  # a word the configuration's options refuse
                    entry.migrated[words] = FileResult(path, original=text, error=error.message)
                else:
                    config = settings.config
                    entry.migrated[words] = process_text(
                        path, text, plan, black_config=config.black, line_length=config.line_length, silenced=settings.silenced
                    )
        return entry.migrated[words]

    def forget(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def _check(self, path: str, text: str, settings: Settings) -> Checked:
        self.checks_run += 1
        if settings.error is not None:
            return Checked(path, text, settings, error=settings.error)
        result = process_text(path, text, settings.plan, check_only=True, silenced=settings.silenced)
        findings = lint.reported(result.findings, path=path, config=settings.config, show_notes=True)
        return Checked(path, text, settings, tuple(findings), result.error)


def settings_for(path: str, overrides: Overrides = Overrides()) -> Settings:
    """The nearest pyproject.toml's settings for PATH and `check`'s words,
    with the editor's over them, as the CLI takes them."""
    try:
        config = with_codes(config_for([path]), overrides.select, overrides.ignore)
        plan = tuple((word, dict(options)) for word, options in plan_for(overrides.to, config, DEFAULT_WORDS))
    except UsageError as error:  # a mistake in pyproject.toml or in the editor's settings, named there
        return Settings(error=error.message)
    return Settings(config, plan, config.codes().silenced(path, known_codes()))
