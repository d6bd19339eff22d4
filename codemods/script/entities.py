"""The things a training script builds: models, optimizers, schedulers,
loaders, datasets, criteria, gradient scalers and devices.

A binding is an entity when its value is a call that makes one, by
qualified name (`torch.optim.SGD`, `torch.utils.data.DataLoader`, a
torch.nn layer, a class of the file that derives from `nn.Module` or
`Dataset`), or a value made from one (`model = Net().to(device)`,
`model = nn.DataParallel(model)`, `net = model`). A user's own class named
`DataLoader` is the file's class, not torch's, and makes no loader.

`Entities.of(expression, scope)` answers "what is this name here?": it
follows the name to its bindings, `self.x` to the assignments of `self.x` in
the class's methods, and a parameter to the arguments passed at the
function's call sites in the file.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .._syntax import children, dotted_name, is_docstring, walk
from . import project_facts
from . import vocabulary as v
from .flow import Flow
from .positions import Lines
from .scopes import Binding, Index, Scope, positional_parameters

GRAD_SCALER = frozenset(
    {
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.cpu.amp.GradScaler",
        "accelmigrate.runtime.precision.grad_scaler",
    }
)
FOLLOW_DEPTH = 4  # how many call sites deep a parameter is followed


@dataclasses.dataclass(eq=False)
class Entity:
    """A value of one kind bound to a name: `optimizer = torch.optim.SGD(...)`."""

    kind: str  # "model", "optimizer", "scheduler", "loader", "dataset", "criterion", "scaler", "device"
    name: str  # as bound: "model", "self.model", "args.device"
    scope: Scope = dataclasses.field(repr=False)
    made_by: str  # the qualified name of what made it ("torch.optim.SGD", "Net"), or "<name>" it came from
    at: cst.CSTNode = dataclasses.field(repr=False)  # the target it is bound to (or the call site passing it)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    binding: Binding = dataclasses.field(repr=False)
    via: Optional["Entity"] = dataclasses.field(default=None, repr=False)  # `model = model.to(device)`
    layer: bool = dataclasses.field(default=False, repr=False)  # `self.x` of an nn.Module subclass: part of a model

    @property
    def line(self) -> int:
        return self.lines(self.at)

    @property
    def value(self) -> Optional[cst.BaseExpression]:
        return self.binding.value

    @property
    def origin(self) -> "Entity":
        """The entity this one was first made as (through `.to()`, wrappers, aliases)."""
        current = self
        while current.via is not None and current.via is not current:
            current = current.via
        return current

    def __repr__(self) -> str:
        return f"{self.kind.capitalize()}({self.name} = {self.made_by}, line {self.line}, in {self.scope.name})"


class Entities:
    """Every entity of the file, and look-ups by use site."""

    def __init__(self, index: Index, flow: Flow, lines: Lines) -> None:
        self.index = index
        self.flow = flow
        self.lines = lines
        self.by_binding: dict[Binding, Entity] = {}
        self._class_kinds: dict[cst.ClassDef, Optional[str]] = {}
        self._returned: dict[cst.FunctionDef, Optional[str]] = {}
        self._received: dict[Binding, list[Entity]] = {}  # parameter -> what its call sites pass
        self._star_dataloader = any(m in v.DATALOADER_MODULES for m in index.star_imports)
        self._looked_up = None  # while bindings are being classified, an answer may still be partial
        self._following = 0  # parameters being followed to their call sites
        self._parameter_owners = self._optimized_parameter_owners()
        for scope in index.scopes:
            for bindings in scope.bindings.values():
                for binding in bindings:
                    self.of_binding(binding)
        # every binding is classified now: later look-ups only read, and are kept
        self.all: list[Entity] = sorted(self.by_binding.values(), key=lambda e: index.order[e.at])
        self._looked_up: Optional[dict[tuple, list[Entity]]] = {}

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.all if e.kind == kind]

    # -- classifying bindings ----------------------------------------------------------

    def of_binding(self, binding: Binding) -> Optional[Entity]:
        if binding in self.by_binding:
            return self.by_binding[binding]
        if binding.value is None or binding.kind not in ("assign", "with", "named"):
            return None
        self.by_binding[binding] = None  # against cycles (`a = b; b = a`)
        found = self.kind_of_value(binding.value, binding.scope)
        if found is None and binding in self._parameter_owners and not self._known_elsewhere(binding):
            found = self._module_made_elsewhere(binding.value, binding.scope)
        if found is None:
            del self.by_binding[binding]
            return None
        kind, made_by, via = found
        entity = Entity(kind, binding.name, binding.scope, made_by, binding.node, self.lines, binding, via)
        entity.layer = "." in binding.name and self._in_module_class(binding.scope)
        self.by_binding[binding] = entity
        return entity

    def kind_of_value(self, value: cst.BaseExpression, scope: Scope, depth: int = 0) -> Optional[tuple]:
        """(kind, made_by, via entity) for a value expression, else None."""
        if isinstance(value, cst.Call):
            return self._kind_of_call(value, scope, depth)
        if isinstance(value, cst.IfExp):
            body, orelse = self.kind_of_value(value.body, scope, depth), self.kind_of_value(value.orelse, scope, depth)
            if body is not None and orelse is not None and body[0] == orelse[0]:
                return body
            return body if orelse is None and _is_none(value.orelse) else None
        if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
            # `device or torch.device("cuda")`, `model or Net()`: whichever side is known
            left, right = self.kind_of_value(value.left, scope, depth), self.kind_of_value(value.right, scope, depth)
            return right if left is None or (right is not None and left[0] == right[0]) else (left if right is None else None)
        if isinstance(value, (cst.Name, cst.Attribute)) and depth < FOLLOW_DEPTH:
            known = self.of(value, scope, depth + 1)
            if known is not None:
                return known.kind, f"<{known.name}>", known
        return None

    def _kind_of_call(self, call: cst.Call, scope: Scope, depth: int) -> Optional[tuple]:
        names = self.index.qualified_names(call.func)
        for name in sorted(names):
            kind = _kind_of_qualified(name)
            if kind is not None:
                via = self._first_argument_entity(call, scope, depth) if kind == "model" and name in _WRAPPERS else None
                return kind, name, via
        if self._star_dataloader and isinstance(call.func, cst.Name) and call.func.value == "DataLoader" and not names:
            return "loader", "torch.utils.data.DataLoader", None
        if isinstance(call.func, cst.Name):
            for binding in self.index.definitions_of(call.func.value, scope):
                kind = self.class_kind(binding.node) if binding.kind == "class" else None
                if kind is None and binding.kind == "def" and depth < FOLLOW_DEPTH:
                    kind = self.returned_kind(binding.node, depth + 1)
                if kind is not None:
                    return kind, _class_name(binding), None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in v.SELF_RETURNING_MODULE_METHODS:
            receiver = call.func.value
            inner = self.kind_of_value(receiver, scope, depth)
            if inner is not None and inner[0] == "model":
                return inner
        return None

    def _optimized_parameter_owners(self) -> dict:
        """Each binding of a name `x` whose `x.parameters()` an optimizer is made from
        (`Adam(vae.parameters())`, in param groups, `chain(...)` or a `filter`) -> all the
        bindings of that name, in order: only a module has parameters an optimizer trains."""
        owners: dict = {}
        for scope in self.index.scopes:
            for call in scope.calls:
                if not any(project_facts.makes_optimizer(q) for q in self.index.qualified_names(call.func)):
                    continue
                first = next((a for a in call.args if a.keyword is None and not a.star), None)
                given = first or next((a for a in call.args if a.keyword is not None and a.keyword.value == "params"), None)
                for node in (n for value in self._through_a_name(given, scope) for n in walk(value)):
                    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "parameters" and not node.args):
                        continue
                    if isinstance(node.func.value, cst.Name):
                        group = tuple(self.index.bindings_of(node.func.value.value, scope))
                        owners.update((b, group) for b in group if b.kind == "assign")
        return owners

    def _through_a_name(self, given: Optional[cst.Arg], scope: Scope) -> list:
        """The optimizer's parameters as written, and where they are a name (`params = filter(lambda p:
        p.requires_grad, model.parameters())`, then `Adam(params)`), what that name is bound to."""
        if given is None:
            return []
        if not isinstance(given.value, cst.Name):
            return [given.value]
        bound = [b.value for b in self.index.bindings_of(given.value.value, scope) if b.kind == "assign" and b.value is not None]
        return [given.value, *bound]

    def _known_elsewhere(self, binding: Binding) -> bool:
        """An earlier binding of the same name is a model by what the file shows (`model = Net()`,
        then `model = wrap(model)`): the model is known, and nothing is inferred. Only earlier ones:
        what a codemod inserts later (`model = torch.compile(model)`) must not change the verdict,
        or a second run would migrate otherwise."""
        group = self._parameter_owners[binding]
        return any(
            other.value is not None and self.kind_of_value(other.value, other.scope) is not None
            for other in group[: group.index(binding)]
        )

    def _module_made_elsewhere(self, value: cst.BaseExpression, scope: Scope) -> Optional[tuple]:
        """("model", made_by, None) for a value whose parameters an optimizer trains, made by a call this
        file cannot classify: a class imported from another module (`densenet.DenseNet(...)`, moved
        with `.to(device)` or not), a function of the file returning one. Not a class of the file that
        derives from nothing but `object`: that is plainly no module."""
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in v.SELF_RETURNING_MODULE_METHODS:
            value = value.func.value
        if not isinstance(value, cst.Call):
            return None
        if isinstance(value.func, cst.Name):
            for binding in self.index.definitions_of(value.func.value, scope):
                if binding.kind == "class" and not any(
                    not (isinstance(b.value, cst.Name) and b.value.value == "object") for b in binding.node.bases
                ):
                    return None
        names = sorted(self.index.qualified_names(value.func))
        return "model", names[0] if names else (dotted_name(value.func) or "<call>"), None

    def _in_module_class(self, scope: Scope) -> bool:
        klass = scope.enclosing_class
        return klass is not None and self.class_kind(klass.node) in ("model", "criterion")

    def _first_argument_entity(self, call: cst.Call, scope: Scope, depth: int) -> Optional[Entity]:
        if not call.args or call.args[0].keyword is not None or call.args[0].star:
            return None
        first = call.args[0].value
        if isinstance(first, (cst.Name, cst.Attribute)):
            return self.of(first, scope, depth + 1)
        return None

    def class_kind(self, klass: cst.ClassDef) -> Optional[str]:
        """"model" for a class of the file deriving (through the file's other
        classes too) from a torch.nn module, "dataset" from torch's Dataset,
        "optimizer" from an optimizer class."""
        if klass in self._class_kinds:
            return self._class_kinds[klass]
        self._class_kinds[klass] = None
        scope = self.index.scope_by_node[klass].parent
        found = None
        for base in klass.bases:
            for name in self.index.qualified_names(base.value):
                found = found or _kind_of_base(name)
            if found is None and isinstance(base.value, cst.Name):
                for binding in self.index.definitions_of(base.value.value, scope):
                    if binding.kind == "class":
                        found = found or self.class_kind(binding.node)
        if found == "model" and klass.name.value.endswith("Loss"):
            found = "criterion"  # `class FocalLoss(nn.Module)`
        self._class_kinds[klass] = found
        return found

    def returned_kind(self, function: cst.FunctionDef, depth: int = 0) -> Optional[str]:
        """The kind every `return` of a function of the file gives, when they
        agree (`def make_model(): return Net().to(device)` makes a model)."""
        if function in self._returned:
            return self._returned[function]
        self._returned[function] = None  # against recursion
        scope = self.index.scope_by_node[function]
        kinds = {
            found[0] if found is not None else None
            for node in walk(function.body, into_definitions=False)
            if isinstance(node, cst.Return) and node.value is not None and not _is_none(node.value)
            for found in [self.kind_of_value(node.value, scope, depth)]
        }
        kind = kinds.pop() if len(kinds) == 1 else None
        self._returned[function] = kind
        return kind

    # -- look-ups by use site ----------------------------------------------------------------

    def of(self, expression: cst.BaseExpression, scope: Scope, depth: int = 0) -> Optional[Entity]:
        """The entity `expression` (a name, `self.x`, `args.x`) holds at a use in
        `scope`: the latest binding in reach that is one, followed through
        parameters to the arguments of the file's call sites."""
        found = self.all_of(expression, scope, depth)
        return found[-1] if found else None

    def all_of(self, expression: cst.BaseExpression, scope: Scope, depth: int = 0) -> list[Entity]:
        if depth > FOLLOW_DEPTH:
            return []
        key = (dotted_name(expression), scope, depth)
        if self._looked_up is None or not key[0]:
            return self._all_of(expression, scope, depth)
        found = self._looked_up.get(key)
        if found is None:
            found = self._all_of(expression, scope, depth)
            if not self._following:  # inside a parameter being followed, an answer may be partial
                self._looked_up[key] = found
        return list(found)

    def _all_of(self, expression: cst.BaseExpression, scope: Scope, depth: int) -> list[Entity]:
        found: list[Entity] = []
        for binding in self._bindings(expression, scope):
            if binding.kind == "param":
                found.extend(self._through_parameter(binding, depth))
                continue
            entity = self.of_binding(binding)
            if entity is not None:
                found.append(entity)
        return found

    def _bindings(self, expression: cst.BaseExpression, scope: Scope) -> list[Binding]:
        if isinstance(expression, cst.Name):
            return self.index.bindings_of(expression.value, scope)
        spelled = dotted_name(expression) if isinstance(expression, cst.Attribute) else ""
        if not spelled:
            return []
        root, _, attribute = spelled.partition(".")
        klass = self._instance_class(root, scope)
        if klass is not None:
            return self.attribute_bindings(klass, attribute)
        return self.index.bindings_of(spelled, scope)

    def _instance_class(self, root: str, scope: Scope) -> Optional[cst.ClassDef]:
        """The class when `root` is the instance parameter of a method of it."""
        function = self.flow.function_of(scope)
        if function is None or not function.is_method:
            return None
        params = positional_parameters(function.node)
        return function.scope.parent.node if params and params[0] == root else None

    def attribute_bindings(self, klass: cst.ClassDef, attribute: str) -> list[Binding]:
        """The assignments of `self.<attribute>` in the methods of `klass`."""
        found = []
        class_scope = self.index.scope_by_node[klass]
        for bindings in class_scope.bindings.values():
            for binding in bindings:
                method = self.flow.functions.get(binding.node) if binding.kind == "def" else None
                if method is None or not method.is_method:
                    continue
                params = positional_parameters(method.node)
                if params:
                    found.extend(method.scope.bindings.get(f"{params[0]}.{attribute}", ()))
        return found

    def _through_parameter(self, binding: Binding, depth: int) -> list[Entity]:
        if binding in self._received:
            return self._received[binding]
        self._received[binding] = []  # against recursion
        function = self.flow.functions.get(binding.scope.node)
        if function is None:
            return []
        found = self._received[binding] = []
        self._following += 1
        try:
            for site in function.callers:
                argument = site.arguments.get(binding.name)
                if argument is not None and isinstance(argument, (cst.Name, cst.Attribute)):
                    found.extend(self.all_of(argument, site.caller, depth + 1))
                elif argument is not None:
                    kind = self.kind_of_value(argument, site.caller, depth + 1)
                    if kind is not None:
                        found.append(Entity(kind[0], binding.name, binding.scope, kind[1], site.call, self.lines, binding, kind[2]))
        finally:
            self._following -= 1
        return found


_WRAPPERS = v.DATA_PARALLEL | v.DISTRIBUTED_DATA_PARALLEL


def _kind_of_qualified(name: str) -> Optional[str]:
    if project_facts.makes_optimizer(name):
        return "optimizer"
    if v.is_scheduler(name):
        return "scheduler"
    if name in v.DATALOADER:
        return "loader"
    if name in GRAD_SCALER:
        return "scaler"
    if name in v.DEVICE_FACTORIES:
        return "device"
    if name in _WRAPPERS:
        return "model"
    if v.is_loss_class(name):
        return "criterion"
    if v.is_module_class(name) or v.is_model_factory(name):
        return "model"
    if v.is_dataset_factory(name):
        return "dataset"
    return None


def _kind_of_base(name: str) -> Optional[str]:
    if v.is_loss_class(name) or name.endswith("._Loss"):
        return "criterion"
    if v.is_module_class(name):
        return "model"
    if name in v.DATASET_BASES:
        return "dataset"
    if project_facts.makes_optimizer(name) or name in v.OPTIMIZER_BASES:
        return "optimizer"
    return None


def _class_name(binding: Binding) -> str:
    return binding.name if binding.scope.kind == "module" else f"{binding.scope.name}.<locals>.{binding.name}"


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


# What a method may read of a parameter and still make nothing gradients flow
# through: a tensor of its device and dtype (`weight.new_zeros(...)`).
_PARAMETER_PROPERTIES = frozenset({"new_zeros", "new_ones", "new_empty", "new_full", "new", "new_tensor", "device", "dtype"})


def touches_no_parameter(klass: cst.ClassDef, name: str, _seen: frozenset = frozenset()) -> bool:
    """Does the method `name` of this model class compute nothing from the
    model's parameters: an RNN's `initHidden()` returning
    `torch.zeros(1, self.hidden_size)`, or `weight.new_zeros(...)` with
    `weight = next(self.parameters())`? It reads `self` only for plain
    attributes (`self.hidden_size`, set to values that call nothing), the
    device and dtype of a parameter, and other such methods: its result
    carries no gradient, so calling it on the bare module changes nothing."""
    methods = {f.name.value: f for f in klass.body.body if isinstance(f, cst.FunctionDef)}
    method = methods.get(name)
    if method is None or name in ("forward", "__call__") or name in _seen:
        return False
    parents = {child: node for node in walk(method.body) for child in children(node)}
    probes = _parameter_probes(method.body, parents)
    for node in walk(method.body):
        if not (isinstance(node, cst.Name) and node.value == "self"):
            continue
        attribute = parents.get(node)
        if not (isinstance(attribute, cst.Attribute) and attribute.value is node):
            return False
        called = isinstance(parents.get(attribute), cst.Call) and parents[attribute].func is attribute
        if attribute.attr.value == "parameters" and called and parents[attribute] in probes:
            continue
        if called and attribute.attr.value in methods:
            if not touches_no_parameter(klass, attribute.attr.value, _seen | {name}):
                return False
        elif called or not (attribute.attr.value == "training" or _plain_attribute(klass, attribute.attr.value)):
            return False
    return True


def plain_forward(klass: cst.ClassDef, name: str) -> bool:
    """Is the method `name` of this model class its forward under another
    name: `def predict(self, x): return self(x)` (or `self.forward(x)`),
    passing its own parameters on in order? Calling the model instead
    computes the same."""
    method = next((f for f in klass.body.body if isinstance(f, cst.FunctionDef) and f.name.value == name), None)
    if method is None or method.decorators or not isinstance(method.body, cst.IndentedBlock):
        return False
    params = method.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg or params.kwonly_params or params.posonly_params:
        return False
    names = [p.name.value for p in params.params]
    statements = [s for s in method.body.body if not is_docstring(s)]
    if not names or names[0] != "self" or len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return False
    returned = statements[0].body[0]
    call = returned.value if isinstance(returned, cst.Return) else None
    if not isinstance(call, cst.Call):
        return False
    func = call.func
    calls_self = isinstance(func, cst.Name) and func.value == "self"
    calls_forward = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" and func.attr.value == "forward"
    passed = [a.value.value if isinstance(a.value, cst.Name) and a.keyword is None and not a.star else None for a in call.args]
    return (calls_self or calls_forward) and passed == names[1:] and all(p.default is None for p in params.params)


def _parameter_probes(body: cst.CSTNode, parents: dict) -> set:
    """The `self.parameters()` calls in `next(self.parameters())` whose result
    is read only for its device, its dtype or a new tensor like it, there or
    through a name bound to it (`weight = next(self.parameters()).data`)."""
    probes = set()
    for node in walk(body):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "next" and len(node.args) == 1):
            continue
        inner = node.args[0].value
        if not (isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value == "parameters"):
            continue
        value = node
        if isinstance(parents.get(value), cst.Attribute) and parents[value].attr.value == "data":
            value = parents[value]
        holder = parents.get(value)
        if isinstance(holder, cst.Attribute) and holder.attr.value in _PARAMETER_PROPERTIES:
            probes.add(inner)
        elif isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0].target, cst.Name):
            if _read_only_for_properties(body, holder.targets[0].target.value, parents):
                probes.add(inner)
    return probes


def _read_only_for_properties(body: cst.CSTNode, name: str, parents: dict) -> bool:
    for node in walk(body):
        if isinstance(node, cst.Name) and node.value == name:
            parent = parents.get(node)
            if isinstance(parent, cst.AssignTarget):
                continue
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "data":
                node, parent = parent, parents.get(parent)
            if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _PARAMETER_PROPERTIES):
                return False
    return True


def _plain_attribute(klass: cst.ClassDef, attribute: str) -> bool:
    """`self.<attribute>` is set in the class only to values that call
    nothing (`self.hidden_size = hidden_size`): a setting, not a layer."""
    values = [
        node.value for node in walk(klass.body) if isinstance(node, cst.Assign)
        for target in node.targets
        if isinstance(target.target, cst.Attribute) and isinstance(target.target.value, cst.Name)
        and target.target.value.value == "self" and target.target.attr.value == attribute
    ]
    return bool(values) and not any(isinstance(n, (cst.Call, cst.Lambda)) for value in values for n in walk(value))


__all__ = ["Entities", "Entity", "GRAD_SCALER", "plain_forward", "touches_no_parameter"]
