"""Run codemods over source text and files.

One file: read (encoding, newlines and BOM kept; refused over
MAX_SOURCE_BYTES) -> answered from the cache when this content was seen
with the same codemods and options (and signed by this user) -> cheap text
pre-check -> one CPython parse (its verdict on syntax, with its positions, and
the `ast` pre-check: which codemods can apply at all) -> LibCST parse, only
when some codemod can -> codemods in their fixed order -> check the result
parses -> fit it to the file (new imports in their isort sections; black over
the whole file if the input was black-formatted, else over the inserted or
rewritten statements too long for the line length) -> diff or atomic write
(refused if the file changed since it was read) -> FileResult. A file that
fails, for whatever reason, becomes a FileResult with an error and is never
written; the others go on.

A notebook (`.ipynb`) goes the same way as one source made of its code cells
(`notebook.py`), without the codemods that restructure a script's entry
point; its findings are placed in their cells.

LibCST's visitors recurse once or more per level of nesting, so the LibCST
part runs in a thread with a large stack and a raised recursion limit: any
program that CPython itself accepts is deep enough to be handled.
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import gc
import io
import os
import re
import sys
import threading
import tokenize
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from accelmigrate.codemods import Finding, infos, load, resolve_infos
from accelmigrate.codemods._finding import ALL_CODES, Suppressions
from accelmigrate.codemods.script import project_facts
from accelmigrate.codemods.script.plain_helpers import carried_lines, without_carried
from accelmigrate.codemods.script.precheck import SourceFacts, precheck
from accelmigrate.codemods.script.project_facts import NO_FACTS, ProjectFacts
from accelmigrate.codemods.script.rules import words_that_may_apply
from accelmigrate.engine.cache import Outcome, ResultCache
from accelmigrate.engine.config import close_match
from accelmigrate.engine import plain_code
from accelmigrate.engine.formatting import (
    black_format,
    configured_line_length,
    fit_changed_statements,
    is_black_formatted,
    parenthesized_long_tuples,
)
from accelmigrate.engine.import_order import first_party_layout, place_new_imports
from accelmigrate.engine.line_map import in_original_lines, lines_of
from accelmigrate.files.notebook import NotebookError, cell_marker_lines, is_notebook, parse_notebook
from accelmigrate.files.sources import FileStamp, InputError, SourceText, one_line, read_source, remove_stale_temporaries, write_atomically
from accelmigrate.project.modules import ProjectFiles
from accelmigrate.project.torch_version import TorchTarget, targeted_torch
from accelmigrate.project.training_elsewhere import TRAINER_LOOP, TRAINING_ELSEWHERE, training_findings

SUPPRESSION_MARK = "accelmigrate:"
# `skip`, `skip[AM101]`, `skip [AM101, AM201]`, `skip[AM101 AM201]`; not `skipped`;
# `skip-file` (no codemod runs on the file), `skip-file[AM101]` (those codes nowhere in it).
# A bracket left open (`skip[AM101`) still names its codes: it never silences every code.
_SKIP = re.compile(r"accelmigrate:\s*skip(-file)?(?![\w-])(?:\s*\[([^\]]*)\]?)?")
# `# noqa: AM101, E501` names the codes of this line as ruff and flake8 read it:
# its AM codes are a `skip[...]` of them. A bare `# noqa` (or one naming other
# tools' codes only) is the other linters' and silences nothing here.
NOQA_MARK = "noqa"
_NOQA = re.compile(r"#\s*noqa\s*:\s*([a-z]+[0-9]+(?:[\s,]+[a-z]+[0-9]+)*)", re.IGNORECASE)

# Selected codemods with their options; a plain, picklable description so that
# worker processes can rebuild it.
Plan = Sequence[tuple[str, Mapping[str, str]]]

# Larger files are refused: the codemods cost about 0.1 s and 1 MB of
# memory per KB of source, so a file of several MB (generated code, an
# embedded table) would hold a worker for many minutes and gigabytes.
MAX_SOURCE_BYTES = 2 * 2**20
# The code of the finding that says a codemod failed on a file.
CODEMOD_FAILED = "AM000"
# CPython (at its default recursion limit) accepts about 3,000 levels of
# nesting; LibCST needs some 7 frames a level, each well under 10 KiB of C stack.
DEEP_RECURSION_LIMIT = 50_000
DEEP_STACK_BYTES = 512 * 2**20  # address space: only the pages used are ever touched
# While a file is migrated, the garbage collector passes less often: a LibCST
# tree of a large file is millions of objects, freed by reference counting
# anyway, and at CPython's default thresholds (a young-generation pass every
# 700 allocations) the collector took a fifth of a check over torch's sources.
GC_THRESHOLDS = (50_000, 20, 100)

# A notebook has no entry point to restructure: its cells run top to bottom in
# one long-lived kernel that no launcher starts twice. main-guard and ddp are
# not run on one, nor the codemods that need them (workers needs main-guard so
# that spawned workers can re-import the classes they load, which a notebook
# cannot give them; sync-bn needs ddp). The note below says so, once a notebook.
NOT_IN_NOTEBOOK = "AM001"
RESTRUCTURING_WORDS = frozenset({"main-guard", "ddp"})
# A skip mark that names a code no codemod has; a code in the configuration
# (select, ignore, per-file-ignores) that names none; a code-specific skip
# mark that silenced nothing (as ruff's RUF100).
UNKNOWN_CODE_IN_MARK = "AM002"
UNKNOWN_CODE_IN_CONFIG = "AM003"
UNUSED_MARK = "AM004"
# A notebook's code cell that does not parse on its own: the others are migrated.
UNPARSED_CELL = "AM007"
# Words whose code needs a newer torch than the project is confined to
# (accelmigrate/project/torch_version.py): left out, saying which and why.
NEEDS_NEWER_TORCH = "AM008"
# A project pinned to a torch older than any word writes for: migrated for a
# current torch, with a note that the requirement must rise.
PINNED_TORCH_TOO_OLD = "AM009"
# Engine codes that need no action (hidden by `check` unless --show-notes).
NOTES = frozenset({NOT_IN_NOTEBOOK, PINNED_TORCH_TOO_OLD})
# Words that act on a training step: where one finds none in a file, it says
# where the training runs (AM005, AM006: accelmigrate/project/training_elsewhere.py).
TRAINING_WORDS = frozenset({"amp", "ddp", "accelerate", "fabric", "accumulate", "fsdp"})
# The engine's own codes, with their titles (`accelmigrate explain AM004`).
ENGINE_CODES = {
    CODEMOD_FAILED: "a codemod failed on the file and changed nothing",
    NOT_IN_NOTEBOOK: "codemods that restructure a script are not applied in a notebook",
    UNKNOWN_CODE_IN_MARK: "skip mark names an unknown code",
    UNKNOWN_CODE_IN_CONFIG: "configuration names an unknown code",
    UNUSED_MARK: "skip mark silences nothing",
    TRAINING_ELSEWHERE: "the training runs in an imported module of the project, not in this file",
    TRAINER_LOOP: "the training loop runs in a third-party library's trainer",
    UNPARSED_CELL: "notebook cell that does not parse: left as written, the other cells migrated",
    NEEDS_NEWER_TORCH: "words not applied: the code they write needs a newer torch than the project's",
    PINNED_TORCH_TOO_OLD: "the project pins a torch older than the migrated code runs on",
}


@dataclasses.dataclass
class FileResult:
    path: str
    original: Optional[str] = None
    migrated: Optional[str] = None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    error: Optional[str] = None
    written: bool = False
    # How the file was read, so that a later write keeps its encoding and
    # notices a concurrent save (see write_result).
    encoding: str = dataclasses.field(default="utf-8", compare=False, repr=False)
    read_as: Optional[FileStamp] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def changed(self) -> bool:
        return self.error is None and self.migrated is not None and self.migrated != self.original


@dataclasses.dataclass
class Migration:
    code: str
    findings: list[Finding]
    used_marks: frozenset = frozenset()  # (line in the source, code) of the mark codes that silenced a finding


class MigrationError(Exception):
    """The source cannot be migrated (syntax error); the message names the line."""


@dataclasses.dataclass(frozen=True)
class Mark:
    """One `# accelmigrate: skip...` comment: where, its codes (None: every
    code), and whether it is a file-level `skip-file`."""

    line: int
    column: int  # 1-based, of the comment
    codes: Optional[tuple[str, ...]]
    whole_file: bool = False


def marks_in(source: str) -> list[Mark]:
    """The skip marks of `source`, in order (comments only: not in strings),
    `# noqa: AMnnn` among them."""
    if SUPPRESSION_MARK not in source and NOQA_MARK not in source.lower():
        return []
    found: list[Mark] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                match = _SKIP.search(token.string)
                if match:
                    codes = match.group(2)
                    listed = tuple(dict.fromkeys(c.upper() for c in re.split(r"[\s,]+", codes) if c)) if codes is not None else None
                    found.append(Mark(token.start[0], token.start[1] + 1, listed, bool(match.group(1))))
                    continue
                noqa = _NOQA.search(token.string)
                ours = tuple(dict.fromkeys(c.upper() for c in re.split(r"[\s,]+", noqa.group(1)) if c.upper().startswith("AM"))) if noqa else ()
                if ours:
                    found.append(Mark(token.start[0], token.start[1] + 1, ours))
    except (tokenize.TokenError, SyntaxError):
        pass  # the parser reports the real problem
    return found


class _MarkCodes(frozenset):
    """The codes silenced on a line; remembers those of its own mark that
    silenced a finding (which marks silence nothing is ruff's RUF100 question)."""

    def __contains__(self, code) -> bool:
        found = frozenset.__contains__(self, code)
        if found and not self.marks:  # a mark's own codes
            self.hits.add(code)
        elif found:  # a line's codes and the file's: the mark that has it
            for mark in self.marks:
                if frozenset.__contains__(mark, code):
                    mark.hits.add(code)
                    break
        return found

    @classmethod
    def of(cls, codes, *marks: "_MarkCodes") -> "_MarkCodes":
        made = cls(codes)
        made.marks, made.hits = marks, set()
        return made


class _FileSuppressions(dict):
    """Line marks, and codes silenced on every line (`skip-file[CODES]`, and
    the codes the configuration leaves out)."""

    def __init__(self, lines: Mapping[int, Optional[frozenset]], everywhere: frozenset, file_mark: Optional[_MarkCodes]) -> None:
        super().__init__(lines)
        self.everywhere, self.file_mark = everywhere, file_mark

    def __bool__(self) -> bool:
        return True

    def __contains__(self, line) -> bool:
        return True

    def __getitem__(self, line):
        own = dict.get(self, line, frozenset())
        if own is ALL_CODES:
            return ALL_CODES
        marks = [m for m in (own, self.file_mark) if isinstance(m, _MarkCodes)]
        return _MarkCodes.of(own | self.everywhere | (self.file_mark or frozenset()), *marks)

    def get(self, line, default=None):
        return self[line]


def suppressions_in(source: str, silenced: frozenset = frozenset()) -> Suppressions:
    """Lines carrying `# accelmigrate: skip` or `# accelmigrate: skip[CODE,...]`
    (and, on every line, `skip-file[CODE,...]`'s codes and `silenced`), and
    those of the plain definitions the file carries (plain_helpers.carried_lines)."""
    found: dict[int, Optional[frozenset]] = {}
    file_codes: set[str] = set()
    for mark in marks_in(source):
        if mark.whole_file:
            file_codes.update(mark.codes or ())
        elif mark.codes is None:
            found[mark.line] = ALL_CODES
        elif found.get(mark.line, frozenset()) is not ALL_CODES:
            found[mark.line] = _MarkCodes.of(mark.codes)
    for line in carried_lines(source):  # the runtime's helpers, written into the file
        found[line] = ALL_CODES
    if file_codes or silenced:
        return _FileSuppressions(found, frozenset(silenced), _MarkCodes.of(file_codes) if file_codes else None)
    return found


def _used_marks(suppressions: Suppressions) -> list[tuple[int, str]]:
    """(line, code) of each line mark's code that silenced a finding; line 0: `skip-file[...]`."""
    used = [(line, code) for line, codes in dict.items(suppressions) if isinstance(codes, _MarkCodes) for code in codes.hits]
    file_mark = getattr(suppressions, "file_mark", None)
    return used + [(0, code) for code in (file_mark.hits if file_mark is not None else ())]


def skips_whole_file(source: str) -> bool:
    """`# accelmigrate: skip-file` (without codes): no codemod runs on it."""
    return SUPPRESSION_MARK in source and any(m.whole_file and m.codes is None for m in marks_in(source))


def known_codes() -> frozenset:
    """Every finding code: the codemods' and the engine's."""
    return frozenset(ENGINE_CODES).union(*(cls.codes for cls in infos().values()))


def _classes(plan: Plan) -> list:
    """The planned codemods, as the registry describes them (not imported)."""
    return resolve_infos({word: options for word, options in plan})


def _parse(source: str, path: str) -> "cst.Module":
    """LibCST's tree of a file that CPython has already accepted."""
    import libcst as cst

    from accelmigrate.engine import indentation

    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        message = str(error.message).splitlines()[0] if error.message else "invalid syntax"
        raise MigrationError(f"{path}: valid Python that LibCST cannot parse ({message}); file left unchanged") from None
    if indentation.needs_care(source):
        tree = indentation.before_codemods(tree)
    return tree


def _ensure_round_trip(tree: "cst.Module", source: str, path: str) -> None:
    """LibCST moves form feeds that sit inside an indentation (it repeats or
    drops them): a file whose text it would change outside the rewritten
    nodes is left alone."""
    if "\f" not in source:
        return
    printed = tree.code
    if printed != source:
        line = next(
            (n for n, (a, b) in enumerate(zip(lines_of(source), lines_of(printed)), 1) if a != b),
            min(source.count("\n"), printed.count("\n")) + 1,
        )
        raise MigrationError(
            f"{path}:{line}: a form feed inside the indentation cannot be kept byte for byte; "
            "file left unchanged (remove the form feed and run again)"
        )


def _run_one(
    cls: "type[Codemod]",
    options: Mapping[str, str],
    wrapper: "MetadataWrapper",
    path: str,
    suppressions: Suppressions,
    rewrite: bool = True,
) -> "tuple[cst.Module, list[Finding], bool]":
    """One codemod over one tree: the new tree, the findings, and whether it
    changed anything (a codemod changes the tree only where it records a fix).
    Without `rewrite` only the findings count (the tree may be left half
    rewritten). Its failure is a finding, never the file's."""
    context = CodemodScratch(path, wrapper)
    try:
        codemod = cls(context, options, suppressions, rewrite=rewrite)
        tree = wrapper.visit(codemod)
        if rewrite and codemod.imports_changed:  # without `rewrite` the tree is not wanted
            from libcst.codemod import CodemodContext
            from libcst.codemod.visitors import RemoveImportsVisitor

            context = CodemodContext(filename=path, wrapper=wrapper, scratch=context.scratch)
            keep_star_imported_torch(context, wrapper.module)
            tree = add_imports(context, tree)
            if context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):
                tree = _import_remover(context).transform_module(tree)
    except Exception as error:  # a bug in one codemod must not cost the others
        detail = _describe(error, in_codemod=True)
        failure = Finding(1, 1, CODEMOD_FAILED, f"codemod {cls.word!r} failed and changed nothing: {detail}", False, cls.word)
        return wrapper.module, [failure], False
    return tree, codemod.findings, codemod.changes_anything()


