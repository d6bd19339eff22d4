"""cudnn-benchmark: `torch.backends.cudnn.benchmark = True` where a conv net trains on inputs of fixed shape.

What it does
    In a file whose trained model holds convolutions and whose training
    loops iterate over DataLoaders that batch with the default collate (no
    `collate_fn`, no `batch_sampler`), inserts
    `torch.backends.cudnn.benchmark = True` once where the script starts:
    the first statement of the main guard, or before the first
    module-level statement that does work in a flat script.

Why
    With benchmark on, cuDNN times its convolution algorithms for each new
    input shape and keeps the fastest: with fixed shapes that is a one-off
    cost on the first step and often 10-30% faster convolutions after. With
    shapes that change every batch (padded sequences, images of varying
    size) it would time the algorithms again and again, which is why that
    case only gets a note.

Run-time gate
    The flag is cuDNN's: a CPU run does not read it and keeps its numbers.

Example
    Before::

        if __name__ == "__main__":
            main()

    After::

        if __name__ == "__main__":
            torch.backends.cudnn.benchmark = True
            main()

Left alone
    A file that sets `cudnn.benchmark` itself; a file that asks for
    deterministic kernels (`cudnn.deterministic`,
    `torch.use_deterministic_algorithms`: benchmark chooses kernels by timing,
    so runs could differ), AM722; a model without convolutions, or loaders
    that may batch shapes that vary, a note (AM721); a module whose training
    runs only when another file calls it (AM723). AM720 is the fix.
"""

from __future__ import annotations

import libcst as cst

from ._base import has_star_args, keyword_arg
from ._speed.entry import attribute_set, script_start
from ._speed.models import is_conv_net, trained_models
from ._speed.statements import InsertingCodemod, torch_spelling

BENCHMARK = frozenset({"torch.backends.cudnn.benchmark"})
DETERMINISTIC = frozenset(
    {"torch.backends.cudnn.deterministic", "torch.use_deterministic_algorithms"}
)
VARYING_BATCHES = ("collate_fn", "batch_sampler")


class CudnnBenchmark(InsertingCodemod):
    word = "cudnn-benchmark"
    needs_torch = (0, 0)  # torch.backends.cudnn.benchmark
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "torch.backends.cudnn.benchmark = True at the start, for conv nets with inputs of fixed shape"
    codes = {
        "AM720": "conv net trained on fixed input shapes without cudnn.benchmark",
        "AM721": "cudnn.benchmark left off: no convolutions, or input shapes that may vary",
        "AM722": "deterministic kernels asked for: cudnn.benchmark would choose kernels by timing",
        "AM723": "training runs only when another module calls this file: set cudnn.benchmark where the script starts",
    }
    notes = frozenset({"AM721"})
    triggers = ("backward",)

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        script = self.script
        steps = script.training_steps
        if not steps or attribute_set(script, BENCHMARK) is not None:
            return
        deterministic = attribute_set(script, DETERMINISTIC)
        if deterministic is not None:
            self.report(deterministic, "AM722", "the script asks for deterministic kernels: cudnn.benchmark left off (turn it on by hand if speed matters more)")
            return
        if not any(is_conv_net(script, model) for model in trained_models(script)):
            self.report(steps[0].backward, "AM721", "the trained model holds no convolutions, which are all that cudnn.benchmark speeds up")
            return
        reason = self._shapes_may_vary()
        if reason:
            self.report(steps[0].backward, "AM721", f"{reason}: set `torch.backends.cudnn.benchmark = True` by hand if the input shapes are fixed")
            return
        start = script_start(script)
        if start is None:
            self.report(steps[0].backward, "AM723", "no entry point here: set `torch.backends.cudnn.benchmark = True` once where the script starts")
            return
        torch = torch_spelling(script, start.statement, self)
        if torch is None:
            self.report(start.statement, "AM723", "no name reads torch here: set `torch.backends.cudnn.benchmark = True` by hand")
            return
        if self.fix(start.statement, "AM720", "`torch.backends.cudnn.benchmark = True` where the script starts: cuDNN keeps the fastest convolution for the fixed shapes"):
            self.inserts.add_before(start.statement, f"{torch}.backends.cudnn.benchmark = True")

    def _shapes_may_vary(self) -> str:
        """Why the input shapes of a conv net may change between batches, or ""."""
        script = self.script
        loops = [loop for step in script.training_steps for loop in [*step.loops, *step.called_in_loops]]
        loaders = [loop.loader for loop in loops if loop.loader is not None]
        if not loaders:
            return "the training loops iterate over no DataLoader this file builds"
        for loader in loaders:
            call = loader.origin.value
            if not isinstance(call, cst.Call):
                return f"`{loader.name}` is not built here"
            if has_star_args(call):
                return f"`{loader.name}` gets arguments that cannot be seen (`*args`, `**kwargs`)"
            for keyword in VARYING_BATCHES:
                if keyword_arg(call, keyword) is not None:
                    return f"`{loader.name}` batches with its own `{keyword}`"
        return ""


__all__ = ["CudnnBenchmark"]
