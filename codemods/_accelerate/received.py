"""The module side of a training loop that scripts of the project hand their
model, optimizer and training DataLoader: `def train_fn(data_loader, model,
optimizer, device)` in `engine.py`, called from `train.py` (the project fact
`received_loops`; handed.py is the script's side).

The scripts prepare what they hand and pass `accelerator=accelerator`; here
the function takes `accelerator` as a parameter (keyword-only after
parameters with defaults), and its code is planned as an entry point's own:
`accelerator.backward(loss)`, clipping through the Accelerator,
`accelerator.print`, files written by the main process (`accelerator.save`,
the model unwrapped), a batch-sized draw shared out, running totals combined
across the processes after the loop over the handed loader. The module's
other functions (a training loop no script of the run hands anything) are left
as they are, as in any module a migrated script imports.

The loop's CUDA autocast blocks and its GradScaler go as in an entry
point's own code: the scripts read their dtype (the fact's
`mixed_precision`) and make their Accelerator with it.

Refused (the engine then migrates neither file): mixed precision elsewhere in
the module or that the scripts' Accelerator cannot take (a GradScaler passed
in, autocast of two kinds), loops of more than one function handed by the
project's scripts, a loop function that is a method or nested.
"""

from __future__ import annotations

import types

import libcst as cst

from .._base import code_of, is_docstring
from ..script import project_facts
from ..script import vocabulary as v
from ..script.entities import GRAD_SCALER
from ..script.reduction import through_scaler
from ..script.steps import ITERATION_WRAPPERS, within_wrappers
from .common import ACCELERATOR, NO_CUDA, CannotMigrate, Plan
from .functions import EntryFunctions, own_scope, with_accelerator_parameter
from .plan import Planner
from .precision import MANUAL_STEP, Precision, mixed_precision
from .totals import combine_after