@dataclasses.dataclass
class CodemodScratch:
    """What a codemod reads and writes of LibCST's CodemodContext (the file,
    its metadata wrapper, and the scratch where imports to add or remove are
    requested), without importing LibCST's whole codemod package for it: a
    third of the CPU of checking a training script. The engine hands the
    scratch to a CodemodContext where it applies the requests."""

    filename: str
    wrapper: "MetadataWrapper"
    scratch: dict = dataclasses.field(default_factory=dict)
    full_module_name: Optional[str] = None
    full_package_name: Optional[str] = None
    metadata_manager: Optional[object] = None
    warnings: list = dataclasses.field(default_factory=list)


def _import_remover(context: "CodemodContext"):
    """LibCST's RemoveImportsVisitor, except that an import line it removes
    leaves behind the cell markers above it: LibCST drops a removed line's
    comment lines with it, and a marker there (the import opened its cell)
    would take the cell's boundary with it, the cell's remaining code
    falling into the cell before. The comment lines up to the last marker
    (those that close the cell before, and the marker) go to the next
    statement; the import's own comments, below the marker, go with it."""
    from libcst.codemod.visitors import RemoveImportsVisitor

    class KeepingCellMarkers(RemoveImportsVisitor):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.emptied: list = []  # original import lines left with no statement

        def leave_SimpleStatementLine(self, original_node, updated_node):
            updated_node = super().leave_SimpleStatementLine(original_node, updated_node)
            if original_node.body and not getattr(updated_node, "body", True):
                self.emptied.append(original_node)
            return updated_node

        def leave_Module(self, original_node, updated_node):
            updated_node = super().leave_Module(original_node, updated_node)
            body, footer = self.carried(original_node.body, updated_node.body, updated_node.footer)
            return updated_node.with_changes(body=body, footer=footer)

        def leave_IndentedBlock(self, original_node, updated_node):
            updated_node = super().leave_IndentedBlock(original_node, updated_node)
            body, footer = self.carried(original_node.body, updated_node.body, updated_node.footer)
            return updated_node.with_changes(body=body, footer=footer)

        def carried(self, originals, updated, footer):
            removed = [any(o is e for e in self.emptied) for o in originals]
            if not any(removed) or len(updated) != removed.count(False):
                return updated, footer
            body, pending, kept = [], [], iter(updated)
            for original, gone in zip(originals, removed):
                if gone:
                    pending += _through_last_marker(original.leading_lines)
                    continue
                statement = next(kept)
                if pending:
                    statement = statement.with_changes(leading_lines=[*pending, *statement.leading_lines])
                    pending = []
                body.append(statement)
            return body, [*pending, *footer]

    return KeepingCellMarkers(context)


