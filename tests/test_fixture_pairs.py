"""Every fixture pair: fixtures/<word>/<case>.py and <case>.expected.py.

- the migrated case equals <case>.expected.py (absent: the case must stay unchanged),
- the output parses, and a second run changes nothing (idempotency),
- when <case>.findings exists, the findings are exactly its lines `LINE:COL CODE`.

A case migrates with its folder's word, unless a line `# fixture-to: WORDS`
near its top names other words (e.g. `device,amp` or `accumulate=4`).
"""

import ast
import re
from pathlib import Path

import pytest

from accelmigrate.codemods import all_codemods
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES

_DIRECTIVE = re.compile(r"^# fixture-to:\s*(\S+)\s*$", re.MULTILINE)


def fixture_cases():
    words = set(all_codemods())
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name in words):
        for case in sorted(folder.glob("*.py")):
            if not case.name.endswith(".expected.py"):
                yield pytest.param(case, id=f"{folder.name}/{case.stem}")


def plan_for(case: Path, source: str):
    directive = _DIRECTIVE.search(source[:2000])
    spec = directive.group(1) if directive else case.parent.name
    plan = []
    for item in spec.split(","):
        word, _, value = item.partition("=")
        plan.append((word, {"value": value} if value else {}))
    return plan


def expected_for(case: Path, source: str) -> str:
    expected = case.with_name(case.stem + ".expected.py")
    return expected.read_text(encoding="utf-8") if expected.exists() else source


@pytest.mark.parametrize("case", list(fixture_cases()))
def test_fixture_pair(case: Path):
    source = case.read_text(encoding="utf-8")
    plan = plan_for(case, source)
    result = migrate_source(source, plan, str(case))
    ast.parse(result.code)
    assert result.code == expected_for(case, source)
    second = migrate_source(result.code, plan, str(case))
    assert second.code == result.code, "not idempotent: a second run changed the output"
    assert not [f for f in second.findings if f.fixed], "a second run still reports fixes"
    findings_file = case.with_name(case.stem + ".findings")
    if findings_file.exists():
        expected = [line.strip() for line in findings_file.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert [f"{f.line}:{f.column} {f.code}" for f in result.findings] == expected


def test_every_codemod_has_fixtures():
    for word in all_codemods():
        folder = FIXTURES / word
        assert folder.is_dir() and any(folder.glob("*.expected.py")), f"no fixture pairs for {word}"
