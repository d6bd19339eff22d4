"""What every migration must keep, checked on any source, and the inputs that
probe it: plans for the codemods, generated programs and parse-preserving
mutations of training scripts.

Shared by tests/test_properties.py (a seeded few hundred cases),
benchmarks/fuzz.py (thousands) and benchmarks/torch_corpus.py (torch's own
sources). The properties, for any source that CPython accepts:

- no crash: neither an exception nor an AM000 finding (a codemod that failed),
- the output parses (and compiles, when the input did),
- a second run changes nothing and reports no further fix.
"""

from __future__ import annotations

import ast
import dataclasses
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import hypothesmith
import libcst as cst
from hypothesis import strategies as st

from accelmigrate.codemods import all_codemods
from accelmigrate.engine.migrate import MigrationError, Plan, migrate_source

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# The codemods that need a value get a typical one, so that every codemod runs.
VALUES = {"accumulate": {"value": "4"}, "batch-scale": {"value": "2"}}


def word_plan(word: str) -> Plan:
    """One codemod (its prerequisites are added by the engine)."""
    return [(word, dict(VALUES.get(word, {})))]


def all_words_plan() -> Plan:
    return [(word, dict(VALUES.get(word, {}))) for word in all_codemods()]


def plan_name(plan: Plan) -> str:
    return ",".join(f"{word}={options['value']}" if options.get("value") else word for word, options in plan)


def trigger_comment() -> str:
    """A comment line holding every codemod's pre-check words, so that every
    codemod parses and visits a generated program instead of skipping it."""
    triggers = sorted({t for cls in all_codemods().values() for t in cls.triggers})
    return "# " + " ".join(triggers) + "\n"


# -- the properties ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
    kind: str  # "crash", "unparsable", "not idempotent", "refused"
    words: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} [{self.words}]: {self.detail}"


