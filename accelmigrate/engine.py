"""Run codemods over source text and files.

One file: read (encoding, newlines and BOM kept) -> cheap text pre-check ->
parse -> codemods in their fixed order -> check the result parses -> keep
black formatting if the input had it -> diff or atomic write -> FileResult.
A file that fails becomes a FileResult with an error and is never written;
the others go on.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import io
import os
import re
import tokenize
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper

from accelmigrate.codemods import Codemod, Finding, all_codemods, resolve
from accelmigrate.codemods._base import ALL_CODES, Suppressions
from accelmigrate.formatting import black_format, is_black_formatted
from accelmigrate.sources import InputError, SourceText, read_source, write_atomically

SUPPRESSION_MARK = "accelmigrate:"
_SKIP = re.compile(r"accelmigrate:\s*skip(?:\[([A-Za-z0-9_,\s]+)\])?")

# Selected codemods with their options; a plain, picklable description so that
# worker processes can rebuild it.
Plan = Sequence[tuple[str, Mapping[str, str]]]


@dataclasses.dataclass
class FileResult:
    path: str
    original: Optional[str] = None
    migrated: Optional[str] = None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    error: Optional[str] = None
    written: bool = False

    @property
    def changed(self) -> bool:
        return self.error is None and self.migrated is not None and self.migrated != self.original


@dataclasses.dataclass
class Migration:
    code: str
    findings: list[Finding]


class MigrationError(Exception):
    """The source cannot be migrated (syntax error); the message names the line."""


def suppressions_in(source: str) -> Suppressions:
    """Lines carrying `# accelmigrate: skip` or `# accelmigrate: skip[CODE,...]`."""
    if SUPPRESSION_MARK not in source:
        return {}
    found: dict[int, Optional[frozenset]] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                match = _SKIP.search(token.string)
                if match:
                    codes = match.group(1)
                    found[token.start[0]] = (
                        frozenset(c.strip().upper() for c in codes.split(",") if c.strip()) if codes else ALL_CODES
                    )
    except (tokenize.TokenError, SyntaxError):
        pass  # the parser reports the real problem
    return found


def _classes(plan: Plan) -> list[tuple[type[Codemod], Mapping[str, str]]]:
    return resolve({word: options for word, options in plan})


def _parse(source: str, path: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        message = str(error.message).splitlines()[0] if error.message else "invalid syntax"
        raise MigrationError(f"{path}:{error.raw_line}:{error.raw_column + 1}: syntax error: {message}") from None


def _run_one(
    cls: type[Codemod], options: Mapping[str, str], wrapper: MetadataWrapper, path: str, suppressions: Suppressions
) -> tuple[cst.Module, list[Finding], bool]:
    """One codemod over one tree: the new tree, the findings, and whether it
    changed anything (a codemod changes the tree only where it records a fix).
    Its failure is a finding, never the file's."""
    context = CodemodContext(filename=path, wrapper=wrapper)
    try:
        codemod = cls(context, options, suppressions)
        tree = wrapper.visit(codemod)
        if codemod.imports_changed:
            tree = AddImportsVisitor(context).transform_module(tree)
            if context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):
                tree = RemoveImportsVisitor(context).transform_module(tree)
    except Exception as error:  # a bug in one codemod must not cost the others
        detail = traceback.format_exception_only(type(error), error)[-1].strip()
        failure = Finding(1, 1, "AM000", f"codemod {cls.word!r} failed and changed nothing: {detail}", False, cls.word)
        return wrapper.module, [failure], False
    changed = codemod.imports_changed or any(f.fixed for f in codemod.findings)
    return tree, codemod.findings, changed


@dataclasses.dataclass(frozen=True)
class _Stage:
    """One version of the file on its way through the codemods."""

    wrapper: MetadataWrapper
    code: str
    suppressions: Suppressions

    @classmethod
    def of(cls, tree: cst.Module, code: str) -> "_Stage":
        # The comments moved with their lines: find the suppressions again.
        return cls(MetadataWrapper(tree, unsafe_skip_copy=True), code, suppressions_in(code))


