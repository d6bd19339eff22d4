"""A model that ddp wraps where the script has no `nn.DataParallel`: each
model an optimizer (or a hand-written update) trains, wrapped in
DistributedDataParallel once it is on its device and before the first
training call, and the checks that make that wrap right (a model trained
through its own methods, layers called under a condition, a second forward
per step, apex's `amp.initialize`). The wrap statement itself is built here
too: the DataParallel replacement uses it.
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst

from .._base import is_name, keyword_arg, walk
from ..script.entities import plain_forward, touches_no_parameter
from ..script.reduction import SUM, UNCLEAR, training_reductions
from ..script.uses import FOLLOW_DEPTH
from .aliases import ModelAliases
from .common import CannotMigrate, Insertion, Var, first_positional
from .queries import detached_where_made, method_of
from .references import MODULE_API, UNWRAP_API, ModelReferences
from .unused import OUTPUTS_NOTE, UnusedParameters

MOVES = frozenset({"to", "cuda"})
LOCAL_BUFFERS_NOTE = (
    "; `**rank_local_buffers()`: it runs several forwards per step, so each rank keeps its own BatchNorm "
    "statistics during forwards (the parameters stay equal; rank 0's are saved)"
)
UNUSED_NOTE = (
    "; `find_unused_parameters=True`: its `forward` calls {layers} only under a condition, so a step may leave "
    "their parameters without gradients"
)
SUMMED_NOTE = (
    "; `sum_gradients_across_ranks`: its loss sums over the batch, so the ranks' gradients are added up (the "
    "original's sum over the whole batch) instead of averaged"
)
APEX_INITIALIZE = frozenset({"apex.amp.initialize"})
# Layers without parameters: calling one under a condition leaves nothing unused.
PARAMETER_FREE_LAYERS = frozenset(
    f"torch.nn.{name}" for name in (
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Identity", "Flatten", "Unflatten",
        "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Softmax",
        "LogSoftmax", "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus", "MaxPool1d", "MaxPool2d", "MaxPool3d",
        "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
        "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "Upsample", "PixelShuffle",
    )
)



class BareModelWrapping(ModelAliases, UnusedParameters, ModelReferences):
    """Plans the wrap of the models the optimizers train, and builds a wrap."""

    def _wrap_notes(self, local_buffers: bool, unused: list[str]) -> str:
        return "".join(unused) + (LOCAL_BUFFERS_NOTE if local_buffers else "")

    def _unused_parameter_notes(self, model: Var) -> list[str]:
        """Why the model needs `find_unused_parameters=True` (empty: it does not)."""
        layers = self._layers_used_conditionally(model)
        notes = [UNUSED_NOTE.format(layers=", ".join(f"`{name}`" for name in layers))] if layers else []
        return notes + ([OUTPUTS_NOTE] if self._outputs_left_unused(model) else [])

    def _plan_wrap_step(
        self, model: Var, anchor: cst.CSTNode, node: cst.CSTNode, code: str, message: str, apply: Callable[[], None],
        local_buffers: bool = False,
    ) -> None:
        self._check_model_uses(model, anchor)
        summed = self._sums_gradients(model)

        def wrap() -> None:
            self._use("is_distributed", "DistributedDataParallel", "ddp_device_ids")
            if local_buffers:
                self._use("rank_local_buffers")
            if summed:
                self._use("sum_gradients_across_ranks")
            apply()

        message += SUMMED_NOTE if summed else ""

        self._step(node, code, message, wrap, core=True)

    def _ddp_wrap(
        self, model: Var, trailing: Optional[cst.TrailingWhitespace] = None, local_buffers: bool = False, unused: bool = False
    ) -> cst.If:
        target = model.code
        nl, indent = self._module.default_newline, self._module.default_indent
        # The runtime spells it for the torch that runs the script (`broadcast_buffers`
        # is deprecated for `forward_sync_buffers` in newer versions).
        extra = (", find_unused_parameters=True" if unused else "") + (", **rank_local_buffers()" if local_buffers else "")
        statement = cst.parse_statement(
            f"if is_distributed():{nl}{indent}{target} = DistributedDataParallel({target}, device_ids=ddp_device_ids({target}){extra}){nl}"
            + (f"{indent}sum_gradients_across_ranks({target})  # its loss sums over the batch{nl}" if self._sums_gradients(model) else ""),
            config=self._config,
        )
        if trailing is not None and trailing.comment is not None:
            inner = statement.body.body[0].with_changes(trailing_whitespace=trailing)
            statement = statement.with_changes(body=statement.body.with_changes(body=[inner, *statement.body.body[1:]]))
        return statement

    def _sums_gradients(self, model: Var) -> bool:
        """DDP averages the ranks' gradients; a loss summed over the batch needs
        their sum (the global batch is split, so the sum is the original's).
        With `ddp=per-process` the average beside the scaled learning rate
        already gives the original's step per sample."""
        return not self.per_process and training_reductions(self.script, model.code) == {SUM}

    def _after_moves(self, anchor: cst.CSTNode, model: Var) -> cst.CSTNode:
        """The last statement of `anchor`'s block, from `anchor` on, that moves the
        model to its device (`model.to(device)`): DDP wraps a model in place.
        Where the block is a branch of an `if` (`if checkpoint is None: model
        = Net(); optimizer = ...` `else: model = checkpoint["model"]; ...`)
        and the block around it moves the model later (`model =
        model.to(device)`), the wrap goes after that move: it wraps the model
        of either branch."""
        while isinstance(self.parent(anchor), cst.If):  # an `elif`: the statement in the block is its whole `if`
            anchor = self.parent(anchor)
        block = self.parent(anchor)
        body = list(block.body)
        last = anchor
        names = self._alias_group(model)  # `model.to(device)` moves `net` too, after `model = net`
        for statement in body[body.index(anchor) + 1:]:
            if any(self._moves_model(statement, name) or self._moves_model_if(statement, name) for name in names):
                last = statement
        branching = self._branching_if(block)
        if branching is not None:
            outer = self._after_moves(branching, model)
            if outer is not branching:
                return outer
        return last

    def _branching_if(self, block: cst.CSTNode) -> Optional[cst.If]:
        """The (outermost) `if` statement that `block` is a branch of."""
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.Else):
            owner = self.parent(owner)
        if not isinstance(owner, cst.If):
            return None
        while isinstance(self.parent(owner), cst.If):  # an `elif`
            owner = self.parent(owner)
        return owner

    def _moves_model_if(self, statement: cst.CSTNode, model: Var) -> bool:
        """`if args.cuda: model.cuda()`, or a device branch that places several
        things (`if self.gpu_mode: self.G.cuda(); self.D.cuda(); self.loss =
        nn.BCELoss().cuda()` `else: self.loss = nn.BCELoss()`): the wrap goes
        after the `if`, the moves keep their condition. Each branch holds only
        output, moves and assignments that read nothing of the model; one
        moves it."""
        if not (isinstance(statement, cst.If) and isinstance(statement.body, cst.IndentedBlock)):
            return False
        inner = list(statement.body.body)
        if statement.orelse is not None:
            if not (isinstance(statement.orelse, cst.Else) and isinstance(statement.orelse.body, cst.IndentedBlock)):
                return False
            inner += statement.orelse.body.body
        moves = [s for s in inner if self._moves_model(s, model)]
        return bool(moves) and all(
            s in moves or self._is_output_statement(s) or self._places_apart_from(s, model) for s in inner
        )

    def _places_apart_from(self, statement: cst.CSTNode, model: Var) -> bool:
        """A move of another module (`self.D.cuda()`) or an assignment to
        something else (`self.loss = nn.BCELoss().cuda()`), reading nothing of the model."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            value = small.value
            if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MOVES):
                return False
        elif not (isinstance(small, cst.Assign) and all(self._target_var(t.target) != model for t in small.targets)):
            return False
        return not any(
            isinstance(node, (cst.Name, cst.Attribute)) and self._var_of(node) == model for node in walk(small)
        )

    def _moves_model(self, statement: cst.CSTNode, model: Var) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        if isinstance(small, cst.Assign) and not (
            len(small.targets) == 1 and self._target_var(small.targets[0].target) == model
        ):
            return False
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in MOVES
            and self._var_of(value.func.value) == model
        )

    def _plan_bare_models(self, only: Optional[set[Var]] = None) -> list[Var]:
        """No DataParallel: each model whose parameters an optimizer (or a
        hand-written update) trains: one, or several as in a GAN (a generator
        and a discriminator, each with its optimizer). `only`: those models."""
        sites = self._update_sites()
        models: dict[Var, cst.Call] = {}
        for site in sites:
            for var in self._models_trained_by(site):
                if only is None or var in only:
                    models.setdefault(var, (self._made_by_method or {}).get(var, site))
        if not models:
            node = sites[0] if sites else self._uses.backward_calls[0]
            raise CannotMigrate(
                node, "AM520",
                "no optimizer over `model.parameters()` found, so ddp cannot tell which model to wrap: once the "
                "model is on its device, add `if is_distributed(): model = DistributedDataParallel(model, "
                "device_ids=ddp_device_ids(model))`, then run ddp again",
            )
        planned = [self._plan_bare_model(model, site, several=len(models) > 1) for model, site in models.items()]
        wrapped = [model for model, _ in planned]
        if len(set(wrapped)) < len(wrapped):
            raise CannotMigrate(
                list(models.values())[1], "AM520",
                "two of the trained models are the same binding where training calls them: wrap each model in "
                "DistributedDataParallel by hand once it is on its device, before its optimizer is built",
            )
        for _, step in planned:
            step()
        return wrapped

    def _plan_bare_model(self, model: Var, site: cst.Call, several: bool) -> tuple[Var, Callable[[], None]]:
        """The binding to wrap, and the step that plans the wrap (planned once every model is known)."""
        self._refuse_self_training(model, site)
        trained = model
        model, built_at = self._binding_called_in_training(model, site)
        anchor, insert_before = self._bare_model_anchor(model, built_at)
        apex_line = self._after_apex_initialize(model, anchor)
        after_apex = apex_line is not anchor
        if after_apex:
            anchor, insert_before = apex_line, False
        # A model called several times before one backward (a discriminator on
        # real and fake batches) would have its BatchNorm buffers overwritten by
        # rank 0's in each forward, in place, while autograd still needs them.
        local_buffers = several and self._training_calls(model) > 1
        unused = self._unused_parameter_notes(model)
        wrap = self._ddp_wrap(model, local_buffers=local_buffers, unused=bool(unused))
        message = f"`{model.code}` wrapped in `DistributedDataParallel` once it is on its device (only when launched on several processes)"
        if after_apex:
            message += ", after `amp.initialize` (apex wraps the bare model first)"
        if model in self._alias_group(trained) and model != trained:
            message += f"; training calls it by this name, and `{trained.code}`, the same module, stays bare for the optimizer"
        if site in self._manual_updates():
            message += "; its hand-written update reads gradients that DDP averages across the ranks in `backward()`"
        message += self._wrap_notes(local_buffers, unused)

        def apply() -> None:
            if insert_before:
                self._before.setdefault(anchor, []).append(Insertion(wrap))
            else:
                self._after.setdefault(anchor, []).append(wrap)

        return model, lambda: self._plan_wrap_step(model, anchor, built_at, "AM503", message, apply, local_buffers)

    def _layers_used_conditionally(self, model: Var) -> list[str]:
        """The layers (`self.<name>` set in `__init__` to anything but a
        parameter-free layer) that the `forward` of the model's class, when it
        is this file's, calls only under an `if` or a conditional expression:
        a step that does not take that branch leaves their parameters without
        gradients, and DDP then fails the next step."""
        klass = self._model_class(model)
        forward = method_of(klass, "forward") if klass is not None else None
        if forward is None:
            return []
        methods = {f.name.value for f in klass.body.body if isinstance(f, cst.FunctionDef)}
        always, sometimes = set(), set()
        for node in walk(forward.body):
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and is_name(node.func.value, "self")):
                continue
            name = node.func.attr.value
            if name in methods or self._parameter_free_layer(klass, name):
                continue
            (sometimes if self._under_condition(node, forward) else always).add(name)
        return sorted(sometimes - always)

    def _model_class(self, model: Var) -> Optional[cst.ClassDef]:
        """This file's class that the model's bindings construct (through
        DataParallel and `.to(...)` alike), when there is exactly one."""
        classes = set()
        for binding in self._bindings_of_var(model):
            for node in walk(binding.value) if binding.value is not None else ():
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
                    classes.update(b.node for b in self.script.bindings_of(node.func.value, node) if b.kind == "class")
        return classes.pop() if len(classes) == 1 else None

    def _parameter_free_layer(self, klass: cst.ClassDef, name: str) -> bool:
        """`self.<name> = nn.Dropout(...)` (or another layer without parameters) in `__init__`."""
        init = method_of(klass, "__init__")
        values = [
            assign.value for assign in (walk(init.body) if init is not None else ())
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Attribute)
            and is_name(assign.targets[0].target.value, "self") and assign.targets[0].target.attr.value == name
        ]
        return bool(values) and all(
            isinstance(value, cst.Call) and any(n in PARAMETER_FREE_LAYERS for n in self.qualified_names(value.func))
            for value in values
        )

    def _under_condition(self, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
        child = node
        for ancestor in self.ancestors(node):
            if ancestor is function:
                return False
            if isinstance(ancestor, cst.If) and child is not ancestor.test:
                return True
            if isinstance(ancestor, cst.IfExp) and child is not ancestor.test:
                return True
            child = ancestor
        return False

    def _refuse_self_training(self, model: Var, site: cst.Call) -> None:
        """A model class that trains itself (`self.optimizer = SGD(self.parameters())`,
        a `fit` method calling `self(x)`): a method cannot rebind `self`, and
        `self(x)` would bypass any wrapper."""
        if model.is_attribute or model.name != "self" or model.owner.kind != "function":
            return
        klass = next((a for a in self.ancestors(site) if isinstance(a, cst.ClassDef)), None)
        name = f"`{klass.name.value}`" if klass is not None else "this model class"
        raise CannotMigrate(
            site, "AM520",
            f"{name} trains itself in its own methods: DistributedDataParallel synchronises gradients only through "
            f"calls of its wrapper, and a method cannot rebind `self`; move the training loop out of the class (build "
            f"the model and its optimizer, wrap the model in DistributedDataParallel once it is on its device, call "
            f"the wrapper in the loop), then run ddp again",
        )

    def _update_sites(self) -> list[cst.Call]:
        """Where parameters get trained: the optimizers' constructions, and the
        `model.parameters()` of hand-written updates."""
        return self._optimizer_calls() + self._manual_updates()

    def _apex_line(self, model: Var) -> Optional[cst.SimpleStatementLine]:
        """`model, optimizer = amp.initialize(model, optimizer, ...)` (apex), when it rebinds `model`."""
        for binding in self._bindings_of_var(model):
            statement = binding.statement
            if isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Call) and self.is_call_to(statement.value, APEX_INITIALIZE):
                line = self.parent(statement)
                return line if isinstance(line, cst.SimpleStatementLine) else None
        return None

    def _after_apex_initialize(self, model: Var, anchor: cst.CSTNode) -> cst.CSTNode:
        """apex refuses a model wrapped before `amp.initialize`: the wrap goes after it."""
        line = self._apex_line(model)
        if line is None:
            return anchor
        block = self.parent(anchor)
        if self.parent(line) is not block or list(block.body).index(line) < list(block.body).index(anchor):
            raise CannotMigrate(
                line, "AM520",
                f"`amp.initialize` (apex) rebinds `{model.code}` apart from where ddp would wrap it: right after it, add "
                f"`if is_distributed(): {model.code} = DistributedDataParallel({model.code}, device_ids=ddp_device_ids({model.code}))`",
            )
        return line

    def _training_calls(self, model: Var) -> int:
        """How many places call `model(...)` where gradients are recorded."""
        count = 0
        for reference, _ in self._followed_references(model):
            parent = self.parent(reference)
            if isinstance(parent, cst.Call) and parent.func is reference and not self.script.in_evaluation(parent):
                count += 1
        return count

    def _binding_called_in_training(self, model: Var, optimizer: cst.Call) -> tuple[Var, cst.Call]:
        """The binding of the optimizer's model that training calls, and the
        call that builds the optimizer from it there. When the optimizer is
        built in a factory (`def make_optimizer(model): return SGD(model.parameters())`),
        wrapping the factory's parameter would wrap a local nobody calls: the
        wrap goes where the factory is called, on the variable passed to it."""
        site: cst.Call = optimizer
        for _ in range(FOLLOW_DEPTH + 1):
            if self._called_outside_no_grad(model):
                self._alias_called_in_training(model, optimizer)  # refused where another name is called too
                return model, site
            if self._parameter_of(model) is None:
                # A model built here is wrapped here (and returned wrapped, if it is); where
                # training calls it by another name (`model = net`, `net(xb)`), under that one.
                return self._alias_called_in_training(model, optimizer) or model, site
            caller = self._caller_binding(model)
            if caller is None:
                break
            model, site = caller
        raise CannotMigrate(
            optimizer, "AM520",
            f"the optimizer trains `{model.code}`, but that binding is never called to compute a loss (a parameter of "
            f"a factory, called from several places or under another name?): wrap the model that the training loop "
            f"calls, once it is on its device and before the optimizer is built from it: `if is_distributed(): "
            f"model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))`",
        )

    def _called_outside_no_grad(self, model: Var) -> bool:
        """`model(...)` or `model.forward(...)` somewhere gradients are recorded."""
        for reference, _ in self._followed_references(model):
            callee, parent = reference, self.parent(reference)
            if isinstance(parent, cst.Attribute) and parent.value is reference and parent.attr.value == "forward":
                callee, parent = parent, self.parent(parent)
            if isinstance(parent, cst.Call) and parent.func is callee and not self.script.in_evaluation(parent):
                return True
            if self._hands_to_a_loop(reference, "model") and not self.script.in_evaluation(reference):
                return True
        return False

    _trained_by: Optional[dict] = None  # optimizer call -> its models, once asked (every model asks of every optimizer)

    def _models_trained_by(self, optimizer: cst.Call) -> list[Var]:
        """The models whose parameters the optimizer (or update) takes, in
        source order (a Var hashes by identity: a set's order would vary)."""
        if self._trained_by is None:
            self._trained_by = {}
        found = self._trained_by.get(optimizer)
        if found is None:
            found = self._trained_by[optimizer] = self._find_models_trained_by(optimizer)
        return found

    def _find_models_trained_by(self, optimizer: cst.Call) -> list[Var]:
        if isinstance(optimizer.func, cst.Attribute) and optimizer.func.attr.value == "parameters":  # a hand-written update
            root = self._root_var(optimizer.func.value)
            return [root] if root is not None else []
        params = first_positional(optimizer) or keyword_arg(optimizer, "params")
        if params is None:
            return []
        models: dict[Var, None] = {}
        for expression, passed_at in self._parameter_sources(params.value):
            for node in walk(expression):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("parameters", "named_parameters")
                ) or self._held_by_model(node):
                    root = self._root_var(node.func.value if isinstance(node, cst.Call) else node.value)
                    for var in self._instances_of_factory_method(root, optimizer) if root is not None else ():
                        models[var] = None
                        if passed_at is not None:  # make_optimizer(name, model.parameters(), lr)
                            self._made_at(var, passed_at)
        return list(models)

    def _held_by_model(self, node: cst.CSTNode) -> bool:
        """`model.params1` in a parameter group: parameters a model of the
        script keeps in an attribute of its own (a list it built from its layers)."""
        return (
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.attr.value not in ("parameters", "named_parameters")
            and self.script.is_model(node.value)
        )

    def _made_at(self, model: Var, call: cst.Call) -> None:
        if self._made_by_method is None:
            self._made_by_method = {}
        self._made_by_method.setdefault(model, call)

    def _parameter_sources(self, params: cst.BaseExpression) -> list[cst.BaseExpression]:
        """`params` and the values of the names it is computed from, a few
        assignments deep: `decay = [p for p in named.values() if ...]` with
        `named = {n: p for n, p in model.named_parameters()}`, in param groups
        `[{"params": decay, "weight_decay": 0.1}, ...]`."""
        found, pending, seen = [(params, None)], [(params, None)], set()
        for _ in range(FOLLOW_DEPTH + 1):
            names = [
                (n, at) for expression, at in pending for n in walk(expression)
                if isinstance(n, cst.Name) and n.value not in seen
            ]
            seen.update(n.value for n, _ in names)
            pending = [(value, at) for name, at in names for value in self._values_flowing_into(name)]
            pending += [passed for name, at in names if at is None for passed in self._passed_for(name)]
            found.extend(pending)
        return found

    def _passed_for(self, name: cst.Name) -> list[tuple[cst.BaseExpression, cst.Call]]:
        """For a parameter of the file's function called from one place (an
        optimizer factory, `def make_optimizer(name, params, lr)`): what that
        call passes for it, and the call."""
        bindings = self.script.bindings_of(name.value, name)
        if len(bindings) != 1 or bindings[0].kind != "param":
            return []
        function = self.script.flow.functions.get(bindings[0].scope.node)
        if function is None or len(function.callers) != 1:
            return []
        site = function.callers[0]
        passed = site.arguments.get(name.value)
        return [(passed, site.call)] if passed is not None else []

    _made_by_method: Optional[dict] = None  # model -> the call that makes its optimizer elsewhere (a method, a factory)

    def _instances_of_factory_method(self, root: Var, optimizer: cst.Call) -> list[Var]:
        """The model itself, or, for `self` in a method of the model's class
        that builds and returns the optimizer without training
        (`def configure_optimizers(self, ...)`, nanoGPT's), each model the
        script calls that method on: `optimizer = model.configure_optimizers(...)`
        trains `model`."""
        if root.is_attribute or root.name != "self" or root.owner.kind != "function":
            return [root]
        method = root.owner.node
        klass = next((a for a in self.ancestors(method) if isinstance(a, cst.ClassDef)), None)
        if klass is None or self._trains(method.body) or not self._returns_value_of(method, optimizer):
            return [root]
        found = []
        for call in self._uses.calls:
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == method.name.value):
                continue
            var = self._var_of(func.value)
            if var is not None and var != root and self._own_class(var) is klass:
                self._made_at(var, call)
                found.append(var)
        return found or [root]

    def _returns_value_of(self, function: cst.FunctionDef, call: cst.Call) -> bool:
        """`return <call>`, or `optimizer = <call>` and then `return optimizer`, in `function`."""
        names = set()
        for node in walk(function.body, into_definitions=False):
            if isinstance(node, cst.Return) and node.value is not None:
                if node.value is call or (isinstance(node.value, cst.Name) and node.value.value in names):
                    return True
            elif isinstance(node, cst.Assign) and node.value is call and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                names.add(node.targets[0].target.value)
        return False

    def _bare_model_anchor(self, model: Var, optimizer: cst.Call) -> tuple[cst.CSTNode, bool]:
        """Where the wrap goes: after the last statement that binds or moves the
        model before the optimizer is built, in a block that also builds the
        optimizer; else just before the statement that builds it."""
        optimizer_line = self._position(optimizer)[0]
        best = None
        # After `model = net` too: the other names keep the bare module.
        bindings = [s for name in self._alias_group(model) for s in self._statements_binding(name)]
        for statement in bindings:
            if self._position(statement)[0] >= optimizer_line:
                continue
            block = self.parent(statement)
            if not any(a is block for a in self.ancestors(optimizer)):
                continue
            if best is None or self._position(statement) > self._position(best):
                best = statement
        if best is not None:
            return self._after_moves(best, model), False
        built_before_calls = self._global_built_before_calls(model, optimizer, bindings)
        if built_before_calls is not None:
            return self._after_moves(built_before_calls, model), False
        statement, block = self._block_statement(optimizer)
        if statement is None or self.innermost_loop(statement) is not None:
            raise CannotMigrate(
                optimizer, "AM520",
                f"cannot find where `{model.code}` is built and moved to its device: after that, add "
                f"`if is_distributed(): {model.code} = DistributedDataParallel({model.code}, device_ids=ddp_device_ids({model.code}))`",
            )
        return statement, True

    def _global_built_before_calls(self, model: Var, site: cst.Call, bindings: list) -> Optional[cst.CSTNode]:
        """A module-level model that a function trains by reading the global
        (`def train(): ... for p in model.parameters(): ...`, called from the
        entry point): its last binding, when every binding shares one block and
        every call of that function comes after it. The function reads the
        global when it runs, so it sees the wrapper."""
        if model.is_attribute or model.owner is not self.script.module_scope or not bindings:
            return None
        function = next((a for a in self.ancestors(site) if isinstance(a, cst.FunctionDef)), None)
        known = self.script.flow.functions.get(function) if function is not None else None
        if known is None or not known.callers or len({id(self.parent(s)) for s in bindings}) != 1:
            return None
        last = max(bindings, key=self._position)
        if self.innermost_loop(last) is not None:
            return None
        end = self._position(last, end=True)
        if all(self._position(caller.call) > end for caller in known.callers):
            return last
        return None

    def _statements_binding(self, model: Var) -> list[cst.CSTNode]:
        """Plain statements (alone on their line, in a block) that assign or move
        `model`, in source order."""
        found = [self.parent(b.statement) for b in self._bindings_of_var(model) if self._is_plain_assignment(b)]
        for reference in self._references(model):
            call = self.parent(self.parent(reference))
            statement = self.parent(self.parent(call)) if isinstance(call, cst.Call) else None
            if statement is not None and self._moves_model(statement, model):
                found.append(statement)
        order = self.script.index.order
        return sorted(dict.fromkeys(found), key=lambda line: order[line.body[0]])

    def _check_model_uses(self, model: Var, anchor: cst.CSTNode) -> None:
        """Refuse when the model is rebound or moved after it is wrapped, or when
        training calls its own methods (which bypass DDP's gradient hooks)."""
        if not self.per_process and UNCLEAR in training_reductions(self.script, model.code):
            raise CannotMigrate(
                anchor, "AM520",
                f"cannot tell whether the loss that trains `{model.code}` is a mean or a sum over the batch (a `sum(...)` "
                f"of terms a loop makes, a `reduction=` that is not a string, a mean added to a sum): DDP averages the "
                f"ranks' gradients, which is the original's gradient for a mean only; write the loss as a mean or a "
                f"sum over the batch (`reduction=\"sum\"`), or wrap the model by hand and add the ranks' gradients up "
                f"for a sum, then run ddp again",
            )
        wrap_line = self._position(anchor, end=True)[0]
        for statement in self._statements_binding(model):
            if self._position(statement)[0] > wrap_line and not self._compiles_model(statement, model):
                raise CannotMigrate(
                    statement, "AM520",
                    f"`{model.code}` is moved or rebound after the point where ddp would wrap it: make the model final "
                    f"and on its device first, then wrap it in DistributedDataParallel by hand",
                )
        self._check_own_methods(model)

    def _check_own_methods(self, model: Var) -> None:
        """Refuse when training calls the model's own methods, which bypass DDP's gradient hooks."""
        for reference, _ in self._followed_references(model):
            method = self._own_method_called(reference)
            if method is None:
                continue
            if self._method_trains_model(model, method) or (
                self._in_training(reference) and not self._bare_call_keeps_gradients(model, reference, method)
            ):
                raise CannotMigrate(
                    reference, "AM527",
                    f"the model's own method `{method}` is called: under DistributedDataParallel gradients are "
                    f"synchronised only through `model(...)`; route the computation through `forward`, then run ddp again",
                )

    def _bare_call_keeps_gradients(self, model: Var, reference: cst.CSTNode, method: str) -> bool:
        """A call of the model's own method in training that the bare module
        can make (`unwrap_model(model).initHidden()`, planned with the other
        reads of the model itself): the method computes nothing from the
        parameters (`torch.zeros(1, self.hidden_size)`), or its result is
        detached where it is made (`model.encoder(x).detach().cpu().numpy()`
        for a metric): no gradient DDP must synchronise flows through it."""
        klass = self._own_class(model)
        if klass is not None and (touches_no_parameter(klass, method) or plain_forward(klass, method)):
            return True  # (a plain forward is routed through the wrapper: see references.py)
        call = self._method_call(reference)
        return call is not None and detached_where_made(self.script, call)

    def _own_class(self, model: Var) -> Optional[cst.ClassDef]:
        """The file's model class of `model`, through the callers that pass it in."""
        for _ in range(FOLLOW_DEPTH + 1):
            klass = self._model_class(model)
            caller = self._caller_binding(model) if klass is None else None
            if caller is None:
                return klass
            model = caller[0]
        return None

    def _method_call(self, reference: cst.CSTNode) -> Optional[cst.Call]:
        """The call `model.method(...)` (or `model.module.method(...)`) starting at `reference`."""
        node = self.parent(reference)
        if isinstance(node, cst.Attribute) and node.attr.value == "module":
            node = self.parent(node)
        call = self.parent(node)
        return call if isinstance(call, cst.Call) and call.func is node else None

    def _method_trains_model(self, model: Var, method: str) -> bool:
        """`model.fit(loader, optimizer)`: a method of the model's class (in this
        file) that trains, calling `self(...)` past any wrapper."""
        klass = self._model_class(model)
        found = method_of(klass, method) if klass is not None else None
        return found is not None and self._trains(found.body)

    def _in_training(self, node: cst.CSTNode) -> bool:
        """Does `node` run where gradients flow to a backward: in a loop whose
        body trains, or in a function that trains and is called in a loop
        (a step function), outside no_grad?"""
        if self.script.in_evaluation(node):
            return False
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.For, cst.While)) and self._trains(ancestor.body):
                return True
            if isinstance(ancestor, cst.FunctionDef):
                function = self.script.flow.functions.get(ancestor)
                return (
                    function is not None
                    and self._trains(ancestor.body)
                    and any(self.innermost_loop(site.call) is not None for site in function.callers)
                )
        return False

    def _compiles_model(self, statement: cst.SimpleStatementLine, model: Var) -> bool:
        """`model = torch.compile(model, ...)`: compiling the DDP model is the recommended order."""
        value = statement.body[0].value
        first = first_positional(value) if isinstance(value, cst.Call) else None
        return (
            first is not None
            and self.is_call_to(value, {"torch.compile"})
            and self._var_of(first.value) == model
        )

    def _own_method_called(self, reference: cst.CSTNode) -> Optional[str]:
        """`model.encode(...)` or `model.module.encode(...)`: the method's name."""
        node = reference
        attribute = self.parent(node)
        if isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "module":
            node, attribute = attribute, self.parent(attribute)
        if not (isinstance(attribute, cst.Attribute) and attribute.value is node):
            return None
        call = self.parent(attribute)
        name = attribute.attr.value
        if isinstance(call, cst.Call) and call.func is attribute and name not in MODULE_API | UNWRAP_API:
            return name
        return None
