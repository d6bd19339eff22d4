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
from accelmigrate.codemods.script.plain_helpers import definitions
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.engine.plain_inlining import without_runtime_imports

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


def runtime_cases():
    for case in fixture_cases():
        path = case.values[0]
        expected = path.with_name(path.stem + ".expected.py")
        if expected.exists() and "accelmigrate.runtime" in expected.read_text(encoding="utf-8"):
            yield case


@pytest.mark.parametrize("case", list(runtime_cases()))
def test_fixture_pair_in_plain_code(case: Path):
    """What `apply` writes by default: the expected output with the runtime's
    helpers defined in the file. It parses, imports from the runtime only the
    helpers that have no plain definition, those imported under another name
    (the file has its own of that name) and those the case imported itself;
    and a second run leaves it as it is (the codemods know the definitions)."""
    source = case.read_text(encoding="utf-8")
    plan = plan_for(case, source)
    plain = without_runtime_imports(source, expected_for(case, source))
    ast.parse(plain)
    left = {name for name in runtime_names(plain) if name in definitions()} - set(runtime_names(source))
    assert not left, f"still imported from the runtime: {sorted(left)}"
    second = migrate_source(plain, plan, str(case))
    assert without_runtime_imports(plain, second.code) == plain, "not idempotent in plain code"


def runtime_names(code: str) -> list[str]:
    """The names imported from the runtime as themselves (not `as` another)."""
    return [
        alias.name
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelmigrate.runtime")
        for alias in node.names
        if alias.asname in (None, alias.name)
    ]
