"""The runtime imports a migration added, replaced by plain definitions.

See accelmigrate/engine/plain_code.py for when; this is how. Each helper
imported from `accelmigrate.runtime` that has a plain definition
(codemods/script/plain_definitions.py) is written once right after the
import block its import sat in, with the definitions it uses, two blank
lines apart; the modules they need (`os`, `contextlib`) are imported. A name
the file already binds otherwise, an import under another name, and an
import the original file had keep their import.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Optional

import libcst as cst

from accelmigrate.codemods.script.plain_helpers import Definition, carried_definition, closure, definitions

RUNTIME_PACKAGE = "accelmigrate.runtime"


def without_runtime_imports(original: str, migrated: str, line_length: int = 88) -> str:
    """`migrated` with the runtime imports that `original` did not have
    replaced by plain definitions (unchanged when there are none), their
    docstrings wrapped to `line_length` and their lines ended as the file's."""
    if RUNTIME_PACKAGE not in migrated:
        return migrated
    tree = cst.parse_module(migrated)
    before = _runtime_imports(cst.parse_module(original)) if RUNTIME_PACKAGE in original else set()
    carried = {statement.name.value for statement in tree.body if carried_definition(statement) is not None}
    bound = {**_star_imported(tree), **_module_bindings(tree)}
    nested = _NestedImports(before, bound, carried)
    tree = tree.visit(nested)
    body = _without_dropped(tree.body, lambda statement: _drop_plain_aliases(statement, before, bound, carried))
    names = [*body.inlined, *nested.inlined]
    if not names:
        return migrated
    at = _where_definitions_go(body.statements, {d.name for d in closure(names)})
    following = body.statements[at] if at < len(body.statements) else None
    written = _definitions_before(following, names, carried, (tree.default_newline, line_length))
    updated = tree.with_changes(body=[*body.statements[:at], *written, *body.statements[at + 1 :]])
    return _with_imports(updated, closure(carried)).code


def _where_definitions_go(statements, names: set[str]) -> int:
    """The index to write the definitions at: after the file's header of
    imports (those before its first function, class or compound statement),
    or before the first statement there that uses one of `names`."""
    header = next((i for i, s in enumerate(statements) if isinstance(s, cst.BaseCompoundStatement)), len(statements))
    imports = [i for i in range(header) if _is_import_line(statements[i])]
    at = imports[-1] + 1 if imports else (1 if statements and _is_docstring(statements[0]) else 0)
    for index in range(at):
        if _uses(statements[index], names):
            return index
    return at


def _uses(statement: cst.CSTNode, names: set[str]) -> bool:
    class Uses(cst.CSTVisitor):
        found = False

        def visit_Name(self, node) -> None:
            self.found = self.found or node.value in names

    visitor = Uses()
    statement.visit(visitor)
    return visitor.found


@dataclasses.dataclass
class _Kept:
    statements: list
    inlined: list  # the runtime names taken out


def _without_dropped(statements, drop) -> _Kept:
    """`statements` without the runtime names `drop` takes out of them (a
    statement left empty goes, and the next one takes its blank lines and
    comments in place of its own blank lines)."""
    kept = _Kept([], [])
    inherited: Optional[list] = None  # the blank lines and comments of the statements dropped just before
    for statement in statements:
        remaining, inlined = drop(statement)
        kept.inlined.extend(inlined)
        if remaining is None:
            inherited = (inherited or []) + list(statement.leading_lines)
            continue
        if inherited is not None:
            own = list(remaining.leading_lines)
            while own and own[0].comment is None:
                own.pop(0)
            remaining = remaining.with_changes(leading_lines=inherited + own)
            inherited = None
        kept.statements.append(remaining)
    return kept


class _NestedImports(cst.CSTTransformer):
    """Drops the replaceable runtime names of imports inside functions and
    classes (a library's self-test imports its helper where it runs), keeping
    the names in `inlined`."""

    def __init__(self, before, bound, carried) -> None:
        super().__init__()
        self.before, self.bound, self.carried = before, bound, carried
        self.inlined: list[str] = []

    def visit_SimpleStatementLine(self, node) -> bool:
        return False

    def leave_IndentedBlock(self, original_node, updated_node):
        kept = _without_dropped(updated_node.body, lambda s: _drop_plain_aliases(s, self.before, self.bound, self.carried))
        if not kept.inlined:
            return updated_node
        self.inlined.extend(kept.inlined)
        return updated_node.with_changes(body=kept.statements or [cst.SimpleStatementLine([cst.Pass()])])


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _runtime_imports(tree: cst.Module) -> set[tuple[str, str]]:
    """(module, name) of every `from accelmigrate.runtime... import name`, at any depth."""
    found = set()
    for small in _import_froms(tree):
        module = _runtime_module(small)
        if module is not None and not isinstance(small.names, cst.ImportStar):
            found.update((module, alias.evaluated_name) for alias in small.names)
    return found