class ReceivedPlanner(Planner):
    """Plans the loop function the scripts hand their prepared objects to, as the entry point they pass the accelerator from."""

    takes_handed_loops = False
    leaves_other_functions = True
    passed = ACCELERATOR  # the parameter the loop takes: once it has it, it is migrated

    def make(self) -> Plan:
        self._refuse_if_already_distributed()
        fact = self._the_handed_loop()
        function = next((
            f for f in self.script.flow.functions.values()
            if f.name == fact.name and f.owner is None and self.script.parent(f.node) is self.module
        ), None)
        if function is None:
            raise CannotMigrate(self.module, "AM820", f"the training loop scripts hand their model to, `{fact.name}`, is not a function of this module's own: accelerate changed nothing")
        if self.passed in function.parameters:
            raise CannotMigrate(function.node, "AM822", f"`{fact.name}` already takes the `{self.passed}` its scripts pass: accelerate changed nothing")
        self._refuse_on_name_clash()
        self.entry, self.body = function.scope, list(function.node.body.body)
        self.functions = EntryFunctions(self, self.entry)
        self.steps = steps = [step for step in self.script.training_steps if self.in_entry(step.backward)]
        self._refuse_incomplete(steps)
        self._plan_handed_precision(fact, function)
        self.accelerator_anchor = next(s for s in self.body if not is_docstring(s))
        self.moved_after, self.cpu, self.shuffled_loaders = None, NO_CUDA, []
        self.plan.edit(function.node.params, with_accelerator_parameter)
        self.plan.fixes.append((
            function.node, "AM801",
            f"`{ACCELERATOR}` a parameter of `{fact.name}`: the scripts that hand it their prepared model, optimizer and "
            f"DataLoader pass their Accelerator, through which its backward, output and checkpoints go",
        ))
        self._plan_devices()
        self._plan_data_parallel()
        self.model_names, self.prepared_names, self.prepared_at = {fact.model}, {fact.model, fact.loader}, -1
        self.training_loaders = [types.SimpleNamespace(name=fact.loader)]  # the loops over it are the training loops
        combine_after(self, self._loops_over(fact.loader), self.combined_total)
        self._plan_backward(steps)
        self._plan_clipping()
        self._plan_model_attributes({fact.model})
        self._plan_output()
        self._plan_exits_and_draws()
        self._refuse_evaluation_on_host_data()
        self.functions.pass_accelerator(self.plan)
        return self.plan

    def _plan_handed_precision(self, fact, function) -> None:
        """The loop's autocast blocks and GradScaler removed, as the scripts' Accelerator is made with the same
        `mixed_precision` (the fact they read, handed.py); any other mixed precision in the module is refused."""
        for call in self.uses.calls:
            names = self.codemod.qualified_names(call.func)
            if names & (v.AUTOCAST | GRAD_SCALER) and not self.in_entry(call):
                raise CannotMigrate(call, "AM821", f"mixed precision in `{code_of(call.func)}` outside the loop the scripts hand their model (`{fact.name}`): accelerate changed nothing; {MANUAL_STEP}")
        self.precision = Precision(self)
        self.precision.plan_mixed_precision()
        expected = mixed_precision(fact.mixed_precision) if fact.mixed_precision else None
        scaled = [step.backward for step in self.steps if through_scaler(step.backward)]
        unscaled = [s.call for step in self.steps for s in step.optimizer_steps if s.through_scaler] + scaled
        if self.precision.mode != expected or unscaled and self.precision.scaler is None:
            raise CannotMigrate(
                unscaled[0] if unscaled else function.node, "AM821",
                f"mixed precision in `{fact.name}` that the scripts' Accelerator cannot be made with (a GradScaler made "
                f"elsewhere, or autocast blocks of more than one kind): accelerate changed nothing; {MANUAL_STEP}",
            )

    def _the_handed_loop(self):
        loops = sorted(project_facts.current().received_loops)
        names = list(dict.fromkeys(fact.name for fact in loops))
        if len(names) > 1:
            listed = ", ".join(f"`{name}`" for name in names)
            raise CannotMigrate(
                self.module, "AM820",
                f"the project's scripts hand this module's loops {listed} their model: accelerate changed nothing; it "
                f"migrates one handed training loop a module (call one loop from the others, or migrate by hand)",
            )
        return loops[0]

    @staticmethod
    def _refuse_incomplete(steps) -> None:
        for step in steps:
            if not step.is_complete:
                raise CannotMigrate(step.backward, "AM820", "a backward with no optimizer step in reach: accelerate changed nothing")

    def _loops_over(self, loader: str) -> list[cst.For]:
        """The loops over the handed loader: in the function's own code over its loader parameter, and in a
        function it alone calls over the parameter that it is passed as (`train_step(model, dataloader=train_loader)`),
        through `enumerate` or `tqdm`."""
        loops = {}
        for step in self.steps:
            function = self.functions.function_of(step.backward)
            for loop in step.loops:
                iterable = self._iterable(loop.node)
                if iterable is None:
                    continue
                if function is None and own_scope(step.function) is self.entry and iterable == loader:
                    loops[loop.node] = None
                elif function is not None and iterable in function.parameters and self._passed_as(function, iterable, loader):
                    loops[loop.node] = None
        return list(loops)

    def _iterable(self, loop) -> str | None:
        """The plain name a `for` loop iterates, through `enumerate` and `tqdm`."""
        if not isinstance(loop, cst.For):
            return None
        iterable = within_wrappers(loop.iter, lambda call: self.codemod.is_call_to(call, ITERATION_WRAPPERS))
        return iterable.value if isinstance(iterable, cst.Name) else None

    def _passed_as(self, function, parameter: str, loader: str) -> bool:
        """Every call of `function` passes the handed function's `loader` for `parameter`."""
        passed = self.functions.passed_by_the_entry(function, parameter)
        return bool(passed) and all(isinstance(a, cst.Name) and a.value == loader for a in passed)


__all__ = ["ReceivedPlanner"]
