"""The trained models of a script: where each is ready (built, placed, and
wrapped), and whether it is a convolutional net."""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Union

import libcst as cst

from .._base import dotted_name, has_star_args, keyword_arg, walk
from ..script import vocabulary as v
from ..script.entities import Entity
from ..script.uses import uses_of
from .statements import BLOCKS, position, statement_of

CONV_DEPTH = 4  # how many of the file's classes deep a model's layers are followed
# torchvision model families built from convolutions (not the vision transformers).
TORCHVISION_CONV_FAMILIES = (
    "resnet", "resnext", "wide_resnet", "vgg", "alexnet", "densenet", "mobilenet", "efficientnet", "regnet",
    "squeezenet", "shufflenet", "googlenet", "inception", "mnasnet", "convnext",
)  # fmt: skip
FILTER = frozenset({"builtins.filter"})
GATHERING = frozenset({"builtins.list", "builtins.tuple", "itertools.chain"})
# Methods that move or convert a model in place, as statements of their own.
MOVES = v.SELF_RETURNING_MODULE_METHODS - {"train", "eval", "requires_grad_"}


@dataclasses.dataclass(frozen=True)
class ReadyModel:
    """A trained model bound to a plain name (`model`, `self.net`), and the
    statement after which it is built, placed and wrapped."""

    name: str
    entity: object  # the script model's Entity
    anchor: cst.CSTNode  # a statement of a block


@dataclasses.dataclass(frozen=True)
class NotReady:
    """Why no such statement can be named: the finding's node and message."""

    node: cst.CSTNode
    reason: str


def trained_models(script) -> list:
    """The models that training steps backpropagate through, one per name and
    scope (a model passed to `train(model, ...)` is the caller's). A step
    whose model the script model cannot name (a class imported from another
    module) trains the modules whose `.parameters()` its optimizers get."""
    found: dict = {}
    for step in script.training_steps:
        for entity in step.models or _optimized_modules(script, step):
            found.setdefault((id(entity.binding.scope), entity.name), entity)
    return list(found.values())


def _optimized_modules(script, step) -> Iterator:
    for optimizer_step in step.optimizer_steps:
        optimizer = optimizer_step.entity
        made = optimizer.origin.value if optimizer is not None else None
        if not isinstance(made, cst.Call):
            continue
        for owner in parameter_owners(script, made) or ():
            entity = script.entity(owner)
            if entity is None:
                entity = _unnamed_kind_model(script, owner)
            if entity is not None and entity.kind == "model":
                yield entity


def _unnamed_kind_model(script, reference: cst.BaseExpression):
    """An Entity for `model = Imported(...)`, which the script model does not
    classify: the latest plain assignment the reference reads."""
    bindings = [b for b in script.bindings_of_reference(reference) if b.kind == "assign" and b.value is not None]
    if not bindings:
        return None
    binding = max(bindings, key=lambda b: script.index.order.get(b.node, -1))
    made_by = sorted(script.qualified_names(binding.value.func)) if isinstance(binding.value, cst.Call) else []
    return Entity("model", binding.name, binding.scope, made_by[0] if made_by else "", binding.node, script.line, binding)


def parameter_owners(script, call: cst.Call) -> Optional[list]:
    """The modules whose `.parameters()` make up an optimizer's first
    argument, as written (`model`, `model.backbone` ...): directly, filtered
    (`filter(...)`, a comprehension over them), gathered (`list`, `tuple`,
    `itertools.chain`, `[*a.parameters(), *b.parameters()]`) or in parameter
    groups (`[{"params": ...}, ...]`). None when anything else is in it (a
    tensor of its own, a list built earlier), or it cannot be seen."""
    if has_star_args(call):
        return None
    given = keyword_arg(call, "params") or next((a for a in call.args if a.keyword is None), None)
    if given is None:
        return None
    owners = _owners(script, given.value)
    if not owners:
        return None
    return list({dotted_name(owner): owner for owner in owners}.values())