def _import_froms(tree: cst.Module) -> list[cst.ImportFrom]:
    class Collect(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list[cst.ImportFrom] = []

        def visit_ImportFrom(self, node) -> None:
            self.found.append(node)

    collect = Collect()
    tree.visit(collect)
    return collect.found


def _runtime_module(small: cst.CSTNode) -> Optional[str]:
    if not isinstance(small, cst.ImportFrom) or small.relative or small.module is None:
        return None
    module = cst.helpers.get_full_name_for_node(small.module) or ""
    return module if module == RUNTIME_PACKAGE or module.startswith(RUNTIME_PACKAGE + ".") else None


def _module_bindings(tree: cst.Module) -> dict[str, str]:
    """The names the file's top level binds (definitions, assignments,
    imports other than the runtime's), each with how: "import" for a plain
    `import a.b` or `import a.b as c`, "other" for the rest. A definition
    written in must take none of them, nor a module it uses one bound otherwise."""
    names: dict[str, str] = {}
    for statement in tree.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            if carried_definition(statement) is None:
                names[statement.name.value] = "other"
            continue
        for name, how in _walk_targets(statement):
            names[name] = "other" if names.get(name, how) == "other" else how
    return names


def _star_imported(tree: cst.Module) -> dict[str, str]:
    """The module names the plain definitions use that the file reads without
    binding them, behind a `from x import *` (`torch` through a project's
    utils): importing one would change what the file's own uses of it mean
    to the next run's analysis, so the definitions needing it are not written
    (their runtime import stays)."""
    stars = any(
        isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
        for statement in tree.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
    )
    if not stars:
        return {}
    modules = {asname or module.split(".")[0] for d in definitions().values() for module, asname in d.modules}

    class Reads(cst.CSTVisitor):
        def __init__(self) -> None:
            self.names: set[str] = set()

        def visit_Name(self, node) -> None:
            if node.value in modules:
                self.names.add(node.value)

    reads = Reads()
    tree.visit(reads)
    return dict.fromkeys(reads.names, "other")


def _walk_targets(statement: cst.CSTNode):
    """(name, how) for each name a top-level simple statement binds."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return
    for small in statement.body:
        if isinstance(small, (cst.Import, cst.ImportFrom)) and _runtime_module(small) is None:
            if not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    name = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
                    yield name, "import" if isinstance(small, cst.Import) else "other"
        elif isinstance(small, (cst.Assign, cst.AnnAssign)):
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            for target in targets:
                if isinstance(target, cst.Name):
                    yield target.value, "other"


def _takes_a_bound_name(name: str, bound: dict[str, str], carried: set[str]) -> bool:
    """Whether writing `name`'s definitions in would take a name the file
    binds otherwise: theirs, or that of a module they use."""
    for definition in closure([name]):
        if definition.name in bound and definition.name not in carried:
            return True
        if any(bound.get(asname or module.split(".")[0]) == "other" for module, asname in definition.modules):
            return True
    return False


def _drop_plain_aliases(statement, before, bound, carried) -> tuple[Optional[cst.CSTNode], list[str]]:
    """The statement without the runtime names the migration imported that a
    plain definition replaces (None when nothing of it is left), and those names."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return statement, []
    small = statement.body[0]
    module = _runtime_module(small)
    if module is None or isinstance(small.names, cst.ImportStar):
        return statement, []
    known = definitions()
    inlined, kept = [], []
    for alias in small.names:
        name = alias.evaluated_name
        definition = known.get(name)
        replaceable = (
            (module, name) not in before
            and definition is not None
            and definition.runtime is not None
            and (alias.asname is None or alias.evaluated_alias == name)
            and (module == RUNTIME_PACKAGE or definition.runtime == f"{module}.{name}")
            and not _takes_a_bound_name(name, bound, carried)
        )
        (inlined if replaceable else kept).append(name if replaceable else alias)
    if not inlined:
        return statement, []
    if not kept:
        return None, inlined
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(body=[small.with_changes(names=kept)]), inlined


def _definitions_before(following: Optional[cst.CSTNode], names: list[str], carried: set[str], style: tuple[str, int]) -> list[cst.CSTNode]:
    """The definitions of `names` (with what they use) the file does not
    carry yet, each two blank lines apart, then `following` given two blank
    lines before it."""
    written: list[cst.CSTNode] = []
    for definition in closure(names):
        if definition.name in carried:
            continue
        carried.add(definition.name)
        node = _parsed(definition, *style)
        written.append(node.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    if following is not None:
        written.append(_two_blank_lines_before(following) if written else following)
    return written


def _two_blank_lines_before(statement: cst.CSTNode) -> cst.CSTNode:
    lines = list(statement.leading_lines)
    blank = 0
    while blank < len(lines) and lines[blank].comment is None:
        blank += 1
    return statement.with_changes(leading_lines=[cst.EmptyLine()] * max(2, blank) + lines[blank:])


def _parsed(definition: Definition, newline: str, line_length: int) -> cst.CSTNode:
    code = definition.code
    if any(len(line) > line_length for line in code.splitlines()):  # written for 88 columns
        from accelmigrate.engine.formatting import black_format

        code = _with_docstring_wrapped(definition, line_length) if definition.docstring else code
        code = black_format(code + "\n", {"line-length": line_length}).rstrip("\n")
    return cst.parse_module((code + "\n").replace("\n", newline)).body[0]


def _with_docstring_wrapped(definition: Definition, line_length: int) -> str:
    """The definition with its docstring's words wrapped to `line_length`
    (the codemods know it by those words, however wrapped)."""
    start = definition.code.index('"""')
    end = definition.code.index('"""', start + 3) + 3
    lines = textwrap.wrap('"""' + definition.docstring, max(20, line_length - 4))
    wrapped = "\n    ".join(lines) + ('"""' if len(lines) == 1 and len(lines[0]) + 7 <= line_length else '\n    """')
    return definition.code[:start] + wrapped + definition.code[end:]


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _with_imports(tree: cst.Module, written: list[Definition]) -> cst.Module:
    """`tree` importing the modules the written definitions use (those its
    top level does not import yet, wherever it does)."""
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    imported = {
        (alias.evaluated_name, alias.evaluated_alias)
        for statement in tree.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.Import)
        for alias in small.names
    }
    modules = sorted({m for d in written for m in d.modules} - imported, key=str)
    if not modules:
        return tree
    context = CodemodContext()
    for module, asname in modules:
        AddImportsVisitor.add_needed_import(context, module, asname=asname)
    return AddImportsVisitor(context).transform_module(tree)
