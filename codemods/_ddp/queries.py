"""What the ddp codemod asks about the script, answered from the shared model:
qualified names and parents, the variable a name or `self.<name>` is, where a
variable is read (followed into the script's own functions it is passed to),
which calls train, which build optimizers.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst
from libcst.metadata import PositionProvider

from .._base import Codemod, dotted_name, is_name, walk
from ..script import vocabulary as v
from ..script.model import ScriptModel
from ..script.uses import FOLLOW_DEPTH, uses_of
from ..script.flow import CallSite, Function
from .common import Var, last_name


class ScriptQueries(Codemod):
    """Questions about the script being migrated, for the parts of ddp."""

    def _target_var(self, target: cst.BaseExpression) -> Optional[Var]:
        if isinstance(target, cst.Name):
            index = self.script.index
            scope = index.scope_of(target)
            return Var(target.value, index.home_of(target.value, scope) or scope)
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
            owner = next((a for a in self.ancestors(target) if isinstance(a, cst.ClassDef)), None)
            return Var(target.attr.value, owner, is_attribute=True) if owner is not None else None
        return None

    def _var_of(self, expression: cst.CSTNode) -> Optional[Var]:
        """The variable an expression reads, when it is a name or `self.<name>`."""
        if isinstance(expression, cst.Name):
            index = self.script.index
            home = index.home_of(expression.value, index.scope_of(expression))
            return Var(expression.value, home) if home is not None else None
        if isinstance(expression, cst.Attribute):
            return self._target_var(expression)
        return None

    def _made_by_call(self, node: cst.CSTNode) -> Optional[cst.Call]:
        """The call a name is bound to, when it is bound once, to a call
        (`stopper` of `stopper = EarlyStopping(patience=7)`)."""
        bindings = self.script.bindings_of(node.value, node) if isinstance(node, cst.Name) else []
        made = [b.value for b in bindings if b.kind == "assign"]
        return made[0] if len(made) == len(bindings) == 1 and isinstance(made[0], cst.Call) else None

    def _root_var(self, expression: cst.CSTNode) -> Optional[Var]:
        """`model.fc` -> model; `self.net.encoder` -> self.net."""
        while isinstance(expression, cst.Attribute):
            var = self._var_of(expression)
            if var is not None:
                return var
            expression = expression.value
        return self._var_of(expression) if isinstance(expression, cst.Name) else None

    def _references(self, var: Var) -> list[cst.CSTNode]:
        """Where the variable is read."""
        if var.is_attribute:
            return self._uses.self_attribute_reads(var.owner, var.name)
        return self._uses.reads(var.name, var.owner)

    def _bindings_of_var(self, var: Var) -> list:
        if not var.is_attribute:
            return var.owner.bindings.get(var.name, [])
        spelled = f"self.{var.name}"
        return [
            b for scope in self.script.scopes for b in scope.bindings.get(spelled, ())
            if self._target_var(b.node) == var
        ]

    def _is_plain_assignment(self, binding) -> bool:
        """`target = value` alone on its line."""
        statement = binding.statement
        line = self.parent(statement)
        return (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and statement.targets[0].target is binding.node
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        )

    def _assigned_values(self, name: cst.Name) -> list[cst.BaseExpression]:
        """The values of the plain assignments (`name = value`) that `name` may read."""
        return [
            b.value for b in self.script.bindings_of(name.value, name)
            if b.kind == "assign" and isinstance(b.statement, cst.Assign) and b.value is not None
        ]

    def _values_flowing_into(self, name: cst.Name) -> list[cst.BaseExpression]:
        """What `name` may hold: its plain assignments, what is appended to or
        extended into it (`biases.append(param)`), and, for a loop target, the
        loop's iterable (`for name, param in model.named_parameters():`)."""
        values = self._assigned_values(name)
        bindings = self.script.bindings_of(name.value, name)
        values += [b.statement.iter for b in bindings if b.kind == "for" and isinstance(b.statement, cst.For)]
        lists = any(  # only a list is appended to: `plain = []`, `decay, plain = [], []`
            _builds_a_list(b.value) if b.value is not None else isinstance(b.statement, cst.Assign) and any(
                _builds_a_list(e.value) for e in getattr(b.statement.value, "elements", ())
            )
            for b in bindings if b.kind == "assign"
        )
        var = self._var_of(name) if lists else None
        for reference in self._references(var) if var is not None else ():
            method = self.parent(reference)
            call = self.parent(method) if isinstance(method, cst.Attribute) else None
            if isinstance(call, cst.Call) and call.func is method and method.attr.value in ("append", "extend", "insert"):
                values += [a.value for a in call.args[-1:]]
        return values

    def _followed_references(self, var: Var, depth: int = 0, path: tuple = ()) -> Iterator[tuple[cst.CSTNode, list]]:
        """References to `var`, and to the parameters of the script's own
        functions it is passed to: (reference, [(call, argument), ...])."""
        for reference in self._references(var):
            yield reference, list(path)
            if depth >= FOLLOW_DEPTH:
                continue
            argument = self.parent(reference)
            call = self.parent(argument) if isinstance(argument, cst.Arg) else None
            if not isinstance(call, cst.Call) or argument.value is not reference or argument.star:
                continue
            function, site = self._call_site(call)
            parameter = next((p for p, passed in site.arguments.items() if passed is reference), None) if site else None
            if parameter is None:
                continue
            inner = Var(parameter, function.scope)
            yield from self._followed_references(inner, depth + 1, path + ((call, reference),))

    def _call_site(self, call: cst.Call) -> tuple[Optional[Function], Optional[CallSite]]:
        """For a call of one of the script's own functions (or methods, or a
        class's `__init__`): that function, and the call with what it passes to
        each parameter."""
        found = self.script.flow.callee(call, self.script.scope_of(call))
        if found is None:
            return None, None
        return found[0], next((site for site in found[0].callers if site.call is call), None)

    def _calls_own_function(self, call: cst.Call) -> bool:
        """Does the call run one of the script's own functions (or methods, or a class's `__init__`)?"""
        return self.script.flow.callee(call, self.script.scope_of(call)) is not None

    def _parameter_of(self, var: Var) -> Optional[cst.Param]:
        """The parameter `var` is, when its function never rebinds it."""
        if var.is_attribute or var.owner.kind != "function":
            return None
        bindings = var.owner.bindings.get(var.name, ())
        return bindings[0].node if len(bindings) == 1 and bindings[0].kind == "param" else None

    def _caller_binding(self, parameter: Var) -> Optional[tuple[Var, cst.Call]]:
        """For a parameter of the script's own function, called from one place:
        the variable passed for it there, and that call."""
        if self._parameter_of(parameter) is None:
            return None
        sites = self.script.flow.functions[parameter.owner.node].callers
        if len(sites) != 1:
            return None
        passed = sites[0].arguments.get(parameter.name)
        outer = self._var_of(passed) if passed is not None else None
        return (outer, sites[0].call) if outer is not None else None

    def _trains(self, node: cst.CSTNode) -> bool:
        """Does running `node` call a backward: through the file's functions the
        model resolves, or through a method of the file's class called on an
        instance the model cannot type (`stepper.step(x, y)`, where `stepper`
        is a parameter given `Stepper(model, optimizer)` by the one caller)?"""
        if self._uses.trains(node):
            return True
        return any(isinstance(call, cst.Call) and self._method_trains(call) for call in walk(node))

    def _method_trains(self, call: cst.Call) -> bool:
        func = call.func
        if not isinstance(func, cst.Attribute) or self._calls_own_function(call):
            return False
        var = self._var_of(func.value) if isinstance(func.value, cst.Name) else None
        klass = self._class_of(var, 0) if var is not None else None
        method = method_of(klass, func.attr.value) if klass is not None else None
        return method is not None and self._uses.trains(method.body)

    def _class_of(self, var: Var, depth: int) -> Optional[cst.ClassDef]:
        """The file's class whose instance `var` holds: built there, or passed
        for a parameter by its one caller."""
        if depth > FOLLOW_DEPTH:
            return None
        caller = self._caller_binding(var)
        if caller is not None:
            return self._class_of(caller[0], depth + 1)
        classes = set()
        for binding in self._bindings_of_var(var):
            value = binding.value
            if binding.kind != "assign" or not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
                return None
            classes.update(b.node for b in self.script.bindings_of(value.func.value, value) if b.kind == "class")
        return classes.pop() if len(classes) == 1 else None

    def _manual_updates(self) -> list[cst.Call]:
        """`for p in model.parameters(): p.data.add_(p.grad, alpha=-lr)` (or
        `p -= lr * p.grad`): the `model.parameters()` of each loop that updates
        the parameters from their gradients by hand."""
        return self.script.derived(_manual_updates)

    def _optimizer_calls(self) -> list[cst.Call]:
        """Calls of an optimizer's class (not a factory: its arguments are not an optimizer's)."""
        return self.script.derived(_optimizer_class_calls)

    def _is_model_or_loader_call(self, call: cst.Call) -> bool:
        return self.is_call_to(call, v.DATA_PARALLEL | v.DATALOADER)

    def _calls_to(self, names) -> list[cst.Call]:
        return [call for call in self._uses.calls if self.is_call_to(call, names)]

    def _fresh_name(self, wanted: str) -> str:
        taken = self._uses.names
        name, number = wanted, 1
        while name in taken:
            number += 1
            name = f"{wanted}{number}"
        return name

    def _code(self, node: cst.CSTNode) -> str:
        return self._module.code_for_node(node).strip()

    def _position(self, node: cst.CSTNode, end: bool = False) -> tuple[int, int]:
        where = self.get_metadata(PositionProvider, node)
        point = where.end if end else where.start
        return point.line, point.column

    def _block_statement(self, node: cst.CSTNode) -> tuple[Optional[cst.CSTNode], Optional[cst.CSTNode]]:
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                return child, ancestor
            if isinstance(ancestor, cst.SimpleStatementSuite):
                return None, None
            child = ancestor
        return None, None

    def _from_import(self, func: cst.BaseExpression) -> Optional[tuple[str, str, Optional[str]]]:
        """`DataParallel` bound by `from torch.nn import DataParallel [as DP]`:
        ("torch.nn", "DataParallel", "DP" or None)."""
        if not isinstance(func, cst.Name):
            return None
        for binding in self.script.bindings_of(func.value, func):
            statement, alias = binding.statement, binding.node
            if binding.kind == "import" and isinstance(statement, cst.ImportFrom) and statement.module is not None:
                asname = alias.asname.name.value if alias.asname is not None else None
                return dotted_name(statement.module), last_name(alias.name), asname
        return None