def _through_last_marker(lines) -> list:
    """The comment lines above a statement up to its last cell marker; none without one."""
    from accelmigrate.codemods._syntax import is_cell_marker

    marks = [n for n, line in enumerate(lines) if is_cell_marker(line)]
    return list(lines[: marks[-1] + 1]) if marks else []


def add_imports(context: "CodemodContext", tree: "cst.Module") -> "cst.Module":
    """What LibCST's AddImportsVisitor makes of `tree`, from a pass over only
    the statements it reads or changes: a leading docstring (or `__strict__`),
    the imports that follow it (those it extends and inserts after) and the
    first statement after them (which gets an empty line above it). It copies
    and visits the whole module, and a script's statements after its imports
    are most of it; they are put back as they are."""
    from libcst.codemod.visitors._add_imports import _skip_first  # the visitor's own test for a leading docstring

    AddImportsVisitor = globals().get("AddImportsVisitor") or __getattr__("AddImportsVisitor")
    end = 1 if _skip_first(tree) else 0
    while end < len(tree.body) and _is_import_line(tree.body[end]):
        end += 1
    head = tree.with_changes(body=tree.body[: end + 1])
    added = AddImportsVisitor(context).transform_module(head)
    return added.with_changes(body=[*added.body, *tree.body[end + 1 :]])


def keep_star_imported_torch(context: "CodemodContext", before: "cst.Module") -> None:
    """No `import torch` for a file that, before the codemod, already read
    `torch` from a star import (`from data import *`): it runs as it is, and
    an import added would make the next run see names it could not see in
    this one (the file's `torch.no_grad()`), which would migrate it further:
    not idempotent. Only the file's own reads count, never the codemod's."""
    import libcst as cst
    from libcst.codemod.visitors import AddImportsVisitor

    key = AddImportsVisitor.CONTEXT_KEY
    wanted = context.scratch.get(key, [])
    torch = [item for item in wanted if item.module == "torch" and item.obj_name is None and item.alias is None]
    if not torch:
        return
    imports = [s.body[0] for s in before.body if isinstance(s, cst.SimpleStatementLine) and s.body and isinstance(s.body[0], (cst.Import, cst.ImportFrom))]
    star = any(isinstance(i, cst.ImportFrom) and isinstance(i.names, cst.ImportStar) for i in imports)
    bound = any(isinstance(i, cst.Import) and any(a.evaluated_name == "torch" for a in i.names) for i in imports)
    if star and not bound and _reads_torch(before):
        context.scratch[key] = [item for item in wanted if item not in torch]


def _reads_torch(tree: "cst.Module") -> bool:
    """`torch.x` read somewhere outside the import statements (whose module
    names, `from torch.utils.data import *`, are no read of the name)."""
    import libcst as cst

    class Reads(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.found = False

        def visit_Import(self, node) -> bool:
            return False

        def visit_ImportFrom(self, node) -> bool:
            return False

        def visit_Attribute(self, node) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == "torch":
                self.found = True

    reads = Reads()
    tree.visit(reads)
    return reads.found


def __getattr__(name: str):
    """LibCST's AddImportsVisitor as `engine.AddImportsVisitor` (imported when
    first asked for, not with the engine); a test may replace it there."""
    if name == "AddImportsVisitor":
        from libcst.codemod.visitors import AddImportsVisitor

        return AddImportsVisitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_import_line(statement: "cst.BaseStatement") -> bool:
    """A line of one import, the statements AddImportsVisitor counts as the import block."""
    import libcst as cst

    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], (cst.Import, cst.ImportFrom))
    )


