"""The parts of the `main-guard` codemod: what stays at module level, what runs the script, what would break, and the guarded layout."""
