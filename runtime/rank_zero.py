"""What the ranks other than 0 hold in place of a writer that rank 0 alone
creates.

A migrated script creates its TensorBoard writer (or a `csv.writer`, or
any logger it only calls methods of) on rank 0 only:

    writer = SummaryWriter(log_dir) if is_main_process() else NullWriter()

so the events are written once. The other ranks keep running every line
that uses the writer, with the values logged computed as before (a loss
averaged across ranks still takes part in its all-reduce): only the
writing is skipped. `NullWriter` takes any method call (`add_scalar`,
`add_histogram`, `writerow`, `flush`, `close`) and does nothing, works as a
context manager, and is never None, so `if writer is not None:` runs alike
on every rank.

Imports the standard library only.
"""

from __future__ import annotations

from typing import Any


class NullWriter:
    """A writer that writes nothing: every method call returns None."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # copy, pickle and the like see a plain object
        return _do_nothing

    def __enter__(self) -> "NullWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __repr__(self) -> str:
        return "NullWriter()"


def _do_nothing(*args: object, **kwargs: object) -> None:
    return None