@dataclasses.dataclass(frozen=True)
class _Stage:
    """One version of the file on its way through the codemods."""

    wrapper: "MetadataWrapper"
    code: str
    suppressions: Suppressions

    @classmethod
    def of(cls, tree: "cst.Module", code: str, silenced: frozenset = frozenset()) -> "_Stage":
        from libcst.metadata import MetadataWrapper

        # The comments moved with their lines: find the suppressions again.
        return cls(MetadataWrapper(tree, unsafe_skip_copy=True), code, suppressions_in(code, silenced))


def migrate_source(
    source: str,
    plan: Plan,
    path: str = "<string>",
    *,
    check_only: bool = False,
    notebook: bool = False,
    silenced: frozenset = frozenset(),
) -> Migration:
    """Apply the planned codemods one after the other, each on the previous
    one's output (so `amp` sees the device binding that `device` added).
    Metadata is resolved again only after a codemod changed the tree. Every
    finding's position is a position in `source`, whatever ran before.

    With `check_only` the code stays `source`, and each codemod sees the file
    as its prerequisites alone leave it (`amp` after `device`, `item` on the
    original): the same findings for far fewer metadata resolutions.

    With `notebook` (`source` is a notebook's code cells), the codemods that
    restructure a script's entry point, and those that need them, are left
    out, with one note naming those that would have applied.

    `silenced` codes are left alone on every line, as if each carried
    `# accelmigrate: skip[CODES]` (the configuration's select and ignore).
    A file marked `# accelmigrate: skip-file` is left alone; a skip mark that
    names an unknown code, or a code-specific one that silences nothing, is a
    finding.
    """
    if skips_whole_file(source):
        return Migration(source, [])
    with _rarer_collections:
        migration = _migrate_source(source, plan, path, check_only, notebook, silenced)
    extra = _mark_findings(source, plan, migration.used_marks, silenced)
    findings = _not_handed_over(migration.findings, plan)
    if extra or len(findings) != len(migration.findings):
        return dataclasses.replace(migration, findings=sorted(findings + extra))
    return migration


def _not_handed_over(findings: list[Finding], plan: Plan) -> list[Finding]:
    """The findings but those whose fix a codemod hands to another word that
    runs in this plan (its `handed_to`): that word makes the change, or
    says why not, itself."""
    classes = _classes(plan)
    running = {cls.word for cls, _ in classes}
    handed = {cls.word: cls.handed_to for cls, _ in classes if cls.handed_to}
    if not handed:
        return findings
    return [f for f in findings if f.fixed or running.isdisjoint(handed.get(f.word, {}).get(f.code, ()))]


def _training_elsewhere(
    source: str, plan: Plan, path: str, findings: list[Finding], silenced: frozenset, covered: frozenset = frozenset()
) -> list[Finding]:
    """Where the words that act on a training step changed and said nothing,
    where the training runs instead (accelmigrate/project/training_elsewhere.py):
    a word never changes nothing silently."""
    quiet = [word for word, _ in plan if word in TRAINING_WORDS and not any(f.word == word for f in findings)]
    if not quiet:
        return []
    try:
        source = parse_notebook(source, path).source if is_notebook(path) else source
    except NotebookError:
        return []
    return training_findings(source, path, quiet, silenced, covered)


def _mark_findings(source: str, plan: Plan, used: frozenset, silenced: frozenset) -> list[Finding]:
    """Skip marks that name no known code (AM002), and codes of a mark that
    silenced nothing this run (AM004): only codes of the planned codemods,
    whose findings this run looked for, and that the configuration counts."""
    marks = marks_in(source)
    if not any(mark.codes for mark in marks):
        return []
    known = known_codes()
    planned = {code for cls, _ in _classes(plan) for code in cls.codes}  # with the codemods they require
    found = []
    for mark in marks:
        unknown = [code for code in mark.codes or () if code not in known]
        if unknown:
            found.append(Finding(
                mark.line, mark.column, UNKNOWN_CODE_IN_MARK,
                f"skip mark names unknown code(s) {', '.join(unknown)}{close_match(unknown[0], known)}; see `accelmigrate list` for the codes", False, "",
            ))
        line = 0 if mark.whole_file else mark.line
        idle = [c for c in mark.codes or () if c in planned and c not in silenced and (line, c) not in used]
        if idle:
            found.append(Finding(
                mark.line, mark.column, UNUSED_MARK,
                f"skip mark silences nothing here: {', '.join(idle)} (remove {'them' if len(idle) > 1 else 'it'} from the mark)",
                False, "",
            ))
    return found


def _migrate_source(source: str, plan: Plan, path: str, check_only: bool, notebook: bool, silenced: frozenset) -> Migration:
    selected = codemods_that_may_apply(source, plan, path)
    left_out: list[str] = []
    if notebook:
        left_out = [cls.word for cls, _ in selected if _restructures(cls)]
        selected = [(cls, options) for cls, options in selected if not _restructures(cls)]
    notes = [_not_in_notebook(left_out)] if left_out else []
    target = targeted_torch(path)
    too_new = [cls for cls, _ in selected if target is not None and target.supported and tuple(cls.needs_torch) > target.version]
    if too_new:
        notes.append(_needs_newer_torch(too_new, target))
        selected = [(cls, options) for cls, options in selected if cls not in too_new]
    if not selected:
        return Migration(source, notes)  # never parsed by LibCST
    selected = [(load(cls), options) for cls, options in selected]
    migration = on_deep_stack(_run_codemods, source, selected, path, check_only, silenced, notebook)
    if target is not None and not target.supported:
        notes += _pinned_too_old(selected, migration.findings, target)
    return Migration(migration.code, sorted(notes + migration.findings), migration.used_marks)


def _cell_crossing(before: str, after: str, word: str) -> Optional[Finding]:
    """An AM000 finding where a codemod's version of a notebook's joint
    source moved or lost a cell marker (code of one cell carried into
    another, a block spanning two cells), at the first marker it moved; None
    where every cell keeps its code. Each codemod keeps its changes within
    cells (an import goes into the cell that needs it, or the first); one
    that cannot is left out, and the notebook is still migrated by the others."""
    old, new = cell_marker_lines(before), cell_marker_lines(after)
    if [cell for _, cell in old] == [cell for _, cell in new]:
        return None
    moved = next((line for (line, cell), (_, other) in zip(old, new) if cell != other), None)
    line = moved or (old[len(new)][0] if len(old) > len(new) else 1)
    return Finding(
        line, 1, CODEMOD_FAILED,
        f"codemod {word!r} failed and changed nothing: its changes would move code across notebook cells "
        "(a block or a statement spanning a cell boundary); make that change by hand, within one cell",
        False, word,
    )


def _restructures(cls) -> bool:
    return cls.word in RESTRUCTURING_WORDS or not RESTRUCTURING_WORDS.isdisjoint(_prerequisites(cls))


def _not_in_notebook(words: list[str]) -> Finding:
    return Finding(
        1, 1, NOT_IN_NOTEBOOK,
        f"not applied in a notebook: {', '.join(words)} (they need the training under `if __name__ == \"__main__\":` "
        "in a script that processes can re-import, which a notebook cannot be; move the training code into a .py "
        "script to migrate it with them)",
        False, words[0],
    )


