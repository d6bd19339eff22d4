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

Left alone
    A model the `ddp` codemod could not wrap (a finding says so), and a file
    that already calls `convert_sync_batchnorm` itself. The conversion sits in the distributed branch: a world
    of one keeps its BatchNorm layers. SyncBatchNorm needs GPUs (nccl): torch
    refuses to synchronise CPU tensors, so a CPU launch of several processes
    should not use this word.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from ._base import Codemod

DISTRIBUTED_DATA_PARALLEL = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
CONVERT = frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm", "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm"})
TRAINING_SIGNS = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.utils.data.DataLoader"})


class SyncBatchNorm(Codemod):
    word = "sync-bn"
    summary = "BatchNorm -> SyncBatchNorm before DistributedDataParallel wraps the model"
    requires = ("ddp",)
    codes = {
        "AM540": "BatchNorm layers converted to SyncBatchNorm before wrapping in DDP",
        "AM541": "no DistributedDataParallel wrap found to convert before",
    }
    # The same as ddp's: this word runs on what ddp wrote, which may be new.
    triggers = ("DataParallel", "DataLoader", "optim")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._convert_before: dict[cst.CSTNode, str] = {}  # statement -> the model's code
        self._wraps: list[cst.Call] = []
        self._training_sign: Optional[cst.CSTNode] = None  # where to report a missing wrap

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._wraps and self._training_sign is not None:
            self.report(
                self._training_sign, "AM541",
                "no `model = DistributedDataParallel(model, ...)` found (see ddp's findings): once the model is wrapped, "
                "add `model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` just before the wrap",
            )
        return updated_node.with_changes(body=self._insert(original_node.body, updated_node.body))

    # -- finding the wraps ------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        if self._training_sign is None and (self.is_call_to(node, TRAINING_SIGNS) or self._is_optimizer(node)):
            self._training_sign = node
        if not self.is_call_to(node, DISTRIBUTED_DATA_PARALLEL):
            return
        self._wraps.append(node)
        statement, model = self._wrap_statement(node)
        if statement is None:
            self.report(node, "AM541", "DistributedDataParallel outside `model = DistributedDataParallel(model, ...)`: convert its BatchNorm layers by hand before wrapping")
            return
        if self._converted_already():
            return
        if self.fix(node, "AM540", f"`{model} = torch.nn.SyncBatchNorm.convert_sync_batchnorm({model})` before wrapping: batch statistics over the global batch (GPUs only)"):
            self._convert_before[statement] = model
            self.add_import("torch")

    def _is_optimizer(self, call: cst.Call) -> bool:
        return any(n.startswith("torch.optim.") and not n.startswith("torch.optim.lr_scheduler.") for n in self.qualified_names(call.func))

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

    def _converted_already(self) -> bool:
        """The file converts BatchNorm layers itself (before DataParallel, or on a second run)."""
        return any(self.is_call_to(node, CONVERT) for node in _calls_in(self._module))

    # -- inserting ----------------------------------------------------------------

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._insert(original_node.body, updated_node.body))

    def _insert(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        if not any(s in self._convert_before for s in originals):
            return list(updated)
        result: list[cst.CSTNode] = []
        for original, statement in zip(originals, updated):
            model = self._convert_before.get(original)
            if model is not None:
                convert = cst.parse_statement(
                    f"{model} = torch.nn.SyncBatchNorm.convert_sync_batchnorm({model}){self._module.default_newline}",
                    config=self._module.config_for_parsing,
                )
                result.append(convert.with_changes(leading_lines=statement.leading_lines))
                statement = statement.with_changes(leading_lines=[])
            result.append(statement)
        return result


def _calls_in(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call):
            yield current
        stack.extend(current.children)
