"""The commands that run a script (`run`, `profile`) need torch; the rest of
the tool never imports it, so torch is an optional dependency
(`accelmigrate[torch]`). Without it those two commands stop at once with one
line that says what to install, rather than a traceback from deep inside a
launch."""

from __future__ import annotations

import importlib.util
import sys

import click

INSTALL_HINT = "pip install 'accelmigrate[torch]' (or pip install torch)"
EXIT_USAGE = 2


def torch_installed() -> bool:
    """Whether `import torch` can find torch, without importing it (seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a half-installed or shadowed torch
        return False


def require_torch(command: str) -> None:
    """Exit with code 2 and one line naming the install command when torch is missing."""
    if not torch_installed():
        click.echo(
            f"accelmigrate {command}: torch is not installed in this environment ({sys.executable}); "
            f"it is needed to run scripts: {INSTALL_HINT}",
            err=True,
        )
        sys.exit(EXIT_USAGE)
