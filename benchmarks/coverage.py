"""How much of what each codemod applies to does it migrate, and what is left?

Runs every codemod as `--to WORD` would (with the words it requires), in
check mode, over the bundled training scripts (fixtures/scripts/)
and every fixture input (fixtures/<word>/<case>.py), and counts each
codemod's own findings: the sites it migrates (fixed findings) and the sites
it leaves with a finding, by code. Notes (codes that ask for no action) are
counted apart from the refusals. Prints one Markdown table per set of files.

    python benchmarks/coverage.py              # both tables
    python benchmarks/coverage.py --scripts    # the bundled scripts only
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping

from accelmigrate.codemods import UnknownCodemod, all_codemods, resolve
from accelmigrate.engine.migrate import MigrationError, migrate_source

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SCRIPTS = FIXTURES / "scripts"
# The value a word that needs one (`accumulate=N`, `batch-scale=K`) is given.
VALUE_FOR_WORDS_THAT_NEED_ONE = "4"


@dataclasses.dataclass
class Tally:
    """One codemod over one set of files."""

    files: int = 0  # files where it found a site
    migrated: int = 0
    left: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # code -> sites
    notes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failed: int = 0  # files where the codemod itself failed (AM000)

    @property
    def refused(self) -> int:
        return sum(self.left.values())


def bundled_scripts() -> list[Path]:
    return sorted(SCRIPTS.glob("*.py"))


def fixture_inputs() -> list[Path]:
    words = set(all_codemods())
    return sorted(
        case
        for folder in FIXTURES.iterdir()
        if folder.is_dir() and folder.name in words
        for case in folder.glob("*.py")
        if not case.name.endswith(".expected.py")
    )


def options_for(word: str) -> dict[str, str]:
    """No options, or the value a word cannot run without."""
    try:
        resolve({word: {}})
        return {}
    except UnknownCodemod:
        return {"value": VALUE_FOR_WORDS_THAT_NEED_ONE}


def tally(files: Iterable[Path]) -> dict[str, Tally]:
    """Every codemod's counts over the files. One check per file with every
    word: in check mode each codemod sees the file as the words it requires
    alone leave it, so its findings are those of `--to WORD`."""
    codemods = all_codemods()
    plan = [(word, options_for(word)) for word in codemods]
    result = {word: Tally() for word in codemods}
    for path in files:
        try:
            migration = migrate_source(path.read_text(encoding="utf-8"), plan, str(path), check_only=True)
        except MigrationError:
            continue  # fixtures of unparsable input
        by_word = collections.defaultdict(list)
        for finding in migration.findings:
            by_word[finding.word].append(finding)
        for word, found in by_word.items():
            count(result[word], found, codemods[word].notes)
    return result


def count(counts: Tally, findings: list, notes: frozenset) -> None:
    counts.files += 1
    for finding in findings:
        if finding.code == "AM000":
            counts.failed += 1
        elif finding.fixed:
            counts.migrated += 1
        elif finding.code in notes:
            counts.notes[finding.code] += 1
        else:
            counts.left[finding.code] += 1


def table(title: str, tallies: Mapping[str, Tally], file_count: int) -> str:
    lines = [
        f"{title} ({file_count} files)",
        "",
        "| word | files with sites | migrated | left with a finding | share migrated | left, by code | notes |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for word, counts in tallies.items():
        sites = counts.migrated + counts.refused
        share = f"{100 * counts.migrated / sites:.0f}%" if sites else "-"
        left = ", ".join(f"{code} {n}" for code, n in sorted(counts.left.items())) or "-"
        notes = ", ".join(f"{code} {n}" for code, n in sorted(counts.notes.items())) or "-"
        if counts.failed:
            left += f", AM000 (codemod failed) {counts.failed}"
        row = (f"`{word}`", counts.files, counts.migrated, counts.refused, share, left, notes)
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", action="store_true", help="only the bundled scripts")
    args = parser.parse_args(argv)
    sets = {"Bundled scripts (`fixtures/scripts/`)": bundled_scripts()}
    if not args.scripts:
        sets["Fixture inputs (`fixtures/<word>/<case>.py`)"] = fixture_inputs()
    started = time.perf_counter()
    for title, files in sets.items():
        tallies = tally(files)
        print(table(title, tallies, len(files)))
        print()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
