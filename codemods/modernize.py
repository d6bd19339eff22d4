"""modernize: rewrite the PyTorch idioms of before 0.4 that fail or mislead today.

What it does
    - `x.data[0]` where `x` provably holds one number becomes `x.item()`
      (AM220): the result of a loss function (`F.nll_loss(...)`, a criterion
      made by `nn.CrossEntropyLoss()` and the like, without
      `reduction="none"`), of `.sum()` / `.mean()`, arithmetic on those, or a
      name assigned once on which `.backward()` runs. `total[0]` on a running
      total of such `.data` values becomes `total.item()`.
    - `total += loss.data` whose total is only ever read as `total[0]`
      accumulates `loss.item()` instead, and the reads become `total`
      (AM223).
    - `Variable(t)` (`torch.autograd.Variable`, however imported) becomes `t`
      when `t` provably carries no gradient (a batch of a DataLoader, a
      freshly made tensor, `h.data`) and nothing later sets a gradient flag on
      it; else `t.detach()`, which is what `Variable(t)` does today.
      `Variable(t, requires_grad=True)` becomes `t.detach().requires_grad_()`
      (a new leaf sharing storage with `t`, as before), or
      `t.requires_grad_()` for a tensor made on the spot.
      `isinstance(x, Variable)` becomes `isinstance(x, torch.Tensor)`, and
      `type(x) == Variable` too (AM221). The import goes when nothing else
      uses it.
    - `Variable(t, volatile=True)`: the statements that use the value, from
      its first use to the end of the loop body (or function body), run under
      `with torch.no_grad():`; the whole loop when everything before that use
      only moves data (AM222).
    - `size_average=` / `reduce=` of a loss become `reduction=` by torch's
      own table (AM224): `reduce=False` -> `"none"`, else
      `size_average=False` -> `"sum"`, else the default `"mean"`.
    - `nn.init.xavier_uniform(w)` and the other initialisers without the
      trailing underscore become `nn.init.xavier_uniform_(w)`, the same
      function under its current name (AM225).

Why
    Since PyTorch 0.4 a loss is a 0-dim tensor: `loss.data[0]` raises
    "invalid index of a 0-dim tensor", so most training scripts from 2017-2018
    stop at their first print. `Variable` is a deprecated alias that now
    detaches its argument (`Variable(y)` of a computed `y` cuts the graph);
    `volatile=True` has no effect at all (a warning), so evaluation loops
    that relied on it build and keep a graph for every batch. `type(h) ==
    Variable` is never true any more, which sends the classic
    `repackage_hidden` into an endless recursion. `size_average`, `reduce`
    and the initialisers without `_` warn on every call.

Example
    Before::

        from torch.autograd import Variable

        for data, target in test_loader:
            data, target = Variable(data, volatile=True), Variable(target)
            output = model(data)
            test_loss += F.nll_loss(output, target, size_average=False).data[0]

    After::

        import torch

        for data, target in test_loader:
            with torch.no_grad():
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()

Left alone
    `x.data[0]` on a tensor not provably holding one number (`output.data[0]`
    is the first sample of a batch: valid indexing); `total += loss.data`
    whose total is read otherwise than `total[0]` (a 0-dim tensor works
    today); `F.sigmoid` / `F.tanh` (deprecated, still work); `size_average`
    or `reduce` given by position; a `Variable(...)` with other arguments,
    and a `volatile=True` whose region cannot be proven (it is used inside an
    `if`, the region backpropagates, or values made there are read later
    where a graph may matter): a finding says what to do by hand. A file
    with `.cuda(async=True)` does not parse on Python 3.7+ and is reported as
    a syntax error (write `non_blocking=True`).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from ._base import Codemod, code_of, dotted_name, has_star_args, keyword_arg, remove_statements, walk
from .item import AUTOGRAD_ATTRIBUTES, DETACHING_METHODS, REDUCTIONS, SAME_VALUE_METHODS, is_number_literal, method_name, positional_args
from .script import ScriptModel
from .script import vocabulary as v
from .script.scopes import Binding, Scope

# -- what torch calls things ---------------------------------------------------------

# torch.nn.functional losses -> how many leading positional parameters cannot
# change the reduction (those before size_average / reduce / reduction).
FUNCTIONAL_LOSSES = {
    "binary_cross_entropy": 3, "binary_cross_entropy_with_logits": 3, "cosine_embedding_loss": 4,
    "cross_entropy": 3, "ctc_loss": 5, "gaussian_nll_loss": 5, "hinge_embedding_loss": 3, "huber_loss": 2,
    "kl_div": 2, "l1_loss": 2, "margin_ranking_loss": 4, "mse_loss": 2, "multi_margin_loss": 5,
    "multilabel_margin_loss": 2, "multilabel_soft_margin_loss": 3, "nll_loss": 3, "poisson_nll_loss": 4,
    "smooth_l1_loss": 2, "soft_margin_loss": 2, "triplet_margin_loss": 7, "triplet_margin_with_distance_loss": 6,
}  # fmt: skip
# torch.nn loss classes -> the same count for their constructors.
LOSS_CLASSES = {
    "BCELoss": 1, "BCEWithLogitsLoss": 1, "CTCLoss": 1, "CosineEmbeddingLoss": 1, "CrossEntropyLoss": 1,
    "GaussianNLLLoss": 2, "HingeEmbeddingLoss": 1, "HuberLoss": 0, "KLDivLoss": 0, "L1Loss": 0, "MSELoss": 0,
    "MarginRankingLoss": 1, "MultiLabelMarginLoss": 0, "MultiLabelSoftMarginLoss": 1, "MultiMarginLoss": 3,
    "NLLLoss": 1, "PoissonNLLLoss": 2, "SmoothL1Loss": 0, "SoftMarginLoss": 0, "TripletMarginLoss": 4,
    "TripletMarginWithDistanceLoss": 3,
}  # fmt: skip
REDUCING = frozenset({"mean", "sum", "batchmean"})  # reductions that give a 0-dim tensor
LEGACY_REDUCTION = ("size_average", "reduce")

# The initialisers torch keeps under their pre-0.4 names only as deprecated aliases.
DEPRECATED_INIT = frozenset(
    {"uniform", "normal", "constant", "eye", "dirac", "xavier_uniform", "xavier_normal",
     "kaiming_uniform", "kaiming_normal", "orthogonal", "sparse"}
)  # fmt: skip
INIT_MODULES = ("torch.nn.init",)

# Calls that make a new tensor without a gradient (unless told requires_grad=True).
_TENSOR_TYPES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Byte", "Char", "Bool")
TENSOR_FACTORIES = frozenset(
    {f"torch.{n}" for n in (
        "tensor", "Tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
        "linspace", "logspace", "eye", "from_numpy", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like", "randint_like",
    )}
    | {f"torch.{t}Tensor" for t in _TENSOR_TYPES}
    | {f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES}
)  # fmt: skip
# Tensor methods whose result is a new tensor object, never the receiver.
NEW_TENSOR_METHODS = frozenset(
    {"clone", "detach", "new", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "view", "view_as",
     "reshape", "expand", "expand_as", "repeat", "transpose", "permute", "t", "squeeze", "unsqueeze", "flatten",
     "narrow", "mean", "sum", "add", "sub", "mul", "div", "pow", "exp", "log", "abs", "neg", "sqrt"}
)  # fmt: skip
# What the identity of a tensor object matters to: after `y = Variable(x)`
# became `y = x`, these on either name would reach the other.
IDENTITY_ATTRIBUTES = frozenset(
    {"requires_grad", "requires_grad_", "grad", "grad_fn", "retain_grad", "register_hook",
     "resize_", "resize_as_", "set_"}
)  # fmt: skip
NUMBER_BUILTINS = frozenset({"builtins.len", "builtins.int", "builtins.float"})
NUMBER_METHODS = frozenset({"item", "numel", "dim"})
ZERO_D_METHODS = REDUCTIONS | {"norm"}
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)
AUGMENTED_ARITHMETIC = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign)
# Methods that only move or view a batch: a statement made of these builds no graph worth keeping.
MOVING_METHODS = frozenset(
    {"cuda", "cpu", "to", "float", "double", "half", "long", "int", "type", "view", "contiguous",
     "squeeze", "unsqueeze", "size", "t", "permute", "transpose"}
)  # fmt: skip
AUTOGRAD_CALLS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})
TRAINING_METHODS = frozenset({"backward", "step", "zero_grad", "manual_backward"})

# How sure the analysis is that a value holds one number.
ZERO_D = "0-d"  # a 0-dim tensor
ONE = "one"  # one number, maybe of shape (1,): `.backward()` without a gradient ran on it
NUMBER = "number"  # a Python number
_CYCLE = "cycle"  # the value being worked out itself (`total = total + x`)
_TENSOR_LEVELS = (ZERO_D, ONE)

Expression = cst.BaseExpression


class Modernize(Codemod):
    word = "modernize"
    summary = "rewrite pre-0.4 idioms that fail today: loss.data[0], Variable(...), volatile=True, size_average"
    codes = {
        "AM220": "x.data[0] on a one-number tensor (an IndexError since PyTorch 0.4): x.item()",
        "AM221": "torch.autograd.Variable: the tensor itself, .detach(), or torch.Tensor in type checks",
        "AM222": "Variable(..., volatile=True) (no effect since PyTorch 0.4): a torch.no_grad() region",
        "AM223": "a running total of loss.data read as total[0]: accumulate loss.item()",
        "AM224": "size_average= / reduce= of a loss: reduction=",
        "AM225": "nn.init initialiser without the trailing underscore: the underscore form",
    }
    triggers = (
        "Variable", ".data", "volatile", "size_average", "reduce",
        "uniform", "normal", "constant", "eye", "dirac", "orthogonal", "sparse",
    )  # fmt: skip
    # Names come from the script model: LibCST's own resolution is not needed.
    METADATA_DEPENDENCIES = ()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replace: dict[cst.CSTNode, object] = {}  # original node -> how to rewrite it
        self._doomed: set[cst.CSTNode] = set()  # statement lines left doing nothing
        self._wraps: dict[cst.CSTNode, list] = {}  # block -> [(first, last) statement under no_grad]
        self._torch = "torch"

    # -- planning, on the original tree -----------------------------------------------

    def visit_Module(self, node: cst.Module) -> bool:
        self.model = ScriptModel.of(self.context.wrapper)
        self.values = _Values(self.model)
        calls = [n for n in walk(node) if isinstance(n, cst.Call)]
        self._plan_accumulators()
        self._plan_one_number_reads(node)
        self._plan_variables(node, calls)
        self._plan_legacy_reductions(calls)
        self._plan_initialisers(node)
        return bool(self._replace or self._doomed or self._wraps)

    # AM220 ---------------------------------------------------------------------------

    def _plan_one_number_reads(self, module: cst.Module) -> None:
        for node in walk(module):
            if not (isinstance(node, cst.Subscript) and _is_index_zero(node)) or node in self._replace:
                continue
            holder = node.value
            if isinstance(holder, cst.Attribute) and holder.attr.value == "data":
                level = self.values.level(holder.value)
                if level in _TENSOR_LEVELS:
                    self._one_number_read(node, code_of(holder.value), "item")
            elif isinstance(holder, cst.Name) and self.values.is_data_total(holder) and self.values.level(holder) == ZERO_D:
                self._one_number_read(node, holder.value, "item")

    def _one_number_read(self, subscript: cst.Subscript, tensor: str, how: str) -> None:
        if self.fix(subscript, "AM220", f"{code_of(subscript)} indexes a tensor that holds one number, which raises "
                    f"IndexError on a 0-dim tensor since PyTorch 0.4: {tensor}.item()"):
            self._replace[subscript] = how

    # AM223 ---------------------------------------------------------------------------

    def _plan_accumulators(self) -> None:
        for total, stores, reads in self.values.data_totals():
            if not reads or any(not _is_index_zero(self.model.parent(r)) for r in reads):
                continue
            atoms = [atom for store in stores for atom in self.values.data_atoms(store)]
            if any(atom is None for atom in atoms):
                continue
            first = stores[0]
            if not self.fix(first, "AM223", f"{total} adds up loss.data tensors and is read only as {total}[0], which "
                            f"raises IndexError on a 0-dim tensor since PyTorch 0.4: add up loss.item() and read {total}"):
                continue
            for atom in atoms:
                self._replace[atom] = "data-item"
            for read in reads:
                self._replace[self.model.parent(read)] = "bare"

    # AM221 / AM222 -------------------------------------------------------------------

    def _plan_variables(self, module: cst.Module, calls: list[cst.Call]) -> None:
        variable_calls = [c for c in calls if self.model.is_call_to(c, v.VARIABLE)]
        references = [
            n for n in walk(module)
            if isinstance(n, (cst.Name, cst.Attribute)) and self.model.is_qualified(n, v.VARIABLE)
            and not isinstance(self.model.parent(n), cst.Attribute) and not _in_import(self.model, n)
            and not (isinstance(self.model.parent(n), cst.Call) and self.model.parent(n).func is n)
        ]  # fmt: skip
        if not variable_calls and not references:
            return
        self._torch = self._torch_spelling()
        volatile = []
        for call in variable_calls:
            flag = self._plan_variable_call(call)
            if flag is not None:
                volatile.append((call, flag))
        self._drop_idle_lines(variable_calls)
        regions = _Regions(self)
        for call, flag in volatile:
            regions.add(call, flag)
        regions.plan()
        for reference in references:
            self._plan_variable_type(reference)
        if any(f.code in ("AM221", "AM222") and f.fixed for f in self.findings):
            self._drop_variable_imports()

    def _plan_variable_call(self, call: cst.Call) -> Optional[Expression]:
        """Plan the rewrite of one `Variable(...)`; its `volatile=` value, if any."""
        positional = positional_args(call)
        keywords = {a.keyword.value for a in call.args if a.keyword is not None}
        if has_star_args(call) or len(positional) != 1 or not keywords <= {"requires_grad", "volatile"}:
            self.report(call, "AM221", f"{_first_line(call)}: Variable is a deprecated alias that detaches its argument; "
                        "pass the tensor itself (x.detach() where it must not carry the graph, "
                        "x.detach().requires_grad_() for a new leaf)")
            return None
        tensor = positional[0].value
        requires_grad, volatile = keyword_arg(call, "requires_grad"), keyword_arg(call, "volatile")
        wants_grad = requires_grad is not None and not _is_false(requires_grad.value)
        fresh = self.values.is_fresh(tensor)
        if wants_grad:
            kind = "requires-grad"
            written = f"{code_of(tensor)}{'' if fresh else '.detach()'}.requires_grad_()"
        elif fresh or (self.values.is_grad_free(tensor) and not self._identity_matters(call, tensor)):
            kind, written = "bare", code_of(tensor)
        else:
            kind, written = "detach", f"{code_of(tensor)}.detach()"
        if not self.fix(call, "AM221", f"Variable(...) is a deprecated alias since PyTorch 0.4: {written}"):
            return None
        flag = requires_grad.value if wants_grad and not _is_true(requires_grad.value) else None
        self._replace[call] = (kind, fresh, flag)
        return volatile.value if volatile is not None and not _is_false(volatile.value) else None

    def _identity_matters(self, call: cst.Call, tensor: Expression) -> bool:
        """Would `y = x` instead of `y = x.detach()` be seen: a gradient flag
        set, or an in-place resize, on either name in the scope."""
        names = {_root_name(tensor), *_assigned_names(self.model, call)} - {None}
        for node in walk(self.model.scope_of(call).node):
            if (
                isinstance(node, cst.Attribute) and node.attr.value in IDENTITY_ATTRIBUTES
                and isinstance(node.value, cst.Name) and node.value.value in names
            ):  # fmt: skip
                return True
        return False

    def _drop_idle_lines(self, calls: list[cst.Call]) -> None:
        """`data, target = Variable(data), Variable(target)` would become
        `data, target = data, target`: drop the line."""
        for call in calls:
            line = self._statement_line(call)
            if line is None or len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
                continue
            assign = line.body[0]
            pairs = list(_pairs(assign.targets[0].target, assign.value)) if len(assign.targets) == 1 else []
            if pairs and all(self._assigns_itself(name, value) for name, value in pairs):
                self._doomed.add(line)

    def _assigns_itself(self, name: cst.CSTNode, value: Expression) -> bool:
        """`x = Variable(x)`, rewritten to `x = x`."""
        how = self._replace.get(value)
        if not (isinstance(how, tuple) and how[0] == "bare" and isinstance(name, cst.Name)):
            return False
        inner = positional_args(value)[0].value
        return isinstance(inner, cst.Name) and inner.value == name.value

    def _statement_line(self, node: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor
            if isinstance(ancestor, cst.BaseCompoundStatement):
                return None
        return None

    def _plan_variable_type(self, reference: cst.CSTNode) -> None:
        check = _type_check(self.model, reference)
        tensor = f"{self._torch or 'torch'}.Tensor"
        if check is None or not self.torch_reads_torch(reference):
            self.report(reference, "AM221", f"{code_of(reference)} is a deprecated alias of torch.Tensor since PyTorch 0.4 "
                        "(and `type(x) == Variable` is never true): test isinstance(x, torch.Tensor) instead")
            return
        kind, node, subject = check
        if kind == "isinstance":
            message = f"isinstance(..., Variable) is isinstance(..., {tensor}) since PyTorch 0.4"
            replaced, how = reference, ("tensor-type",)
        else:
            message = (f"{code_of(node)} is never true since PyTorch 0.4 (a tensor's type is {tensor}), "
                       f"which was the meaning of the test: isinstance({code_of(subject)}, {tensor})")
            replaced, how = node, ("type-check", kind, subject)
        if self.fix(reference, "AM221", message):
            self._replace[replaced] = how
            self._need_torch(reference)

    def _drop_variable_imports(self) -> None:
        for binding in self.model.imports:
            if binding.qualified in v.VARIABLE or binding.qualified == "torch.autograd" and binding.name != "torch":
                RemoveImportsVisitor.remove_unused_import_by_node(self.context, binding.statement)
                self.imports_changed = True

    # spelling `torch` where code is added ------------------------------------------

    def _torch_spelling(self) -> Optional[str]:
        """The module-level name that imports torch, else "torch" when nothing
        binds that name (an import is added), else None."""
        for binding in self.model.imports:
            if binding.qualified == "torch" and binding.scope.kind == "module":
                return binding.name
        return "torch" if "torch" not in self.model.module_scope.bindings else None

    def _need_torch(self, at: cst.CSTNode) -> None:
        if self.model.index.names_of(self._torch, self.model.scope_of(at)) != frozenset({"torch"}):
            self.add_import("torch")

    def torch_reads_torch(self, at: cst.CSTNode) -> bool:
        """`torch` (as spelled) at `at` reads the module, or nothing yet."""
        if self._torch is None:
            return False
        names = self.model.index.names_of(self._torch, self.model.scope_of(at))
        return names in (frozenset({"torch"}), frozenset())

    # AM224 ---------------------------------------------------------------------------

    def _plan_legacy_reductions(self, calls: list[cst.Call]) -> None:
        for call in calls:
            if not any(keyword_arg(call, name) for name in LEGACY_REDUCTION) or self.values.loss_prefix(call) is None:
                continue
            given = {name: keyword_arg(call, name) for name in LEGACY_REDUCTION}
            values = {name: _literal_flag(arg.value) if arg else None for name, arg in given.items()}
            if any(arg is not None and values[name] == "?" for name, arg in given.items()):
                self.report(call, "AM224", f"{_first_line(call)}: size_average and reduce are deprecated; pass "
                            'reduction= instead: "none" when reduce is false, else "sum" when size_average is false, else "mean"')
                continue
            reduction = _legacy_reduction(values["size_average"], values["reduce"])
            written = f'reduction="{reduction}"' if reduction != "mean" else "no reduction argument (the default, mean)"
            if self.fix(call, "AM224", f"size_average / reduce are deprecated arguments: {written}"):
                self._replace[call] = ("reduction", reduction)

    # AM225 ---------------------------------------------------------------------------

    def _plan_initialisers(self, module: cst.Module) -> None:
        for node in walk(module):
            if isinstance(node, cst.ImportFrom) and dotted_name(node.module or cst.Name("_")) in INIT_MODULES:
                if not isinstance(node.names, cst.ImportStar):
                    for alias in node.names:
                        if isinstance(alias.name, cst.Name) and alias.name.value in DEPRECATED_INIT:
                            self._rename(alias.name, alias.name.value)
            elif isinstance(node, (cst.Attribute, cst.Name)) and not _in_import(self.model, node):
                name = node.attr.value if isinstance(node, cst.Attribute) else node.value
                if name in DEPRECATED_INIT and self.model.qualified_names(node) == {f"torch.nn.init.{name}"}:
                    if isinstance(node, cst.Name) and isinstance(self.model.parent(node), cst.Attribute):
                        continue  # the attribute of `init.normal`: the Attribute is handled
                    self._rename(node, name)

    def _rename(self, node: cst.CSTNode, name: str) -> None:
        if self.fix(node, "AM225", f"torch.nn.init.{name} is a deprecated alias: torch.nn.init.{name}_"):
            self._replace[node] = ("rename", f"{name}_")

    # -- rewriting ----------------------------------------------------------------------

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> Expression:
        how = self._replace.get(original_node)
        if how == "item":
            tensor = updated_node.value.value if isinstance(original_node.value, cst.Attribute) else updated_node.value
            return _method_call(tensor, "item", updated_node)
        if how == "bare":
            return updated_node.value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Expression:
        how = self._replace.get(original_node)
        if how == "data-item":
            return _method_call(updated_node.value, "item", updated_node)
        return self._renamed(how, updated_node, lambda name: updated_node.with_changes(attr=cst.Name(name)))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Expression:
        how = self._replace.get(original_node)
        return self._renamed(how, updated_node, lambda name: updated_node.with_changes(value=name))

    def _renamed(self, how, updated: Expression, rename) -> Expression:
        if isinstance(how, tuple) and how[0] == "rename":
            return rename(how[1])
        if isinstance(how, tuple) and how[0] == "tensor-type":
            return cst.parse_expression(f"{self._torch}.Tensor").with_changes(lpar=updated.lpar, rpar=updated.rpar)
        return updated

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Expression:
        how = self._replace.get(original_node)
        if not isinstance(how, tuple):
            return updated_node
        if how[0] == "reduction":
            return _with_reduction(updated_node, how[1])
        kind, fresh, flag = how
        tensor = positional_args(updated_node)[0].value
        if kind == "bare":
            return _in_context(tensor, self.model.parent(original_node), updated_node)
        receiver = tensor if kind == "requires-grad" and fresh else _method_call(tensor, "detach")
        if kind == "detach":
            return receiver.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        arguments = [cst.Arg(flag)] if flag is not None else []
        return _method_call(receiver, "requires_grad_", updated_node, arguments)

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> Expression:
        how = self._replace.get(original_node)
        if not (isinstance(how, tuple) and how[0] == "type-check"):
            return updated_node
        _, kind, subject = how
        test = cst.parse_expression(f"isinstance({code_of(subject)}, {self._torch}.Tensor)")
        if kind == "is-not":
            test = cst.UnaryOperation(operator=cst.Not(), expression=test)
        return test.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._new_body(original_node, updated_node))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._new_body(original_node, updated_node))

    def _new_body(self, original, updated) -> list:
        """The block's statements, without the idle lines, with the planned
        spans under `with torch.no_grad():`."""
        old, new = list(original.body), list(updated.body)
        spans = self._wraps.get(original, [])
        if self._doomed.isdisjoint(old) and not spans:
            return new
        for first, last in sorted(spans, key=lambda span: old.index(span[0]), reverse=True):
            start, end = old.index(first), old.index(last) + 1
            inside = {n for o, n in zip(old[start:end], new[start:end]) if o in self._doomed}
            region = self._no_grad_region(remove_statements(new[start:end], inside))
            old[start:end] = [region]
            new[start:end] = [region]
        return remove_statements(new, {n for o, n in zip(old, new) if o in self._doomed})

    def _no_grad_region(self, statements: list) -> cst.With:
        leading = statements[0].leading_lines
        statements[0] = statements[0].with_changes(leading_lines=[])
        return cst.With(
            items=[cst.WithItem(item=cst.parse_expression(f"{self._torch}.no_grad()"))],
            body=cst.IndentedBlock(body=statements),
            leading_lines=leading,
        )


# -- the values: one number? no gradient? -------------------------------------------------


class _Values:
    """What the script model shows about values: whether an expression holds
    one number, whether it can carry a gradient, and which running totals
    add up `.data` values."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self._levels: dict[tuple, Optional[str]] = {}
        self._in_progress: set[tuple] = set()
        self._grad_free: dict[tuple, bool] = {}
        self._global_names = {name for scope in model.scopes for name in scope.declared_global}

    # one number ------------------------------------------------------------------------

    def level(self, value: Expression) -> Optional[str]:
        """ZERO_D, ONE or NUMBER when the value provably holds one number; else None."""
        if is_number_literal(value) and not (isinstance(value, cst.Name)):
            return NUMBER
        if isinstance(value, cst.Name):
            return self._name_level(value)
        if isinstance(value, cst.Attribute) and value.attr.value == "data":
            return self._tensor_level(value.value)
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, (cst.Minus, cst.Plus)):
            return self.level(value.expression)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, ARITHMETIC):
            return _arithmetic(self.level(value.left), self.level(value.right))
        if isinstance(value, cst.Call):
            return self._call_level(value)
        return None

    def _tensor_level(self, value: Expression) -> Optional[str]:
        level = self.level(value)
        return level if level in _TENSOR_LEVELS else None

    def _call_level(self, call: cst.Call) -> Optional[str]:
        if self.model.is_call_to(call, NUMBER_BUILTINS):
            return NUMBER
        if self.is_reducing_loss_call(call):
            return ZERO_D
        positional = positional_args(call)
        if self.model.is_call_to(call, {"torch.sum", "torch.mean"}):
            return ZERO_D if len(call.args) == 1 and len(positional) == 1 else None
        method = method_name(call)
        if method is None or self._is_module_function(call):
            return None
        if method in NUMBER_METHODS or (method == "size" and len(positional) == 1):
            return NUMBER
        if method in ZERO_D_METHODS and not call.args:
            return ZERO_D
        if method in SAME_VALUE_METHODS:
            return self._tensor_level(call.func.value)
        return None

    def _is_module_function(self, call: cst.Call) -> bool:
        """`torch.sum(...)`, `np.mean(...)`: a function of an imported module, not a method."""
        root = call.func
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and any(b.kind == "import" for b in self.model.bindings_of(root.value, root))

    def _name_level(self, name: cst.Name) -> Optional[str]:
        bindings = self.model.bindings_of(name.value, name)
        if not bindings or name.value in self._global_names:
            return None
        key = (id(bindings[0].scope), name.value)
        if key in self._in_progress:
            return _CYCLE
        if key not in self._levels:
            self._in_progress.add(key)
            try:
                level = _combine([self._binding_level(b) for b in bindings])
                if level is None and self._backpropagated_once(name.value, bindings):
                    level = ONE
            finally:
                self._in_progress.discard(key)
            self._levels[key] = level
        return self._levels[key]

    def _binding_level(self, binding: Binding) -> Optional[str]:
        if binding.kind == "augassign":
            statement = binding.statement
            return self.level(statement.value) if isinstance(statement.operator, AUGMENTED_ARITHMETIC) else None
        value = assigned(binding)
        return self.level(value) if value is not None else None

    def _backpropagated_once(self, name: str, bindings: list[Binding]) -> bool:
        """Assigned once, and `name.backward()` (without a gradient) runs on
        it: it holds one number, or the backward call raises."""
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].value is None:
            return False
        scope = bindings[0].scope
        for call in scope.calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute) and func.attr.value == "backward" and not call.args
                and isinstance(func.value, cst.Name) and func.value.value == name
            ):  # fmt: skip
                return True
        return False

    # losses ----------------------------------------------------------------------------

    def loss_prefix(self, call: cst.Call) -> Optional[int]:
        """For a torch loss function or loss class constructor: how many
        positional arguments leave its reduction alone; else None."""
        if not dotted_name(call.func):
            return None  # `nn.MSELoss()(out, y)` calls the loss, it does not make one
        for qualified in self.model.qualified_names(call.func):
            module, _, last = qualified.rpartition(".")
            if module == "torch.nn.functional" and last in FUNCTIONAL_LOSSES:
                return FUNCTIONAL_LOSSES[last]
            if v.is_loss_class(qualified) and last in LOSS_CLASSES:
                return LOSS_CLASSES[last]
        return None

    def reduces(self, call: cst.Call) -> bool:
        """A loss function or loss constructor called so that it reduces to one number."""
        prefix = self.loss_prefix(call)
        if prefix is None or has_star_args(call) or len(positional_args(call)) > prefix:
            return False
        reduction, reduce = keyword_arg(call, "reduction"), keyword_arg(call, "reduce")
        if reduce is not None:
            return _literal_flag(reduce.value) in (True, None) and (
                keyword_arg(call, "size_average") is None or _literal_flag(keyword_arg(call, "size_average").value) != "?"
            )
        if keyword_arg(call, "size_average") is not None:
            return _literal_flag(keyword_arg(call, "size_average").value) != "?"
        return reduction is None or (isinstance(reduction.value, cst.SimpleString) and reduction.value.evaluated_value in REDUCING)

    def is_reducing_loss_call(self, call: cst.Call) -> bool:
        """`F.nll_loss(out, y)`, `criterion(out, y)`, `nn.MSELoss()(out, y)`."""
        if self.loss_prefix(call) is not None:
            return self._is_functional(call) and self.reduces(call)
        return self._is_reducing_criterion(call.func, 0)

    def _is_functional(self, call: cst.Call) -> bool:
        return any(q.startswith("torch.nn.functional.") for q in self.model.qualified_names(call.func))

    def _is_reducing_criterion(self, value: Expression, depth: int) -> bool:
        if depth > 4:
            return False
        if isinstance(value, cst.Call):
            if method_name(value) in v.SELF_RETURNING_MODULE_METHODS and not self._is_module_function(value):
                return self._is_reducing_criterion(value.func.value, depth + 1)
            return self.loss_prefix(value) is not None and not self._is_functional(value) and self.reduces(value)
        if isinstance(value, cst.IfExp):
            return self._is_reducing_criterion(value.body, depth + 1) and self._is_reducing_criterion(value.orelse, depth + 1)
        if isinstance(value, cst.Name):
            bindings = self.model.bindings_of(value.value, value)
            return bool(bindings) and all(self._binding_is_reducing_criterion(b, depth) for b in bindings)
        if isinstance(value, cst.Attribute):
            entity = self.model.entity(value)
            return entity is not None and entity.kind == "criterion" and entity.value is not None and \
                self._is_reducing_criterion(entity.value, depth + 1)
        return False

    def _binding_is_reducing_criterion(self, binding: Binding, depth: int) -> bool:
        if binding.kind == "param":
            arguments = self._arguments(binding)
            return bool(arguments) and all(self._is_reducing_criterion(a, depth + 1) for a in arguments)
        value = assigned(binding)
        return binding.kind == "assign" and value is not None and self._is_reducing_criterion(value, depth + 1)

    def _arguments(self, parameter: Binding) -> Optional[list[Expression]]:
        """What the file's calls pass for a parameter (its default where a call
        passes nothing); None when a call cannot be read or there is none."""
        function = self.model.flow.functions.get(parameter.scope.node)
        sites = function.callers if function is not None else []
        if not sites:
            return None
        found = []
        for site in sites:
            argument = site.arguments.get(parameter.name, parameter.value)
            if argument is None or not site.complete:
                return None
            found.append(argument)
        return found

    # running totals of `.data` ------------------------------------------------------------

    def is_data_total(self, name: cst.Name) -> bool:
        bindings = self.model.bindings_of(name.value, name)
        return any(self._adds_data(b) for b in bindings)

    def _adds_data(self, binding: Binding) -> bool:
        value = binding.statement.value if binding.kind == "augassign" else _self_addition(binding)
        return value is not None and any(
            isinstance(n, cst.Attribute) and n.attr.value == "data" for n in walk(value)
        )

    def data_totals(self) -> Iterator[tuple[str, list[cst.CSTNode], list[cst.Name]]]:
        """(name, the statements adding to it, its other reads) for each
        variable that only ever gets number literals and `.data` values
        added to it."""
        for scope in self.model.scopes:
            for name, bindings in scope.bindings.items():
                if name in self._global_names or "." in name or not any(self._adds_data(b) for b in bindings):
                    continue
                stores = []
                for binding in bindings:
                    if self._adds_data(binding):
                        stores.append(binding.statement)
                    elif not (binding.kind == "assign" and is_number_literal(binding.value or cst.Name("x"))):
                        break
                else:
                    yield name, stores, self._reads(scope, name, stores)

    def data_atoms(self, statement: cst.CSTNode) -> list[Optional[cst.Attribute]]:
        """The `x.data` parts of what a store adds, each with x one number; a
        None in the list when another part may be a tensor."""
        value = statement.value
        if isinstance(statement, cst.Assign):
            value = _self_addition_value(statement)
        return list(self._atoms(value))

    def _atoms(self, value: Expression) -> Iterator[Optional[cst.Attribute]]:
        if isinstance(value, cst.Attribute) and value.attr.value == "data":
            yield value if self._tensor_level(value.value) is not None else None
        elif isinstance(value, cst.BinaryOperation) and isinstance(value.operator, ARITHMETIC):
            yield from self._atoms(value.left)
            yield from self._atoms(value.right)
        elif isinstance(value, cst.UnaryOperation):
            yield from self._atoms(value.expression)
        elif self.level(value) != NUMBER:
            yield None

    def _reads(self, scope: Scope, name: str, stores: list) -> list[cst.Name]:
        """Every read of the variable outside its own stores."""
        inside = {id(n) for store in stores for n in walk(store)}
        found = []
        for node in walk(scope.node):
            if (
                isinstance(node, cst.Name) and node.value == name and id(node) not in inside
                and self.model.index.home_of(name, self.model.scope_of(node)) is scope
                and not _is_binding_target(self.model, node)
            ):  # fmt: skip
                found.append(node)
        return found

    # no gradient ------------------------------------------------------------------------

    def is_detached(self, value: Expression, seen: frozenset = frozenset()) -> bool:
        """A value without a graph: a number, or made from `.data`, `.item()`,
        `.detach()` by methods whose arguments have no graph either
        (`output.data.max(1)[1]`, `pred.eq(target.data).sum()`)."""
        if self.level(value) == NUMBER or _is_plain_literal(value):
            return True
        if isinstance(value, cst.BinaryOperation):
            return self.is_detached(value.left, seen) and self.is_detached(value.right, seen)
        if isinstance(value, cst.Attribute):
            return value.attr.value == "data" or self.is_detached(value.value, seen)
        if isinstance(value, cst.Subscript):
            return self.is_detached(value.value, seen)
        if isinstance(value, cst.Call):
            method = method_name(value)
            if method is None or self._is_module_function(value):
                return False
            arguments_detached = all(self.is_detached(arg.value, seen) for arg in value.args)
            return arguments_detached and (method in DETACHING_METHODS or self.is_detached(value.func.value, seen))
        if isinstance(value, cst.Name) and value.value not in seen and value.value not in self._global_names:
            bindings = self.model.bindings_of(value.value, value)
            return bool(bindings) and all(
                b.kind in ("assign", "augassign")
                and (b.statement.value if b.kind == "augassign" else assigned(b)) is not None
                and self.is_detached(b.statement.value if b.kind == "augassign" else assigned(b), seen | {value.value})
                for b in bindings
            )
        return False

    def is_fresh(self, value: Expression) -> bool:
        """A new tensor object, without a gradient, that nothing else holds."""
        if isinstance(value, cst.Attribute):
            return value.attr.value == "data"
        if isinstance(value, cst.BinaryOperation):
            return self.is_grad_free(value.left) and self.is_grad_free(value.right)  # arithmetic makes a new tensor
        if isinstance(value, cst.Call):
            if self._is_factory(value.func):
                flag = keyword_arg(value, "requires_grad")
                return flag is None or _is_false(flag.value)
            method = method_name(value)
            if method is None or method == "requires_grad_" or self._is_module_function(value):
                return False
            # a method of a tensor nobody holds gives that tensor or a new one
            return method == "detach" or self.is_fresh(value.func.value) or (
                method in NEW_TENSOR_METHODS and self.is_grad_free(value.func.value)
            )
        return False

    def _is_factory(self, func: Expression) -> bool:
        """`torch.zeros`, `torch.FloatTensor`, or a name for them:
        `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`."""
        if self.model.is_qualified(func, TENSOR_FACTORIES):
            return True
        if isinstance(func, cst.IfExp):
            return self._is_factory(func.body) and self._is_factory(func.orelse)
        if not isinstance(func, cst.Name):
            return False
        bindings = self.model.bindings_of(func.value, func)
        return bool(bindings) and all(
            b.kind == "assign" and b.value is not None and not isinstance(b.value, cst.Name) and self._is_factory(b.value)
            for b in bindings
        )

    def is_grad_free(self, value: Expression) -> bool:
        """Provably carries no gradient (nor does anything inside it)."""
        if self.is_fresh(value) or is_number_literal(value) and not isinstance(value, cst.Name):
            return True
        if isinstance(value, cst.Call):
            method = method_name(value)
            if self.model.is_call_to(value, v.VARIABLE):
                flag = keyword_arg(value, "requires_grad")
                return flag is None or _is_false(flag.value)
            return (
                method is not None and method != "requires_grad_" and not self._is_module_function(value)
                and self.is_grad_free(value.func.value)
            )  # fmt: skip
        if isinstance(value, cst.Subscript):
            return self.is_grad_free(value.value)
        if isinstance(value, cst.BinaryOperation):
            return self.is_grad_free(value.left) and self.is_grad_free(value.right)
        if isinstance(value, cst.IfExp):
            return self.is_grad_free(value.body) and self.is_grad_free(value.orelse)
        if isinstance(value, cst.Name):
            return self._name_grad_free(value)
        return False

    def _name_grad_free(self, name: cst.Name) -> bool:
        bindings = self.model.bindings_of(name.value, name)
        if not bindings or name.value in self._global_names:
            return False
        key = (id(bindings[0].scope), name.value)
        if key not in self._grad_free:
            self._grad_free[key] = True  # a binding that reads the name itself adds nothing new
            self._grad_free[key] = all(self._binding_grad_free(b) for b in bindings)
        return self._grad_free[key]

    def _binding_grad_free(self, binding: Binding) -> bool:
        if binding.kind == "for" and isinstance(binding.statement, cst.For):
            return self._iterates_a_loader(binding.statement)
        if binding.kind == "param":
            arguments = self._arguments(binding)
            return bool(arguments) and all(self.is_grad_free(argument) for argument in arguments)
        if binding.kind != "assign":
            return False
        value = assigned(binding)
        if value is None and isinstance(binding.statement, cst.Assign):
            value = binding.statement.value  # `real, _ = batch`: the parts of a value without gradients
        return value is not None and self.is_grad_free(value)

    def _iterates_a_loader(self, loop: cst.For) -> bool:
        first = loop.body.body[0] if loop.body.body else None
        loops = self.model.loops_around(first) if first is not None else []
        return bool(loops) and loops[0].node is loop and loops[0].loader is not None


