"""What every codemod shares: the `Codemod` base class, the `Finding` type and
matchers by qualified name.

A codemod is a LibCST transformer that either rewrites a node and records a
fixed Finding, or leaves the node alone and records an unfixed Finding that
tells the user what to do by hand. The engine runs it through a
`MetadataWrapper`, so `self.get_metadata(...)` works for everything listed in
`METADATA_DEPENDENCIES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Collection, Iterable, Mapping, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

if TYPE_CHECKING:  # LibCST's codemod package is imported only where imports are asked for (a third of a check's CPU)
    from libcst.codemod import CodemodContext

from ._syntax import (  # noqa: F401 (re-exported: the codemods import them from here)
    CLIP_GRAD_FUNCTIONS,
    code_of,
    walk,
    parent_map,
    children,
    dotted_name,
    is_main_guard,
    is_docstring,
    times_or_divided,
    keyword_arg,
    has_star_args,
)

# The script model of the latest version of a file (its MetadataWrapper):
# codemods run one version at a time, so one entry serves them all.
_latest_script: list = [None, None]  # [wrapper, model]


def _script_model(wrapper):
    """The script model of this file version, built once for every codemod that runs on it."""
    from .script import ScriptModel  # deferred: the model is built only for a file that reaches the codemods

    if _latest_script[0] is not wrapper:
        if _latest_script[1] is not None:
            _latest_script[1].release()
        _latest_script[:] = [wrapper, ScriptModel.of(wrapper)]
    return _latest_script[1]


from ._finding import ALL_CODES, Finding, Suppressions  # noqa: E402 (re-exported: defined without LibCST)
from . import _options  # noqa: E402
from accelmigrate.project.torch_version import LOWEST_SUPPORTED  # noqa: E402

_NO_DEFAULT = object()


class Codemod(cst.CSTTransformer):
    """Base class of every codemod. Subclasses set the class attributes below.

    A plain transformer, not LibCST's matcher-decoratable one: no codemod uses
    matcher decorators, and their bookkeeping on every node costs a fifth of a
    check's time."""

    word: ClassVar[str]  # the --to word
    codes: ClassVar[Mapping[str, str]]  # finding code -> one-line title, in the present: what to act on
    # Codes that need no action (information only): `check` hides them unless
    # --show-notes, and they never make it fail.
    notes: ClassVar[frozenset] = frozenset()
    summary: ClassVar[str]
    requires: ClassVar[Sequence[str]] = ()  # words that must run first
    # Words this one cannot run with: both would own the same part of the
    # script (its device, precision, processes). Asking for both is a usage
    # error, never a word that silently changes nothing.
    excludes: ClassVar[Sequence[str]] = ()
    # The file is parsed for this codemod only when one of these substrings
    # occurs in its text. Choose them so that no possible match is missed:
    # every spelling of what the codemod matches must contain one of them.
    triggers: ClassVar[Sequence[str]]
    # True for a codemod that edits two files of a project as one change (a
    # model wrapped in the script for the loop of another module: the facts
    # `training_loops` and `received_loops`): where it refuses one of them,
    # the engine migrates both again without those facts.
    reads_handoffs: ClassVar[bool] = False
    # Finding codes whose fix is another word's work: code -> those words.
    # Where one of them runs in the same plan, the finding is not reported
    # (that word makes the change, or says why not, itself).
    handed_to: ClassVar[Mapping[str, Sequence[str]]] = {}
    # The oldest torch the code it writes runs on (accelmigrate/project/torch_version.py):
    # in a project confined to an older one, the word is left out, with AM008.
    needs_torch: ClassVar[tuple[int, int]] = LOWEST_SUPPORTED

    # True for a codemod that records every finding and fix while it plans,
    # in visit_Module (or later, in leave_Module), and rewrites only what it
    # recorded as fixed: its walk over the module's statements (LibCST
    # rebuilds every node) is skipped where it fixed nothing, and where the
    # engine only wants its findings (`rewrite=False`: a check whose later
    # codemods do not read this version). tests/test_engine_speed.py holds
    # each such codemod to it.
    plans_in_visit_module: ClassVar[bool] = False

    # No LibCST metadata is resolved before the visit (LibCST unions this over
    # the class hierarchy, so it must stay empty here): names, scopes and
    # parents come from the shared script model (`self.script`), and positions
    # are resolved only when a codemod reports (see get_metadata).
    METADATA_DEPENDENCIES = ()
    _script_of: Optional[object] = None  # the MetadataWrapper whose model `_script` is
    _script = None

    def __init__(
        self,
        context: CodemodContext,
        options: Optional[Mapping[str, str]] = None,
        suppressions: Optional[Suppressions] = None,
        *,
        rewrite: bool = True,
    ) -> None:
        super().__init__()
        self.rewrite = rewrite  # False: only the findings are wanted, not the new tree
        self.context = context  # where imports to add and remove are scheduled
        self.options = dict(options or {})
        self.suppressions = suppressions or {}
        self.findings: list[Finding] = []
        self.imports_changed = False
        self._parent_map: Optional[dict[cst.CSTNode, cst.CSTNode]] = None

    def get_metadata(self, key, node, default=_NO_DEFAULT):
        """As LibCST's, with PositionProvider and ParentNodeProvider computed
        the first time they are asked for, over the tree being visited
        (positions by the script model, one statement at a time)."""
        if key is ParentNodeProvider:
            if self._parent_map is None:
                self._parent_map = parent_map(self.context.wrapper.module)
            return self._lookup(self._parent_map, key, node, default)
        if key is PositionProvider and key not in self.metadata:
            try:
                return self.script.line.range(node)
            except KeyError:
                if default is _NO_DEFAULT:
                    raise KeyError(f"no PositionProvider metadata for {type(node).__name__}") from None
                return default
        return super().get_metadata(key, node, default) if default is not _NO_DEFAULT else super().get_metadata(key, node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        descend = super().on_visit(node)
        if isinstance(node, cst.Module) and self.plans_in_visit_module and not (self.rewrite and self.changes_anything()):
            return False  # leave_Module still runs
        return descend

    def changes_anything(self) -> bool:
        """Whether this visit rewrites the tree: a codemod changes it only
        where it records a fix, or to add or remove imports."""
        return self.imports_changed or any(finding.fixed for finding in self.findings)

    @property
    def script(self):
        """The shared model of the file version being visited (`codemods/script/`):
        its models, optimizers, loaders, training steps, devices and entry point.
        Built once per version and shared by every codemod that runs on it."""
        wrapper = self.context.wrapper
        if self._script_of is not wrapper:  # read millions of times a run: no import, no lookup
            self._script, self._script_of = _script_model(wrapper), wrapper
        return self._script

    @staticmethod
    def _lookup(mapping, key, node, default):
        if node in mapping:
            return mapping[node]
        if default is _NO_DEFAULT:
            raise KeyError(f"no {key.__name__} metadata for {type(node).__name__}")
        return default

    # -- class-level helpers used by the engine -----------------------------

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Raise ValueError with a message for the user when `options` (from
        `--to word=value` or the config) make no sense for this codemod.
        Read every option the codemod takes here: the configuration reports
        a key that this method never reads as unknown. The checks live in
        `_options.py`, which the registry reads without importing codemods."""
        _options.check(cls.word, options)

    @classmethod
    def wants(cls, source: str) -> bool:
        """The cheap pre-check: could this file contain anything for us?"""
        return any(trigger in source for trigger in cls.triggers)

    # -- findings ------------------------------------------------------------

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        """`# accelmigrate: skip` (or `skip[CODE,...]`) on any line of the node."""
        if not self.suppressions:
            return False
        where = self.get_metadata(PositionProvider, node)
        for line in range(where.start.line, where.end.line + 1):
            if line in self.suppressions:
                codes = self.suppressions[line]
                if codes is ALL_CODES or code in codes:
                    return True
        return False

    def report(self, node: cst.CSTNode, code: str, message: str, fixed: bool = False) -> bool:
        """Record a finding at `node`. Returns False (and records nothing) when the
        user suppressed it, in which case the caller must leave the node alone."""
        assert code in self.codes, f"{self.word}: undeclared finding code {code}"
        if self.is_suppressed(node, code):
            return False
        start = self.get_metadata(PositionProvider, node).start
        self.findings.append(Finding(start.line, start.column + 1, code, message, fixed, self.word))
        return True

    def fix(self, node: cst.CSTNode, code: str, message: str) -> bool:
        """Record a fix at `node`; False when suppressed (then do not rewrite)."""
        return self.report(node, code, message, fixed=True)

    # -- imports -------------------------------------------------------------

    def add_import(self, module: str, obj: Optional[str] = None, asname: Optional[str] = None) -> None:
        """Schedule `import module` / `from module import obj`; the engine
        applies it where the new tree is wanted."""
        if self.rewrite:
            from libcst.codemod.visitors import AddImportsVisitor

            AddImportsVisitor.add_needed_import(self.context, module, obj, asname)
        self.imports_changed = True

    def remove_import_of(self, node: cst.CSTNode) -> None:
        """Schedule the removal of the import that `node` (a use, or an import
        statement) relies on, once nothing else uses it; the engine applies
        it. Only where the new tree is wanted: LibCST resolves the scopes of
        the whole module for it, and a check that only wants findings does
        not print the tree."""
        if self.rewrite:
            from libcst.codemod.visitors import RemoveImportsVisitor

            RemoveImportsVisitor.remove_unused_import_by_node(self.context, node)
        self.imports_changed = True

    # -- matching by meaning -------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> frozenset:
        return self.script.qualified_names(node)

    def is_qualified(self, node: cst.CSTNode, names: Collection[str]) -> bool:
        """True when `node` (a Name, Attribute or Call's func) refers to one of `names`."""
        return not self.qualified_names(node).isdisjoint(names)

    def is_call_to(self, node: cst.CSTNode, names: Collection[str]) -> bool:
        return isinstance(node, cst.Call) and self.is_qualified(node.func, names)

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.script.parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def assignment_line(self, value: cst.CSTNode) -> Optional[tuple[cst.SimpleStatementLine, cst.Assign]]:
        """When `value` is the whole right-hand side of `target = value`, a
        statement alone on its line in a block: that line and the Assign."""
        assign = self.parent(value)
        line = self.parent(assign) if isinstance(assign, cst.Assign) else None
        if (
            isinstance(assign, cst.Assign)
            and assign.value is value
            and len(assign.targets) == 1
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(self.parent(line), (cst.IndentedBlock, cst.Module))
        ):
            return line, assign
        return None

    def innermost_loop(self, node: cst.CSTNode) -> Optional[Union[cst.For, cst.While]]:
        """The loop whose body runs `node` repeatedly, within the same function.

        A node in a loop's `else:` or in its iterable is not repeated by it, and a
        function or class defined inside a loop body is a new scope, not a loop
        body of its own."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
                return ancestor
            child = ancestor
        return None


# -- small syntax helpers shared by codemods (the node helpers live in _syntax.py) --


def append_keyword_args(call: cst.Call, new_args: Sequence[tuple[str, cst.BaseExpression]]) -> cst.Call:
    """Add `name=value` arguments after the last one, following the call's
    layout: one per line, at the arguments' indentation, when the call puts one
    argument per line; else on the last line. Comments stay where they were,
    and so does what closes the call (a trailing comma, the line of `)`)."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[_keyword(name, value, cst.MaybeSentinel.DEFAULT) for name, value in new_args])
    line_start = _argument_line_start(call)
    if line_start is None:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    else:
        separator = cst.Comma(whitespace_after=_fresh_line(line_start))
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # It keeps its comma (and a comment after it); the new last argument
        # gets a comma that closes the call as the old one did.
        closing = last.comma.whitespace_after
        if isinstance(closing, cst.ParenthesizedWhitespace):
            final_comma = cst.Comma(whitespace_after=_fresh_line(closing))
            if line_start is not None:
                last = last.with_changes(comma=last.comma.with_changes(
                    whitespace_after=closing.with_changes(indent=line_start.indent, last_line=line_start.last_line)
                ))
            else:
                last = last.with_changes(comma=separator)
                final_comma = cst.Comma(whitespace_after=closing)
        else:
            final_comma = last.comma
            last = last.with_changes(comma=separator)
        tail_space = cst.SimpleWhitespace("")
    else:
        final_comma = cst.MaybeSentinel.DEFAULT
        tail_space = last.whitespace_after_arg  # e.g. the line break before `)`
        last = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    additions = [
        _keyword(name, value, separator if i < len(new_args) - 1 else final_comma)
        for i, (name, value) in enumerate(new_args)
    ]
    additions[-1] = additions[-1].with_changes(whitespace_after_arg=tail_space)
    return call.with_changes(args=[*args[:-1], last, *additions])


def _argument_line_start(call: cst.Call) -> Optional[cst.ParenthesizedWhitespace]:
    """The line break and indentation before each argument, when the call puts
    one argument per line; None otherwise."""
    separators = [a.comma.whitespace_after for a in call.args[:-1] if isinstance(a.comma, cst.Comma)]
    if len(separators) != len(call.args) - 1:
        return None
    breaks = [w for w in separators if isinstance(w, cst.ParenthesizedWhitespace)]
    if len(breaks) != len(separators):
        return None
    if breaks:
        return breaks[-1]
    opening = call.whitespace_before_args
    return opening if isinstance(opening, cst.ParenthesizedWhitespace) else None


def _fresh_line(like: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    """A line break with the indentation of `like`, without its comments."""
    return cst.ParenthesizedWhitespace(indent=like.indent, last_line=like.last_line)


def _keyword(name: str, value: cst.BaseExpression, comma) -> cst.Arg:
    no_space = cst.SimpleWhitespace("")
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
        comma=comma,
    )


def remove_statements(
    body: Sequence[cst.BaseStatement], doomed: Collection[cst.CSTNode]
) -> list[cst.BaseStatement]:
    """`body` without the statements in `doomed` (original nodes, matched by
    identity), keeping the comment lines above a removed statement on the
    statement that follows it, and leaving a `pass` when nothing would remain."""
    kept: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    for statement in body:
        if statement in doomed:
            carried.extend(getattr(statement, "leading_lines", ()))
            continue
        if carried and hasattr(statement, "leading_lines"):
            statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
            carried = []
        kept.append(statement)
    if not kept:
        kept.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
    elif carried and not any(line.comment for line in carried):
        pass  # only blank lines were left over after the last statement
    elif carried:
        kept.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
    return kept


def is_name(node: cst.CSTNode, value: Optional[str] = None) -> bool:
    return isinstance(node, cst.Name) and (value is None or node.value == value)


__all__ = [
    "ALL_CODES",
    "CLIP_GRAD_FUNCTIONS",
    "code_of",
    "dotted_name",
    "is_docstring",
    "is_main_guard",
    "times_or_divided",
    "walk",
    "Codemod",
    "Finding",
    "Suppressions",
    "append_keyword_args",
    "has_star_args",
    "is_name",
    "keyword_arg",
    "remove_statements",
]
