"""The `amp` codemod's helper modules (codemods/amp.py is the codemod):

- plan.py: the names it matches and what it plans (steps, regions, bindings);
- names.py: where devices and optimizers are bound, read from the script model;
- passed.py: devices and optimizers that a function receives as arguments;
- regions.py: the autocast region of a step, where unscale_ and update go;
- bindings.py: where `amp_dtype` and `scaler` are bound, and how they are spelled;
- introduced.py: the names it adds, chosen to mean what it means wherever they are read;
- placement.py: whether a step computes on the device in reach, or on the CPU;
- evaluation.py, checkpoints.py, apex.py, deprecated.py: the other rewrites;
- edits.py: planned edits applied as the transformer leaves the tree.
"""