# -- no_grad regions for volatile=True ------------------------------------------------------


class _Regions:
    """Where the values made with `volatile=True` are used: the statements
    that go under `with torch.no_grad():`."""

    def __init__(self, codemod: Modernize) -> None:
        self.codemod = codemod
        self.model = codemod.model
        self.starts: dict[cst.CSTNode, list] = {}  # block -> [(first statement that uses the values, call)]

    def add(self, call: cst.Call, flag: Expression) -> None:
        codemod = self.codemod
        if not _is_true(flag):
            codemod.report(call, "AM222", f"volatile={code_of(flag)} has had no effect since PyTorch 0.4 and was dropped: "
                           f"run the code that uses this value under `with torch.set_grad_enabled(not {_operand(flag)}):`")
            return
        if self.model.in_evaluation(call):
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4; this code already runs under no_grad")
            return
        statement = self._statement(call)
        block = self.model.parent(statement) if statement is not None else None
        if statement is None or not self._is_body(block):
            self._refuse(call, "it is not made in the loop body or function body that uses it")
            return
        names = _assigned_names(self.model, call)
        body = list(block.body)
        after = body[body.index(statement) + (1 if names else 0):]
        first = next((s for s in after if not names or _reads_any(s, names)), None)
        if first is None:
            codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4, and the value is not used after: dropped")
            return
        self.starts.setdefault(block, []).append((first, call))

    def plan(self) -> None:
        for block, starts in self.starts.items():
            body = list(block.body)
            first = min((s for s, _ in starts), key=body.index)
            calls = [call for _, call in starts]
            region = body[body.index(first):]
            why = self._why_not(region, block)
            if why is not None:
                for call in calls:
                    self._refuse(call, why)
                continue
            if self.codemod._torch is None or not self.codemod.torch_reads_torch(first):
                for call in calls:
                    self._refuse(call, "the name torch means something else here")
                continue
            target = self._whole_loop(block, body[: body.index(first)])
            if target is not None and self._why_not([target], self.model.parent(target)) is None:
                holder, span = self.model.parent(target), (target, target)
            else:
                holder, span = block, (first, region[-1])
            fixed = [
                self.codemod.fix(call, "AM222", "volatile=True has had no effect since PyTorch 0.4 (every batch "
                                 "built a graph): the code using this value runs under torch.no_grad()")
                for call in calls
            ]
            if all(fixed):
                self.codemod._wraps.setdefault(holder, []).append(span)
                self.codemod._need_torch(first)

    def _refuse(self, call: cst.Call, why: str) -> None:
        self.codemod.report(call, "AM222", f"volatile=True has had no effect since PyTorch 0.4, and was dropped; "
                            f"no torch.no_grad() region was added because {why}: put the code that uses "
                            "this value under `with torch.no_grad():` by hand")

    def _statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        return self.codemod._statement_line(call)

    def _is_body(self, block: Optional[cst.CSTNode]) -> bool:
        holder = self.model.parent(block) if isinstance(block, cst.IndentedBlock) else None
        return isinstance(holder, (cst.For, cst.While, cst.FunctionDef)) and holder.body is block

    def _whole_loop(self, block: cst.IndentedBlock, before: list) -> Optional[cst.For]:
        """The loop itself, when everything its body runs before the region only moves data."""
        loop = self.model.parent(block)
        holder = self.model.parent(loop)
        if not isinstance(loop, cst.For) or loop.orelse is not None or not isinstance(holder, (cst.IndentedBlock, cst.Module)):
            return None
        doomed = self.codemod._doomed
        if all(s in doomed or self._only_moves_data(s) for s in before):
            return loop
        return None

    def _only_moves_data(self, statement: cst.CSTNode) -> bool:
        for node in walk(statement):
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(node, cst.Call) and not (
                self.model.is_call_to(node, v.VARIABLE | {"torch.cuda.is_available"})
                or (method_name(node) in MOVING_METHODS and not self.codemod.values._is_module_function(node))
            ):
                return False
        return True

    def _why_not(self, region: list, block: cst.CSTNode) -> Optional[str]:
        """Why these statements cannot go under no_grad, or None."""
        for statement in region:
            for node in walk(statement):
                if isinstance(node, cst.Call) and (
                    method_name(node) in TRAINING_METHODS or self.model.is_call_to(node, AUTOGRAD_CALLS)
                ):
                    return f"`{_first_line(node)}` in that region needs gradients"
                if isinstance(node, cst.Attribute) and node.attr.value in AUTOGRAD_ATTRIBUTES:
                    return f"`{_first_line(node)}` in that region reads gradient state"
        scope = self.model.scope_of(region[0])
        if not self._backpropagates(scope):
            return None
        for name in sorted(_bound_names(region)):
            if self._only_numbers_bound(region, name):
                continue  # `test_loss += loss.data[0]`: nothing with a graph leaves the region
            for read in self._reads_outside(scope, name, region):
                if not self._assigned_before(read, name, scope, region):
                    return f"{name}, made there, is read later in code that also trains (line {self.model.line(read)})"
        return None

    def _only_numbers_bound(self, region: list, name: str) -> bool:
        """Every assignment of `name` in the region gives a value without a graph."""
        values = []
        for statement in region:
            for node in walk(statement):
                if isinstance(node, (cst.Assign, cst.AugAssign)):
                    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                    if any(name in _plain_target_names(t) for t in targets):
                        values.append(node.value if len(targets) == 1 and isinstance(targets[0], cst.Name) else None)
                elif isinstance(node, (cst.For, cst.CompFor, cst.WithItem, cst.AnnAssign, cst.NamedExpr)):
                    bound = node.asname.name if isinstance(node, cst.WithItem) and node.asname else getattr(node, "target", None)
                    if bound is not None and name in _plain_target_names(bound):
                        values.append(None)
        return all(value is not None and self.codemod.values.is_detached(value) for value in values)

    def _backpropagates(self, scope: Scope) -> bool:
        return any(
            method_name(c) in ("backward", "manual_backward") or self.model.is_call_to(c, AUTOGRAD_CALLS)
            for c in walk(scope.node)
            if isinstance(c, cst.Call)
        )

    def _reads_outside(self, scope: Scope, name: str, region: list) -> Iterator[cst.Name]:
        inside = {id(n) for statement in region for n in walk(statement)}
        for node in walk(scope.node):
            if (
                isinstance(node, cst.Name) and node.value == name and id(node) not in inside
                and self.model.index.home_of(name, self.model.scope_of(node)) is scope
                and not _is_binding_target(self.model, node)
            ):  # fmt: skip
                yield node

    def _assigned_before(self, read: cst.Name, name: str, scope: Scope, region: list) -> bool:
        """Between any run of the region and `read`, a plain assignment of
        `name` runs: one before the read in a block that does not hold the
        region, or a `for` around the read, not around the region, binds it."""
        around_region = set(self.model.ancestors(region[0]))
        child: cst.CSTNode = read
        for ancestor in self.model.ancestors(read):
            if ancestor is scope.node or ancestor in around_region:
                return False
            if isinstance(ancestor, cst.For) and child is ancestor.body and name in _target_names(ancestor.target):
                return True
            body = getattr(ancestor, "body", None)
            if isinstance(body, (list, tuple)) and child in body:
                for statement in body[: body.index(child)]:
                    if isinstance(statement, cst.SimpleStatementLine) and any(
                        isinstance(small, cst.Assign) and any(name in _target_names(t.target) for t in small.targets)
                        for small in statement.body
                    ):
                        return True
            child = ancestor
        return False