def _compiles(code: str) -> Optional[str]:
    """None when CPython compiles `code`, else the error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `0()` and the like: valid, if odd
            compile(code, "<migrated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # ValueError: a null byte
        return f"{type(error).__name__}: {error}"
    return None


def _failures(findings) -> list[str]:
    return [f"{f.line}:{f.column} {f.message}" for f in findings if f.code == "AM000"]


def _migrate(source: str, plan: Plan, words: str, path: str):
    """The migration, or the Problem that it raised."""
    try:
        return migrate_source(source, plan, path), None
    except MigrationError as error:
        # The engine's answer to a syntax error: wrong only for valid Python.
        return None, Problem("refused", words, str(error))
    except RecursionError as error:
        return None, Problem("crash", words, f"RecursionError: {error}")
    except Exception as error:  # the property under test: nothing escapes
        return None, Problem("crash", words, traceback.format_exception_only(type(error), error)[-1].strip())


def problems_of(source: str, plan: Plan, path: str = "<fuzz>") -> tuple[list[Problem], Optional[str]]:
    """The broken properties of migrating `source` with `plan`, and the
    migrated code (None when the migration raised)."""
    words = plan_name(plan)
    first, problem = _migrate(source, plan, words, path)
    if problem:
        return [problem], None
    problems = [Problem("crash", words, message) for message in _failures(first.findings)]
    if first.code == source:
        return problems, first.code  # a second run would see the same input
    try:
        ast.parse(first.code)
    except SyntaxError as error:
        return [*problems, Problem("unparsable", words, f"line {error.lineno}: {error.msg}")], first.code
    if _compiles(source) is None and (error := _compiles(first.code)):
        return [*problems, Problem("unparsable", words, f"does not compile: {error}")], first.code
    second, problem = _migrate(first.code, plan, words, path)
    if problem:
        return [*problems, dataclasses.replace(problem, detail=f"second run: {problem.detail}")], first.code
    problems += [Problem("crash", words, f"second run: {message}") for message in _failures(second.findings)]
    if second.code != first.code:
        problems.append(Problem("not idempotent", words, "a second run changed the output"))
    elif refixed := [f"{f.line}:{f.column} {f.code}" for f in second.findings if f.fixed and f.code != "AM000"]:
        problems.append(Problem("not idempotent", words, f"a second run reports fixes again: {', '.join(refixed)}"))
    return problems, first.code


# -- inputs: the bundled training scripts and fixture inputs ----------------------------------


def training_sources() -> list[Path]:
    """fixtures/scripts/*.py and every fixture input (not the expected outputs)."""
    words = set(all_codemods())
    found = sorted((FIXTURES / "scripts").glob("*.py"))
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name in words):
        found += sorted(p for p in folder.glob("*.py") if not p.name.endswith(".expected.py"))
    return found


def spread(items: Sequence, count: int, offset: int = 0) -> list:
    """`count` items spread evenly over `items`, starting `offset` in."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[(int(i * step) + offset) % len(items)] for i in range(count)]


# -- parse-preserving mutations ---------------------------------------------------------------
#
# Each takes a module and returns another that CPython still compiles and that
# means the same for a codemod reading it (names bound the same way, the same
# calls on the same objects); the source around them is kept.


def _stored_names(statements: Sequence[ast.stmt]) -> set[str]:
    """Names these statements bind in their own scope (not in nested functions,
    classes or comprehensions)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.add(node.id)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in statements:
        visit(statement)
    return found


def _declared(statements: Sequence[ast.stmt], kind: type) -> set[str]:
    return {name for s in statements for node in ast.walk(s) if isinstance(node, kind) for name in node.names}


def _code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _statements(module: cst.Module, nodes: Sequence[cst.CSTNode]) -> list[ast.stmt]:
    return ast.parse("\n".join(_code_of(n) for n in nodes) or "pass").body if nodes else []


class _RenameNames(cst.CSTTransformer):
    """Renames every use of some names, except where a name is not a variable:
    attributes, keyword arguments, imports."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # the object is renamed on leaving, never the attribute's name

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(value=original.value.visit(self))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return True

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.renames.get(updated.value, updated.value))


def rename_variables(module: cst.Module) -> cst.Module:
    """Every plain variable (bound by assignment, `for` or `with`; never a
    parameter, keyword, import, function, class or global) gets a new name."""
    tree = ast.parse(module.code)
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    excluded = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    excluded |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    excluded |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    excluded |= {name for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    excluded |= {"__name__", "__file__", "__all__", "_"}
    words = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    renames = {name: f"{name}_renamed" for name in sorted(stored - excluded) if f"{name}_renamed" not in words}
    return module.visit(_RenameNames(renames)) if renames else module


# Modules written `import a.b as b` in training scripts; `from a import b` names
# the same module only when b is a module, so only these are swapped that way.
_SUBMODULES = {
    "torch.nn", "torch.nn.functional", "torch.optim", "torch.distributed", "torch.multiprocessing",
    "torch.utils.data", "torch.cuda", "torch.amp", "torch.cuda.amp", "torch.nn.parallel", "torch.optim.lr_scheduler",
}


def _dotted(node: cst.BaseExpression) -> str:
    return _code_of(node).replace(" ", "")


def _as_dotted(name: str) -> cst.BaseExpression:
    return cst.parse_expression(name)


class _SwapImports(cst.CSTTransformer):
    def leave_Import(self, original: cst.Import, updated: cst.Import):
        # `import a.b as x` -> `from a import b as x` (`as x` dropped when x is b)
        if len(updated.names) != 1 or not updated.names[0].asname or not isinstance(updated.names[0].name, cst.Attribute):
            return updated
        alias = updated.names[0]
        parent, _, last = _dotted(alias.name).rpartition(".")
        asname = alias.asname.name.value
        return cst.ImportFrom(
            module=_as_dotted(parent),
            names=[cst.ImportAlias(cst.Name(last), None if asname == last else cst.AsName(cst.Name(asname)))],
        )

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        # `from a import b [as x]` -> `import a.b as x`, where a.b is a module
        if updated.relative or updated.module is None or isinstance(updated.names, cst.ImportStar) or len(updated.names) != 1:
            return updated
        alias = updated.names[0]
        full = f"{_dotted(updated.module)}.{_dotted(alias.name)}"
        if full not in _SUBMODULES:
            return updated
        asname = alias.asname.name.value if alias.asname else _dotted(alias.name)
        return cst.Import(names=[cst.ImportAlias(_as_dotted(full), cst.AsName(cst.Name(asname)))])


def swap_import_styles(module: cst.Module) -> cst.Module:
    """`import torch.nn as nn` <-> `from torch import nn`, for modules."""
    return module.visit(_SwapImports())


class _AliasImport(cst.CSTTransformer):
    def __init__(self, module_name: str, alias: str) -> None:
        self.module_name, self.alias = module_name, alias

    def leave_ImportAlias(self, original: cst.ImportAlias, updated: cst.ImportAlias) -> cst.ImportAlias:
        if updated.asname is None and _dotted(updated.name) == self.module_name:
            return updated.with_changes(asname=cst.AsName(cst.Name(self.alias)))
        return updated


def alias_torch(module: cst.Module) -> cst.Module:
    """`import torch` -> `import torch as torch_alias`, every use renamed; kept
    when the file also binds `torch` otherwise (a local, a parameter)."""
    tree = ast.parse(module.code)
    plain = [a for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name == "torch" and not a.asname]
    other = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "torch" and not isinstance(n.ctx, ast.Load)]
    other += [a for a in ast.walk(tree) if isinstance(a, ast.arg) and a.arg == "torch"]
    # `import torch.nn` binds `torch` as well: such a file keeps the name working.
    if not plain or other or "torch_alias" in module.code:
        return module
    module = module.visit(_AliasImport("torch", "torch_alias"))
    return module.visit(_RenameNames({"torch": "torch_alias"}))


def _comment_every_line(statement: cst.CSTNode):
    if isinstance(statement, cst.SimpleStatementLine) and statement.trailing_whitespace.comment is None:
        statement = statement.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(cst.SimpleWhitespace("  "), cst.Comment("# kept"))
        )
    if hasattr(statement, "leading_lines"):
        extra = [cst.EmptyLine(indent=False), cst.EmptyLine(comment=cst.Comment("# a note on the next line"))]
        statement = statement.with_changes(leading_lines=[*statement.leading_lines, *extra])
    return statement


class _CommentStatements(cst.CSTTransformer):
    def leave_IndentedBlock(self, original, updated: cst.IndentedBlock):
        return updated.with_changes(body=[_comment_every_line(s) for s in updated.body])

    def leave_Module(self, original, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=[_comment_every_line(s) for s in updated.body])


def insert_comments(module: cst.Module) -> cst.Module:
    """A blank line and a comment line before every statement, and a trailing
    comment on every simple line that has none."""
    return module.visit(_CommentStatements())


def _is_main_guard(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.If):
        return False
    test = statement.test
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name) and test.left.value == "__name__"
        and len(test.comparisons) == 1 and isinstance(test.comparisons[0].operator, cst.Equal)
    )


def _is_header(statement: cst.CSTNode, index: int) -> bool:
    """A statement that stays at module level: imports, definitions, a docstring."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        first = statement.body[0]
        if isinstance(first, (cst.Import, cst.ImportFrom)):
            return True
        if index == 0 and isinstance(first, cst.Expr) and isinstance(first.value, (cst.SimpleString, cst.ConcatenatedString)):
            return True
    return False


def _global_line(names: set[str], keyword: str = "global") -> list[cst.BaseStatement]:
    return [cst.parse_statement(f"{keyword} {', '.join(sorted(names))}\n")] if names else []


def wrap_module_code(module: cst.Module) -> cst.Module:
    """The module-level code (not imports, definitions or the main guard) moves
    into a function called under a main guard; `global` keeps its names
    module-level, so the functions that read them still do."""
    body = list(module.body)
    moved = [s for i, s in enumerate(body) if not _is_header(s, i) and not _is_main_guard(s)]
    if not moved:
        return module
    names = _stored_names(_statements(module, moved)) - _declared(_statements(module, moved), ast.Global)
    function = cst.FunctionDef(
        name=cst.Name("wrapped_module_code"),
        params=cst.Parameters(),
        body=cst.IndentedBlock(body=[*_global_line(names), *moved]),
        leading_lines=[cst.EmptyLine()],
    )
    call = cst.parse_statement('if __name__ == "__main__":\n    wrapped_module_code()\n')
    kept = [s for s in body if not any(s is m for m in moved)]
    guards = [i for i, s in enumerate(kept) if _is_main_guard(s)]
    at = guards[0] if guards else len(kept)
    return module.with_changes(body=[*kept[:at], function, call, *kept[at:]])


def drop_main_guard(module: cst.Module) -> cst.Module:
    """`if __name__ == "__main__": BODY` -> BODY at module level."""
    body: list[cst.CSTNode] = []
    changed = False
    for statement in module.body:
        if _is_main_guard(statement) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
            inlined = list(statement.body.body)
            inlined[0] = inlined[0].with_changes(leading_lines=[*statement.leading_lines, *inlined[0].leading_lines])
            body.extend(inlined)
            changed = True
        else:
            body.append(statement)
    return module.with_changes(body=body) if changed else module


def _calls_training_step(node: cst.CSTNode) -> bool:
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if attribute.attr.value in ("backward", "step"):
                found.append(attribute)

    node.visit(Finder())
    return bool(found)


class _LoopIntoMethod(cst.CSTTransformer):
    """The first `for` loop that trains moves into `class LoopRunner: def run(runner)`,
    called where the loop was. Its names stay bound where they were: `global`
    at module level, `nonlocal` in a function (for the names the function binds)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.scopes: list[cst.CSTNode] = []  # the enclosing functions and classes
        self.done = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original, updated):
        self.scopes.pop()
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_ClassDef(self, original, updated):
        self.scopes.pop()
        return updated

    def _replacement(self, original: cst.For, loop: cst.For) -> list[cst.BaseStatement]:
        stored = _stored_names(_statements(self.module, [loop]))
        if self.scopes:
            # The names the function binds outside the loop are the ones `nonlocal` can reach.
            without_loop = self.scopes[-1].deep_replace(original, cst.SimpleStatementLine([cst.Pass()]))
            function = ast.parse(_code_of(without_loop).strip()).body[0]
            outer = _stored_names(function.body) | {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
            if _declared(function.body, ast.Global) & stored:
                return [loop]
            declaration = _global_line(stored & outer, "nonlocal")
        else:
            declaration = _global_line(stored)
        method = cst.FunctionDef(
            name=cst.Name("run"),
            params=cst.Parameters(params=[cst.Param(cst.Name("runner"))]),  # `self` may be the loop's
            body=cst.IndentedBlock(body=[*declaration, loop.with_changes(leading_lines=[])]),
        )
        runner = cst.ClassDef(name=cst.Name("LoopRunner"), body=cst.IndentedBlock(body=[method]), leading_lines=loop.leading_lines)
        return [runner, cst.parse_statement("LoopRunner().run()\n")]

    def leave_For(self, original: cst.For, updated: cst.For):
        in_class_body = self.scopes and isinstance(self.scopes[-1], cst.ClassDef)
        if self.done or in_class_body or not _calls_training_step(original):
            return updated
        self.done = True
        return cst.FlattenSentinel(self._replacement(original, updated))


def loop_into_method(module: cst.Module) -> cst.Module:
    return module.visit(_LoopIntoMethod(module))


MUTATIONS: dict[str, Callable[[cst.Module], cst.Module]] = {
    "rename-variables": rename_variables,
    "swap-imports": swap_import_styles,
    "alias-torch": alias_torch,
    "comments": insert_comments,
    "wrap-module-code": wrap_module_code,
    "drop-main-guard": drop_main_guard,
    "loop-into-method": loop_into_method,
}


def all_mutations(module: cst.Module) -> cst.Module:
    """Every mutation, one after the other."""
    for mutation in MUTATIONS.values():
        module = mutation(module)
    return module


def mutated(source: str, mutation: Callable[[cst.Module], cst.Module]) -> Optional[str]:
    """The mutated source, or None when the mutation has nothing to change or
    would give code that CPython refuses (then it is not a valid input)."""
    code = mutation(cst.parse_module(source)).code
    if code == source or _compiles(code):
        return None
    return code


MUTATION_NAMES = (*MUTATIONS, "all")


def mutated_inputs(name: str, count: Optional[int] = None) -> Iterator[tuple[Path, str]]:
    """(input, mutated source) for the inputs the mutation changes: all of them,
    or the first `count` in a spread order that starts at a different place
    for each mutation (so that the samples differ)."""
    inputs = training_sources()
    start = MUTATION_NAMES.index(name) * len(inputs) // len(MUTATION_NAMES)
    order = inputs[start:] + inputs[:start]
    order = order[::3] + order[1::3] + order[2::3]  # scripts and each codemod's fixtures early
    found = 0
    for path in order:
        if count is not None and found >= count:
            return
        source = mutated(path.read_text(encoding="utf-8"), mutation_named(name))
        if source is not None:
            found += 1
            yield path, source


def mutation_named(name: str) -> Callable[[cst.Module], cst.Module]:
    return all_mutations if name == "all" else MUTATIONS[name]


# -- generated code spliced into a training script --------------------------------------------

# A small training script that gives every codemod something to rewrite.
SKELETON = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train(epochs):
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)).cuda()
    model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        for inputs, targets in loader:
            inputs, targets = inputs.cuda(), targets.cuda()
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss)
            torch.cuda.empty_cache()
    torch.save(model.state_dict(), "model.pt")
    return losses


if __name__ == "__main__":
    train(2)
'''

# The names the skeleton gives meaning to, for statements that rebind or reuse them.
SKELETON_NAMES = (
    "torch", "nn", "DataLoader", "TensorDataset", "train", "epochs", "data", "loader", "model", "optimizer",
    "criterion", "losses", "epoch", "inputs", "targets", "loss", "device", "scaler", "rank", "cuda",
)


class _Blocks(cst.CSTVisitor):
    def __init__(self) -> None:
        self.blocks: list[cst.BaseSuite] = []

    def visit_Module(self, node: cst.Module) -> None:
        self.blocks.append(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.append(node)


def blocks_of(module: cst.Module) -> list:
    """The module and every indented block, in source order."""
    finder = _Blocks()
    module.visit(finder)
    return finder.blocks


def splice(module: cst.Module, block_index: int, position: int, statements: Sequence[cst.BaseStatement]) -> cst.Module:
    """`statements` inserted into the block_index-th block (see blocks_of),
    before its position-th statement (both taken modulo what exists)."""
    blocks = blocks_of(module)
    block = blocks[block_index % len(blocks)]
    body = list(block.body)
    at = position % (len(body) + 1)
    new_block = block.with_changes(body=[*body[:at], *statements, *body[at:]])
    if block is module:
        return new_block
    return module.deep_replace(block, new_block)


def _atom(code: str) -> str:
    return code if code.isidentifier() else f"({code})"


_LEAVES = ("None", "0", "1", "'cuda'", "'cuda:1'", "'cpu'", "[]", "()")
_ATTRIBUTES = ("item()", "backward()", "step()", "zero_grad()", "parameters()", "state_dict()", "cuda", "module", "device")


def expressions() -> st.SearchStrategy[str]:
    """Expressions over the skeleton's names, in the shapes the codemods look for."""
    names = st.sampled_from(SKELETON_NAMES)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        atom = inner.map(_atom)
        return st.one_of(
            st.builds("{}.cuda()".format, atom),
            st.builds("{}.cuda({})".format, atom, inner),
            st.builds("{}.to({})".format, atom, inner),
            st.builds("{}({})".format, atom, inner),
            st.builds("{}({}={})".format, atom, names, inner),
            st.builds("{}.{}".format, atom, st.sampled_from(_ATTRIBUTES)),
            st.builds("torch.device('cuda', {})".format, inner),
            st.builds("f'cuda:{{{}}}'".format, atom),
            st.builds("DataLoader({}, batch_size={})".format, inner, inner),
            st.builds("nn.DataParallel({})".format, inner),
            st.builds("torch.optim.SGD({}.parameters(), lr={})".format, atom, inner),
            st.builds("[{} for {} in {}]".format, inner, names, atom),
            st.builds("{} if {} else {}".format, atom, atom, atom),
            st.builds("lambda {}: {}".format, names, atom),
            st.builds("({} := {})".format, names, atom),
            st.builds("{}[{}]".format, atom, inner),
            st.builds("{}, {}".format, atom, atom),
            st.builds("{} + {}".format, atom, atom),
        )

    return st.recursive(st.one_of(names, st.sampled_from(_LEAVES)), extend, max_leaves=4)


def statements() -> st.SearchStrategy[str]:
    """One statement (with its newline) that rebinds, deletes or reuses the
    skeleton's names: shadowed modules, models and losses in odd places."""
    names, value = st.sampled_from(SKELETON_NAMES), expressions()
    return st.one_of(
        st.builds("{} = {}\n".format, names, value),
        st.builds("{}, {} = {}, {}\n".format, names, names, value.map(_atom), value.map(_atom)),
        st.builds("{} += {}\n".format, names, value),
        st.builds("{}.{} = {}\n".format, names, st.sampled_from(("module", "device", "lr", "sampler")), value),
        st.builds("del {}\n".format, names),
        st.builds("{}\n".format, value),
        st.builds("for {} in {}:\n    {} = {}\n".format, names, value, names, value),
        st.builds("with {} as {}:\n    pass\n".format, value.map(_atom), names),
        st.builds("def {}(*args, **kwargs):\n    return {}\n".format, names, value),
        st.builds("class {}:\n    {} = {}\n".format, names, names, value),
        st.builds("import os as {}\n".format, names),
        st.builds("from torch import {} as {}\n".format, st.sampled_from(("nn", "optim", "cuda", "distributed")), names),
        st.builds("if {}:\n    {} = {}\nelse:\n    {} = {}\n".format, value, names, value, names, value),
        st.builds("try:\n    {} = {}\nexcept Exception as {}:\n    pass\n".format, names, value, names),
        st.builds("global {}\n".format, names),
    )


def _spliced(parts: tuple[int, int, list[str]]) -> Optional[str]:
    block, position, sources = parts
    try:
        inserted = [s for source in sources for s in cst.parse_module(source).body]
    except cst.ParserSyntaxError:
        return None
    code = splice(cst.parse_module(SKELETON), block, position, inserted).code
    return None if _compiles(code) else code


def spliced_scripts(code: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The skeleton with generated statements inserted into one of its blocks;
    only what CPython compiles (a `global` after a use, `return` at module
    level and the like are dropped)."""
    parts = st.tuples(st.integers(0, 10), st.integers(0, 12), st.lists(code, min_size=1, max_size=3))
    return parts.map(_spliced).filter(lambda source: source is not None)


def generated_programs() -> st.SearchStrategy[str]:
    """hypothesmith's programs, made to pass every codemod's pre-check."""
    return hypothesmith.from_grammar().map(lambda source: trigger_comment() + source)


def plans() -> st.SearchStrategy[Plan]:
    """Each codemod alone (with its prerequisites), or all of them together."""
    return st.sampled_from([*(word_plan(word) for word in all_codemods()), all_words_plan()])
