"""channels-last: conv nets and their 4-D inputs in the channels-last memory format.

What it does
    For a trained model that holds 2-D convolutions, inserts
    `model = to_channels_last(model)` after the statement where the model is
    built and placed, and sends the first input of each of its forward
    calls in the training step through `to_channels_last(...)`:
    `model(images)` becomes `model(to_channels_last(images))`.

Why
    cuDNN's convolution kernels on tensor cores read NHWC: in the default
    NCHW layout every convolution transposes its input and output. With the
    weights and the inputs channels-last (the same shapes, other strides),
    convolutions under autocast run 10-30% faster; the layout then flows
    through the network on its own.

Order
    It runs after `device` and before `ddp`, so the model is converted
    before DistributedDataParallel registers the gradient buckets of its
    parameters (converting after the wrap would make every gradient copy
    through buckets of another layout).

Run-time gate
    `to_channels_last` (accelmigrate.runtime.speed) converts a module whose
    parameters are on CUDA and a 4-D tensor on CUDA; anything else (a CPU
    run, a 2-D input, a tuple) passes unchanged, so a CPU run keeps its
    numbers. ACCELMIGRATE_CHANNELS_LAST=1 converts on a CPU too, =0 never.

Example
    Before::

        model = ResNet().to(device)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(images), labels)

    After::

        model = ResNet().to(device)
        model = to_channels_last(model)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(to_channels_last(images)), labels)

Left alone
    Models without 2-D convolutions (3-D ones would need
    `channels_last_3d`); a file that already uses channels-last; a model
    built or moved in a loop, bound by unpacking or passed inline, and
    forward calls whose input cannot be seen (`model(*batch)`, only
    keywords), each with a finding to convert by hand (AM731); evaluation
    forwards (a channels-last model accepts NCHW inputs too). AM730 is the
    fix, one per model.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._base import dotted_name
from ._speed import RUNTIME
from ._speed.entry import attribute_set
from ._speed.models import NotReady, is_conv_net, ready_model, trained_models
from ._speed.statements import InsertingCodemod

CHANNELS_LAST = frozenset({"torch.channels_last", f"{RUNTIME}.to_channels_last"})
TWO_D = frozenset({2})


class ChannelsLast(InsertingCodemod):
    word = "channels-last"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "conv nets: the model and its 4-D training inputs channels-last (on CUDA)"
    codes = {
        "AM730": "conv net trained in the channels-first memory format",
        "AM731": "conv net whose model or inputs cannot be converted here: convert them by hand",
    }
    triggers = ("backward",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._inputs: set[cst.CSTNode] = set()  # first arguments of forward calls to convert

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        script = self.script
        if attribute_set(script, CHANNELS_LAST) is not None:
            return
        for entity in trained_models(script):
            if is_conv_net(script, entity, TWO_D):
                self._convert(entity)

    def _convert(self, entity) -> None:
        ready = ready_model(self.script, entity, before_wraps=True)
        if isinstance(ready, NotReady):
            self.report(ready.node, "AM731", f"{ready.reason}: add `{entity.name} = to_channels_last({entity.name})` by hand once it is placed, and convert its inputs")
            return
        inputs, unseen = self._forward_inputs(entity)
        if unseen is not None or not inputs:
            where = unseen if unseen is not None else ready.anchor
            self.report(where, "AM731", f"the inputs of `{entity.name}` in the training step cannot be seen here: convert the model and its 4-D inputs by hand")
            return
        name = ready.name
        if self.fix(ready.anchor, "AM730", f"`{name} = to_channels_last({name})` once placed, and its training inputs too (on CUDA; ACCELMIGRATE_CHANNELS_LAST=0|1 overrides)"):
            self.inserts.add_after(ready.anchor, f"{name} = to_channels_last({name})")
            self._inputs.update(inputs)
            self.add_import(RUNTIME, "to_channels_last")

    def _forward_inputs(self, entity) -> tuple[list, Optional[cst.CSTNode]]:
        """The first positional arguments of the model's forward calls in the
        training steps that train it; or the call whose input cannot be seen."""
        origin = entity.origin
        inputs = []
        for step in self.script.training_steps:
            if not any(m.origin is origin for m in step.models):
                continue
            for call in step.function.calls:
                if not self._calls_model(call, origin) or self.script.in_evaluation(call):
                    continue
                first = call.args[0] if call.args else None
                if first is None or first.keyword is not None or first.star:
                    return [], call
                inputs.append(first.value)
        return inputs, None

    def _calls_model(self, call: cst.Call, origin) -> bool:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        if not dotted_name(func):
            return False
        return any(e.origin is origin for e in self.script.entities_of(func))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.value not in self._inputs:
            return updated_node
        converted = cst.Call(func=cst.Name("to_channels_last"), args=[cst.Arg(updated_node.value)])
        return updated_node.with_changes(value=converted)


__all__ = ["ChannelsLast"]
