"""A training DataLoader given its arguments as a dict, `DataLoader(dataset,
**train_kwargs)` (the classic MNIST example builds `train_kwargs`, then
`.update()`s it with CUDA settings): the call becomes
`DataLoader(dataset, **sharded_loader_kwargs(dataset, train_kwargs))`, which
at run time takes the dict as it then is, nothing lost, with a
SeededDistributedSampler in place of its `shuffle=` and this process's share
of its `batch_size` (`split_batch=False` under `ddp=per-process`). A dict
that holds its own `sampler=` is refused here where its keys show, and by the
helper where they do not.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import keyword_arg
from ..script import vocabulary as v
from ..script.workers_facts import KwargsDict, workers_facts
from .common import CannotMigrate, Insertion, dataset_name_for, is_plain_reference, keyword_of
from .index_batches import IndexBatchSharding

# Keywords the helper reads or replaces: given beside `**kwargs` they would be given twice.
READ_BY_THE_HELPER = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "generator"})


class LoaderKwargsSharding(IndexBatchSharding):
    """Plans `sharded_loader_kwargs(...)` for a training DataLoader's `**kwargs`."""

    def _plan_loader_kwargs(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """Plans the rewrite; the batch size the dict is seen to hold, if any."""
        stars = [a for a in call.args if a.star]
        positional = [a for a in call.args if a.keyword is None and not a.star]
        dataset = positional[0] if positional else keyword_arg(call, "dataset")
        if (
            len(stars) != 1 or stars[0].star != "**" or len(positional) > 1 or dataset is None
            or any(keyword_of(a) in READ_BY_THE_HELPER for a in call.args)
        ):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader with `*args`/`**kwargs` beside its batch or shuffle arguments: pass "
                "`sampler=SeededDistributedSampler(dataset, shuffle=...)` instead of `shuffle=`, and the batch size "
                "through `per_process_batch_size()`, by hand",
            )
        if any(self._clashes(n) for n in self._uses.names.get("sharded_loader_kwargs", ())):
            raise CannotMigrate(
                call, "AM530",
                "`sharded_loader_kwargs`, which this DataLoader's `**kwargs` needs, already names something here: "
                "rename yours, then run ddp again",
            )
        seen = workers_facts(self.script).kwargs_dict(call, lambda c: self.is_call_to(c, v.DATALOADER))
        batch = None
        if isinstance(seen, KwargsDict):
            for key in ("sampler", "batch_sampler"):
                if seen.values_of(key):
                    raise CannotMigrate(
                        call, "AM522",
                        f"training DataLoader whose `**{seen.name}` holds its own `{key}=`: it must give each rank a "
                        f"different share of the data (see DistributedSampler), or every rank trains on the same samples",
                    )
            sizes = seen.values_of("batch_size")
            batch = sizes[0] if len(sizes) == 1 else None
        line, assign, _ = self._loader_assignment(call)
        dataset_code = self._code(dataset.value)
        hoisted = None
        if not is_plain_reference(dataset.value):
            hoisted = self._fresh_name(dataset_name_for(assign.targets[0].target))
            dataset_code = hoisted
        kwargs_code = self._code(stars[0].value)
        split = ", split_batch=False" if self.per_process else ""
        helper_code = f"sharded_loader_kwargs({dataset_code}, {kwargs_code}{split})"
        if self.per_process:
            message = (
                f"`**{helper_code}`: a SeededDistributedSampler in place of the dict's `shuffle=`; its batch size "
                f"kept per process (ddp=per-process): the global batch is now that x world size"
            )
        else:
            message = (
                f"`**{helper_code}`: the dict as it is at run time, with a SeededDistributedSampler in place of its "
                f"`shuffle=` (the same order in a world of one) and its batch size split across the processes"
            )

        def rewrite(updated: cst.Call) -> cst.Call:
            args = []
            for argument in updated.args:
                if argument.star == "**":
                    argument = argument.with_changes(value=cst.parse_expression(helper_code, config=self._config))
                elif hoisted is not None and (argument.keyword is None and not argument.star or keyword_of(argument) == "dataset"):
                    argument = argument.with_changes(value=cst.Name(hoisted))
                args.append(argument)
            return updated.with_changes(args=args)

        def apply() -> None:
            self._use("sharded_loader_kwargs")
            if hoisted is not None:
                statement = cst.parse_statement(f"{hoisted} = {self._code(dataset.value)}{self._module.default_newline}", config=self._config)
                self._before.setdefault(line, []).append(Insertion(statement, take_leading="all"))
            self._edits[call] = rewrite

        self._step(call, "AM504", message, apply)
        if batch is not None:
            self._check_split_batch(call, batch)
        return batch
