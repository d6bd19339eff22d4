"""A stand-in for NVIDIA apex, for the tests only: apex has no build on PyPI
and needs CUDA. It keeps the one-process fp32 arithmetic apex's amp does
on a machine where mixed precision is off, which is what a script migrated
onto Accelerate computes on a CPU (`mixed_precision="no"`)."""

from . import amp  # as apex itself does: `import apex` then `apex.amp.initialize`
