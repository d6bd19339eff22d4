"""The uses of a model that ddp wraps which must read the unwrapped one:
`state_dict` and the `named_*` methods (names without `module.`), `.module`,
the model's own methods and layers, `torch.save(model)` and the calls that
trace or inspect it (torchinfo, jit, onnx, `add_graph`): each goes through
`unwrap_model(...)`, in every world size alike.
"""

from __future__ import annotations

import libcst as cst

from ..script import vocabulary as v
from ..script.entities import plain_forward
from .common import RUNTIME, Var, call_of
from .foreign_calls import ForeignCalls
from .output import SUMMARY_WRITERS

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
# Calls that trace or inspect a module given as their first argument: they
# need the user's module, not its DDP wrapper.
INSPECTING_CALLS = frozenset(
    {
        "torchinfo.summary", "torchsummary.summary", "torch.jit.trace", "torch.jit.script", "torch.onnx.export",
        "torch.fx.symbolic_trace", "thop.profile", "ptflops.get_model_complexity_info",
    }
)


class ModelReferences(ForeignCalls):
    """Plans the reads of a wrapped model that go to the model itself."""

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
                elif attribute not in MODULE_API and self._calls_plain_forward(model, parent):
                    self._plan_forward_route(parent, name)
                elif attribute not in MODULE_API:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.{attribute}` -> `unwrap_model({name}).{attribute}`: the model's own, which its DDP wrapper lacks",
                    )
            elif self._saved_in_a_checkpoint(reference):
                self._plan_unwrap(
                    reference, reference,
                    f"`unwrap_model({name})` in the checkpoint `torch.save` writes: the model itself, not its DDP "
                    f"wrapper (which a later run could not load)",
                )
            elif isinstance(parent, cst.Subscript) and parent.value is reference:
                self._plan_unwrap(reference, reference, f"`{name}[...]` -> `unwrap_model({name})[...]`: DDP has no layers to index")
            elif isinstance(parent, cst.Arg) and parent.value is reference and not parent.star:
                call = self.parent(parent)
                if isinstance(call, cst.Call) and self._takes_bare_model(call, parent):
                    self._plan_unwrap(
                        reference, reference,
                        f"`{self._code(call.func)}(unwrap_model({name}), ...)`: a function of another module gets the "
                        f"model itself, whose own attributes the DDP wrapper lacks (it does not train through it here: "
                        f"no optimizer given, its result feeds no backward; if it trains, pass `{name}` itself)",
                    )
                    continue
                if not (isinstance(call, cst.Call) and call.args[0] is parent and parent.keyword is None):
                    continue
                if self.is_call_to(call, v.TORCH_SAVE):
                    self._plan_unwrap(reference, reference, f"`torch.save(unwrap_model({name}), ...)`: the model itself, not its DDP wrapper")
                elif self.is_call_to(call, INSPECTING_CALLS) or self._adds_graph(call):
                    self._plan_unwrap(
                        reference, reference,
                        f"`{self._code(call.func)}(unwrap_model({name}), ...)`: it traces or inspects the model itself, not its DDP wrapper",
                    )

    def _saved_in_a_checkpoint(self, reference: cst.CSTNode) -> bool:
        """`reference` is a value of a dict, list or tuple that `torch.save`
        writes: `torch.save({"epoch": epoch, "model": model}, path)`, or the
        container bound to a name first (`state = {...}`, `torch.save(state, path)`)."""
        element = self.parent(reference)
        if not (isinstance(element, (cst.DictElement, cst.Element)) and element.value is reference):
            return False
        container = self.parent(element)
        saved = [container]
        assign = self.parent(container)
        if isinstance(assign, cst.Assign) and assign.value is container and len(assign.targets) == 1:
            var = self._target_var(assign.targets[0].target)
            saved += self._references(var) if var is not None else []
        for node in saved:
            argument = self.parent(node)
            call = self.parent(argument) if isinstance(argument, cst.Arg) else None
            if isinstance(call, cst.Call) and call.args[0] is argument and argument.keyword is None and self.is_call_to(call, v.TORCH_SAVE):
                return True
        return False

    def _calls_plain_forward(self, model: Var, attribute: cst.Attribute) -> bool:
        """`model.predict(x)`, where the class's `predict` only returns `self(x)`."""
        call = self.parent(attribute)
        if not (isinstance(call, cst.Call) and call.func is attribute):
            return False
        klass = self._own_class(model)
        return klass is not None and plain_forward(klass, attribute.attr.value)

    def _plan_forward_route(self, attribute: cst.Attribute, name: str) -> None:
        """`model.predict(x)` -> `model(x)`: the same forward, through the
        wrapper, which synchronises its gradients."""

        def apply() -> None:
            self._edits[attribute] = lambda updated: updated.value

        self._step(
            attribute, "AM527",
            f"`{name}.{attribute.attr.value}(...)` -> `{name}(...)`: the method only runs the model's forward, and a "
            f"call of the DDP wrapper synchronises its gradients",
            apply,
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
