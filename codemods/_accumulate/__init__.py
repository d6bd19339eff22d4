"""The parts of the accumulate codemod that batch-scale shares: the `=N`
factor and the module constant it defines (`factor.py`), small syntax
questions (`syntax.py`), and the reading of one training loop (`loops.py`).
Not a codemod: the registry skips modules whose name starts with `_`."""
