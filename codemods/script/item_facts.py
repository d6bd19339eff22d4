"""What the `item` codemod reads from a script beyond the shared model: the
calls, attribute chains and assignment-like statements it follows losses
through, and the reads of each variable.

`item_facts(model)` gathers them once per model from the nodes the model
already ordered (no walk of the whole tree).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .model import ScriptModel
from .scopes import BUILTINS, Scope
from .uses import uses_of


def item_facts(model: ScriptModel) -> "ItemFacts":
    return model.derived(ItemFacts)


@dataclasses.dataclass(eq=False)
class ItemFacts:
    """The nodes in source order: every call, every attribute, and every
    `target = value` (each target of `a = b = v`, Subscript and tuple targets
    included), `target += value`, `target: T = value` and `with value as target`,
    as (target, value, statement)."""

    model: ScriptModel
    calls: list = dataclasses.field(default_factory=list)
    attributes: list = dataclasses.field(default_factory=list)
    bindings: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for node in self.model.index.order:
            if isinstance(node, cst.Call):
                self.calls.append(node)
            elif isinstance(node, cst.Attribute):
                self.attributes.append(node)
            elif isinstance(node, cst.Assign):
                self.bindings.extend((target.target, node.value, node) for target in node.targets)
            elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and node.value is not None:
                self.bindings.append((node.target, node.value, node))
            elif isinstance(node, cst.With):
                self.bindings.extend(
                    (item.asname.name, item.item, item) for item in node.items if item.asname is not None
                )

    def home(self, name: cst.Name) -> Scope:
        """The scope whose variable `name` is (where it is used when no scope binds it)."""
        index = self.model.index
        scope = index.scope_of(name)
        return index.home_of(name.value, scope) or scope

    def reads(self, name: str, home: Scope) -> list[cst.Name]:
        """The Names that read the variable `name` of `home`, in source order."""
        return uses_of(self.model).reads(name, home)

    def is_module_or_builtin(self, receiver: cst.BaseExpression) -> bool:
        """`torch`, `F`, `np.linalg`, `math`: a name chain rooted at an import
        or an unbound builtin, not a value the script computed."""
        root: Optional[cst.BaseExpression] = receiver
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name):
            return False
        bindings = self.model.bindings_of(root.value, root)
        if not bindings:
            return root.value in BUILTINS
        return any(b.kind == "import" for b in bindings)


__all__ = ["ItemFacts", "item_facts"]