def migrate_source(source: str, plan: Plan, path: str = "<string>", *, check_only: bool = False) -> Migration:
    """Apply the planned codemods one after the other, each on the previous
    one's output (so `amp` sees the device binding that `device` added).
    Metadata is resolved again only after a codemod changed the tree. Every
    finding's position is a position in `source`, whatever ran before.

    With `check_only` the code stays `source`, and each codemod sees the file
    as its prerequisites alone leave it (`amp` after `device`, `item` on the
    original): the same findings for far fewer metadata resolutions.
    """
    selected = [(cls, options) for cls, options in _classes(plan) if cls.wants(source)]
    if not selected:
        _ensure_valid_syntax(source, path)  # CPython's parser: far cheaper than LibCST's
        return Migration(source, [])
    original = _Stage.of(_parse(source, path), source)
    findings: list[Finding] = []

    def advance(stage: _Stage, cls: type[Codemod], options: Mapping[str, str]) -> _Stage:
        tree, found, changed = _run_one(cls, options, stage.wrapper, path, stage.suppressions)
        findings.extend(found if stage.code is source else _in_original_lines(found, stage.code, source))
        return _Stage.of(tree, tree.code) if changed else stage

    if check_only:
        words = [cls.word for cls, _ in selected]
        stages: dict[tuple[str, ...], _Stage] = {(): original}
        for cls, options in selected:
            before = tuple(w for w in words if w in _prerequisites(cls))
            stages[(*before, cls.word)] = advance(stages[before], cls, options)
        return Migration(source, sorted(findings))
    stage = original
    for cls, options in selected:
        stage = advance(stage, cls, options)
    return Migration(stage.code, sorted(findings))


def _prerequisites(cls: type[Codemod]) -> set[str]:
    """Every word `cls` requires, directly or through another codemod."""
    registry = all_codemods()
    found: set[str] = set()
    pending = list(cls.requires)
    while pending:
        word = pending.pop()
        if word not in found:
            found.add(word)
            pending.extend(registry[word].requires)
    return found


def _in_original_lines(findings: list[Finding], stage: str, original: str) -> list[Finding]:
    """Findings positioned in an intermediate version of the file, moved to the
    matching lines of the original (a line that an earlier codemod inserted
    maps to the original line where it was inserted)."""
    if not findings:
        return findings
    before, after = original.splitlines(), stage.splitlines()
    to_original: dict[int, int] = {}
    for _, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        for offset in range(j2 - j1):
            to_original[j1 + offset + 1] = min(i1 + offset, max(i1, i2 - 1), max(len(before) - 1, 0)) + 1
    return [dataclasses.replace(f, line=to_original.get(f.line, f.line)) for f in findings]


def _ensure_valid_syntax(source: str, path: str) -> None:
    try:
        ast.parse(source)
    except SyntaxError as error:
        column = f"{error.offset}:" if error.offset else ""
        raise MigrationError(f"{path}:{error.lineno}:{column} syntax error: {error.msg}") from None


def _ensure_parses(code: str, path: str) -> None:
    try:
        ast.parse(code)
    except SyntaxError as error:
        raise MigrationError(
            f"{path}:{error.lineno}: internal error: the migrated code does not parse ({error.msg}); file left unchanged"
        ) from None


def process_file(
    path: str,
    plan: Plan,
    *,
    check_only: bool = False,
    write: bool = False,
    black_config: Optional[Mapping] = None,
) -> FileResult:
    result = FileResult(path)
    try:
        source = read_source(Path(path))
        result.original = source.text
        migration = migrate_source(source.text, plan, path, check_only=check_only)
        result.findings = migration.findings
        migrated = migration.code
        if migrated != source.text:
            _ensure_parses(migrated, path)
            if black_config is not None and is_black_formatted(source.text, black_config):
                migrated = black_format(migrated, black_config)
        result.migrated = migrated
        if write and result.changed:
            write_atomically(Path(path), SourceText(migrated, source.encoding))
            result.written = True
    except (InputError, MigrationError) as error:
        result.error = str(error)
    except OSError as error:
        result.error = f"{path}: cannot write: {error.strerror or error}"
    return result


def process_files(
    paths: Sequence[str],
    plan: Plan,
    *,
    check_only: bool = False,
    write: bool = False,
    black_config: Optional[Mapping] = None,
    jobs: Optional[int] = None,
    on_done: Optional[Callable[[FileResult], None]] = None,
) -> list[FileResult]:
    """Process many files, in worker processes when there are several; results
    come back in the order of `paths`."""
    jobs = jobs or os.cpu_count() or 1
    kwargs = dict(check_only=check_only, write=write, black_config=black_config)
    results: list[FileResult] = []
    if jobs <= 1 or len(paths) < 4:
        for path in paths:
            results.append(process_file(path, plan, **kwargs))
            if on_done:
                on_done(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=min(jobs, len(paths))) as pool:
        chunk = max(1, min(16, len(paths) // (jobs * 8)))
        for result in pool.map(_process_file_star, [(p, plan, kwargs) for p in paths], chunksize=chunk):
            results.append(result)
            if on_done:
                on_done(result)
    return results


def _process_file_star(job: tuple[str, Plan, dict]) -> FileResult:
    path, plan, kwargs = job
    return process_file(path, plan, **kwargs)


def plan_of(items: Iterable[tuple[type[Codemod], Mapping[str, str]]]) -> list[tuple[str, dict[str, str]]]:
    return [(cls.word, dict(options)) for cls, options in items]
