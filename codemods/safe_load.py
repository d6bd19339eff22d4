"""safe-load: `torch.load(..., weights_only=True)` where what is loaded is a state dict.

What it does
    Adds `weights_only=True` to a `torch.load(...)` whose result is only
    given to `.load_state_dict(...)`: directly
    (`model.load_state_dict(torch.load(path))`), through string keys
    (`torch.load(path)["model"]`), or through a name whose every read is
    such a use (`checkpoint = torch.load(path)` followed by
    `model.load_state_dict(checkpoint["model"])`,
    `optimizer.load_state_dict(checkpoint["optimizer"])`, `"scaler" in
    checkpoint`).

Why
    Without `weights_only=True`, `torch.load` unpickles: a checkpoint
    downloaded or shared can run any code on the machine that loads it.
    With it, only tensors, containers and numbers are rebuilt, which is all
    a state dict holds. torch 2.6 and later make it the default; saying it
    keeps the script safe on older torch and says what the file expects.

Example
    Before::

        checkpoint = torch.load(args.resume, map_location=device)
        model.load_state_dict(checkpoint["model"])

    After::

        checkpoint = torch.load(args.resume, map_location=device, weights_only=True)
        model.load_state_dict(checkpoint["model"])

Left alone
    A load whose result is used otherwise (`checkpoint["epoch"]`, a whole
    pickled model, `args` kept in the checkpoint): AM751 says to check
    what the file holds, then pass `weights_only=True` (allowing extra
    classes with `torch.serialization.add_safe_globals`). A load given
    `weights_only=` already (`False` gets AM751), a `pickle_module=`, or
    arguments that cannot be seen (`**kwargs`, AM751). AM750 is the fix.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._base import Codemod, append_keyword_args, has_star_args, keyword_arg
from .script import vocabulary as v
from .script.uses import uses_of


class SafeLoad(Codemod):
    word = "safe-load"
    needs_torch = (1, 13)  # torch.load(weights_only=)
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "torch.load(..., weights_only=True) where what is loaded is a state dict"
    codes = {
        "AM750": "torch.load of a state dict without weights_only=True",
        "AM751": "torch.load that may unpickle more than tensors: check the file, then pass weights_only=True",
    }
    triggers = ("load",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._safe: set[cst.Call] = set()

    def visit_Module(self, node: cst.Module) -> None:
        for call in uses_of(self.script).calls:
            if self.is_call_to(call, v.TORCH_LOAD):
                self._judge(call)

    def _judge(self, call: cst.Call) -> None:
        given = keyword_arg(call, "weights_only")
        if given is not None:
            if isinstance(given.value, cst.Name) and given.value.value == "False":
                self.report(call, "AM751", "`weights_only=False` unpickles whatever the file holds, code included: load only files you trust")
            return
        if has_star_args(call) or keyword_arg(call, "pickle_module") is not None:
            self.report(call, "AM751", "the arguments of this torch.load cannot all be seen (or it unpickles with its own module): pass `weights_only=True` by hand if it loads a state dict")
            return
        if not self._loads_state_dict(call):
            self.report(
                call, "AM751",
                "what this torch.load returns is used as more than a state dict: if the file holds only tensors, "
                "containers and numbers, pass `weights_only=True` (allow other classes with torch.serialization.add_safe_globals)",
            )
            return
        if self.fix(call, "AM750", "`weights_only=True`: the state dict is rebuilt without unpickling code"):
            self._safe.add(call)

    # -- what the loaded value feeds ---------------------------------------------------------

    def _loads_state_dict(self, call: cst.Call) -> bool:
        if self._feeds_load_state_dict(call):
            return True
        name = self._assigned_name(call)
        if name is None:
            return False
        scope = self.script.scope_of(call)
        reads = uses_of(self.script).reads(name.value, scope)
        return bool(reads) and all(self._feeds_load_state_dict(read) or self._membership_test(read) for read in reads)

    def _feeds_load_state_dict(self, value: cst.CSTNode) -> bool:
        """`x.load_state_dict(value)`, or of `value["key"]...`."""
        node = value
        parent = self.parent(node)
        while isinstance(parent, cst.Subscript) and parent.value is node and _string_key(parent):
            node, parent = parent, self.parent(parent)
        if not isinstance(parent, cst.Arg) or parent.value is not node or parent.star:
            return False
        call = self.parent(parent)
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "load_state_dict"):
            return False
        positional = [a for a in call.args if a.keyword is None]
        return (positional[:1] == [parent]) or (parent.keyword is not None and parent.keyword.value == "state_dict")

    def _membership_test(self, read: cst.Name) -> bool:
        """`"optimizer" in checkpoint`: reads only the keys."""
        comparison = self.parent(self.parent(read))
        target = self.parent(read)
        return (
            isinstance(target, cst.ComparisonTarget)
            and target.comparator is read
            and isinstance(target.operator, (cst.In, cst.NotIn))
            and isinstance(comparison, cst.Comparison)
        )

    def _assigned_name(self, call: cst.Call) -> Optional[cst.Name]:
        """`name` of `name = torch.load(...)`."""
        assign = self.parent(call)
        if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
            target = assign.targets[0].target
            return target if isinstance(target, cst.Name) else None
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self._safe:
            return updated_node
        return append_keyword_args(updated_node, [("weights_only", cst.Name("True"))])


def _string_key(subscript: cst.Subscript) -> bool:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return False
    key = subscript.slice[0].slice.value
    return isinstance(key, (cst.SimpleString, cst.ConcatenatedString))


__all__ = ["SafeLoad"]
