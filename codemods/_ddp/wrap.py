"""Which model the ddp codemod wraps in DistributedDataParallel, and where:
in place of `nn.DataParallel`, or else the one model the optimizers train, at
the binding training calls, once it is on its device; and the uses of the
model that must read the unwrapped one (`state_dict`, `.module`, `torch.save`).
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from .._base import is_main_guard, is_name, keyword_arg, walk
from ..script import vocabulary as v
from ..script.uses import FOLLOW_DEPTH
from .output import SUMMARY_WRITERS
from .common import RUNTIME, CannotMigrate, Insertion, Var, as_atom, call_of, first_positional, keyword_of
from .queries import ScriptQueries, method_of

# Attributes of a model that mean the same on DistributedDataParallel.
MODULE_API = frozenset(
    {
        "train", "eval", "parameters", "buffers", "children", "modules", "zero_grad", "to", "cuda", "cpu",
        "float", "half", "double", "bfloat16", "type", "apply", "requires_grad_", "training", "forward",
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "register_backward_hook", "share_memory", "no_sync",
    }
)
# ...and those that must go to the unwrapped model (names and keys without `module.`).
UNWRAP_API = frozenset(
    {"state_dict", "load_state_dict", "named_parameters", "named_buffers", "named_modules", "named_children"}
)
MOVES = frozenset({"to", "cuda"})
LOCAL_BUFFERS_NOTE = (
    "; `**rank_local_buffers()`: it runs several forwards per step, so each rank keeps its own BatchNorm "
    "statistics during forwards (the parameters stay equal; rank 0's are saved)"
)
UNUSED_NOTE = (
    "; `find_unused_parameters=True`: its `forward` calls {layers} only under a condition, so a step may leave "
    "their parameters without gradients"
)
# Calls that trace or inspect a module given as their first argument: they
# need the user's module, not its DDP wrapper.
INSPECTING_CALLS = frozenset(
    {
        "torchinfo.summary", "torchsummary.summary", "torch.jit.trace", "torch.jit.script", "torch.onnx.export",
        "torch.fx.symbolic_trace", "thop.profile", "ptflops.get_model_complexity_info",
    }
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


class ModelWrapping(ScriptQueries):
    """Plans the wrap and the unwrapping reads."""

    def _vars_wrapped_by(self, calls: list[cst.Call]) -> list[Var]:
        """`model` of each existing `model = DistributedDataParallel(model, ...)`."""
        found: list[Var] = []
        for call in calls:
            assign = self.parent(call)
            if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
                var = self._target_var(assign.targets[0].target)
                if var is not None and var not in found:
                    found.append(var)
        return found

    def _plan_models(self) -> list[Var]:
        """Plan wrapping the trained models in DistributedDataParallel; the variables that hold them."""
        wrappers = self._calls_to(v.DATA_PARALLEL)
        if not wrappers:
            return self._plan_bare_models()
        trained = {var: None for site in self._update_sites() for var in self._models_trained_by(site)}  # in order
        converted, covered = [], set()
        for call in wrappers:
            _, _, model = self._wrapper_assignment(call)
            inner = first_positional(call)
            inner_var = self._moved_var(inner.value) if inner is not None else None
            if trained and model not in trained and inner_var not in trained:
                self._plan_drop_data_parallel(call, model)
                continue
            if len(wrappers) > 1 and not trained:
                raise CannotMigrate(
                    call, "AM520",
                    f"several models are wrapped in DataParallel and no optimizer here shows which of them trains: "
                    f"ddp changed nothing; drop the DataParallel of each model that only runs inference (or wrap each "
                    f"trained one in DistributedDataParallel by hand), then run ddp again",
                )
            converted.append((call, model))
            covered.update({model, inner_var})
        several = len(converted) > 1
        models = [self._plan_data_parallel_step(call, model, several) for call, model in converted]
        left = {var: None for var in trained if var not in covered}
        return models + (self._plan_bare_models(left) if left else [])

    def _moved_var(self, expression: cst.BaseExpression) -> Optional[Var]:
        """The variable of `net`, `net.to(device)` or `net.cuda().float()`."""
        while (
            isinstance(expression, cst.Call)
            and isinstance(expression.func, cst.Attribute)
            and expression.func.attr.value in v.SELF_RETURNING_MODULE_METHODS
        ):
            expression = expression.func.value
        return self._var_of(expression)

    def _plan_data_parallel_step(self, call: cst.Call, model: Var, several: bool) -> Var:
        local_buffers = several and self._training_calls(model) > 1
        unused = self._layers_used_conditionally(model)
        model, anchor, apply = self._plan_data_parallel(call, local_buffers, bool(unused))
        message = f"`DataParallel` -> `DistributedDataParallel` for `{model.code}` once it is on its device (only when launched on several processes)"
        dropped = [keyword_of(a) or "a positional argument" for a in call.args[1:]]
        if dropped:
            message += f"; its {', '.join(dropped)} dropped: each process computes on its own device"
        message += self._wrap_notes(local_buffers, unused)
        self._plan_wrap_step(model, anchor, call, "AM502", message, apply, local_buffers)
        return model

    def _wrap_notes(self, local_buffers: bool, unused: list[str]) -> str:
        notes = UNUSED_NOTE.format(layers=", ".join(f"`{name}`" for name in unused)) if unused else ""
        return notes + (LOCAL_BUFFERS_NOTE if local_buffers else "")

    def _plan_wrap_step(
        self, model: Var, anchor: cst.CSTNode, node: cst.CSTNode, code: str, message: str, apply: Callable[[], None],
        local_buffers: bool = False,
    ) -> None:
        self._check_model_uses(model, anchor)

        def wrap() -> None:
            self._use("is_distributed", "DistributedDataParallel", "ddp_device_ids")
            if local_buffers:
                self._use("rank_local_buffers")
            apply()

        self._step(node, code, message, wrap, core=True)

    def _plan_drop_data_parallel(self, call: cst.Call, model: Var) -> None:
        """A model in DataParallel that no optimizer trains (a distillation
        teacher, a second model that reloads the trained one's checkpoint for
        inference): each process runs it whole on its own device, so its
        DataParallel goes; `.module` still reads the model itself."""
        line, assign, _ = self._wrapper_assignment(call)
        chained = self._self_returning_chain(call, assign.value)
        inner = first_positional(call)
        if inner is None:
            raise CannotMigrate(call, "AM520", "DataParallel without a module argument: remove it by hand")
        rebinds_itself = not chained and self._var_of(inner.value) == model
        imported = self._from_import(call.func)

        def apply() -> None:
            if rebinds_itself:  # teacher = nn.DataParallel(teacher)
                self._remove.add(line)
                self._forget_import(imported)
            else:
                self._strip_data_parallel(call, chained, imported)

        self._step(
            call, "AM513",
            f"`DataParallel` dropped from `{model.code}`: no optimizer trains it, so each process runs it whole on its "
            f"own device; `state_dict`s it loads carry no `module.` prefix (strip it from older checkpoints with "
            f"`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, \"module.\")`)",
            apply, core=True,
        )
        for reference, _ in self._followed_references(model):
            parent = self.parent(reference)
            if isinstance(parent, cst.Attribute) and parent.value is reference and parent.attr.value == "module":
                self._plan_unwrap(parent, reference, f"`{self._code(reference)}.module` -> `unwrap_model({self._code(reference)})`")

    def _ddp_wrap(
        self, model: Var, trailing: Optional[cst.TrailingWhitespace] = None, local_buffers: bool = False, unused: bool = False
    ) -> cst.If:
        target = model.code
        nl, indent = self._module.default_newline, self._module.default_indent
        # The runtime spells it for the torch that runs the script (`broadcast_buffers`
        # is deprecated for `forward_sync_buffers` in newer versions).
        extra = (", find_unused_parameters=True" if unused else "") + (", **rank_local_buffers()" if local_buffers else "")
        statement = cst.parse_statement(
            f"if is_distributed():{nl}{indent}{target} = DistributedDataParallel({target}, device_ids=ddp_device_ids({target}){extra}){nl}",
            config=self._config,
        )
        if trailing is not None and trailing.comment is not None:
            inner = statement.body.body[0].with_changes(trailing_whitespace=trailing)
            statement = statement.with_changes(body=statement.body.with_changes(body=[inner]))
        return statement

    def _plan_data_parallel(self, call: cst.Call, local_buffers: bool, unused: bool) -> tuple[Var, cst.CSTNode, Callable[[], None]]:
        line, assign, model = self._wrapper_assignment(call)
        inner = first_positional(call)
        if inner is None:
            raise CannotMigrate(call, "AM520", "DataParallel without a module argument: replace it by DistributedDataParallel by hand")
        chained = self._self_returning_chain(call, assign.value)
        rebinds_itself = not chained and self._var_of(inner.value) == model  # model = nn.DataParallel(model)
        anchor, conditions = self._unconditional_anchor(line)
        if conditions and not rebinds_itself:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel under a condition, in another form than `model = nn.DataParallel(model)`: replace it by "
                "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` "
                "after the model is on its device",
            )
        anchor = self._after_apex_initialize(model, self._after_moves(anchor, model))
        wrap = self._ddp_wrap(model, line.trailing_whitespace if rebinds_itself else None, local_buffers, unused)
        if rebinds_itself:  # the comments about the DataParallel line now describe the wrap
            wrap = wrap.with_changes(leading_lines=[l for l in line.leading_lines if l.comment is not None])
        imported = self._from_import(call.func)

        def apply() -> None:
            if rebinds_itself:
                self._remove.add(line)
                self._comments_moved.add(line)
                for condition in conditions:  # innermost first
                    if all(s in self._remove for s in condition.body.body):
                        self._remove.add(condition)
                self._forget_import(imported)
            else:
                self._strip_data_parallel(call, chained, imported)
            self._after.setdefault(anchor, []).append(wrap)

        return model, anchor, apply

    def _strip_data_parallel(self, call: cst.Call, chained: bool, imported) -> None:
        """`model = nn.DataParallel(Net()).to(device)` -> `model = Net().to(device)`."""
        self._edits[call] = lambda updated: as_atom(updated.args[0].value) if chained else updated.args[0].value
        self._forget_import(imported)

    def _forget_import(self, imported) -> None:
        """`from torch.nn import DataParallel` may be unused now."""
        if imported is not None:
            RemoveImportsVisitor.remove_unused_import(self.context, *imported)

    def _wrapper_assignment(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, cst.Assign, Var]:
        """`model = nn.DataParallel(...)[.to(...)...]`: its line, Assign and target."""
        expression: cst.CSTNode = call
        parent = self.parent(expression)
        while isinstance(parent, cst.Attribute) and isinstance(self.parent(parent), cst.Call):
            expression = self.parent(parent)
            parent = self.parent(expression)
        if isinstance(parent, cst.Return):
            raise CannotMigrate(
                call, "AM520",
                "DataParallel returned from a function: wrap the returned model where it is used, after it is "
                "on its device: `if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))`",
            )
        statement = self.assignment_line(expression)
        if statement is None:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel outside a plain `model = nn.DataParallel(...)` statement: replace it by "
                "DistributedDataParallel by hand, once the model is on its device",
            )
        line, assign = statement
        model = self._target_var(assign.targets[0].target)
        if model is None:
            raise CannotMigrate(call, "AM520", "DataParallel assigned to something other than a name or `self.<name>`: wrap the model by hand")
        return line, assign, model

    def _self_returning_chain(self, call: cst.Call, value: cst.BaseExpression) -> bool:
        """True when `value` is `call` followed by methods that return the model
        itself (`.to(device)`, `.cuda()`, ...); raises for any other chain."""
        node: cst.CSTNode = call
        chained = False
        while node is not value:
            attribute = self.parent(node)
            if not (isinstance(attribute, cst.Attribute) and attribute.attr.value in v.SELF_RETURNING_MODULE_METHODS):
                raise CannotMigrate(call, "AM520", "DataParallel(...) followed by a method other than .to()/.cuda(): wrap the model by hand")
            node = self.parent(attribute)
            chained = True
        return chained

    def _unconditional_anchor(self, line: cst.SimpleStatementLine) -> tuple[cst.CSTNode, list[cst.If]]:
        """The statement that runs whenever `line` could: `line` itself, or the
        outermost `if` around it whose bodies hold nothing else but output
        (`if torch.cuda.device_count() > 1: print(...); model = nn.DataParallel(model)`)."""
        anchor: cst.CSTNode = line
        conditions: list[cst.If] = []
        while True:
            block = self.parent(anchor)
            owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if isinstance(owner, cst.If) and is_main_guard(owner.test):
                return anchor, conditions  # the script's entry point runs unconditionally
            if not isinstance(owner, cst.If) or owner.orelse is not None or block is not owner.body:
                if isinstance(owner, (cst.For, cst.While, cst.With, cst.Try, cst.If)):
                    raise CannotMigrate(line, "AM520", "DataParallel inside a loop, `with`, `try` or `if`/`else`: wrap the model by hand")
                return anchor, conditions
            others = [s for s in owner.body.body if s is not anchor]
            if not all(self._is_output_statement(s) for s in others):
                raise CannotMigrate(
                    line, "AM520",
                    "DataParallel under a condition that also does other work: replace it by "
                    "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` by hand",
                )
            conditions.append(owner)
            anchor = owner

    def _after_moves(self, anchor: cst.CSTNode, model: Var) -> cst.CSTNode:
        """The last statement of `anchor`'s block, from `anchor` on, that moves the
        model to its device (`model.to(device)`): DDP wraps a model in place."""
        block = self.parent(anchor)
        body = list(block.body)
        last = anchor
        for statement in body[body.index(anchor) + 1:]:
            if self._moves_model(statement, model):
                last = statement
        return last

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
                    models.setdefault(var, site)
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
        unused = self._layers_used_conditionally(model)
        wrap = self._ddp_wrap(model, local_buffers=local_buffers, unused=bool(unused))
        message = f"`{model.code}` wrapped in `DistributedDataParallel` once it is on its device (only when launched on several processes)"
        if after_apex:
            message += ", after `amp.initialize` (apex wraps the bare model first)"
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
            if self._called_outside_no_grad(model) or self._parameter_of(model) is None:
                return model, site  # a model built here is wrapped here (and returned wrapped, if it is)
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
        return False

    def _models_trained_by(self, optimizer: cst.Call) -> list[Var]:
        """The models whose parameters the optimizer (or update) takes, in
        source order (a Var hashes by identity: a set's order would vary)."""
        if isinstance(optimizer.func, cst.Attribute) and optimizer.func.attr.value == "parameters":  # a hand-written update
            root = self._root_var(optimizer.func.value)
            return [root] if root is not None else []
        params = first_positional(optimizer) or keyword_arg(optimizer, "params")
        if params is None:
            return []
        expressions = [params.value]
        if isinstance(params.value, cst.Name):  # params = [p for p in model.parameters() if ...]
            expressions.extend(self._assigned_values(params.value))
        models: dict[Var, None] = {}
        for expression in expressions:
            for node in walk(expression):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("parameters", "named_parameters")
                ):
                    root = self._root_var(node.func.value)
                    if root is not None:
                        models[root] = None
        return list(models)

    def _bare_model_anchor(self, model: Var, optimizer: cst.Call) -> tuple[cst.CSTNode, bool]:
        """Where the wrap goes: after the last statement that binds or moves the
        model before the optimizer is built, in a block that also builds the
        optimizer; else just before the statement that builds it."""
        optimizer_line = self._position(optimizer)[0]
        best = None
        for statement in self._statements_binding(model):
            if self._position(statement)[0] >= optimizer_line:
                continue
            block = self.parent(statement)
            if not any(a is block for a in self.ancestors(optimizer)):
                continue
            if best is None or self._position(statement) > self._position(best):
                best = statement
        if best is not None:
            return self._after_moves(best, model), False
        statement, block = self._block_statement(optimizer)
        if statement is None or self.innermost_loop(statement) is not None:
            raise CannotMigrate(
                optimizer, "AM520",
                f"cannot find where `{model.code}` is built and moved to its device: after that, add "
                f"`if is_distributed(): {model.code} = DistributedDataParallel({model.code}, device_ids=ddp_device_ids({model.code}))`",
            )
        return statement, True

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
        wrap_line = self._position(anchor, end=True)[0]
        for statement in self._statements_binding(model):
            if self._position(statement)[0] > wrap_line and not self._compiles_model(statement, model):
                raise CannotMigrate(
                    statement, "AM520",
                    f"`{model.code}` is moved or rebound after the point where ddp would wrap it: make the model final "
                    f"and on its device first, then wrap it in DistributedDataParallel by hand",
                )
        for reference, _ in self._followed_references(model):
            method = self._own_method_called(reference)
            if method is not None and (self._in_training(reference) or self._method_trains_model(model, method)):
                raise CannotMigrate(
                    reference, "AM527",
                    f"the model's own method `{method}` is called: under DistributedDataParallel gradients are "
                    f"synchronised only through `model(...)`; route the computation through `forward`, then run ddp again",
                )

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

    def _plan_model_references(self, model: Var, had_data_parallel: bool) -> None:
        """`model.state_dict()` / `.load_state_dict()` / `.named_*()` / `.module` /
        `torch.save(model)` go to the unwrapped model, in every world size alike."""
        for reference, _ in self._followed_references(model):
            parent = self.parent(reference)
            name = self._code(reference)
            if isinstance(parent, cst.Arg) and self._is_unwrap_argument(parent):
                continue
            if isinstance(parent, cst.Attribute) and parent.value is reference:
                attribute = parent.attr.value
                if attribute == "module":
                    self._plan_unwrap(parent, reference, f"`{name}.module` -> `unwrap_model({name})`")
                elif attribute == "load_state_dict" and had_data_parallel:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.load_state_dict` -> `unwrap_model({name}).load_state_dict`: checkpoints are saved "
                        f"without `module.` now; strip it from older ones with "
                        f"`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, \"module.\")`",
                    )
                elif attribute in UNWRAP_API:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.{attribute}` -> `unwrap_model({name}).{attribute}`: names without `module.`, whatever the world size",
                    )
                elif attribute not in MODULE_API:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.{attribute}` -> `unwrap_model({name}).{attribute}`: the model's own, which its DDP wrapper lacks",
                    )
            elif isinstance(parent, cst.Subscript) and parent.value is reference:
                self._plan_unwrap(reference, reference, f"`{name}[...]` -> `unwrap_model({name})[...]`: DDP has no layers to index")
            elif isinstance(parent, cst.Arg) and parent.keyword is None:
                call = self.parent(parent)
                if not (isinstance(call, cst.Call) and call.args[0] is parent):
                    continue
                if self.is_call_to(call, v.TORCH_SAVE):
                    self._plan_unwrap(reference, reference, f"`torch.save(unwrap_model({name}), ...)`: the model itself, not its DDP wrapper")
                elif self.is_call_to(call, INSPECTING_CALLS) or self._adds_graph(call):
                    self._plan_unwrap(
                        reference, reference,
                        f"`{self._code(call.func)}(unwrap_model({name}), ...)`: it traces or inspects the model itself, not its DDP wrapper",
                    )

    def _adds_graph(self, call: cst.Call) -> bool:
        """`writer.add_graph(model, ...)` on a `writer = SummaryWriter(...)`."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "add_graph" and isinstance(func.value, cst.Name)):
            return False
        return any(
            isinstance(value, cst.Call) and self.is_call_to(value, SUMMARY_WRITERS) for value in self._assigned_values(func.value)
        )

    def _is_unwrap_argument(self, arg: cst.Arg) -> bool:
        call = self.parent(arg)
        return isinstance(call, cst.Call) and self.is_qualified(call.func, {f"{RUNTIME}.unwrap_model"})

    def _plan_unwrap(self, node: cst.CSTNode, reference: cst.CSTNode, message: str) -> None:
        def apply() -> None:
            self._use("unwrap_model")
            if node is reference:
                self._edits[node] = lambda updated: call_of("unwrap_model", updated)
            else:
                self._edits[node] = lambda updated: call_of("unwrap_model", updated.value)

        self._step(node, "AM508", message, apply)
