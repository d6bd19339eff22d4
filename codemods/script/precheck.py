"""The pre-check: plain facts about a file from CPython's `ast`, before LibCST.

`precheck(source)` parses once with `ast.parse` and walks the tree once,
collecting what the codemods look for: imports (with a file-wide alias table
that resolves `nn.Linear` to `torch.nn.Linear`), the qualified names the code
uses, method calls, backward and optimizer steps, DataLoader constructions,
CUDA placements and device strings, the main guard. It costs about one
`ast.parse` (ten times less than LibCST's parser), so a file that no selected
codemod can change is answered without LibCST.

Which codemods can apply, given these facts, is decided in `rules.py`. The
alias table ignores scopes, so it resolves at least every name that LibCST's
qualified names resolve: a rule that asks for a qualified name never misses
one that a codemod would match.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import re
from typing import Callable, Collection, Iterable, Mapping, Optional

from . import vocabulary as v

LOCAL_RANK_FLAGS = frozenset({"--local_rank", "--local-rank"})
# Names that the ddp and fsdp codemods add and refuse to find taken (their
# AM530); tests/test_script_model.py checks that they are the codemods' own.
DDP_ADDED_NAMES = frozenset(
    {
        "DistributedDataParallel", "SeededDistributedSampler", "barrier", "ddp_device_ids", "draw_rank_share",
        "init_distributed", "is_distributed", "is_main_process", "main_process_first", "per_process_batch_size", "rank_local_buffers",
        "NullWriter", "rank_share", "rank_zero_decides", "sharded_loader_kwargs", "sum_gradients_across_ranks", "unwrap_model",
        "world_size", "set_loader_epoch", "sum_across_ranks", "average_across_ranks",
    }
)  # fmt: skip
FSDP_ADDED_NAMES = frozenset({"shard_model", "save_full_state_dict", "load_full_state_dict"})
ACCUMULATION_CONSTANT = "ACCUMULATION_STEPS"
BATCH_SCALE_CONSTANT = "BATCH_SCALE"


@dataclasses.dataclass(frozen=True)
class SourceFacts:
    """What one `ast` walk tells about a file. Qualified names come from the
    file's imports (`references`); `names` are the identifiers other than
    attribute names; counts say how often a thing occurs."""

    imports_torch: bool
    imported_modules: frozenset  # `torch.nn`, and `torch.utils.data.DataLoader` for a from-import
    star_imports: frozenset  # modules of `from M import *`
    references: frozenset  # qualified names of the name chains the code uses (`torch.optim.SGD`)
    calls: Mapping[str, int]  # qualified name of a callee -> calls
    method_calls: Mapping[str, int]  # `x.name(...)` -> calls, whatever x is
    names: frozenset  # Name identifiers, function, class, parameter and import names
    attributes: frozenset  # `x.name` attribute names
    cuda_strings: int  # strings that name or format a CUDA device ("cuda", "cuda:0", f"cuda:{i}", "cuda:%d"), but not compared or given as `device_type=`
    nccl_strings: int  # string constants "nccl", in any case (a process-group backend)
    zero_subscripts: int  # `x[0]` (also `x[0,]`, `x[False]`)
    data_zero_subscripts: int  # `x.data[0]`
    data_totals: int  # `total += <... .data ...>`, `total = total + <... .data ...>`
    legacy_reduction_calls: frozenset  # qualified names of callees given `size_average=` or `reduce=`
    local_rank_flag: bool  # a "--local_rank" / "--local-rank" string
    backward_calls: int  # `x.backward(...)`, `manual_backward(...)`, torch.autograd.backward
    training_steps: tuple  # lines of backward calls with a `.step(` in the same function
    dataloader_calls: int  # torch's DataLoader constructed (or a bare DataLoader under its `import *`)
    module_constants: frozenset  # names assigned at module level
    main_guard: bool  # `if __name__ == "__main__":` at module level
    loops: int
    lines: int

    # -- questions ------------------------------------------------------------------

    def uses(self, qualified: Collection[str]) -> bool:
        """Does the code name any of these (qualified) names?"""
        return not self.references.isdisjoint(qualified)

    def uses_prefix(self, *prefixes: str) -> bool:
        return any(q.startswith(prefixes) for q in self.references)

    def uses_where(self, predicate: Callable[[str], bool]) -> bool:
        return any(predicate(q) for q in self.references)

    def calls_to(self, qualified: Collection[str]) -> int:
        return sum(self.calls.get(q, 0) for q in qualified)

    @property
    def has_training_step(self) -> bool:
        return bool(self.training_steps)

    @property
    def cuda_calls(self) -> int:
        return self.method_calls.get("cuda", 0)

    @property
    def optimizer_steps(self) -> int:
        return self.method_calls.get("step", 0)

    @property
    def data_parallel(self) -> bool:
        return self.uses(v.DATA_PARALLEL)

    @property
    def torch_save(self) -> bool:
        return self.uses(v.TORCH_SAVE)

    @property
    def empty_cache(self) -> bool:
        return self.uses(v.EMPTY_CACHE)

    @property
    def apex(self) -> bool:
        return any(m == "apex" or m.startswith("apex.") for m in self.imported_modules)

    @property
    def mixed_precision(self) -> bool:
        """autocast, GradScaler, torch.cuda.amp, apex: any use of the AMP APIs."""
        return self.apex or self.uses_prefix(*v.AMP_PREFIXES) or self.uses(v.AUTOCAST) or not self.names.isdisjoint(v.AMP_NAMES)

    @property
    def no_grad(self) -> bool:
        return self.uses(v.NO_GRAD)


def precheck(source: str) -> SourceFacts:
    """The facts of `source`; raises SyntaxError as `ast.parse` does."""
    return facts_of(ast.parse(source), source)


def facts_of(tree: ast.Module, source: str) -> SourceFacts:
    """The facts of `source` from its tree, parsed already."""
    return _Walk(tree).facts(source)


# -- the walk ---------------------------------------------------------------------------

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# A string that names a CUDA device, or the text around an index formatted
# into one (`f"cuda:{i}"`, `"cuda:{}".format(i)`, `"cuda:%d" % i`, `"cuda:" + str(i)`):
# the only strings the `device` codemod rewrites or reports ("cudnn", "cuda_graph"
# and "cuda not available" are none of them).
_CUDA_DEVICE_TEXT = re.compile(r"cuda(:(\d+|\{0?\}|%[dsi])?)?")
# Leaves that tell nothing (a Name's Load or Store, `+`, `==`, `and`): a
# sixth of the nodes, skipped before they are visited.
_NO_FACTS = frozenset(
    kind
    for base in (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
    for kind in base.__subclasses__()
)


class _Walk:
    """One pass over the `ast` tree, with an explicit stack (no recursion
    limit on deep files). Name chains are resolved after the walk, once every
    import is known."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, set[str]] = collections.defaultdict(set)
        self.imported: set[str] = set()
        self.stars: set[str] = set()
        self.chains: collections.Counter = collections.Counter()  # (root, rest) -> occurrences
        self.called_chains: collections.Counter = collections.Counter()
        self.methods: collections.Counter = collections.Counter()
        self.names: set[str] = set()
        self.attributes: set[str] = set()
        self.cuda_strings = 0
        self.nccl_strings = 0
        self.zero_subscripts = 0
        self.data_zero_subscripts = 0
        self.data_totals = 0
        self.reduction_chains: collections.Counter = collections.Counter()  # callees given size_average= / reduce=
        self.local_rank_flag = False
        self.backwards: list[tuple[int, int]] = []  # (function index, line)
        self.stepping_functions: set[int] = set()
        self.loops = 0
        self.module_constants: set[str] = set()
        self.main_guard = False
        self._function_count = 0
        self._not_placing: set[int] = set()  # ids of strings that are compared or name a device type
        self._run(tree)

    def _run(self, tree: ast.Module) -> None:
        for statement in tree.body:
            self._module_statement(statement)
        stack: list[tuple[ast.AST, int]] = [(tree, 0)]
        while stack:
            node, function = stack.pop()
            if isinstance(node, _FUNCTIONS):
                self._function_count += 1
                function = self._function_count
            inner = self._visit(node, function)
            for child in ast.iter_child_nodes(node) if inner is None else inner:
                if type(child) not in _NO_FACTS:
                    stack.append((child, function))

    def _module_statement(self, statement: ast.stmt) -> None:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            self.module_constants.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.If) and _is_main_guard(statement.test):
            self.main_guard = True

    def _visit(self, node: ast.AST, function: int) -> Optional[Iterable[ast.AST]]:
        """Record `node`; return the children to walk when they are not all of
        them (a name chain is read here whole)."""
        if isinstance(node, ast.Name):
            self.names.add(node.id)
            self.chains[(node.id, "")] += 1
        elif isinstance(node, ast.Attribute):
            return self._attribute(node)
        elif isinstance(node, ast.Call):
            self._call(node, function)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self._string(node.value, placing=id(node) not in self._not_placing)
        elif isinstance(node, ast.Subscript):
            if _is_index_zero(node.slice):
                self.zero_subscripts += 1
                value = node.value
                self.data_zero_subscripts += isinstance(value, ast.Attribute) and value.attr == "data"
        elif isinstance(node, (ast.AugAssign, ast.Assign)):
            self.data_totals += _adds_data(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._import(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.names.add(node.name)
        elif isinstance(node, ast.arg):
            self.names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            self.names.add(node.arg)
            if node.arg == "device_type":  # torch.autocast(device_type="cuda"): amp's, never a placement
                self._not_placing.add(id(node.value))
        elif isinstance(node, ast.Compare):  # `x.device.type == "cuda"` tests, it places nothing
            self._not_placing.update(id(side) for side in (node.left, *node.comparators))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self.names.add(node.name)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)):
            self.loops += 1
        return None

    def _attribute(self, node: ast.Attribute) -> Optional[Iterable[ast.AST]]:
        parts = []
        current: ast.AST = node
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        self.attributes.update(parts)
        if isinstance(current, ast.Name):
            self.names.add(current.id)
            self.chains[(current.id, "." + ".".join(reversed(parts)))] += 1
            return ()
        return (current,)

    def _call(self, node: ast.Call, function: int) -> None:
        func = node.func
        chain = _chain(func)
        if chain is not None:
            self.called_chains[chain] += 1
            if any(keyword.arg in v.LEGACY_REDUCTION for keyword in node.keywords):
                self.reduction_chains[chain] += 1
        if isinstance(func, ast.Attribute):
            self.methods[func.attr] += 1
            if func.attr in ("backward", "manual_backward"):
                self.backwards.append((function, node.lineno))
            elif func.attr == "step":
                self.stepping_functions.add(function)
        elif isinstance(func, ast.Name) and func.id in ("backward", "manual_backward"):
            self.backwards.append((function, node.lineno))  # `from torch.autograd import backward`

    def _string(self, value: str, placing: bool) -> None:
        if _CUDA_DEVICE_TEXT.fullmatch(value):
            self.cuda_strings += placing
        elif value.lower() == "nccl":
            self.nccl_strings += 1
        elif value in LOCAL_RANK_FLAGS:
            self.local_rank_flag = True

    def _import(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self.imported.add(alias.name)
                self.names.update(alias.name.split("."))
                if alias.asname:
                    self.names.add(alias.asname)
                    self.aliases[alias.asname].add(alias.name)
                else:
                    root = alias.name.split(".")[0]
                    self.aliases[root].add(root)
            return
        module = "." * node.level + (node.module or "")
        self.imported.add(module)
        self.names.update(part for part in module.split(".") if part)
        for alias in node.names:
            if alias.name == "*":
                self.stars.add(module)
                continue
            qualified = f"{module}.{alias.name}" if module and not module.endswith(".") else f"{module}{alias.name}"
            self.imported.add(qualified)
            self.names.add(alias.name)
            self.names.add(alias.asname or alias.name)
            self.aliases[alias.asname or alias.name].add(qualified)

    # -- after the walk ------------------------------------------------------------------

    def _resolve(self, counter: collections.Counter) -> collections.Counter:
        resolved: collections.Counter = collections.Counter()
        for (root, rest), count in counter.items():
            for qualified in self.aliases.get(root, ()):
                resolved[qualified + rest] += count
        return resolved

    def facts(self, source: str) -> SourceFacts:
        calls = self._resolve(self.called_chains)
        references = frozenset(self._resolve(self.chains))
        dataloaders = sum(calls.get(q, 0) for q in v.DATALOADER)
        if self.stars & v.DATALOADER_MODULES:
            dataloaders += self.called_chains.get(("DataLoader", ""), 0)
        steps = tuple(line for function, line in self.backwards if function in self.stepping_functions)
        backward_calls = len(self.backwards) + sum(calls.get(q, 0) for q in v.AUTOGRAD_BACKWARD)
        return SourceFacts(
            imports_torch=any(m == "torch" or m.startswith("torch.") for m in self.imported),
            imported_modules=frozenset(self.imported),
            star_imports=frozenset(self.stars),
            references=references,
            calls=dict(calls),
            method_calls=dict(self.methods),
            names=frozenset(self.names),
            attributes=frozenset(self.attributes),
            cuda_strings=self.cuda_strings,
            nccl_strings=self.nccl_strings,
            zero_subscripts=self.zero_subscripts,
            data_zero_subscripts=self.data_zero_subscripts,
            data_totals=self.data_totals,
            legacy_reduction_calls=frozenset(self._resolve(self.reduction_chains)),
            local_rank_flag=self.local_rank_flag,
            backward_calls=backward_calls,
            training_steps=steps,
            dataloader_calls=dataloaders,
            module_constants=frozenset(self.module_constants),
            main_guard=self.main_guard,
            loops=self.loops,
            lines=source.count("\n") + 1,
        )


def _chain(node: ast.AST) -> Optional[tuple[str, str]]:
    """(`a`, `.b.c`) for the name chain `a.b.c`, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, "".join("." + p for p in reversed(parts))


def _adds_data(statement: ast.AST) -> bool:
    """`total += <...>` or `total = total + <...>` (either side), where what
    is added reads some `.data`: a running total of tensors' data."""
    added: Optional[ast.AST] = None
    if isinstance(statement, ast.AugAssign):
        added = statement.value
    elif len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        value, name = statement.value, statement.targets[0].id
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
            if isinstance(value.left, ast.Name) and value.left.id == name:
                added = value.right
            elif isinstance(value.right, ast.Name) and value.right.id == name:
                added = value.left
    return added is not None and any(isinstance(n, ast.Attribute) and n.attr == "data" for n in ast.walk(added))


def _is_index_zero(index: ast.AST) -> bool:
    if isinstance(index, ast.Tuple) and len(index.elts) == 1:
        index = index.elts[0]
    return isinstance(index, ast.Constant) and isinstance(index.value, int) and index.value == 0


def _is_main_guard(test: ast.AST) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


__all__ = ["SourceFacts", "precheck"]
