"""modernize: rewrite the PyTorch idioms of before 0.4 that fail or mislead today.

What it does
    - `x.data[0]` where `x` provably holds one number becomes `x.item()`
      (AM220): the result of a loss function (`F.nll_loss(...)`, a criterion
      made by `nn.CrossEntropyLoss()` and the like, without
      `reduction="none"`), of `.sum()` / `.mean()`, arithmetic on those, what
      a function or method of the file returns when every `return` gives one
      of those, a name assigned once on which `.backward()` runs, or a read
      that follows `name.backward()` with no assignment of the name between.
      `total[0]` on a running total of such `.data` values becomes
      `total.item()`.
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
      only moves data; only up to the last statement that reads a value made
      from it where the rest trains (a DQN's target values), and at module
      level (AM222). Values made there may be read later: made from the
      volatile value, they had no graph in PyTorch 0.3 and have none now.
      `x.volatile = False` lines, which cut that in 0.3, go.
    - `size_average=` / `reduce=` of a loss become `reduction=` by torch's
      own table (AM224): `reduce=False` -> `"none"`, else
      `size_average=False` -> `"sum"`, else the default `"mean"`.
    - `nn.init.xavier_uniform(w)` and the other initialisers without the
      trailing underscore become `nn.init.xavier_uniform_(w)`, the same
      function under its current name (AM225).
    - `loss.backward(retain_variables=True)` (and `torch.autograd.backward`'s)
      becomes `retain_graph=True`, the keyword's name since 0.4 (AM226).
    - `from apex import amp` (NVIDIA apex's amp, gone from current apex
      releases) is a finding naming `--to amp`, which moves it onto torch.amp
      (AM227); moving it changes the arithmetic's precision, which modernize
      never does. Not reported where `amp`, `accelerate` or `fabric` runs too.

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

        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()

Left alone
    `x.data[0]` on a tensor provably holding more (a model's output, a batch
    of a DataLoader, a slice, a layer's weight: `output.data[0]` is the first
    sample, valid indexing); where neither can be told, a finding says to
    write `.item()` if it holds one number; `total += loss.data`
    whose total is read otherwise than `total[0]` (a 0-dim tensor works
    today); `F.sigmoid` / `F.tanh` (deprecated, still work); `size_average`
    or `reduce` given by position; a `Variable(...)` with other arguments,
    and a `volatile=True` whose region would change what the script computes
    (it is made inside an `if`, the region backpropagates, a value made there
    without the volatile input keeps a graph that code which trains reads
    later, or a later backward runs through a value made from it, which
    PyTorch 0.3 refused): a finding says what to do by hand. A file
    with `.cuda(async=True)` does not parse on Python 3.7+ and is reported as
    a syntax error (write `non_blocking=True`).
"""

from __future__ import annotations

import libcst as cst

from ._base import code_of, remove_statements
from ._item.syntax import positional_args
from ._modernize.apex_amp import CODE as APEX_AMP_CODE, MIGRATING_WORDS, ApexAmpPlans
from ._modernize.backward_args import BackwardArgumentPlans
from ._modernize.init_names import InitNamePlans
from ._modernize.loss_arguments import LossArgumentPlans, with_reduction
from ._modernize.one_number import DataIndexPlans
from ._modernize.planning import Planning
from ._modernize.syntax import Expression, in_context, method_call
from ._modernize.values import Values
from ._modernize.variables import VariablePlans


class Modernize(DataIndexPlans, VariablePlans, LossArgumentPlans, InitNamePlans, BackwardArgumentPlans, ApexAmpPlans, Planning):
    word = "modernize"
    needs_torch = (0, 4)  # the 0.4 spellings
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "rewrite pre-0.4 idioms that fail today: loss.data[0], Variable(...), volatile=True, size_average"
    codes = {
        "AM220": "x.data[0] on a one-number tensor (an IndexError since PyTorch 0.4): x.item()",
        "AM221": "torch.autograd.Variable: the tensor itself, .detach(), or torch.Tensor in type checks",
        "AM222": "Variable(..., volatile=True) (no effect since PyTorch 0.4): a torch.no_grad() region",
        "AM223": "a running total of loss.data read as total[0]: accumulate loss.item()",
        "AM224": "size_average= / reduce= of a loss: reduction=",
        "AM225": "nn.init initialiser without the trailing underscore: the underscore form",
        "AM226": "backward(retain_variables=...) (a TypeError since PyTorch 0.4): retain_graph=",
        APEX_AMP_CODE: "NVIDIA apex amp, gone from current apex: `--to amp` moves it onto torch.amp",
    }
    handed_to = {APEX_AMP_CODE: MIGRATING_WORDS}
    triggers = (
        "Variable", ".data", "volatile", "size_average", "reduce",
        "uniform", "normal", "constant", "eye", "dirac", "orthogonal", "sparse", "retain_variables", "apex",
    )  # fmt: skip
    # Names come from the script model: LibCST's own resolution is not needed.

    # -- planning, on the original tree -----------------------------------------------

    def visit_Module(self, node: cst.Module) -> bool:
        self.model = self.script
        self.values = Values(self.model)
        calls = self.model.index.nodes_of(cst.Call)
        self._plan_accumulators()
        self._plan_one_number_reads()
        self._plan_variables(calls)
        self._plan_legacy_reductions(calls)
        self._plan_initialisers()
        self._plan_backward_arguments()
        self._plan_apex_amp()
        return bool(self._replace or self._doomed or self._wraps)

    # -- rewriting ----------------------------------------------------------------------

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> Expression:
        how = self._replace.get(original_node)
        if how == "item":
            tensor = updated_node.value.value if isinstance(original_node.value, cst.Attribute) else updated_node.value
            return method_call(tensor, "item", updated_node)
        if how == "bare":
            return updated_node.value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Expression:
        how = self._replace.get(original_node)
        if how == "data-item":
            return method_call(updated_node.value, "item", updated_node)
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
            return with_reduction(updated_node, how[1])
        kind, fresh, flag = how
        tensor = positional_args(updated_node)[0].value
        if kind == "bare":
            return in_context(tensor, self.model.parent(original_node), updated_node)
        receiver = tensor if kind == "requires-grad" and fresh else method_call(tensor, "detach")
        if kind == "detach":
            return receiver.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        arguments = [cst.Arg(flag)] if flag is not None else []
        return method_call(receiver, "requires_grad_", updated_node, arguments)

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
