"""Migrated code that needs torch only, unless the user keeps the runtime.

The codemods write calls of small helpers (`get_device()`,
`default_num_workers()`, `autocast_dtype(device)` ...) and import them from
`accelmigrate.runtime`. By default each import the migration added is
replaced by the helper's plain definition, written into the file
(accelmigrate/engine/plain_inlining.py); with `--runtime` (or
`runtime = true` under `[tool.accelmigrate]`) the imports stay, and the
runtime's switches (ACCELMIGRATE_PRECISION, ACCELMIGRATE_DEVICE ...) keep
working. A helper the file imported already, or whose name the file uses
for something of its own, keeps its import either way (plain_inlining.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

# Set for one file's migration (a worker process migrates files one at a time).
_runtime_kept = contextvars.ContextVar("runtime_kept", default=False)


@contextlib.contextmanager
def keeping_runtime(kept: bool) -> Iterator[None]:
    """Within it, migrated code keeps its imports of the runtime (when `kept`)."""
    token = _runtime_kept.set(kept)
    try:
        yield
    finally:
        _runtime_kept.reset(token)


def as_configured(original: str, migrated: str, line_length: int, torch: Optional[tuple[int, int]] = None) -> str:
    """`migrated` as this run writes it: with the runtime's helpers, or plain
    (definitions fitted to `line_length`, spelled for the `torch` the
    project targets: accelmigrate/project/torch_version.py)."""
    if _runtime_kept.get() or "accelmigrate.runtime" not in migrated:
        return migrated
    from accelmigrate.codemods.script.plain_helpers import for_torch
    from accelmigrate.engine.plain_inlining import without_runtime_imports  # LibCST: only where there is work

    with for_torch(torch):
        return without_runtime_imports(original, migrated, line_length)


