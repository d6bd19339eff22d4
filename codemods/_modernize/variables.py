"""`Variable(t)` becomes `t`, `t.detach()` or `t.detach().requires_grad_()`,
and `Variable` in type checks becomes `torch.Tensor` (AM221); the calls
with `volatile=` are handed to the no_grad regions (AM222)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, has_star_args, keyword_arg, walk
from .._item.syntax import first_line, positional_args
from ..script import ScriptModel
from ..script import vocabulary as v
from .syntax import Expression, assigned_names, in_import, is_false, is_true, root_name, target_value_pairs
from .volatile import Regions

# What the identity of a tensor object matters to: after `y = Variable(x)`
# became `y = x`, these on either name would reach the other.
IDENTITY_ATTRIBUTES = frozenset(
    {"requires_grad", "requires_grad_", "grad", "grad_fn", "retain_grad", "register_hook",
     "resize_", "resize_as_", "set_"}
)  # fmt: skip


class VariablePlans:
    """The planning of AM221 (and the start of AM222), a part of the `Modernize` codemod."""

    def _plan_variables(self, calls: list[cst.Call]) -> None:
        variable_calls = [c for c in calls if self.model.is_call_to(c, v.VARIABLE)]
        references = [
            n for n in self.model.index.nodes_of(cst.Name, cst.Attribute)
            if self.model.is_qualified(n, v.VARIABLE)
            and not isinstance(self.model.parent(n), cst.Attribute) and not in_import(self.model, n)
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
        regions = Regions(self)
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
            self.report(call, "AM221", f"{first_line(call)}: Variable is a deprecated alias that detaches its argument; "
                        "pass the tensor itself (x.detach() where it must not carry the graph, "
                        "x.detach().requires_grad_() for a new leaf)")
            return None
        tensor = positional[0].value
        requires_grad, volatile = keyword_arg(call, "requires_grad"), keyword_arg(call, "volatile")
        wants_grad = requires_grad is not None and not is_false(requires_grad.value)
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
        flag = requires_grad.value if wants_grad and not is_true(requires_grad.value) else None
        self._replace[call] = (kind, fresh, flag)
        return volatile.value if volatile is not None and not is_false(volatile.value) else None

    def _identity_matters(self, call: cst.Call, tensor: Expression) -> bool:
        """Would `y = x` instead of `y = x.detach()` be seen: a gradient flag
        set, or an in-place resize, on either name in the scope."""
        names = {root_name(tensor), *assigned_names(self.model, call)} - {None}
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
            pairs = list(target_value_pairs(assign.targets[0].target, assign.value)) if len(assign.targets) == 1 else []
            if pairs and all(self._assigns_itself(name, value) for name, value in pairs):
                self._doomed.add(line)

    def _assigns_itself(self, name: cst.CSTNode, value: Expression) -> bool:
        """`x = Variable(x)`, rewritten to `x = x`."""
        how = self._replace.get(value)
        if not (isinstance(how, tuple) and how[0] == "bare" and isinstance(name, cst.Name)):
            return False
        inner = positional_args(value)[0].value
        return isinstance(inner, cst.Name) and inner.value == name.value

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
                self.remove_import_of(binding.statement)


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
