"""The training DataLoaders of the ddp codemod: each gets a
SeededDistributedSampler and a per-process batch size, its epoch loop a
`sampler.set_epoch(epoch)`; with `ddp=per-process`, the optimizers' learning
rates are scaled by the world size instead.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import append_keyword_args, dotted_name, has_star_args, keyword_arg, walk
from ..script import vocabulary as v
from ..script.workers_facts import KwargsDict, workers_facts
from ..script.uses import FOLLOW_DEPTH
from .common import (
    RUNTIME, CannotMigrate, Insertion, Var, call_of, dataset_name_for, header, is_none, is_plain_reference, keyword_of, loop_body,
)
from .handed_loops import HandedLoops
from .loader_kwargs import LoaderKwargsSharding
from .output import TQDM

RUNTIME_SAMPLER = frozenset({f"{RUNTIME}.SeededDistributedSampler"})
RANK_SHARE = frozenset({f"{RUNTIME}.rank_share"})  # migrated before
SHARDED_KWARGS = frozenset({f"{RUNTIME}.sharded_loader_kwargs"})
LR_SCHEDULERS_WITH_LR = frozenset(
    {"torch.optim.lr_scheduler.OneCycleLR", "torch.optim.lr_scheduler.CyclicLR"}
)
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
# What the sampler rewrite reads or replaces: a `**kwargs` dict holding none of
# them (`{"num_workers": 1, "pin_memory": True} if cuda else {}`) leaves it alone.
SHARDING_ARGUMENTS = frozenset({"dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "generator"})


class LoaderSharding(LoaderKwargsSharding, HandedLoops):
    """Plans the samplers, set_epoch calls and learning rates."""

    def _plan_loaders(self) -> None:
        for call in self._calls_to(v.DATALOADER):
            self._plan_loader(call)
        received = self._plan_received_loaders()
        if self._training_loaders or received or self._calls_to(v.DISTRIBUTED_SAMPLER | RUNTIME_SAMPLER | SHARDED_KWARGS | RANK_SHARE):
            return
        for call, fact in self._handed_calls():
            loader = self._handed_argument(call, fact, "loader")
            if self._sharded_elsewhere(loader):  # the module that builds it shards it
                try:
                    self._plan_set_epoch(call, loader, [], received=True)
                except CannotMigrate as problem:
                    self.report(problem.node, problem.code, problem.message)
                continue
            self.report(
                call, "AM521",
                f"the loader handed to `{fact.name}` is not a DataLoader built in this file, so it got no "
                f"DistributedSampler: every rank trains on the same batches (correct, but no faster than one "
                f"process); where it is built, give it `sampler=SeededDistributedSampler(dataset, shuffle=...)` "
                f"instead of `shuffle=` and pass its batch size through `per_process_batch_size()`",
            )
            return
        if self._handed_calls():
            return
        built_elsewhere = self._loops_over_loaders_built_elsewhere()
        for loop, loader in built_elsewhere:  # the module that builds it shards it
            try:
                self._plan_set_epoch(loop, loader, [], received=True)
            except CannotMigrate as problem:
                self.report(problem.node, problem.code, problem.message)
        if built_elsewhere:
            return
        problem = self._plan_index_batches()
        if problem is not None:
            self.report(
                problem.node, "AM521",
                "no training DataLoader found to give a DistributedSampler, and the batches the step draws itself "
                f"cannot all be traced ({problem.reason}): every rank trains on the same batches (correct, but no "
                "faster than one process); give each rank its share of the data by hand (`rank_share(batch)`: its "
                "rows `global_rank()::world_size()`)",
            )

    def _loops_over_loaders_built_elsewhere(self) -> list[tuple[cst.For, cst.Name]]:
        """The training loops of this file over a loader that a function of another module of the project builds
        and returns (`dataloader = get_celeba(params)`, the fact `sharded_loaders`): it is sharded there."""
        found = []
        for step in self.script.training_steps if self.reads_handoffs else ():
            for loop in step.loops:
                returned = self.script.loader_returned_to(loop.node)
                if returned is not None and (loop.node, returned[0]) not in found:
                    found.append((loop.node, returned[0]))
        return found

    def _loader_sharded_before(self, call: cst.Call) -> bool:
        """The DataLoader has a DistributedSampler already (a migration run before)."""
        sampler = keyword_arg(call, "sampler")
        if sampler is not None and isinstance(sampler.value, cst.Call) and self.is_call_to(sampler.value, v.DISTRIBUTED_SAMPLER | RUNTIME_SAMPLER):
            return True
        return any(a.star == "**" and isinstance(a.value, cst.Call) and self.is_call_to(a.value, SHARDED_KWARGS) for a in call.args)

    def _plan_loader(self, call: cst.Call) -> None:
        if self._loader_sharded_before(call):
            self._plan_set_epoch_for(call)  # migrated before
            return
        loops = self._batch_loops(call)
        training = [loop for loop in loops if self._trains(loop_body(loop[0]))]
        if (loops and not training) or (not loops and self._evaluated_elsewhere(call)):
            self.report(
                call, "AM524",
                "evaluation DataLoader left whole: every rank evaluates the full set, so rank 0 prints what one "
                "process would; to split that work instead, give it `DistributedSampler(dataset, shuffle=False)` and "
                "combine sums and counts with `mean_across_ranks(total, count)`, minding the samples the sampler "
                "repeats to even out the ranks",
            )
            return
        if not loops and self._handed_loader_references(call):
            self._plan_handed_loader(call)
            return
        if not loops:
            self.report(
                call, "AM521",
                "cannot see where this DataLoader is iterated: if it feeds training, give it "
                "`sampler=SeededDistributedSampler(dataset, shuffle=...)` instead of `shuffle=`, pass its batch size "
                "through `per_process_batch_size()` and call `loader.sampler.set_epoch(epoch)` at the top of each epoch",
            )
            return
        self._training_loaders.append(call)
        try:
            batch = self._plan_training_loader(call)
        except CannotMigrate as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        for loop, expression, path in training:
            self._plan_local_batch_sizes(loop, batch)
            self._plan_batch_draws(loop, batch)
            try:
                self._plan_set_epoch(loop, expression, path)
            except CannotMigrate as problem:
                self.report(problem.node, problem.code, problem.message)
            self._plan_rank_totals(loop)

    def _bound_loader(self, call: cst.Call) -> Optional[Var]:
        """`loader` of `loader = DataLoader(...)`."""
        assign = self.parent(call)
        return self._target_var(assign.targets[0].target) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None

    def _evaluated_elsewhere(self, call: cst.Call) -> bool:
        var = self._bound_loader(call)
        return var is not None and self._only_evaluated(var)

    def _plan_built_loaders(self, calls: list[cst.Call]) -> None:
        """The loaders this module builds for a training loop a script hands
        them to: sharded here (where one cannot be, ddp stops for the file,
        and the engine leaves the script unwrapped too)."""
        for call in calls:
            self._training_loaders.append(call)
            if not self._loader_sharded_before(call):
                self._plan_training_loader(call)

    def _handed_loader_references(self, call: cst.Call) -> list[tuple[cst.Call, cst.CSTNode]]:
        """(the handed call, the loader's reference there) for each call of
        another module's training loop that this DataLoader is handed to."""
        var = self._bound_loader(call)
        references = self._references(var) if var is not None else []
        return [
            (handed, reference) for handed, fact in self._handed_calls() for reference in references
            if self._handed_argument(handed, fact, "loader") is reference
        ]

    def _plan_handed_loader(self, call: cst.Call) -> None:
        """The loader of a training loop in another module: sharded here, where
        it is built (a loader that cannot be stops ddp for the file: the loop
        there takes it as sharded), its epoch set around the call."""
        self._training_loaders.append(call)
        self._plan_training_loader(call)
        for handed, reference in self._handed_loader_references(call):
            self._plan_set_epoch(handed, reference, [])

    def _plan_received_loaders(self) -> bool:
        """The loader parameters of this module's loops that a script hands a
        sharded loader: `set_loader_epoch(loader, epoch)` in an epoch loop
        here (it leaves a loader without a DistributedSampler as it is: a
        caller outside the run may hand it a plain one), each rank's own
        noise, the running totals combined across the ranks; a shape sized by
        a global batch size stops ddp here."""
        found = False
        for loader in self._received_loaders():
            found = True
            for reference, path in self._followed_references(loader):  # into the functions it is handed on to
                for loop in self._loops_over(reference):
                    if self._trains(loop_body(loop)):
                        self._refuse_global_batch_shapes(loop)
                        self._plan_batch_draws(loop, None)
                        self._plan_set_epoch(loop, reference, path, received=True)
                        self._plan_rank_totals(loop)
        return found

    def _refuse_global_batch_shapes(self, loop: cst.CSTNode) -> None:
        for node in walk(loop_body(loop)):
            if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node).rpartition(".")[2] == "batch_size" and self._is_shape_argument(node):
                raise CannotMigrate(
                    node, "AM533",
                    f"`{self._code(node)}` shapes a tensor in a loop whose loader the script shards: each step now "
                    f"holds this process's share of the batch; read the batch's own size (`x.size(0)`), then run ddp again",
                )

    def _plan_training_loader(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """Plans the sampler and the split batch; the batch size it is given (None: in a dict it cannot see)."""
        if has_star_args(call) and not self._kwargs_leave_sharding_alone(call):
            return self._plan_loader_kwargs(call)
        for name in ("sampler", "batch_sampler"):
            if keyword_arg(call, name) is not None:
                raise CannotMigrate(
                    call, "AM522",
                    f"training DataLoader with its own `{name}=`: it must give each rank a different share of "
                    f"the data (see DistributedSampler), or every rank trains on the same samples",
                )
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) > 2:
            raise CannotMigrate(call, "AM523", "DataLoader with more than two positional arguments: name them, then run ddp again")
        dataset = positional[0] if positional else keyword_arg(call, "dataset")
        batch = positional[1] if len(positional) > 1 else keyword_arg(call, "batch_size")
        if dataset is None or batch is None or is_none(batch.value):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader without a visible batch size: give it `batch_size=`, then run ddp again",
            )
        line, assign, _ = self._loader_assignment(call)
        shuffle = keyword_arg(call, "shuffle")
        shuffle_code = self._code(shuffle.value) if shuffle is not None else "False"
        hoisted = None
        dataset_code = self._code(dataset.value)
        if not is_plain_reference(dataset.value):
            hoisted = self._fresh_name(dataset_name_for(assign.targets[0].target))
            dataset_code = hoisted
        sampler_code = f"SeededDistributedSampler({dataset_code}, shuffle={shuffle_code}{self._sampler_generator(call)})"
        batch_code = self._code(batch.value)
        if self.per_process:
            message = (
                f"`SeededDistributedSampler(shuffle={shuffle_code})` instead of `shuffle=`; batch size `{batch_code}` kept per "
                f"process (ddp=per-process): the global batch is now `{batch_code}` x world size, with fewer steps per epoch"
            )
        else:
            message = (
                f"`SeededDistributedSampler(shuffle={shuffle_code})` instead of `shuffle=`, the same order in a world of "
                f"one; batch size `{batch_code}` split "
                f"across the processes: the global batch and the steps per epoch stay as they were"
            )

        def apply() -> None:
            self._use("SeededDistributedSampler")
            if not self.per_process:
                self._use("per_process_batch_size")
            if hoisted is not None:
                statement = cst.parse_statement(f"{hoisted} = {self._code(dataset.value)}{self._module.default_newline}", config=self._config)
                statement = self._download_first_if_needed(dataset.value, statement)
                self._before.setdefault(line, []).append(Insertion(statement, take_leading="all"))
            self._edits[call] = lambda updated: self._rewrite_loader(updated, sampler_code, hoisted)

        self._step(call, "AM504", message, apply)
        self._check_split_batch(call, batch.value)
        drop_last = keyword_arg(call, "drop_last")
        if drop_last is None or not (isinstance(drop_last.value, cst.Name) and drop_last.value.value == "True"):
            self._unevenly_shared.append(call)  # noted with the other per-rank consequences, once ddp applies
        return batch.value

    def _kwargs_leave_sharding_alone(self, call: cst.Call) -> bool:
        """`DataLoader(ds, batch_size=b, shuffle=True, **kwargs)` where every key
        `kwargs` may hold shows, and none is one the sampler rewrite reads."""
        found = workers_facts(self.script).kwargs_dict(call, lambda c: self.is_call_to(c, v.DATALOADER))
        return isinstance(found, KwargsDict) and not any(e.key in SHARDING_ARGUMENTS for e in found.entries)

    def _sampler_generator(self, call: cst.Call) -> str:
        """`, generator=g` when the DataLoader shuffles with its own generator:
        the sampler must draw from that same generator object."""
        generator = keyword_arg(call, "generator")
        if generator is None or is_none(generator.value):
            return ""
        if not is_plain_reference(generator.value):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader whose `generator=` is not a plain name: bind the generator to a name and pass "
                "that, then run ddp again (the sampler must shuffle with the same generator)",
            )
        return f", generator={self._code(generator.value)}"

    def _rewrite_loader(self, call: cst.Call, sampler_code: str, hoisted: Optional[str]) -> cst.Call:
        sampler = cst.parse_expression(sampler_code, config=self._config)
        args = list(call.args)
        positional = [i for i, a in enumerate(args) if a.keyword is None and not a.star]
        dataset_index = positional[0] if positional else next(i for i, a in enumerate(args) if keyword_of(a) == "dataset")
        batch_index = positional[1] if len(positional) > 1 else next(i for i, a in enumerate(args) if keyword_of(a) == "batch_size")
        if hoisted is not None:
            args[dataset_index] = args[dataset_index].with_changes(value=cst.Name(hoisted))
        if not self.per_process:
            args[batch_index] = args[batch_index].with_changes(value=call_of("per_process_batch_size", args[batch_index].value))
        shuffle_index = next((i for i, a in enumerate(args) if keyword_of(a) == "shuffle"), None)
        if shuffle_index is not None:
            args[shuffle_index] = args[shuffle_index].with_changes(keyword=cst.Name("sampler"), value=sampler)
            return call.with_changes(args=args)
        return append_keyword_args(call.with_changes(args=args), [("sampler", sampler)])

    def _loader_assignment(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, cst.Assign, Var]:
        assign = self.parent(call)
        line = self.parent(assign)
        var = self._target_var(assign.targets[0].target) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
        if (
            var is None
            or assign.value is not call
            or not isinstance(line, cst.SimpleStatementLine)
            or not isinstance(self.parent(line), (cst.IndentedBlock, cst.Module))
        ):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader not assigned to a name on its own line: bind it (`train_loader = DataLoader(...)`), "
                "then run ddp again",
            )
        return line, assign, var

    def _batch_loops(self, call: cst.Call) -> list[tuple[cst.For, cst.CSTNode, list[tuple[cst.Call, cst.CSTNode]]]]:
        """The `for` loops that iterate this DataLoader, directly or in the
        script's own functions it is passed to: (loop, the loader's expression
        there, the calls that led there with the argument passed)."""
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            var = self._target_var(parent.targets[0].target)
            if var is None:
                return []
            return [
                (loop, held, held_path)
                for reference, path in self._followed_references(var)
                for held, held_path in self._held_on_self(reference, path)
                for loop in self._loops_over(held)
            ]
        loop = self._loop_iterating(call)
        return [(loop, call, [])] if loop is not None else []

    def _held_on_self(self, reference: cst.CSTNode, path: list) -> Iterator[tuple[cst.CSTNode, list]]:
        """The reference itself, and where it is kept as an attribute
        (`self.train_loader = train_loader` in a trainer's `__init__`): the
        class's reads of `self.train_loader`, in whichever method iterates it
        (no call path leads there: the epoch loop is found through that
        method's callers)."""
        yield reference, path
        assign = self.parent(reference)
        if not (isinstance(assign, cst.Assign) and assign.value is reference and len(assign.targets) == 1):
            return
        held = self._target_var(assign.targets[0].target)
        if held is not None and held.is_attribute:
            for read in self._references(held):
                yield read, []

    def _loops_over(self, reference: cst.CSTNode) -> list[cst.CSTNode]:
        """The loops that iterate the loader `reference` reads: directly, or
        through the progress bar it is given to (`pbar = tqdm(loader)`, then
        `for batch in pbar:`), which yields the loader's batches."""
        loop = self._loop_iterating(reference)
        if loop is not None:
            return [loop]
        bar = self._progress_bar_of(reference)
        if bar is None:
            return []
        return [loop for bar_reference in self._references(bar) for loop in [self._loop_iterating(bar_reference)] if loop is not None]

    def _progress_bar_of(self, reference: cst.CSTNode) -> Optional[Var]:
        """`bar` of `bar = tqdm(<reference>, ...)` (or `tqdm(enumerate(<reference>))`)."""
        node = reference
        for _ in range(2):
            argument = self.parent(node)
            call = self.parent(argument) if isinstance(argument, cst.Arg) else None
            if not (isinstance(call, cst.Call) and argument is call.args[0] and argument.keyword is None):
                return None
            if self.is_call_to(call, TQDM):
                assign = self.parent(call)
                if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
                    return self._target_var(assign.targets[0].target)
                return None
            if not self.is_call_to(call, {"builtins.enumerate"}):
                return None
            node = call
        return None

    def _loop_iterating(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The `for` statement or comprehension whose iterable holds `node`."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.BaseSuite)):
                return None
            if isinstance(ancestor, cst.For):
                return ancestor if child is ancestor.iter else None
            if isinstance(ancestor, cst.CompFor):
                if child is not ancestor.iter:
                    return None
                return next(a for a in self.ancestors(ancestor) if isinstance(a, COMPREHENSIONS))
            child = ancestor
        return None

    def _plan_set_epoch_for(self, call: cst.Call) -> None:
        for loop, expression, path in self._batch_loops(call):
            if self._trains(loop_body(loop)):
                try:
                    self._plan_set_epoch(loop, expression, path)
                except CannotMigrate as problem:
                    self.report(problem.node, problem.code, problem.message)

    def _plan_set_epoch(self, batch_loop: cst.For, expression: cst.CSTNode, path: list, received: bool = False) -> None:
        """`received`: the loader arrives as a parameter, sharded or not: `set_loader_epoch(loader, epoch)`."""
        found = self._epoch_loop(batch_loop, expression, list(path), 0)
        if found is None:
            return  # one pass over the data: nothing to reshuffle
        epoch_loop, loader = found
        if not isinstance(epoch_loop, cst.For) or not isinstance(epoch_loop.target, cst.Name) or epoch_loop.target.value == "_":
            raise CannotMigrate(
                header(epoch_loop), "AM521",
                f"epoch loop without a plain epoch variable: call `{self._code(loader)}.sampler.set_epoch(epoch)` "
                f"at the top of each epoch by hand, or every epoch sees the same order",
            )
        if not isinstance(epoch_loop.body, cst.IndentedBlock):
            raise CannotMigrate(header(epoch_loop), "AM521", "one-line epoch loop: call `loader.sampler.set_epoch(epoch)` at the top of each epoch by hand")
        if any(isinstance(n, cst.Call) and dotted_name(n.func).rpartition(".")[2] in ("set_epoch", "set_loader_epoch") for n in walk(epoch_loop.body)):
            return
        if not is_plain_reference(loader):
            raise CannotMigrate(header(epoch_loop), "AM521", "the training DataLoader has no plain name in the epoch loop: call `loader.sampler.set_epoch(epoch)` by hand")
        key = (epoch_loop, self._code(loader))
        if key in self._set_epoch_planned:
            return
        self._set_epoch_planned.add(key)
        first = epoch_loop.body.body[0]
        epoch = epoch_loop.target.value
        code = f"set_loader_epoch({self._code(loader)}, {epoch})" if received else f"{self._code(loader)}.sampler.set_epoch({epoch})"
        statement = cst.parse_statement(code + self._module.default_newline, config=self._config)

        def apply() -> None:
            if received:
                self._use("set_loader_epoch")
            self._before.setdefault(first, []).append(Insertion(statement))

        self._step(epoch_loop.target, "AM505", f"`{code.strip()}` at the top of the epoch loop: a new order every epoch, the same on every rank", apply)

    def _epoch_loop(self, node: cst.CSTNode, loader: cst.CSTNode, path: list, depth: int) -> Optional[tuple[cst.CSTNode, cst.CSTNode]]:
        """The loop around `node` (the loop over the data, or a call that leads
        to it) and the loader's expression there."""
        outer = self.innermost_loop(node)
        if outer is not None:
            return outer, loader
        if path:
            call, argument = path.pop()
            return self._epoch_loop(call, argument, path, depth)
        function = next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
        if function is None or depth >= FOLLOW_DEPTH or not is_plain_reference(loader):
            return None
        sites = self.script.flow.functions[function].callers
        if len(sites) != 1:
            return None
        return self._epoch_loop(sites[0].call, loader, [], depth + 1)

    def _plan_learning_rates(self) -> None:
        if not self.per_process:
            return
        for optimizer in self._optimizer_calls():
            lr = keyword_arg(optimizer, "lr")
            positional = [a for a in optimizer.args if a.keyword is None]
            if lr is None and len(positional) > 1:
                lr = positional[1]
            if lr is None:
                self.report(
                    optimizer, "AM529",
                    "optimizer on its default learning rate: the global batch grows with the world size, so pass "
                    "`lr=<default> * world_size()` by hand",
                )
                continue
            if any(isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.world_size"}) for n in walk(lr.value)):
                continue
            self._plan_scaled_lr(optimizer, lr)
        for update in self._manual_updates():
            self.report(
                update, "AM529",
                "hand-written update: the global batch grows with the world size, so multiply the learning rate it "
                "applies by `world_size()` by hand",
            )
        for scheduler in self._calls_to(LR_SCHEDULERS_WITH_LR):
            self.report(
                scheduler, "AM529",
                "this scheduler sets its own learning rates: multiply them by world_size() by hand, as the optimizers' were",
            )

    def _plan_scaled_lr(self, optimizer: cst.Call, lr: cst.Arg) -> None:
        def scale(updated: cst.Arg) -> cst.Arg:
            value = updated.value
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated.with_changes(value=cst.BinaryOperation(value, cst.Multiply(), call_of("world_size")))

        def apply() -> None:
            self._use("world_size")
            self._edits[lr] = scale

        self._step(
            lr, "AM510",
            f"learning rate `{self._code(lr.value)}` x `world_size()`: per-process batches make the global batch "
            f"world-size times larger (linear scaling rule; consider a warm-up)",
            apply,
        )