# Found once per file version (kept on its model): every trained model asks.


def _manual_updates(script: ScriptModel) -> list[cst.Call]:
    found = []
    for call in uses_of(script).calls:
        loop = script.parent(call)
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "parameters"
            and isinstance(loop, cst.For)
            and loop.iter is call
            and isinstance(loop.target, cst.Name)
            and _updates_from_gradient(loop.body, loop.target.value)
        ):
            found.append(call)
    return found


def _optimizer_class_calls(script: ScriptModel) -> list[cst.Call]:
    return [call for call in uses_of(script).calls if script.makes_optimizer(call, classes_only=True)]


def _updates_from_gradient(body: cst.CSTNode, name: str) -> bool:
    """Does `body` read `<name>.grad` and change `<name>` in place
    (`name.data.add_(...)`, `name.sub_(...)`, `name -= ...`, `name.data -= ...`)?"""
    reads_gradient = changes_in_place = False
    for node in walk(body):
        if isinstance(node, cst.Attribute) and node.attr.value == "grad" and is_name(node.value, name):
            reads_gradient = True
        elif isinstance(node, cst.AugAssign) and _roots_at(node.target, name):
            changes_in_place = True
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value.endswith("_")
            and _roots_at(node.func.value, name)
        ):
            changes_in_place = True
    return reads_gradient and changes_in_place


def _roots_at(node: cst.CSTNode, name: str) -> bool:
    """`name` or `name.data`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return is_name(node, name)


def method_of(klass: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    """The method `name` defined in the body of `klass`."""
    return next((f for f in klass.body.body if isinstance(f, cst.FunctionDef) and f.name.value == name), None)


# Reads of a tensor that leave the graph: what is computed from them carries no gradient.
DETACHING = frozenset({"detach", "data", "item", "tolist", "numpy"})


def detached_where_made(script: ScriptModel, call: cst.Call) -> bool:
    """`call(...)` under no_grad, or read through `.detach()`, `.data`,
    `.item()`, `.tolist()` or `.numpy()` in the chain of attributes and calls
    right after it (`net.encoder(x).detach().cpu().numpy()`)."""
    if script.in_evaluation(call):
        return True
    node: cst.CSTNode = call
    while True:
        parent = script.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value in DETACHING:
                return True
            node = parent
        elif isinstance(parent, cst.Call) and parent.func is node:
            node = parent
        else:
            return False


def _builds_a_list(value: cst.BaseExpression) -> bool:
    """`[]`, `[a, b]` or `list()`: a list the code goes on to fill."""
    return isinstance(value, cst.List) or (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "list" and not value.args
    )
