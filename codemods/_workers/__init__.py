"""The parts of the workers codemod (codemods/workers.py)."""
