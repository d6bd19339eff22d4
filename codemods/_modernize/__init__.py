"""The parts of the `modernize` codemod, one module per family of pre-0.4 idioms."""