# -- small helpers ------------------------------------------------------------------------


def assigned(binding: Binding) -> Optional[Expression]:
    """The value a binding gives: `x = value`, or the matching part of
    `a, b = value_a, value_b`."""
    if binding.value is not None:
        return binding.value
    statement = binding.statement
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return None
    for target, value in _pairs(statement.targets[0].target, statement.value):
        if target is binding.node:
            return value
    return None


def _pairs(target: cst.CSTNode, value: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, Expression]]:
    """(target, value) for each part of `a, b = x, y`, or the one pair."""
    if isinstance(target, (cst.Tuple, cst.List)):
        if not isinstance(value, (cst.Tuple, cst.List)) or len(target.elements) != len(value.elements):
            return
        if any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
            return
        for t, e in zip(target.elements, value.elements):
            yield from _pairs(t.value, e.value)
    else:
        yield target, value


def _assigned_names(model: ScriptModel, value: Expression) -> list[str]:
    """The names that `value` is assigned to, where it is a whole value or a
    part matched by unpacking: `data` in `data, y = Variable(data), y`."""
    node: cst.CSTNode = value
    parent = model.parent(node)
    while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
        node, parent = parent, model.parent(parent)
    if not isinstance(parent, cst.Assign):
        return []
    return [
        name.value
        for target in parent.targets
        for name, part in _pairs(target.target, parent.value)
        if part is value and isinstance(name, cst.Name)
    ]