def _needs_newer_torch(classes: list, target: TorchTarget) -> Finding:
    needs = ", ".join(f"{cls.word} (torch {'.'.join(map(str, cls.needs_torch))})" for cls in classes)
    return Finding(
        1, 1, NEEDS_NEWER_TORCH,
        f"not applied: {needs}: the code they write does not run on torch {target.key()}, which this project "
        f"targets ({target.where}); raise the project's torch to apply them",
        False, classes[0].word,
    )


def _pinned_too_old(selected: list, findings: list[Finding], target: TorchTarget) -> list[Finding]:
    """A note where a word wrote code that the project's (old) pinned torch cannot run."""
    fixed = {f.word for f in findings if f.fixed}
    newer = [cls for cls, _ in selected if cls.word in fixed and tuple(cls.needs_torch) > target.version]
    if not newer:
        return []
    needed = ".".join(map(str, max(tuple(cls.needs_torch) for cls in newer)))
    return [Finding(
        1, 1, PINNED_TORCH_TOO_OLD,
        f"written for torch {needed} or later ({', '.join(cls.word for cls in newer)}): this project pins torch "
        f"{target.key()} ({target.where}), older than any torch the migrated code runs on; raise it to torch>={needed}",
        False, newer[0].word,
    )]


def codemods_that_may_apply(source: str, plan: Plan, path: str = "<string>") -> list[tuple[object, Mapping[str, str]]]:
    """The planned codemods, in running order, that may change or report
    something in `source`, decided before LibCST: each codemod's text trigger,
    then one CPython parse (at CPython's own recursion limit) that gives both
    its verdict on syntax (a MigrationError) and the pre-check facts, which
    each codemod's rule reads (seeing also what the codemods before it may
    write)."""
    # A file the project pairs with another (a helper module whose output
    # becomes rank 0's) may need a word whose own triggers it lacks.
    paired = project_facts.current().pairs
    source = without_carried(source)
    wanted = [(cls, options) for cls, options in _classes(plan) if cls.wants(source) or paired and cls.reads_handoffs]
    facts = _cpython_facts(source, path, walk=bool(wanted))
    if facts is None:
        return []
    kept = set(words_that_may_apply(facts, [cls.word for cls, _ in wanted]))
    return [(cls, options) for cls, options in wanted if cls.word in kept or paired and cls.reads_handoffs]


def _run_codemods(
    source: str,
    selected: "list[tuple[type[Codemod], Mapping[str, str]]]",
    path: str,
    check_only: bool,
    silenced: frozenset = frozenset(),
    notebook: bool = False,
) -> Migration:
    original = _Stage.of(_parse(source, path), source, silenced)
    findings: list[Finding] = []
    line_maps: dict[str, dict[int, int]] = {}  # a version's code -> its lines' lines in `source`
    made = [original]

    def used_marks() -> frozenset:
        """The mark codes that silenced a finding in any version, at their lines in `source`."""
        used = set()
        for stage in made:
            hits = _used_marks(stage.suppressions)
            if stage.code is not source:
                lines = [Finding(line, 1, code, "", False, "") for line, code in hits if line]
                hits = [(f.line, f.code) for f in in_original_lines(lines, stage.code, source, line_maps)] + [
                    (line, code) for line, code in hits if not line
                ]
            used.update(hits)
        return frozenset(used)

    def advance(
        stage: _Stage, cls: "type[Codemod]", options: Mapping[str, str], *, record: bool = True, read: bool = True
    ) -> _Stage:
        """The stage after `cls`. When no later codemod `read`s it, only its
        findings count: the codemod plans and reports as in `apply`, but
        neither rewrites the tree nor adds or removes imports."""
        tree, found, changed = _run_one(cls, options, stage.wrapper, path, stage.suppressions, rewrite=read)
        if notebook and changed and read:
            crossing = _cell_crossing(stage.code, tree.code, cls.word)
            if crossing is not None:  # the other codemods still migrate the notebook
                found, changed = [*(f for f in found if not f.fixed), crossing], False
        if record:
            findings.extend(found if stage.code is source else in_original_lines(found, stage.code, source, line_maps))
        if changed and read:
            made.append(_Stage.of(tree, tree.code, silenced))
            return made[-1]
        return stage

    if check_only:
        by_word = {cls.word: (cls, options) for cls, options in selected}
        stages: dict[tuple[str, ...], _Stage] = {(): original}

        def stage_after(words: tuple[str, ...]) -> _Stage:
            """The file as these prerequisites, in order, leave it; a chain no
            codemod has run yet (two prerequisites that do not need each
            other) is run here, its findings already counted by their own."""
            if words not in stages:
                stages[words] = advance(stage_after(words[:-1]), *by_word[words[-1]], record=False)
            return stages[words]

        required = _required_words(selected)
        for cls, options in selected:
            before = tuple(w for w in by_word if w in _prerequisites(cls))
            if cls.word in required:
                stages[(*before, cls.word)] = advance(stage_after(before), cls, options)
            else:  # no codemod runs on what this one leaves
                advance(stage_after(before), cls, options, read=False)
        return Migration(source, sorted(findings), used_marks())
    stage = original
    for cls, options in selected:
        stage = advance(stage, cls, options)
    if stage is original:
        return Migration(source, sorted(findings), used_marks())
    _ensure_round_trip(original.wrapper.module, source, path)
    final = stage.wrapper.module
    from accelmigrate.engine import indentation

    code = indentation.after_codemods(final).code if indentation.needs_care(source) else stage.code
    return Migration(code, sorted(findings), used_marks())


_deep = threading.local()


def on_deep_stack(function: Callable, *args):
    """`function(*args)` in a thread with a large stack and a high recursion
    limit (the limit is per interpreter: raised only while such a thread
    runs, since only its stack can hold that many frames)."""
    if getattr(_deep, "active", False):
        return function(*args)
    outcome: dict[str, object] = {}
    context = contextvars.copy_context()  # the caller's (the project's facts of the file)

    def run() -> None:
        _deep.active = True
        try:
            with _raised_recursion_limit:
                outcome["value"] = context.run(function, *args)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = _start_with_deep_stack(run)
    if thread is None:  # no such thread to be had: the ordinary stack and limit
        return function(*args)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]


_stack_size_lock = threading.Lock()


def _start_with_deep_stack(run: Callable[[], None]) -> Optional[threading.Thread]:
    with _stack_size_lock:
        try:
            previous = threading.stack_size(DEEP_STACK_BYTES)
        except (ValueError, RuntimeError):
            return None
        try:
            thread = threading.Thread(target=run, name="accelmigrate-codemods", daemon=True)
            thread.start()
        except RuntimeError:
            return None
        finally:
            threading.stack_size(previous)
    return thread


