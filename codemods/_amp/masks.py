"""Fill constants that float16 cannot hold. Attention code masks scores
with a large finite number (`scores.masked_fill(mask == 0, -1e9)`): under
float16 autocast the scores are float16, whose largest finite value is
65504, and torch refuses the fill ("value cannot be converted to type
at::Half without overflow") at the first step. bfloat16 and float32 hold it,
so the script fails only where autocast picks float16 (GPUs before Ampere).

The codemod writes the constant by the scores' own dtype, as Hugging Face's
models do: `torch.finfo(scores.dtype).min` (`.max` for a positive fill), the
most negative number that dtype holds. After a softmax both mask alike: the
masked entries' weights are exactly 0 in every dtype, and a row masked whole
stays uniform. Rewritten where amp adds autocast to the file, or in the
code of the file's `nn.Module` classes (a model module that a training
script reaches): their methods and the functions of the file they call; a
fill of a value it cannot name twice (a call's result) is a finding.
"""

from __future__ import annotations

import math
from typing import Optional

import libcst as cst

from .._base import code_of, dotted_name, walk
from ..script import vocabulary as v

FLOAT16_MAX = 65504.0
FILLS = frozenset({"masked_fill", "masked_fill_"})


class MaskConstants:
    """Mixed into the codemod."""

    def plan_masks(self) -> None:
        in_models = {id(node) for code in self._model_code() for node in walk(code)}
        for call in (n for n in walk(self.tree) if isinstance(n, cst.Call)):
            if not (self.autocast_spans or id(call) in in_models):
                continue
            constant = _overflowing_fill(call)
            if constant is None or self.is_suppressed(call, "AM419"):
                continue
            receiver = call.func.value
            if not dotted_name(receiver):
                self.report(call, "AM419", f"`{code_of(constant)}` fills a tensor that float16 cannot hold it in: under float16 autocast `{call.func.attr.value}` raises at the first step; bind the tensor to a name and fill it with `torch.finfo(name.dtype).min` (`.max` for a positive fill)")
                continue
            bound = "min" if _value(constant) < 0 else "max"
            self.need_torch()
            text = f"{self.torch}.finfo({code_of(receiver)}.dtype).{bound}"
            self.edits.replace[constant] = lambda updated, text=text: cst.parse_expression(text)
            self.fix(call, "AM419", f"`{code_of(constant)}` -> `{text}`: float16 cannot hold the constant (under float16 autocast the fill raises); the dtype's own extreme masks alike after a softmax")

    def _model_code(self) -> list:
        """The file's classes that derive from a torch.nn module class, and
        the functions of the file their methods call (an `attention(q, k, v,
        mask)` helper), and those these call."""
        found = [
            klass for klass in walk(self.tree) if isinstance(klass, cst.ClassDef)
            and any(v.is_module_class(name) for base in klass.bases for name in self.qualified_names(base.value))
        ]
        pending = list(found)
        while pending:
            for call in (n for n in walk(pending.pop()) if isinstance(n, cst.Call)):
                callee = self.script.flow.callee(call, self.script.scope_of(call))
                if callee is not None and callee[0].node not in found:
                    found.append(callee[0].node)
                    pending.append(callee[0].node)
        return found


def _overflowing_fill(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The fill value of `x.masked_fill(mask, -1e9)` when it is a number float16 cannot hold."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in FILLS):
        return None
    value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "value"), None)
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if value is None and len(positional) == 2:
        value = positional[1]
    number = _value(value) if value is not None else None
    return value if number is not None and math.isfinite(number) and abs(number) > FLOAT16_MAX else None


def _value(node: cst.BaseExpression) -> Optional[float]:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _value(node.expression)
        return -inner if inner is not None else None
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    return None


__all__ = ["MaskConstants"]
