"""`size_average=` / `reduce=` of a loss become `reduction=` (AM224), and
which calls are torch losses that reduce to one number."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import dotted_name, has_star_args, keyword_arg
from .._item.syntax import first_line, method_name, positional_args
from ..script import vocabulary as v
from ..script.scopes import Binding
from .syntax import Expression, assigned, literal_flag

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


class LossArgumentPlans:
    """The planning of AM224, a part of the `Modernize` codemod."""

    def _plan_legacy_reductions(self, calls: list[cst.Call]) -> None:
        for call in calls:
            if not any(keyword_arg(call, name) for name in v.LEGACY_REDUCTION) or self.values.loss_prefix(call) is None:
                continue
            given = {name: keyword_arg(call, name) for name in v.LEGACY_REDUCTION}
            values = {name: literal_flag(arg.value) if arg else None for name, arg in given.items()}
            if any(arg is not None and values[name] == "?" for name, arg in given.items()):
                self.report(call, "AM224", f"{first_line(call)}: size_average and reduce are deprecated; pass "
                            'reduction= instead: "none" when reduce is false, else "sum" when size_average is false, else "mean"')
                continue
            reduction = _legacy_reduction(values["size_average"], values["reduce"])
            written = f'reduction="{reduction}"' if reduction != "mean" else "no reduction argument (the default, mean)"
            if self.fix(call, "AM224", f"size_average / reduce are deprecated arguments: {written}"):
                self._replace[call] = ("reduction", reduction)


class Losses:
    """What `Values` knows about losses: torch's loss functions and classes,
    and whether a call or a criterion reduces to one number."""

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
            return literal_flag(reduce.value) in (True, None) and (
                keyword_arg(call, "size_average") is None or literal_flag(keyword_arg(call, "size_average").value) != "?"
            )
        if keyword_arg(call, "size_average") is not None:
            return literal_flag(keyword_arg(call, "size_average").value) != "?"
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


def _legacy_reduction(size_average, reduce) -> str:
    """torch.nn._reduction.legacy_get_string: None counts as True."""
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


def with_reduction(call: cst.Call, reduction: str) -> cst.Call:
    """The call without size_average / reduce / reduction, then with
    `reduction="..."` where the first of them was (none for "mean")."""
    dropped = {*v.LEGACY_REDUCTION, "reduction"}
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