class _SharedSetting:
    """A process-wide setting changed while at least one thread is inside:
    the first to enter changes it, the last to leave puts back what was there."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None], changed: Callable[[Any], Any]) -> None:
        self.read, self.write, self.changed = read, write, changed
        self.lock = threading.Lock()
        self.inside = 0
        self.before: Any = None

    def __enter__(self) -> None:
        with self.lock:
            if self.inside == 0:
                self.before = self.read()
                self.write(self.changed(self.before))
            self.inside += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                self.write(self.before)


_raised_recursion_limit = _SharedSetting(
    sys.getrecursionlimit, sys.setrecursionlimit, lambda before: max(before, DEEP_RECURSION_LIMIT)
)
# 0: collection is off, and stays off.
_rarer_collections = _SharedSetting(
    gc.get_threshold,
    lambda thresholds: gc.set_threshold(*thresholds),
    lambda before: tuple(max(mine, theirs) for mine, theirs in zip(GC_THRESHOLDS, before)) if before[0] else before,
)


def _required_words(selected: Sequence[tuple[object, Mapping[str, str]]]) -> set[str]:
    """The words whose version of the file some selected codemod runs on."""
    return {word for cls, _ in selected for word in _prerequisites(cls)}


def _prerequisites(cls) -> set[str]:
    """Every word `cls` requires, directly or through another codemod."""
    registry = infos()
    found: set[str] = set()
    pending = list(cls.requires)
    while pending:
        word = pending.pop()
        if word not in found:
            found.add(word)
            pending.extend(registry[word].requires)
    return found


def _cpython_facts(source: str, path: str, *, walk: bool) -> Optional[SourceFacts]:
    """CPython's verdict on `source` (a syntax error becomes a MigrationError
    with CPython's position, 1-based line and column, and message), from its
    one parse; with `walk`, the pre-check facts read from that parse."""
    try:
        if walk:
            return precheck(source)
        ast.parse(source)
        return None
    except SyntaxError as error:
        where = f"{error.lineno}:{error.offset}" if error.offset else f"{error.lineno}"
        raise MigrationError(f"{path}:{where}: syntax error: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise MigrationError(f"{path}: nested too deeply for Python's own parser; file left unchanged") from None
    except ValueError as error:  # NUL characters in a string given directly
        raise MigrationError(f"{path}: {error}") from None


def _ensure_parses(code: str, path: str) -> None:
    try:
        ast.parse(code)
    except (SyntaxError, RecursionError, MemoryError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else "nested too deeply for Python's parser"
        line = f"{error.lineno}:" if isinstance(error, SyntaxError) else ""
        raise MigrationError(
            f"{path}:{line} internal error: the migrated code does not parse ({reason}); file left unchanged"
        ) from None


def process_file(
    path: str,
    plan: Plan,
    *,
    check_only: bool = False,
    write: bool = False,
    black_config: Optional[Mapping] = None,
    cache: Optional[ResultCache] = None,
    line_length: Optional[int] = None,
    silenced: frozenset = frozenset(),
    covered: frozenset = frozenset(),
    project: ProjectFacts = NO_FACTS,
    runtime: bool = False,
) -> FileResult:
    """One file, start to end. Whatever goes wrong becomes this file's error
    (never the run's end); the file is then never written. With a `cache`
    (opened for this plan, mode and black settings), content seen before is
    answered from it. Inserted code is fitted to `line_length` (None: black's
    configured length, else 88). `covered`: the files (resolved) migrated
    in the same run, whose training is not "elsewhere" (AM005); `project`:
    what the project's other files tell about this one; `runtime`: the
    migrated code imports the runtime's helpers (accelmigrate/engine/plain_code.py)."""
    try:
        source = read_source(Path(path))
    except InputError as error:
        return FileResult(path, error=str(error))
    with project_facts.given(project), plain_code.keeping_runtime(runtime):
        result = _process_source(path, source, plan, check_only, black_config, cache, line_length, silenced, covered)
    result.encoding, result.read_as = source.encoding, source.read_as
    if write and result.changed:
        write_result(result)
    return result


def write_result(result: FileResult) -> None:
    """Write a changed result over its file, atomically and only if the file
    is still as it was read; a failure becomes the result's error."""
    path = result.path
    try:
        write_atomically(Path(path), SourceText(result.migrated, result.encoding), replacing=result.read_as)
        result.written = True
    except InputError as error:
        result.error = str(error)
    except OSError as error:
        result.error = f"{path}: cannot write: {error.strerror or error}"
    except Exception as error:  # a bug, or an input nobody foresaw: this file only
        result.error = f"{path}: internal error, file left unchanged: {_describe(error)}"


def process_text(
    path: str,
    text: str,
    plan: Plan,
    *,
    check_only: bool = False,
    black_config: Optional[Mapping] = None,
    line_length: Optional[int] = None,
    silenced: frozenset = frozenset(),
    runtime: bool = False,
) -> FileResult:
    """What `process_file` makes of a file holding `text`, without reading or
    writing it (an editor's buffer, stdin): `result.migrated` is exactly the
    text `apply` would write. `path` names it in messages and decides whether
    it is a notebook. `silenced`: codes the codemods leave alone everywhere
    (`Config.codes().silenced(path, known_codes())`)."""
    with plain_code.keeping_runtime(runtime):
        return _process_source(path, SourceText(text, "utf-8"), plan, check_only, black_config, None, line_length, silenced)


def _process_source(
    path: str,
    source: SourceText,
    plan: Plan,
    check_only: bool,
    black_config: Optional[Mapping],
    cache: Optional[ResultCache],
    line_length: Optional[int],
    silenced: frozenset = frozenset(),
    covered: frozenset = frozenset(),
) -> FileResult:
    result = FileResult(path)
    try:
        if not is_notebook(path):  # a notebook's outputs (images) cost nothing: its code cells are measured
            size = source.read_as.size if source.read_as else len(source.text.encode("utf-8", "surrogatepass"))
            _ensure_not_too_large(path, size)
        result.original = source.text
        outcome = _cached_outcome(source, path, cache, plan, check_only, black_config, line_length, silenced)
        # outside the cache: it depends on the other files of the project
        findings = outcome.findings if outcome.error else outcome.findings + _training_elsewhere(source.text, plan, path, outcome.findings, silenced, covered)
        result.findings, result.error = _in_cells(path, source.text, sorted(findings)), outcome.error
        if outcome.error is not None:
            return result
        result.migrated = source.text if outcome.migrated is None else outcome.migrated
    except InputError as error:
        result.error = str(error)
    except Exception as error:  # a bug, or an input nobody foresaw: this file only
        result.error = f"{path}: internal error, file left unchanged: {_describe(error)}"
    return result


def _ensure_not_too_large(path: str, size: int, what: str = "") -> None:
    if size > MAX_SOURCE_BYTES:
        raise InputError(
            f"{path}: {what}{size / 2**20:.1f} MB, over the {MAX_SOURCE_BYTES // 2**20} MB that can be migrated safely; "
            "skipped (migrate the training code in a file of its own)"
        )


def _cached_outcome(
    source: SourceText,
    path: str,
    cache: Optional[ResultCache],
    plan: Plan,
    check_only: bool,
    black_config: Optional[Mapping],
    line_length: Optional[int],
    silenced: frozenset = frozenset(),
) -> Outcome:
    if cache is None:
        return _outcome(source.text, path, plan, check_only, black_config, line_length, silenced)
    layout = "" if check_only else first_party_layout(path)
    target = targeted_torch(path)  # which words apply, and how the plain definitions are spelled
    layout += "\2" + (target.key() if target is not None else "")
    facts = project_facts.current().key()  # what the other files of the project say of this one
    key = cache.key(path, source, layout + ("\0" + ",".join(sorted(silenced)) if silenced else "") + ("\1" + facts if facts else ""))
    outcome = cache.get(key, source)
    if outcome is None or not _still_parses(outcome, path):
        outcome = _outcome(source.text, path, plan, check_only, black_config, line_length, silenced)
        if not any(f.code == CODEMOD_FAILED for f in outcome.findings):  # a failure may not recur (memory, a bug fixed)
            cache.put(key, outcome, source)
    return outcome


def _still_parses(outcome: Outcome, path: str) -> bool:
    """Whether a cached migration is still valid Python (the first
    guarantee holds even for an entry damaged after it was signed)."""
    if outcome.migrated is None:
        return True
    try:
        _ensure_parses(parse_notebook(outcome.migrated, path).source if is_notebook(path) else outcome.migrated, path)
    except (MigrationError, NotebookError):
        return False
    return True


def _outcome(
    text: str,
    path: str,
    plan: Plan,
    check_only: bool,
    black_config: Optional[Mapping],
    line_length: Optional[int] = None,
    silenced: frozenset = frozenset(),
) -> Outcome:
    """What the codemods make of `text`: the migrated text (None: unchanged)
    and the findings, or the error that refuses it. Only what follows from
    the text is caught here; anything else is the caller's (and never cached)."""
    if is_notebook(path):
        return _notebook_outcome(text, path, plan, check_only, black_config, line_length, silenced)
    if "\r" in text and "\n" not in text:  # old Mac line ends, which CPython reads as "\n"
        outcome = _outcome(text.replace("\r", "\n"), path, plan, check_only, black_config, line_length, silenced)
        return dataclasses.replace(outcome, migrated=outcome.migrated and outcome.migrated.replace("\n", "\r"))
    try:
        migration = migrate_source(text, plan, path, check_only=check_only, silenced=silenced)
    except MigrationError as error:
        return Outcome(None, [], str(error))
    migrated = on_deep_stack(
        plain_code.as_configured, text, migration.code, line_length or configured_line_length(black_config or {}), _written_for(path)
    )
    if migrated == text:
        return Outcome(None, migration.findings)
    try:
        _ensure_parses(migrated, path)
    except MigrationError as error:
        return Outcome(None, migration.findings, str(error))
    return Outcome(_fitted(text, migrated, path, black_config, line_length), migration.findings)


def _written_for(path: str) -> Optional[tuple[int, int]]:
    """The torch whose spellings the plain definitions take: the project's,
    where it is one the words write for; else the newest's (None)."""
    target = targeted_torch(path)
    return target.version if target is not None and target.supported else None


def _fitted(original: str, migrated: str, path: str, black_config: Optional[Mapping], line_length: Optional[int]) -> str:
    """MIGRATED in the file's style: new imports in their isort sections, then
    black over the whole file if it was black-formatted, else black over the
    inserted or rewritten statements that are too long for the line length."""
    length = line_length or configured_line_length(black_config or {})
    placed = parenthesized_long_tuples(original, place_new_imports(original, migrated, path), length)
    if black_config is not None and is_black_formatted(original, black_config):
        return black_format(placed, black_config)
    return fit_changed_statements(original, placed, length, black_config or {})


def _notebook_outcome(
    text: str,
    path: str,
    plan: Plan,
    check_only: bool,
    black_config: Optional[Mapping],
    line_length: Optional[int],
    silenced: frozenset = frozenset(),
) -> Outcome:
    """A notebook's outcome: its code cells migrated as one source (magics and
    shell lines inert), then put back into its JSON text, where only the
    `source` of the cells that changed is rewritten. Findings keep their
    positions in that source (`_in_cells` places them)."""
    try:
        notebook = parse_notebook(text, path)
        _ensure_not_too_large(path, len(notebook.source.encode("utf-8", "surrogatepass")), "code cells of ")
        if not notebook.is_python:
            return Outcome(None, [])
        migration = migrate_source(notebook.source, plan, path, check_only=check_only, notebook=True, silenced=silenced)
        unparsed = [
            Finding(cell.first_line, 1, UNPARSED_CELL, f"this cell does not parse ({why}): it is left as written, and the other cells were migrated without it; fix it and run again", False, "")
            for cell, why in notebook.unparsed
        ]
        migration = dataclasses.replace(migration, findings=sorted(migration.findings + unparsed)) if unparsed else migration
        length = line_length or configured_line_length(black_config or {})
        code = on_deep_stack(plain_code.as_configured, notebook.source, migration.code, length, _written_for(path))
        if code == notebook.source:
            return Outcome(None, migration.findings)
        _ensure_parses(code, path)
        fitted = _fitted(notebook.source, code, path, None, length)  # black formats no cell markers
        return Outcome(notebook.with_source(fitted), migration.findings)
    except MigrationError as error:
        return Outcome(None, [], _in_notebook_terms(str(error), text))
    except NotebookError as error:
        message = str(error)
        return Outcome(None, [], message if message.startswith(path) else f"{path}: {message}")


def _in_notebook_terms(message: str, text: str) -> str:
    """A syntax error's `path:LINE:` (a line of the cells' joint source) as
    `path:cell N:LINE:`."""
    match = re.match(r"(?P<path>.*?\.ipynb):(?P<line>\d+):", message)
    if match is None:
        return message
    cell, line = parse_notebook(text).cell_position(int(match.group("line")))
    return f"{match.group('path')}:cell {cell + 1}:{line}:" + message[match.end():]


def _in_cells(path: str, text: str, findings: list[Finding]) -> list[Finding]:
    """A notebook's findings placed in their cells (`cell N`, line in the cell)."""
    if not findings or not is_notebook(path):
        return findings
    return parse_notebook(text, path).in_cells(findings)


# An error's text can be a whole syntax tree (a KeyError of a node): kept to what a report needs.
DETAIL_LIMIT = 300


def _describe(error: BaseException, in_codemod: bool = False) -> str:
    """One line: the error, cut to DETAIL_LIMIT; for a codemod's failure, the
    line of the codemods' code it was raised from (what a bug report needs)."""
    text = one_line(traceback.format_exception_only(type(error), error)[-1].strip())
    if len(text) > DETAIL_LIMIT:
        text = text[:DETAIL_LIMIT] + "..."
    codemods = sys.modules.get("accelmigrate.codemods")
    if in_codemod and codemods is not None:
        root = Path(codemods.__file__).resolve().parent
        for frame in reversed(traceback.extract_tb(error.__traceback__)):
            raised_in = Path(frame.filename).resolve()
            if raised_in.is_relative_to(root):
                return f"{text} (at codemods/{raised_in.relative_to(root).as_posix()}:{frame.lineno})"
    return text


def process_files(
    paths: Sequence[str],
    plan: Plan,
    *,
    check_only: bool = False,
    write: bool = False,
    black_config: Optional[Mapping] = None,
    jobs: Optional[int] = None,
    on_done: Optional[Callable[[FileResult], None]] = None,
    cache_folder: Optional[Path] = None,
    line_length: Optional[int] = None,
    codes=None,
    follow_imports: bool = False,
    exclude: Sequence[str] = (),
    runtime: bool = False,
) -> list[FileResult]:
    """Process many files, in worker processes when there are several; results
    come back in the order of `paths`. Before writing, temporary files that a
    killed run left next to them are removed. With `cache_folder`, results are
    kept there and files whose content was seen before are answered from it.
    `codes` (a config's `CodeSelection`): the codes each file's codemods
    leave alone (not selected, ignored).

    With `follow_imports`, the modules of the project that the files reach
    (accelmigrate/project/modules.py) are migrated with them, after them in the
    results; a module without a training step of its own gets the words that
    do not act on one (`exclude`: globs of modules left out). A file and
    the modules it reaches are written all together or not at all."""
    jobs = jobs or os.cpu_count() or 1
    _classes(plan)  # an unknown word or option is the caller's error, raised before any file is read
    project = ProjectFiles.of(paths, exclude) if follow_imports else ProjectFiles(list(paths), {}, frozenset(), {})
    paths = project.files
    caches: dict[str, Optional[ResultCache]] = {}

    readers = {info.word: info.notes for info, _ in _classes(plan) if info.reads_handoffs}
    handing = {path for path, facts in project.facts.items() if readers and facts.pairs}

    def file_kwargs(path: str, paired: bool = True) -> tuple[Plan, dict]:
        # A module without a training step gets the words that act on one
        # only where the project pairs it with another file (it builds the
        # loader a paired loop is handed, or it is a helper of a script).
        kept = readers.keys() if paired and path in handing else ()
        own = [(word, options) for word, options in plan if word not in TRAINING_WORDS or word in kept] if path in project.without_training else plan
        key = repr(own)
        if key not in caches:
            caches[key] = _open_cache(cache_folder, own, check_only, black_config, line_length, runtime)
        kwargs = dict(
            check_only=check_only, black_config=black_config, cache=caches[key], line_length=line_length,
            covered=project.covered, project=project.facts.get(path, NO_FACTS), runtime=runtime,
        )
        return own, ({**kwargs, "silenced": codes.silenced(path, known)} if codes is not None else kwargs)

    known = known_codes() if codes is not None else frozenset()
    if write:
        remove_stale_temporaries({Path(os.path.realpath(p)).parent for p in paths})
    results: list[FileResult] = []
    # Each group is written as soon as its last file is migrated: a run
    # killed halfway leaves every file whole, and the done ones written.
    groups = project.groups()
    group_of = {path: group for group in groups for path in group}
    finished: dict[str, FileResult] = {}

    def settle(group: list[str]) -> None:
        """Where a word that edits two files as one change refused one of
        them, or the script that imports them, the files it would have paired
        are migrated again without the facts that pair them: neither half of
        the change is made (nor a helper module's output made rank 0's for a
        script that stays one process)."""
        scripts = project.reached_from.keys()
        refused = {path for path in group if (path in handing or path in scripts) and _refused_handoff(finished[path], readers)}
        for path in group if refused else ():
            if path in handing and path not in refused:  # a refused file keeps its result: it says why
                own, kwargs = file_kwargs(path, paired=False)
                kwargs["project"] = kwargs["project"].unpaired()
                rerun = process_file(path, own, **kwargs)
                results[results.index(finished[path])] = finished[path] = rerun

    def done(result: FileResult) -> None:
        results.append(result)
        finished[result.path] = result
        group = group_of[result.path]
        complete = all(path in finished for path in group)
        if complete:
            settle(group)
            if write:
                _write_together([finished[path] for path in group])
        if on_done and not any(path in handing for path in group):
            on_done(result)
        elif on_done and complete:  # a paired file is told of once its group is settled
            for path in group:
                on_done(finished[path])

    if jobs <= 1 or len(paths) < 4:
        for path in paths:
            own, kwargs = file_kwargs(path)
            done(process_file(path, own, **kwargs))
    else:
        _process_in_pool(paths, file_kwargs, jobs, done)
    return results


def _refused_handoff(result: FileResult, readers: Mapping[str, frozenset]) -> bool:
    """One of `readers` (word -> its notes), the words that pair two files,
    refused this file: none of its findings is a fix, and one is not a note."""
    for word, notes in readers.items():
        own = [f for f in result.findings if f.word == word]
        if own and not any(f.fixed for f in own) and any(f.code not in notes for f in own):
            return True
    return False


def _open_cache(
    cache_folder: Optional[Path], plan: Plan, check_only: bool, black_config: Optional[Mapping], line_length: Optional[int], runtime: bool
) -> Optional[ResultCache]:
    if cache_folder is None:
        return None
    settings = {
        "plan": [[word, sorted(options.items())] for word, options in plan],
        "check": check_only,
        "black": black_config,
        "line_length": line_length,
        "runtime": runtime,
    }
    return ResultCache.open(cache_folder, settings)


def _process_in_pool(paths: Sequence[str], file_kwargs: Callable[[str], tuple[Plan, dict]], jobs: int, done: Callable[[FileResult], None]) -> None:
    from concurrent.futures import ProcessPoolExecutor  # multiprocessing: only where there is a pool
    from concurrent.futures.process import BrokenProcessPool

    finished = 0
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(paths))) as pool:
            # The largest files first, one per task: a large file started last
            # would keep one worker busy long after the others are done.
            futures = {i: pool.submit(_process_file_star, (paths[i], *file_kwargs(paths[i]))) for i in _largest_first(paths)}
            for i in range(len(paths)):
                done(futures[i].result())
                finished += 1
    except BrokenProcessPool:
        for path in paths[finished:]:
            done(_process_file_alone(path, *file_kwargs(path)))


