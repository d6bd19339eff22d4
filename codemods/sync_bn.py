"""sync-bn: BatchNorm layers synchronised across DDP processes (SyncBatchNorm).

What it does
    Before a model is wrapped in `DistributedDataParallel` (as the `ddp`
    codemod writes it, `model = DistributedDataParallel(model, ...)`), inserts
    `model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`, which
    replaces every BatchNorm layer of the model by a SyncBatchNorm that keeps
    the same parameters and running statistics.

Why
    With DataParallel, a BatchNorm layer normalised each GPU's slice of the
    batch, but with DDP every process normalises only its own per-process
    batch, which the `ddp` codemod makes world-size times smaller: at small
    per-GPU batches (detection, segmentation, 3D), the batch statistics get
    noisy and accuracy drops. SyncBatchNorm computes the statistics over the
    global batch, at the cost of one all-gather per BatchNorm layer per step.

Example
    Before::

        if is_distributed():
            model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))

    After::

        if is_distributed():
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))

    The conversion is spelled with a name that means torch in that scope
    (`torch`, the script's own alias such as `T` or `nn`, or an added
    `from torch.nn import SyncBatchNorm` when a local variable is named
    `torch`). A wrap that passes `process_group=` passes the same group to
    the conversion, so that the statistics are reduced over the processes
    whose gradients are.

Left alone
    A model the `ddp` codemod could not wrap (a finding says so), and a file
    that already calls `convert_sync_batchnorm` itself. A model sure to have
    no BatchNorm layer gets nothing (AM544, a note): it is built from torch
    layers other than BatchNorm (`nn.Sequential(nn.Linear(...), ...)`) or
    from classes of this file that build only such layers, and its
    construction passes no model built elsewhere. A model from elsewhere
    (torchvision, another module, torch.hub) may have some, and is converted.
    A wrap whose process
    group is not a plain name (`process_group=dist.new_group(...)`) or cannot
    be seen (`**kwargs`): a finding says to convert with that group by hand.
    The conversion sits in the distributed branch: a world of one keeps its
    BatchNorm layers. SyncBatchNorm needs GPUs (nccl): torch refuses to
    synchronise CPU tensors, so a CPU launch of several processes should not
    use this word.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from ._base import Codemod, code_of, keyword_arg, walk
from .script.layers import BATCH_NORM, CONVERT
from ._ddp.common import is_plain_reference
from .script import vocabulary as v
from .script.uses import uses_of
from .script.ddp_spelling import is_unbound, spelling_at

RANK_LOCAL_BUFFERS = "accelmigrate.runtime.distributed.rank_local_buffers"

TRAINING_SIGNS = v.DATA_PARALLEL | v.DATALOADER
# Imported names that can spell SyncBatchNorm, from the outermost module in.
SYNC_BATCH_NORM_PATHS = (("torch", "nn.SyncBatchNorm"), ("torch.nn", "SyncBatchNorm"), ("torch.nn.SyncBatchNorm", ""))
# DistributedDataParallel(module, device_ids, output_device, dim, broadcast_buffers, init_sync, process_group, ...)
PROCESS_GROUP_POSITION = 6
# torch callables that may hand back a model of unknown layers
TORCH_LOADERS = ("torch.hub.", "torch.load", "torch.jit.", "torch.export.")
WRAPPERS = v.DATA_PARALLEL | v.DISTRIBUTED_DATA_PARALLEL
# Methods of a model that return the model itself (`Net().cuda()`).
MODEL_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "double", "to_empty"})
MODEL_TRACE_DEPTH = 8  # names and wrappers followed back to the model's construction


class SyncBatchNorm(Codemod):
    word = "sync-bn"
    summary = "BatchNorm -> SyncBatchNorm before DistributedDataParallel wraps the model"
    requires = ("ddp",)
    codes = {
        "AM540": "BatchNorm layers that compute batch statistics per process under DDP (SyncBatchNorm shares them)",
        "AM541": "no DistributedDataParallel wrap found to convert before",
        "AM542": "the wrap's process group cannot be passed to the conversion",
        "AM543": "no name for torch.nn.SyncBatchNorm where the conversion goes",
        "AM544": "model without BatchNorm layers: nothing to convert",
    }
    notes = frozenset({"AM544"})
    # The same as ddp's: this word runs on what ddp wrote, which may be new.
    triggers = ("DataParallel", "DataLoader", "optim")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._convert_before: dict[cst.CSTNode, str] = {}  # statement -> the conversion's code
        self._wraps: list[cst.Call] = []
        self._training_sign: Optional[cst.CSTNode] = None  # where to report a missing wrap
        self._data_parallel_calls: list[cst.Call] = []

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        # The classes defined at the top level of this file, by name.
        self._classes = {s.name.value: s for s in node.body if isinstance(s, cst.ClassDef)}

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._wraps and self._training_sign is not None and not self._all_models_without_batch_norm():
            self.report(
                self._training_sign, "AM541",
                "no `model = DistributedDataParallel(model, ...)` found (see ddp's findings): once the model is wrapped, "
                "add `model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` just before the wrap",
            )
        return updated_node.with_changes(body=self._insert(original_node.body, updated_node.body))

    # -- finding the wraps ------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, v.DATA_PARALLEL):
            self._data_parallel_calls.append(node)
        if self._training_sign is None and (self.is_call_to(node, TRAINING_SIGNS) or self.script.makes_optimizer(node)):
            self._training_sign = node
        if not self.is_call_to(node, v.DISTRIBUTED_DATA_PARALLEL):
            return
        self._wraps.append(node)
        if node.args and self._without_batch_norm(node.args[0].value):
            self.report(node, "AM544", f"`{code_of(node.args[0].value)}` has no BatchNorm layer (it is built in this file from layers without one): nothing to convert")
            return
        statement, model = self._wrap_statement(node)
        if statement is None:
            self.report(node, "AM541", "DistributedDataParallel outside `model = DistributedDataParallel(model, ...)`: convert its BatchNorm layers by hand before wrapping")
            return
        if self._converted_already():
            return
        group = self._process_group(node)
        if group is None:
            self.report(
                node, "AM542",
                "the process group of this DistributedDataParallel cannot be repeated here: convert by hand just "
                "before the wrap, with `convert_sync_batchnorm(model, process_group=<the same group>)`, so that "
                "batch statistics are reduced over the processes whose gradients are",
            )
            return
        spelling = self._sync_batch_norm_at(node)
        if spelling is None:
            self.report(
                node, "AM543",
                "no name means torch here (a local variable shadows `torch` and `SyncBatchNorm`): convert by hand "
                "just before the wrap with `convert_sync_batchnorm`",
            )
            return
        extra = f", process_group={group}" if group else ""
        convert = f"{model} = {spelling}.convert_sync_batchnorm({model}{extra})"
        if self.fix(node, "AM540", f"`{convert}` before wrapping: batch statistics over the global batch (GPUs only)"):
            self._convert_before[statement] = convert
            self._add_import_for(spelling)

    def _wrap_statement(self, call: cst.Call) -> tuple[Optional[cst.SimpleStatementLine], str]:
        """`model = DistributedDataParallel(model, ...)` on its own line: (line, "model")."""
        statement = self.assignment_line(call)
        if statement is None or not call.args or call.args[0].keyword is not None or call.args[0].star:
            return None, ""
        line, assign = statement
        target = self._module.code_for_node(assign.targets[0].target).strip()
        if self._module.code_for_node(call.args[0].value).strip() != target:
            return None, ""
        return line, target

    def _process_group(self, call: cst.Call) -> Optional[str]:
        """The wrap's process group as code that reads the same group just
        before the wrap: "" for the default group, None when it cannot be
        repeated there (a call, a hidden `**kwargs`)."""
        if any(a.star for a in call.args if not self._names_no_group(a)):
            return None
        positional = [a for a in call.args if a.keyword is None]
        given = keyword_arg(call, "process_group") or (
            positional[PROCESS_GROUP_POSITION] if len(positional) > PROCESS_GROUP_POSITION else None
        )
        if given is None or (isinstance(given.value, cst.Name) and given.value.value == "None"):
            return ""
        if not is_plain_reference(given.value):
            return None
        return self._module.code_for_node(given.value).strip()

    def _names_no_group(self, argument: cst.Arg) -> bool:
        """`**rank_local_buffers()`: the runtime's buffer settings, never a process group."""
        value = argument.value
        return (
            argument.star == "**"
            and isinstance(value, cst.Call)
            and RANK_LOCAL_BUFFERS in self.qualified_names(value.func)
        )

    def _sync_batch_norm_at(self, call: cst.Call) -> Optional[str]:
        """`torch.nn.SyncBatchNorm`, spelled with a name that reads it where the wrap is."""
        spelled = spelling_at(self.script, call, SYNC_BATCH_NORM_PATHS)
        if spelled is not None:
            return spelled
        if is_unbound(self.script, call, "torch"):
            return "torch.nn.SyncBatchNorm"
        if is_unbound(self.script, call, "SyncBatchNorm"):
            return "SyncBatchNorm"
        return None

    def _add_import_for(self, spelling: str) -> None:
        if spelling == "SyncBatchNorm":
            self.add_import("torch.nn", "SyncBatchNorm")
        elif spelling.startswith("torch."):
            self.add_import("torch")

    def _converted_already(self) -> bool:
        """The file converts BatchNorm layers itself (before DataParallel, or on a second run)."""
        return any(self.is_call_to(call, CONVERT) for call in uses_of(self.script).calls)

    # -- BatchNorm: converting is only worth a finding where there may be some ----

    def _all_models_without_batch_norm(self) -> bool:
        """Every model the file builds or wraps in DataParallel is sure to have no BatchNorm."""
        built = [m.value for m in self.script.models]
        wrapped = [call.args[0].value for call in self._data_parallel_calls if call.args]
        models = built + wrapped
        return bool(models) and all(m is not None and self._without_batch_norm(m) for m in models)

    def _without_batch_norm(self, model: cst.BaseExpression, depth: int = 0) -> bool:
        """The model is sure to hold no BatchNorm layer: followed through
        wrappers, moves (`.cuda()`) and names back to where it is built, that
        expression builds only torch layers other than BatchNorm and classes
        of this file that do the same, and passes no model built elsewhere."""
        if depth > MODEL_TRACE_DEPTH:
            return False
        if isinstance(model, cst.Call):
            if self.is_call_to(model, WRAPPERS):
                return bool(model.args) and self._without_batch_norm(model.args[0].value, depth + 1)
            if isinstance(model.func, cst.Attribute) and model.func.attr.value in MODEL_METHODS:
                return self._without_batch_norm(model.func.value, depth + 1)
            return self._code_without_batch_norm(model, set(), in_class=False)
        entity = self.script.entity(model)
        built = entity.origin.value if entity is not None else None
        return built is not None and built is not model and self._without_batch_norm(built, depth + 1)

    def _code_without_batch_norm(self, code: cst.CSTNode, seen: set[str], *, in_class: bool) -> bool:
        """`code` names no BatchNorm class, passes no model built elsewhere,
        and each call in it builds no BatchNorm layer."""
        for node in walk(code):
            if isinstance(node, (cst.Name, cst.Attribute)):
                if self.qualified_names(node) & BATCH_NORM or (not in_class and self.script.is_model(node)):
                    return False
            elif isinstance(node, cst.Call) and not self._builds_no_batch_norm(node, seen, in_class=in_class):
                return False
        return True

    def _class_without_batch_norm(self, name: str, seen: set[str]) -> bool:
        seen.add(name)
        return self._code_without_batch_norm(self._classes[name], seen, in_class=True)

    def _builds_no_batch_norm(self, call: cst.Call, seen: set[str], *, in_class: bool) -> bool:
        """The call builds no BatchNorm layer: a torch layer or function, a
        builtin, a class of this file without one, or, in a class's own code,
        a method of a value (`self.conv(x)`, `layers.append(...)`). Anything
        else may build one (a block of another module, a layer class passed
        in as a parameter, a model loaded by torch.hub)."""
        names = self.qualified_names(call.func)
        if in_class and isinstance(call.func, cst.Attribute) and all(".<locals>." in name for name in names):
            return True
        for name in names:
            if name in self._classes:
                if name not in seen and not self._class_without_batch_norm(name, seen):
                    return False
            elif not ((name.startswith("torch.") and not name.startswith(TORCH_LOADERS)) or name.startswith("builtins.")):
                return False
        return bool(names)

    # -- inserting ----------------------------------------------------------------

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._insert(original_node.body, updated_node.body))

    def _insert(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        if not any(s in self._convert_before for s in originals):
            return list(updated)
        result: list[cst.CSTNode] = []
        for original, statement in zip(originals, updated):
            code = self._convert_before.get(original)
            if code is not None:
                convert = cst.parse_statement(f"{code}{self._module.default_newline}", config=self._module.config_for_parsing)
                result.append(convert.with_changes(leading_lines=statement.leading_lines))
                statement = statement.with_changes(leading_lines=[])
            result.append(statement)
        return result