def _owners(script, node: cst.BaseExpression) -> Optional[list]:
    """The modules whose parameters are all that `node` holds, or None."""
    if isinstance(node, cst.Call):
        return _owners_of_call(script, node)
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        plain = isinstance(node.elt, cst.Name) and isinstance(node.for_in.target, cst.Name) and node.elt.value == node.for_in.target.value
        return _owners(script, node.for_in.iter) if plain and node.for_in.inner_for_in is None else None
    if isinstance(node, (cst.List, cst.Tuple)):
        return _all_owners(script, (e.value if isinstance(e, cst.StarredElement) else _group_parameters(e.value) for e in node.elements))
    if isinstance(node, cst.Dict):
        group = _group_parameters(node)
        return _owners(script, group) if group is not None else None
    return None


def _owners_of_call(script, call: cst.Call) -> Optional[list]:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "parameters" and not call.args and dotted_name(func.value):
        return [func.value]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if len(positional) != len(call.args):
        return None
    if script.is_qualified(func, FILTER) and len(positional) == 2:
        return _owners(script, positional[1])
    if script.is_qualified(func, GATHERING):
        return _all_owners(script, positional)
    return None


def _all_owners(script, parts) -> Optional[list]:
    found = []
    for part in parts:
        owners = _owners(script, part) if part is not None else None
        if not owners:
            return None
        found.extend(owners)
    return found


def _group_parameters(value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """`{"params": X, "lr": ...}` -> X; any other element is not a group."""
    if not isinstance(value, cst.Dict):
        return value
    for element in value.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString) and element.key.evaluated_value == "params":
            return element.value
    return None


def ready_model(script, entity, before_wraps: bool = False) -> Union[ReadyModel, NotReady]:
    """Where `entity`'s model is ready: after the last statement of its scope
    that binds or moves it, lifted to the block that holds them all. With
    `before_wraps`, wrapping it (`DataParallel(model)`, DDP) does not count:
    the model is ready once placed."""
    binding = entity.binding
    if binding.kind != "assign" or not (isinstance(binding.node, cst.Name) or _is_self_attribute(binding.node)):
        return NotReady(entity.at, f"the model `{entity.name}` is not bound to a plain name or `self.` attribute")
    bindings = [b for b in binding.scope.bindings.get(entity.name, ()) if b.kind == "assign"]
    if before_wraps:
        bindings = [b for b in bindings if not _wraps(script, b.value)]
    statements = [statement_of(script, b.node) for b in bindings]
    statements += list(_moves(script, binding.scope.node, entity.name))
    statements = _before_training(script, binding.scope, [s for s in statements if s is not None])
    if not statements:
        return NotReady(entity.at, f"the model `{entity.name}` is not built before the code that trains it")
    if any(isinstance(a, (cst.For, cst.While)) for s in statements for a in _ancestors_to_scope(script, s)):
        return NotReady(entity.at, f"the model `{entity.name}` is built or moved inside a loop")
    home = _common_block(script, statements)
    last = max(statements, key=lambda s: position(script, s))
    anchor = next(s for s in [last, *script.ancestors(last)] if script.parent(s) is home)
    return ReadyModel(entity.name, entity, anchor)


def _wraps(script, value) -> bool:
    return isinstance(value, cst.Call) and script.is_call_to(value, v.DATA_PARALLEL | v.DISTRIBUTED_DATA_PARALLEL)


