"""Helpers of the `device` codemod (codemods/device.py): what CUDA literals
and device values mean, where a placement finds its device, and the plans for
each kind of call."""
