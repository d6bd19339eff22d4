"""The script model: one analysis of a training script, read by every codemod.

`ScriptModel.of(module)` (or `.of(wrapper)`) computes, in a few linear passes over the LibCST tree:

- imports and qualified names (`qualified_names(node)`, `is_call_to(...)`),
  the names each scope binds (`scopes`), parents (`parent(node)`);
- entities: models, optimizers, schedulers, loaders, datasets, criteria,
  gradient scalers (`models`, `optimizers`, ..., `entity(expression)`);
- training steps (backward, optimizer steps, zero_grad, loss, models) with
  their loops, and evaluation regions;
- device bindings, functions with their parameters and call sites, and the
  entry point.

The facts are plain data classes whose repr a test can print; they point at
the LibCST nodes (by identity), so a codemod can rewrite what it is told
about, and give their `line` (looked up on first use, one statement at
a time: LibCST's positions of a whole module cost more than
the parse, and a file with nothing to report never needs them).
Facts come in source order. `print(model.summary())` shows it all.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, TypeVar, Union

import libcst as cst
from libcst.metadata import MetadataWrapper

from .._syntax import keyword_arg, walk
from .devices import DeviceBinding, device_bindings, is_device_string
from .entities import Entities, Entity
from .flow import EntryPoint, Flow, Function
from .positions import Lines
from . import project_facts
from .project_facts import ProjectFacts
from .project_facts import current as current_project_facts
from .scopes import Binding, Index, Scope
from . import vocabulary as v
from .steps import ITERATION_WRAPPERS, EvaluationRegion, Loop, Steps, TrainingStep, within_wrappers

_Facts = TypeVar("_Facts")


class ScriptModel:
    """What a training script is made of. Build it with `ScriptModel.of`."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        # What the project's other files tell about this one (the engine's, while it migrates it).
        self.project: ProjectFacts = current_project_facts()
        self.index = Index(module, dict(self.project.star_names), dict(self.project.reexports))
        # `model.line(node)`, `model.line.range(node)`: positions, resolved one
        # statement at a time when first asked
        self.line = lines = Lines(module, self.index.parent)
        self.flow = Flow(self.index, lines)
        self._entities = Entities(self.index, self.flow, lines)
        steps = Steps(self.index, self.flow, self._entities, lines)
        self.training_steps: list[TrainingStep] = steps.training
        self.evaluation: list[EvaluationRegion] = steps.evaluation
        self._steps = steps
        self.devices: list[DeviceBinding] = device_bindings(self.index, self._entities, lines)
        self.entry: EntryPoint = self.flow.entry_point()
        self._derived: dict = {}

    def derived(self, build: Callable[["ScriptModel"], _Facts]) -> _Facts:
        """`build(self)`, computed once per model: the facts that one family of
        codemods derives from the model (uses of names, device facts...).
        Kept on the model, so they live and die with it; `release` drops them."""
        found = self._derived.get(build)
        if found is None:
            found = self._derived[build] = build(self)
        return found

    def release(self) -> None:
        """Drop the derived facts: they point back at the model, and without
        them the model and its tree are freed as soon as nothing uses them,
        not at the garbage collector's next full pass."""
        self._derived.clear()

    @classmethod
    def of(cls, source: Union[cst.Module, MetadataWrapper]) -> "ScriptModel":
        """The model of a module (or of the engine's MetadataWrapper's module)."""
        return cls(source.module if isinstance(source, MetadataWrapper) else source)

    # -- positions and structure ------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.index.parent(node)

    def ancestors(self, node: cst.CSTNode):
        return self.index.ancestors(node)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        return self.index.scope_of(node)

    @property
    def scopes(self) -> list[Scope]:
        return self.index.scopes

    @property
    def module_scope(self) -> Scope:
        return self.index.module_scope

    @property
    def parents(self) -> dict:
        """Every node's parent, but for whitespace, comments and punctuation."""
        return self.index.parents

    # -- names ------------------------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> frozenset:
        return self.index.qualified_names(node)

    def is_qualified(self, node: cst.CSTNode, names) -> bool:
        return self.index.is_qualified(node, names)

    def is_call_to(self, node: cst.CSTNode, names) -> bool:
        return self.index.is_call_to(node, names)

    def bindings_of(self, name: str, at: cst.CSTNode) -> list[Binding]:
        """The bindings a use of `name` at `at` may read."""
        return self.index.bindings_of(name, self.index.scope_of(at))

    @functools.cached_property
    def imports(self) -> tuple[Binding, ...]:
        """Every import binding, in every scope (found once: many codemods ask)."""
        return tuple(b for s in self.index.scopes for bs in s.bindings.values() for b in bs if b.kind == "import")

    @property
    def star_imports(self) -> list[str]:
        return self.index.star_imports

    # -- entities ---------------------------------------------------------------------------

    def entity(self, expression: cst.BaseExpression) -> Optional[Entity]:
        """What a name (or `self.x`, `args.x`) holds where it is used."""
        return self._entities.of(expression, self.index.scope_of(expression))

    def entities_of(self, expression: cst.BaseExpression) -> list[Entity]:
        """Every entity `expression` may hold where it is used (followed through
        parameters to the file's call sites), not only the latest."""
        return self._entities.all_of(expression, self.index.scope_of(expression))

    def bindings_of_reference(self, expression: cst.BaseExpression) -> list[Binding]:
        """The bindings a name, `self.x` (the assignments in the class's
        methods) or `args.x` may read where `expression` uses it."""
        return self._entities._bindings(expression, self.index.scope_of(expression))

    def kind_of(self, expression: cst.BaseExpression) -> Optional[str]:
        """"model", "optimizer", ... for a name or a value expression."""
        if isinstance(expression, (cst.Name, cst.Attribute)):
            found = self.entity(expression)
            return found.kind if found is not None else None
        found = self._entities.kind_of_value(expression, self.index.scope_of(expression))
        return found[0] if found is not None else None

    def is_optimizer(self, expression: cst.BaseExpression) -> bool:
        return self.kind_of(expression) == "optimizer"

    def makes_optimizer(self, call: cst.CSTNode, *, classes_only: bool = False) -> bool:
        """A call that builds an optimizer (`optim.SGD(...)`, timm's
        `create_optimizer`, a class of the project deriving from torch's
        `Optimizer`; `classes_only`: an optimizer class's call, whose
        arguments are the optimizer's own)."""
        if not isinstance(call, cst.Call):
            return False
        if any(
            project_facts.makes_optimizer(name) and not (classes_only and name in v.OPTIMIZER_FACTORIES)
            for name in self.qualified_names(call.func)
        ):
            return True
        # A class of this file deriving from one (`class LARS(torch.optim.Optimizer)`).
        definitions = self.index.definitions_of(call.func.value, self.index.scope_of(call)) if isinstance(call.func, cst.Name) else []
        return any(b.kind == "class" and self._entities.class_kind(b.node) == "optimizer" for b in definitions)

    def class_kind(self, klass: cst.ClassDef) -> Optional[str]:
        """"model", "dataset", "optimizer" (or "criterion") for a class of the file deriving from one; else None."""
        return self._entities.class_kind(klass)

    def loader_built_elsewhere(self, loader: cst.BaseExpression) -> Optional[cst.Call]:
        """The call of a function of another module of the project that returns
        the DataLoader `loader` is bound to, once, here (the project fact
        `sharded_loaders`): `train_loader, val_loader = data.get_loaders(...)`; else None."""
        sources = self.project.sharded_loaders
        bindings = self.bindings_of(loader.value, loader) if sources and isinstance(loader, cst.Name) else []
        if len(bindings) != 1 or not isinstance(bindings[0].statement, cst.Assign) or not isinstance(bindings[0].statement.value, cst.Call):
            return None
        assign = bindings[0].statement
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if isinstance(target, cst.Tuple):
            positions = [i for i, e in enumerate(target.elements) if e.value is bindings[0].node]
        else:
            positions = [-1] if target is bindings[0].node else []
        names = self.qualified_names(assign.value.func)
        return assign.value if any((name, position) in sources for name in names for position in positions) else None

    def loader_returned_to(self, loop: cst.CSTNode) -> Optional[tuple[cst.Name, cst.Call]]:
        """For a `for` loop over a name (through `enumerate`/`tqdm`) bound to the DataLoader a function of another
        module of the project returns (`dataloader = get_celeba(params)`, then `for batch in dataloader:`): that name
        and the call; else None. The loader is made there, so whatever it needs is done there."""
        if not isinstance(loop, cst.For):
            return None
        iterable = within_wrappers(loop.iter, lambda call: self.is_call_to(call, ITERATION_WRAPPERS))
        built = self.loader_built_elsewhere(iterable) if isinstance(iterable, cst.Name) else None
        return (iterable, built) if built is not None else None

    def dataloader_made_by(self, call: cst.Call) -> Optional[cst.Call]:
        """For a call of a function of the file that returns a DataLoader (`get_data_loader(data, 128, shuffle=True)`,
        every `return` of it giving one): the one DataLoader(...) call in its own body; else None."""
        if not isinstance(call.func, cst.Name):
            return None
        for binding in self.index.definitions_of(call.func.value, self.index.scope_of(call)):
            if binding.kind == "def" and self._entities.returned_kind(binding.node) == "loader":
                made = [node for node in walk(binding.node.body, into_definitions=False) if isinstance(node, cst.Call) and self.is_dataloader(node)]
                return made[0] if len(made) == 1 else None
        return None

    def time_first_padding(self, loader: cst.Call) -> Optional[cst.Call]:
        """The `pad_sequence(...)` without `batch_first=True` in the collate function a DataLoader call is given
        (a function of the file, the closure a function of the file returns, a lambda, a `partial` of one): the
        batches it makes hold their sequences time-first, the samples along the second dimension; else None."""
        given = keyword_arg(loader, "collate_fn")
        for function in self._functions_behind(given.value) if given is not None else ():
            for node in walk(function):
                if isinstance(node, cst.Call) and self.is_call_to(node, v.PAD_SEQUENCE):
                    positional = [a for a in node.args if a.keyword is None]
                    batch_first = keyword_arg(node, "batch_first") or (positional[1] if len(positional) > 1 else None)
                    if batch_first is None or not (isinstance(batch_first.value, cst.Name) and batch_first.value.value == "True"):
                        return node
        return None

    def _functions_behind(self, value: cst.BaseExpression, depth: int = 0) -> list:
        """The definitions a callable expression may run: a def or lambda of the file, through names, `partial`
        and a factory call (whose body holds the function it returns)."""
        if isinstance(value, cst.Lambda):
            return [value]
        if depth > 3:
            return []
        if isinstance(value, cst.Call):
            partial = self.is_call_to(value, {"functools.partial"}) and value.args
            return self._functions_behind(value.args[0].value if partial else value.func, depth + 1)
        found = []
        for binding in self.bindings_of(value.value, value) if isinstance(value, cst.Name) else ():
            if binding.kind == "def":
                found.append(binding.node)
            elif binding.kind == "assign" and binding.value is not None:
                found += self._functions_behind(binding.value, depth + 1)
        return found

    def is_dataloader(self, call: cst.CSTNode) -> bool:
        """A call of torch's DataLoader, by any spelling; also a bare
        `DataLoader(...)` that nothing in the file binds, where
        `from torch.utils.data import *` is the file's only star import."""
        if self.is_call_to(call, v.DATALOADER):
            return True
        stars = set(self.star_imports)
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value == "DataLoader"
            and bool(stars)
            and stars <= v.DATALOADER_MODULES
            and self.index.home_of("DataLoader", self.index.scope_of(call)) is None
        )

    def is_model(self, expression: cst.BaseExpression) -> bool:
        return self.kind_of(expression) == "model"

    @property
    def entities(self) -> list[Entity]:
        return self._entities.all

    @property
    def models(self) -> list[Entity]:
        """Models built by the script (not the layers a model class assigns to `self`)."""
        return [e for e in self._entities.of_kind("model") if not e.layer]

    @property
    def layers(self) -> list[Entity]:
        """`self.x = nn.Linear(...)` in the methods of the file's nn.Module classes."""
        return [e for e in self._entities.of_kind("model") if e.layer]

    @property
    def optimizers(self) -> list[Entity]:
        return self._entities.of_kind("optimizer")

    @property
    def schedulers(self) -> list[Entity]:
        return self._entities.of_kind("scheduler")

    @property
    def loaders(self) -> list[Entity]:
        return self._entities.of_kind("loader")

    @property
    def datasets(self) -> list[Entity]:
        return self._entities.of_kind("dataset")

    @property
    def trained_models(self) -> list[Entity]:
        """The models whose forward makes a loss that a training step backpropagates."""
        found: dict[Entity, None] = {}
        for step in self.training_steps:
            found.update(dict.fromkeys(step.models))
        return list(found)

    # -- steps, loops, functions --------------------------------------------------------------

    def steps_in(self, function: str) -> list[TrainingStep]:
        """The training steps whose backward runs in the function of this qualified name."""
        return [s for s in self.training_steps if s.function.name == function]

    def loops_around(self, node: cst.CSTNode) -> list[Loop]:
        return self._steps.loops_around(node)

    def in_evaluation(self, node: cst.CSTNode) -> bool:
        """Inside a no_grad / inference_mode block or a function decorated with one."""
        regions = self._no_grad_regions
        return any(a in regions for a in self.index.ancestors(node))

    @functools.cached_property
    def _no_grad_regions(self) -> frozenset:
        return frozenset(r.node for r in self.evaluation if r.kind != "eval")

    @property
    def functions(self) -> list[Function]:
        return sorted(self.flow.functions.values(), key=lambda f: self.index.order[f.node])

    def function(self, name: str) -> Optional[Function]:
        return next((f for f in self.flow.functions.values() if f.name == name), None)

    def function_at(self, node: cst.CSTNode) -> Optional[Function]:
        """The function whose code holds `node`."""
        return self.flow.function_of(self.index.scope_of(node))

    def holds_device(self, expression: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`expression`, read at `site`, holds a device: `torch.device(...)`,
        a device string, a name every binding of which in reach binds one,
        or `args.device` of a `--device` flag."""
        if isinstance(expression, (cst.SimpleString, cst.FormattedString, cst.IfExp)):
            return is_device_string(expression)
        if isinstance(expression, cst.Call):
            return self.kind_of(expression) == "device"
        devices = {id(d.node) for d in self.devices if d.kind in ("torch.device", "get_device", "string")}
        if isinstance(expression, cst.Name):
            bindings = self.bindings_of(expression.value, site)
            return bool(bindings) and all(id(b.node) in devices for b in bindings)
        if isinstance(expression, cst.Attribute) and expression.attr.value == "device" and isinstance(expression.value, cst.Name):
            return any(d.kind == "flag" and d.name == "--device" for d in self.devices)
        return False

    def values_of(self, holder: cst.BaseExpression, depth: int = 2) -> list[cst.BaseExpression]:
        """What `holder` (a name, `self.x`) may hold: the values assigned to
        it, and for a parameter, what the file's calls of its function pass
        (followed `depth` names deep); a binding that cannot be read makes
        the list hold the binding's node."""
        found: dict[int, cst.BaseExpression] = {}
        for binding in self.bindings_of_reference(holder):
            if binding.kind == "assign" and binding.value is not None:
                found[id(binding.value)] = binding.value
            elif binding.kind == "param" and depth > 0:
                function = self.flow.function_of(binding.scope)
                sites = function.callers if function is not None else []
                passed = [site.arguments.get(binding.name) for site in sites]
                for value in passed if passed and all(v is not None for v in passed) else [binding.node]:
                    more = self.values_of(value, depth - 1) if isinstance(value, (cst.Name, cst.Attribute)) else [value]
                    found.update((id(v), v) for v in more)
            else:
                found[id(binding.node)] = binding.node
        return list(found.values())

    # -- printing -----------------------------------------------------------------------------

    def summary(self) -> str:
        """Every fact, one a line: what a reader (or a failing test) looks at."""
        lines = [f"entry: {self.entry!r}"]
        lines += [f"import {b.name} -> {b.qualified} ({b.scope.name})" for b in self.imports]
        lines += [repr(e) + (" [layer]" if e.layer else "") for e in self.entities]
        lines += [repr(s) for s in self.training_steps]
        lines += [repr(r) for r in self.evaluation]
        lines += [repr(d) for d in self.devices]
        for function in self.functions:
            lines.append(f"def {function.name}({', '.join(function.parameters)}), line {function.line}: called {function.callers}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"ScriptModel({len(self.training_steps)} training steps, {len(self.models)} models, "
            f"{len(self.optimizers)} optimizers, {len(self.loaders)} loaders, main guard: {self.entry.main_guard is not None})"
        )


__all__ = ["ScriptModel"]