def _is_self_attribute(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _moves(script, scope_node: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    """Statements `name.to(device)`, `name.cuda()` of the scope's own code."""
    by_scope = script.derived(_moves_by_scope)
    found = by_scope.get(scope_node)
    if found is None:  # each scope is read once, whatever the number of its models
        found = by_scope[scope_node] = _scope_moves(script, scope_node)
    return found.get(name, [])


def _moves_by_scope(script) -> dict:
    return {}  # scope node -> {name: its move statements}, filled as scopes are asked about


def _scope_moves(script, scope_node: cst.CSTNode) -> dict[str, list[cst.CSTNode]]:
    body = scope_node.body if isinstance(scope_node, cst.FunctionDef) else scope_node
    found: dict[str, list[cst.CSTNode]] = {}
    for node in walk(body, into_definitions=False):
        if (
            isinstance(node, cst.Expr)
            and isinstance(node.value, cst.Call)
            and isinstance(node.value.func, cst.Attribute)
            and node.value.func.attr.value in MOVES
        ):
            found.setdefault(dotted_name(node.value.func.value), []).append(statement_of(script, node))
    return found


def _ancestors_to_scope(script, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        yield ancestor


def _common_block(script, statements: list) -> cst.CSTNode:
    """The innermost block that holds every one of the statements."""
    chains = [set(script.ancestors(s)) for s in statements]
    return next(node for node in script.ancestors(statements[0]) if isinstance(node, BLOCKS) and all(node in c for c in chains))


def _before_training(script, scope, statements: list) -> list:
    """The statements that run before the scope's code first trains (a
    backward, or a call of a function that leads to one): a model rebuilt
    after training (to evaluate a checkpoint) is not the one trained."""
    first = script.derived(_first_training_call).get(scope)
    if first is None:
        return statements
    return [s for s in statements if position(script, s) < first]


def _first_training_call(script) -> dict:
    """Each scope's first training call, by its place in the source order (found once per model)."""
    order = script.index.order
    first: dict = {}
    for call in uses_of(script).training_calls():
        if call in order:
            scope = script.scope_of(call)
            first[scope] = min(first.get(scope, order[call]), order[call])
    return first


# -- convolutional nets ----------------------------------------------------------------


def is_conv_net(script, entity, dimensions: frozenset = frozenset({1, 2, 3})) -> bool:
    """Does the model hold convolutions of these dimensions? Read from what
    built it: a torchvision convolutional family, the layers of the file's
    own nn.Module classes and model-building functions (and the classes they
    build, their bases), or
    `nn.Sequential(nn.Conv2d(...), ...)` itself."""
    origin = entity.origin
    if any(_torchvision_conv(name) for name in _made_by(script, origin)):
        return True
    value = origin.value
    return value is not None and _holds_conv(script, value, dimensions, CONV_DEPTH, set())


def _made_by(script, entity) -> list[str]:
    return [entity.made_by] if entity.made_by else []


def _torchvision_conv(qualified: str) -> bool:
    if not qualified.startswith("torchvision.models."):
        return False
    return qualified.rsplit(".", 1)[-1].startswith(TORCHVISION_CONV_FAMILIES)


def _holds_conv(script, node: cst.CSTNode, dimensions: frozenset, depth: int, seen: set) -> bool:
    for inner in walk(node):
        if isinstance(inner, cst.Call):
            names = script.qualified_names(inner.func)
            if any(_is_conv(name, dimensions) or _torchvision_conv(name) for name in names):
                return True
            if depth and isinstance(inner.func, cst.Name):
                for klass in _file_classes(script, inner.func, seen):
                    if _holds_conv(script, klass, dimensions, depth - 1, seen):
                        return True
        elif isinstance(inner, cst.ClassDef) and depth:
            for base in inner.bases:
                if isinstance(base.value, cst.Name):
                    for klass in _file_classes(script, base.value, seen):
                        if _holds_conv(script, klass, dimensions, depth - 1, seen):
                            return True
    return False


def _file_classes(script, name: cst.Name, seen: set) -> Iterator[cst.CSTNode]:
    """The file's classes (and functions: `def build(): return nn.Sequential(...)`) `name` reads."""
    for binding in script.bindings_of(name.value, name):
        if binding.kind in ("class", "def") and binding.node not in seen:
            seen.add(binding.node)
            yield binding.node


def _is_conv(qualified: str, dimensions: frozenset) -> bool:
    """`torch.nn.Conv2d`, `torch.nn.LazyConvTranspose2d`, `torch.nn.functional.conv2d` ..."""
    last = qualified.rsplit(".", 1)[-1].lower().removeprefix("lazy")
    if not (qualified.startswith("torch.nn.") and last.startswith("conv")):
        return False
    return any(last.endswith(f"{d}d") for d in dimensions)


__all__ = ["NotReady", "ReadyModel", "parameter_owners", "TORCHVISION_CONV_FAMILIES", "is_conv_net", "ready_model", "trained_models"]
