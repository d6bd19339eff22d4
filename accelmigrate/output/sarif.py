"""SARIF 2.1.0 output, for GitHub code scanning and other SARIF readers:
one rule per finding code of the codemods that ran (its help is the
`explain` entry), one result per finding shown, and the files that could not
be processed as tool execution notifications."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Mapping, Sequence

from accelmigrate import __version__

from accelmigrate.codemods import Finding, all_codemods
from accelmigrate.engine.migrate import CODEMOD_FAILED, ENGINE_CODES, FileResult
from accelmigrate.output import lint
from accelmigrate.output.explain import code_entry, entry_text

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SOURCE_ROOT = "%SRCROOT%"
# SARIF's levels for our severities
LEVELS = {lint.ERROR: "error", lint.WARNING: "warning", lint.NOTE: "note"}

Plan = Sequence[tuple[str, Mapping[str, str]]]


def sarif_log(results: Sequence[FileResult], findings_shown: Mapping[str, list[Finding]], plan: Plan) -> dict:
    """The log of one run. `findings_shown`: path -> the findings to report."""
    engine_codes = sorted({f.code for found in findings_shown.values() for f in found if f.code in ENGINE_CODES} - {CODEMOD_FAILED})
    rules = _rules(plan, engine_codes)
    index = {rule["id"]: i for i, rule in enumerate(rules)}
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accelmigrate",
                        "version": __version__,
                        "informationUri": "https://github.com/accelmigrate/accelmigrate",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {SOURCE_ROOT: {"uri": Path.cwd().as_uri() + "/"}},
                "invocations": [_invocation(results)],
                "results": [
                    _result(path, finding, index, plan) for path, findings in findings_shown.items() for finding in findings
                ],
            }
        ],
    }


def _rules(plan: Plan, engine_codes: Sequence[str] = ()) -> list[dict]:
    registry = all_codemods()
    entries = [code_entry(None, code) for code in (CODEMOD_FAILED, *engine_codes)]
    for word, _ in plan:
        cls = registry[word]
        entries += [code_entry(cls, code) for code in cls.codes if code not in engine_codes]
    return [
        {
            "id": entry["code"],
            "name": entry["code"],
            "shortDescription": {"text": entry["title"]},
            "fullDescription": {"text": entry["title"]},
            "help": {"text": entry_text(entry)},
            "defaultConfiguration": {"level": LEVELS[entry["severity"]]},
            "properties": {"codemod": entry["codemod"] or ""},
        }
        for entry in entries
    ]


def _result(path: str, finding: Finding, index: Mapping[str, int], plan: Plan) -> dict:
    return {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": LEVELS[lint.severity(finding)],
        "message": {"text": lint.located_message(finding, plan)},
        "locations": [{"physicalLocation": _physical_location(path, finding)}],
        "properties": {"fixable": finding.fixed, "codemod": finding.word},
    }


def _physical_location(path: str, finding: Finding) -> dict:
    """The file, and the line and column in it; in a notebook the file only
    (its lines are JSON; the message names the cell and line)."""
    location: dict = {"artifactLocation": _artifact(path)}
    if not lint.in_notebook(finding):
        location["region"] = {"startLine": finding.line, "startColumn": finding.column}
    return location


def _artifact(path: str) -> dict:
    """A relative path as a URI reference under the source root; an absolute one as a file URI."""
    where = Path(path)
    if where.is_absolute():
        return {"uri": where.as_uri()}
    return {"uri": urllib.parse.quote(where.as_posix()), "uriBaseId": SOURCE_ROOT}


def _invocation(results: Sequence[FileResult]) -> dict:
    errors = [r for r in results if r.error]
    return {
        "executionSuccessful": not errors,
        "toolExecutionNotifications": [
            {
                "level": "error",
                "message": {"text": r.error},
                "locations": [{"physicalLocation": {"artifactLocation": _artifact(r.path)}}],
            }
            for r in errors
        ],
    }
