"""A wrapped model passed to a function of another module (`evaluate(net,
val_loader)` from the project's evaluate.py): such a function may read the
model's own attributes (`net.n_classes`), which the DDP wrapper lacks, so it
gets the bare module, unless the call may train through it: an optimizer
passed along, or a result that feeds a backward (`loss = compute_loss(model,
batch)`), keep the wrapper, whose forward synchronises the gradients.
"""

from __future__ import annotations

import libcst as cst

from .._base import walk
from .handed_loops import HandedLoops

# Libraries whose calls see the DDP wrapper as they should (`torch.compile`
# compiles the wrapper; `isinstance` asks about it).
KEPT_PREFIXES = ("torch.", "builtins.", "apex.")


class ForeignCalls(HandedLoops):
    """Which calls of other modules' functions get the bare model."""

    def _takes_bare_model(self, call: cst.Call, argument: cst.Arg) -> bool:
        """`argument` (the model) is given to an imported function that does
        not train through it, as far as this file shows."""
        names = self.qualified_names(call.func)
        if not names or any(n.startswith(KEPT_PREFIXES) for n in names) or self._calls_own_function(call):
            return False
        if not self._imported_callee(call.func) or self._hands_to_a_loop(argument.value, "model"):
            return False
        if any(a is not argument and self._is_optimizer(a.value) for a in call.args):
            return False
        return not self._feeds_backward(call)

    def _imported_callee(self, func: cst.BaseExpression, followed: frozenset = frozenset()) -> bool:
        """An imported function, or a method of an instance of an imported
        class (`early_stopping(val_loss, model)` with `early_stopping =
        EarlyStopping(patience=7)` from the project's utils). A name made by a
        call through itself (`nn = nn.DataParallel(m)`) is followed once."""
        root = func
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or root.value in followed:
            return False
        if any(b.kind == "import" for b in self.script.bindings_of(root.value, root)):
            return True
        made = self._made_by_call(root)
        return made is not None and self._imported_callee(made.func, followed | {root.value})

    def _is_optimizer(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Name):
            return any(self.script.makes_optimizer(v) for v in self._assigned_values(value))
        return isinstance(value, cst.Attribute) and value.attr.value in ("optimizer", "optim", "opt")

    def _feeds_backward(self, call: cst.Call) -> bool:
        """The call's value may reach a `backward()`: inside a backward's
        receiver, returned, or bound to a name a backward's loss is computed from."""
        enclosing, statement = [], None
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                statement = ancestor
                break
            enclosing.append(ancestor)
        if isinstance(statement, cst.Expr) and statement.value is call:
            return False  # its value is dropped
        if isinstance(statement, (cst.If, cst.While)) and not any(isinstance(a, cst.NamedExpr) for a in enclosing):
            return False  # tested only (`if early_stopping(val_loss, model):`)
        if not isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            return True  # returned, yielded, tested: not followed, so kept wrapped
        return bool(_target_names(statement) & self._loss_names(self.script.scope_of(call)))

    def _loss_names(self, scope) -> set[str]:
        """Names the backward calls in `scope` read, and the names their values are computed from."""
        names: set[str] = set()
        for backward in self._uses.backward_calls:
            if self.script.scope_of(backward) is scope:
                names |= {n.value for n in walk(backward.func) if isinstance(n, cst.Name)}
                names |= {n.value for a in backward.args for n in walk(a.value) if isinstance(n, cst.Name)}
        assigns = [a for a in walk(scope.node) if isinstance(a, (cst.Assign, cst.AugAssign)) and self.script.scope_of(a) is scope]
        for _ in range(len(assigns) + 1):
            before = len(names)
            for assign in assigns:
                if _target_names(assign) & names:
                    names |= {n.value for n in walk(assign.value) if isinstance(n, cst.Name)}
            if len(names) == before:
                break
        return names


def _target_names(statement: cst.BaseSmallStatement) -> set[str]:
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    return {n.value for target in targets for n in walk(target) if isinstance(n, cst.Name)}
