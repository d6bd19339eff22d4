"""`accelmigrate server`: a language server over stdio (pygls).

One warm process for the whole editing session. On open, change (full or
incremental sync) and save of a Python file or a notebook (its .ipynb text,
or the cells of a notebook document, as VS Code's notebook editor sends
them) it publishes what `check` reports for the buffer's text: notes as
information, the others as warnings; a hover on a finding shows its
`explain` entry. Each fixable finding offers the quick fix "apply `WORD` to
this file", each warning "skip CODE on this line" (the project's mark), and
the document offers `source.fixAll.accelmigrate` for the configured words:
the fixes edit only the lines (of the cells) that `accelmigrate apply --to
WORDS` changes for that text, as `documentChanges` naming the version they
were computed for where the editor takes them, so an editor refuses a fix
made stale by typing. Results are kept per document and keyed by its text
(`server_documents.py`), so only the changed document is checked again;
checks run off the request path, a burst of changes is checked once after
it, and the newest text wins (`server_lsp.py`). The editor's settings
(`initializationOptions`, or `workspace/didChangeConfiguration`'s
`accelmigrate` section: `to`, `select`, `ignore`) count over
pyproject.toml's, and a changed pyproject.toml (`didChangeWatchedFiles`,
which the server registers for) re-publishes every open document. A message
over MAX_MESSAGE_BYTES is dropped, never held in memory.

A document that cannot be checked (it does not parse, a mistake in
pyproject.toml) gets one error diagnostic where the error is, never a crash.
Like `check`, the server never imports torch (`accelmigrate/status` says so).

The features are in `server_lsp.py`, imported when the server starts: pygls
is an optional extra, and without it the command says how to install it.
"""

from __future__ import annotations

import sys

import click

INSTALL_HINT = "`accelmigrate server` needs pygls: pip install 'accelmigrate[server]'"
# The largest message read: a `Content-Length` beyond it (a broken client, or
# 100 GB) is read through and dropped, never held in memory at once.
MAX_MESSAGE_BYTES = 128 * 2**20
_CHUNK = 2**20
# What stands for a dropped message: a notification no handler takes (LSP ignores `$/` ones).
_DROPPED = b'{"jsonrpc": "2.0", "method": "$/accelmigrate/dropped"}'


class BoundedInput:
    """stdin as pygls reads it (a header line, then a body of `Content-Length`
    bytes), refusing a body over MAX_MESSAGE_BYTES: it is read in chunks and
    dropped, with a line on stderr."""

    def __init__(self, stream, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.stream, self.limit = stream, limit

    def readline(self) -> bytes:
        return self.stream.readline(self.limit)

    def read(self, size: int) -> bytes:
        if size <= self.limit:
            return self.stream.read(size)
        print(f"accelmigrate server: dropped a message of {size} bytes (the limit is {self.limit})", file=sys.stderr, flush=True)
        left = size
        while left:
            chunk = self.stream.read(min(left, _CHUNK))
            if not chunk:
                return b""  # the stream ended: so does the server
            left -= len(chunk)
        return _DROPPED


@click.command("server")
def server_command() -> None:
    """Run the language server: speaks LSP over stdio, for an editor to start
    (the findings of `check` as diagnostics, the fixes of `apply` as code actions)."""
    try:
        from accelmigrate.server.lsp import server
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] not in ("pygls", "lsprotocol", "cattrs", "attrs"):
            raise
        raise click.ClickException(f"{INSTALL_HINT} ({error.name.partition('.')[0]} is not installed)") from None
    server.start_io(stdin=BoundedInput(sys.stdin.buffer))


if __name__ == "__main__":
    server_command()
