"""Files in and out: finding sources (git ignores kept), reading and writing them without losing a byte,
notebooks as one source of their code cells, and command-line paths that look like options."""
