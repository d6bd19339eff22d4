"""Where a size shapes a tensor: an argument of a shape method
(`x.view(batch_size, -1)`), of a torch function (`torch.zeros(batch_size, 1)`)
or of `range`, alone or in a tuple (`torch.zeros((batch_size, 1))`). Read by
the words that split a batch across processes (ddp, accelerate, fabric): a
global batch size there must become this process's share."""

from __future__ import annotations

import libcst as cst

# Tensor methods whose arguments are sizes.
SHAPE_METHODS = frozenset(
    {"view", "reshape", "expand", "repeat", "unflatten", "new_zeros", "new_ones", "new_empty", "new_full", "resize_"}
)


def is_shape_argument(codemod, node: cst.CSTNode, excluded: frozenset = frozenset()) -> bool:
    """`node` is a size given to a shape method, a torch function (not one of
    `excluded`, qualified names) or `range`; never an attribute's or a
    keyword's own name."""
    argument = codemod.parent(node)
    if isinstance(argument, cst.Attribute) and argument.attr is node:
        return False
    if isinstance(argument, cst.Element):
        sequence = codemod.parent(argument)
        argument = codemod.parent(sequence) if isinstance(sequence, (cst.Tuple, cst.List)) else None
    if not isinstance(argument, cst.Arg) or argument.keyword is node:
        return False
    call = codemod.parent(argument)
    if not isinstance(call, cst.Call) or (excluded and codemod.is_call_to(call, excluded)):
        return False
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in SHAPE_METHODS:
        return True
    return codemod.is_call_to(call, {"builtins.range"}) or any(n.startswith("torch.") for n in codemod.qualified_names(call.func))