def _self_addition(binding: Binding) -> Optional[Expression]:
    """`total = total + x`: the added value `x`; else None."""
    statement = binding.statement
    if binding.kind != "assign" or not isinstance(statement, cst.Assign):
        return None
    return _self_addition_value(statement, binding.name)


def _self_addition_value(statement: cst.Assign, name: Optional[str] = None) -> Optional[Expression]:
    target = statement.targets[0].target if len(statement.targets) == 1 else None
    if not isinstance(target, cst.Name) or (name is not None and target.value != name):
        return None
    value = statement.value
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
        if isinstance(value.left, cst.Name) and value.left.value == target.value:
            return value.right
        if isinstance(value.right, cst.Name) and value.right.value == target.value:
            return value.left
    return None


def _combine(levels: Iterable[Optional[str]]) -> Optional[str]:
    """The level of a name from those of the values it is assigned."""
    levels = [level for level in levels if level != _CYCLE]
    if not levels or None in levels:
        return None
    tensors = [level for level in levels if level != NUMBER]
    if not tensors:
        return NUMBER
    return ONE if ONE in tensors else ZERO_D


def _arithmetic(left: Optional[str], right: Optional[str]) -> Optional[str]:
    if left is None or right is None:
        return None
    return _combine([left, right])


def _is_index_zero(node: Optional[cst.CSTNode]) -> bool:
    """`x[0]`."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return False
    index = node.slice[0].slice
    return isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.evaluated_value == 0


def _literal_flag(value: Expression):
    """True / False / None for those literals, else "?"."""
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value.value]
    return "?"


def _is_true(value: Expression) -> bool:
    return _literal_flag(value) is True


def _is_false(value: Expression) -> bool:
    return _literal_flag(value) is False


def _legacy_reduction(size_average, reduce) -> str:
    """torch.nn._reduction.legacy_get_string: None counts as True."""
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


def _with_reduction(call: cst.Call, reduction: str) -> cst.Call:
    """The call without size_average / reduce / reduction, then with
    `reduction="..."` where the first of them was (none for "mean")."""
    dropped = {*LEGACY_REDUCTION, "reduction"}
    args, placed = [], False
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in dropped:
            args.append(arg)
        elif not placed and reduction != "mean":
            args.append(arg.with_changes(keyword=cst.Name("reduction"), value=cst.SimpleString(f'"{reduction}"')))
            placed = True
    if args and args[-1] is not call.args[-1]:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
        if not isinstance(call.args[-1].comma, cst.Comma):
            args[-1] = args[-1].with_changes(whitespace_after_arg=call.args[-1].whitespace_after_arg)
    return call.with_changes(args=args)


def _method_call(receiver: Expression, method: str, like: Optional[Expression] = None, args=()) -> cst.Call:
    """`receiver.method(args)`, parenthesising a receiver that needs it, with
    the parentheses of the node it replaces."""
    if not _is_atomic(receiver):
        receiver = receiver.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    call = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(method)), args=list(args))
    if like is not None:
        call = call.with_changes(lpar=like.lpar, rpar=like.rpar)
    return call


def _is_atomic(value: Expression) -> bool:
    return bool(value.lpar) or isinstance(
        value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.Integer, cst.Float,
                cst.List, cst.Tuple, cst.Dict, cst.Set)
    )  # fmt: skip


_LOOSE_CONTEXTS = (cst.Arg, cst.Element, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return, cst.Expr, cst.DictElement)


def _in_context(value: Expression, parent: Optional[cst.CSTNode], replaced: cst.Call) -> Expression:
    """`value` where `replaced` was: in parentheses when it would bind less
    tightly than the call it replaces."""
    if replaced.lpar:
        return value.with_changes(lpar=replaced.lpar, rpar=replaced.rpar)
    if _is_atomic(value) or isinstance(parent, _LOOSE_CONTEXTS):
        return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _is_plain_literal(value: Expression) -> bool:
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(value, cst.Name) and value.value in ("True", "False", "None")
    )


def _operand(value: Expression) -> str:
    return code_of(value) if _is_atomic(value) else f"({code_of(value)})"


def _root_name(value: Expression) -> Optional[str]:
    while isinstance(value, (cst.Attribute, cst.Call, cst.Subscript)):
        value = value.func if isinstance(value, cst.Call) else value.value
    return value.value if isinstance(value, cst.Name) else None


def _target_names(target: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(target) if isinstance(n, cst.Name)} if not isinstance(target, cst.Attribute) else set()


def _bound_names(statements: list) -> set[str]:
    """The plain names the statements assign (not attributes or items)."""
    names: set[str] = set()
    for statement in statements:
        for node in walk(statement, into_definitions=False):
            if isinstance(node, cst.AssignTarget):
                names |= _plain_target_names(node.target)
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                names |= _plain_target_names(node.target)
            elif isinstance(node, (cst.For, cst.CompFor)):
                names |= _plain_target_names(node.target)
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                names |= _plain_target_names(node.asname.name)
    return names


def _plain_target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_plain_target_names(e.value) for e in target.elements)) if target.elements else set()
    if isinstance(target, cst.StarredElement):
        return _plain_target_names(target.value)
    return set()


def _reads_any(statement: cst.CSTNode, names: list[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in walk(statement))


def _is_binding_target(model: ScriptModel, name: cst.Name) -> bool:
    """`name` is (part of) what an assignment, `for` or `with` binds, not a read."""
    child: cst.CSTNode = name
    for ancestor in model.ancestors(name):
        if isinstance(ancestor, cst.AssignTarget):
            return True
        if isinstance(ancestor, (cst.For, cst.CompFor)) and child is ancestor.target:
            return True
        if isinstance(ancestor, (cst.AnnAssign,)) and child is ancestor.target:
            return True
        if isinstance(ancestor, cst.AsName):
            return True
        if not isinstance(ancestor, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return False
        child = ancestor
    return False


def _in_import(model: ScriptModel, node: cst.CSTNode) -> bool:
    return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in model.ancestors(node))


def _type_check(model: ScriptModel, reference: cst.CSTNode):
    """How a bare reference to Variable is used: ("isinstance", the
    isinstance call, None), ("is"/"is-not", the comparison, the subject of
    `type(subject)`), or None for anything else."""
    parent = model.parent(reference)
    holder = model.parent(parent)
    if isinstance(parent, cst.Arg) and model.is_call_to(holder, {"builtins.isinstance"}):
        args = positional_args(holder)
        if len(args) == 2 and args[1] is parent:
            return "isinstance", holder, None
        return None
    if isinstance(parent, cst.Element) and isinstance(holder, cst.Tuple):
        arg, call = model.parent(holder), model.parent(model.parent(holder))
        if isinstance(arg, cst.Arg) and model.is_call_to(call, {"builtins.isinstance"}):
            args = positional_args(call)
            if len(args) == 2 and args[1] is arg:
                return "isinstance", call, None
        return None
    comparison = holder if isinstance(parent, cst.ComparisonTarget) else parent
    if not isinstance(comparison, cst.Comparison) or len(comparison.comparisons) != 1:
        return None
    operator = comparison.comparisons[0].operator
    other = comparison.left if comparison.comparisons[0].comparator is reference else comparison.comparisons[0].comparator
    if not (
        model.is_call_to(other, {"builtins.type"}) and len(other.args) == 1 and other.args[0].keyword is None
        and not other.args[0].star
    ):  # fmt: skip
        return None
    if isinstance(operator, (cst.Equal, cst.Is)):
        return "is", comparison, other.args[0].value
    if isinstance(operator, (cst.NotEqual, cst.IsNot)):
        return "is-not", comparison, other.args[0].value
    return None


def _first_line(node: cst.CSTNode) -> str:
    text = code_of(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."

