"""How DistributedDataParallel combines the ranks' gradients, for losses that sum over the batch.

DDP averages each gradient over the ranks: right for a loss that is a mean
over the batch (the mean of the ranks' means over equal shares is the mean
over the whole batch). A loss that sums over the batch (`reduction="sum"`)
gives each rank the sum over its share; the whole batch's gradient is the sum
of those, and the average is 1/world of it (SGD would train at 1/world of its
learning rate). `sum_gradients_across_ranks(model)` makes DDP add them up.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def sum_gradients_across_ranks(model: torch.nn.Module) -> None:
    """Make a DistributedDataParallel `model` all-reduce its gradients with a
    sum instead of the average; nothing for a bare model (a world of one).

    Called once, right after the wrap and before the first backward; DDP
    accepts one communication hook per model."""
    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(model.process_group, _all_reduce_sum)


def _all_reduce_sum(group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's default all-reduce hook, without its division by the world size.
    (DDP checks these annotations as objects: no `from __future__ import annotations` here.)"""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


__all__ = ["sum_gradients_across_ranks"]
