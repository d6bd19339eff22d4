"""tf32: float32 matrix products on CUDA in TF32, set once where the script starts.

What it does
    Inserts `use_tf32_matmul()` (accelmigrate.runtime.speed) as the first
    statement of the main guard, or before the first module-level statement
    that does work in a flat script, in a file that trains.
    `use_tf32_matmul()` sets `torch.backends.cuda.matmul.fp32_precision =
    "tf32"` (the API torch 2.9 and later prefer; `matmul.allow_tf32 = True`
    on older torch).

Why
    On Ampere and later GPUs, TF32 tensor cores multiply float32 matrices
    several times faster, rounding the inputs to a 10-bit mantissa and
    accumulating in float32: the precision that cuDNN convolutions already use
    by default. Linear layers and attention in float32 (everything outside an
    autocast region) get the same speed.

Run-time gate
    The setting is CUDA's own: CPU matmuls keep full float32, so a CPU run
    gives the original's numbers. (`torch.set_float32_matmul_precision("high")`
    would also let oneDNN round CPU matmuls, and mixing it with the new API
    warns.) ACCELMIGRATE_TF32=0 keeps full float32 on the GPU too.

Example
    Before::

        if __name__ == "__main__":
            main()

    After::

        if __name__ == "__main__":
            use_tf32_matmul()
            main()

Left alone
    A file that already chooses its matmul precision (`allow_tf32`,
    `fp32_precision`, `set_float32_matmul_precision`); a file without a
    training step; a module whose training runs only when another file
    calls it (AM711: enable TF32 in the script that starts). AM710 is the
    fix.
"""

from __future__ import annotations

import libcst as cst

from ._speed import RUNTIME
from ._speed.entry import attribute_set, script_start
from ._speed.statements import InsertingCodemod

MATMUL_PRECISION = frozenset(
    {
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.backends.cuda.matmul.fp32_precision",
        "torch.backends.fp32_precision",
        "torch.set_float32_matmul_precision",
        f"{RUNTIME}.use_tf32_matmul",
    }
)


class Tf32(InsertingCodemod):
    word = "tf32"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "float32 matmuls on CUDA in TF32 (torch.backends.cuda.matmul.fp32_precision), set once at the start"
    codes = {
        "AM710": "float32 matmuls on CUDA without TF32",
        "AM711": "training runs only when another module calls this file: enable TF32 where the script starts",
    }
    triggers = ("backward",)

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        steps = self.script.training_steps
        if not steps or attribute_set(self.script, MATMUL_PRECISION) is not None:
            return
        start = script_start(self.script)
        if start is None:
            self.report(steps[0].backward, "AM711", "no entry point here: set `torch.backends.cuda.matmul.allow_tf32 = True` once where the script starts")
            return
        if self.fix(start.statement, "AM710", "`use_tf32_matmul()` where the script starts: TF32 matmuls on CUDA (ACCELMIGRATE_TF32=0 keeps float32)"):
            self.inserts.add_before(start.statement, "use_tf32_matmul()")
            self.add_import(RUNTIME, "use_tf32_matmul")


__all__ = ["Tf32"]
