"""The names one model goes by: `net = Net()`, then `model = net` (or
`model = net.to(device)`, the same object) for the optimizer, while the loop
calls `net(xb)`. DistributedDataParallel synchronises gradients only through
calls of its wrapper, so the wrap belongs to the name the forward is called
through; the other names keep the bare module (the optimizer steps the same
parameters either way).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ..script import vocabulary as v
from .common import CannotMigrate, Var
from .queries import ScriptQueries

COMPILE = frozenset({"torch.compile"})


class ModelAliases(ScriptQueries):
    """Finds the other names of a trained model, and the one training calls."""

    def _moved_var(self, expression: cst.BaseExpression) -> Optional[Var]:
        """The variable of `net`, `net.to(device)`, `net.cuda().float()` or
        `torch.compile(net)` (which runs the same module's parameters)."""
        while isinstance(expression, cst.Call):
            if isinstance(expression.func, cst.Attribute) and expression.func.attr.value in v.SELF_RETURNING_MODULE_METHODS:
                expression = expression.func.value
            elif self.is_call_to(expression, COMPILE) and expression.args and expression.args[0].keyword is None:
                expression = expression.args[0].value
            else:
                break
        return self._var_of(expression)

    def _alias_source(self, var: Var) -> Optional[Var]:
        """`net` for a `model` whose every binding is `model = net[.to(...)]`
        (or rebinds `model` itself: `model = torch.compile(model)`)."""
        sources = {self._moved_var(b.value) for b in self._bindings_of_var(var) if b.value is not None} - {var}
        bindings = self._bindings_of_var(var)
        if len(sources) != 1 or len(bindings) != len([b for b in bindings if self._is_plain_assignment(b)]):
            return None
        source = sources.pop()
        return source if source != var else None

    def _alias_group(self, var: Var) -> list[Var]:
        """`var` and every name bound to the same module by a plain
        `other = var[.to(...)]` (either way round), in the order found."""
        root = var
        for _ in range(len(self._bindings_of_var(var)) + 8):  # a chain of aliases, never a cycle
            source = self._alias_source(root)
            if source is None:
                break
            root = source
        group, pending = [root], [root]
        while pending:
            current = pending.pop()
            for reference in self._references(current):
                alias = self._assigned_alias(reference)
                if alias is not None and alias not in group and self._alias_source(alias) == current:
                    group.append(alias)
                    pending.append(alias)
        return group

    def _assigned_alias(self, reference: cst.CSTNode) -> Optional[Var]:
        """`model` of `model = <reference>[.to(...)]` alone on its line."""
        node = reference
        parent = self.parent(node)
        while isinstance(parent, cst.Attribute) and parent.value is node and isinstance(self.parent(parent), cst.Call):
            if parent.attr.value not in v.SELF_RETURNING_MODULE_METHODS:
                return None
            node = self.parent(parent)
            parent = self.parent(node)
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            return self._target_var(parent.targets[0].target)
        return None

    def _alias_called_in_training(self, model: Var, site: cst.CSTNode) -> Optional[Var]:
        """The one other name of `model` that training calls, when `model`
        itself is not called (None: no other name is). Two names called to
        compute losses would need the wrapper under both: refused."""
        group = self._alias_group(model)
        if len(group) < 2:
            return None
        called = [var for var in group if self._called_outside_no_grad(var)]
        if len(called) > 1:
            names = ", ".join(f"`{var.code}`" for var in called)
            raise CannotMigrate(
                site, "AM520",
                f"the trained model's forward is called through several names of the same module ({names}): under "
                f"DistributedDataParallel gradients are synchronised only through calls of the wrapper; call it "
                f"through one name, then run ddp again",
            )
        return called[0] if called and called[0] != model else None
