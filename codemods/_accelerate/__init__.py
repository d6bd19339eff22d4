"""Helpers of the accelerate codemod (codemods/accelerate.py)."""