def _write_together(results: list[FileResult]) -> None:
    """Write the changed files of one group (a script and the modules of its
    project) all, or none: where one failed, the others are not written;
    where a write fails, those written before it are put back."""
    failed = next((r for r in results if r.error is not None), None)
    written: list[FileResult] = []
    for result in results:
        if failed is None and result.changed:
            write_result(result)
            if result.error is None:
                written.append(result)
                continue
            failed = result
            for earlier in written:  # back to the files as they were read
                write_atomically(Path(earlier.path), SourceText(earlier.original, earlier.encoding))
                earlier.written = False
    if failed is not None:
        for result in results:
            if result is not failed and result.changed:
                result.error = f"{result.path}: not written, since {failed.path} (of the same project) could not be: {failed.error}"


def _largest_first(paths: Sequence[str]) -> list[int]:
    def size(i: int) -> int:
        try:
            return os.path.getsize(paths[i])
        except OSError:
            return 0  # reported when the file is read

    return sorted(range(len(paths)), key=size, reverse=True)


def _process_file_alone(path: str, plan: Plan, kwargs: dict) -> FileResult:
    """After a worker process died (killed, out of memory, a crash in native
    code), each remaining file gets a process of its own, so that only the
    file that kills one is lost."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(max_workers=1) as pool:
            return pool.submit(_process_file_star, (path, plan, kwargs)).result()
    except BrokenProcessPool:
        return FileResult(path, error=f"{path}: the process migrating this file died (killed, or out of memory); file left unchanged")


def _process_file_star(job: tuple[str, Plan, dict]) -> FileResult:
    path, plan, kwargs = job
    return process_file(path, plan, **kwargs)


def plan_of(items: Iterable[tuple[object, Mapping[str, str]]]) -> list[tuple[str, dict[str, str]]]:
    return [(cls.word, dict(options)) for cls, options in items]
