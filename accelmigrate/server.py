"""`accelmigrate server`: a language server over stdio (pygls).

One warm process for the whole editing session. On open, change (full or
incremental sync) and save of a Python file or a notebook (its .ipynb text,
or the cells of a notebook document, as VS Code's notebook editor sends
them) it publishes what `check` reports for the buffer's text: notes as
information, the others as warnings; a hover on a finding shows its
`explain` entry. Each fixable finding offers the quick fix "apply `WORD` to
this file", and the document offers `source.fixAll.accelmigrate` for the
configured words: both replace the document (each changed cell) with exactly
what `accelmigrate apply --to WORDS` writes for that text. Results are kept
per document and keyed by its text (`server_documents.py`), so only the
changed document is checked again.

A document that cannot be checked (it does not parse, a mistake in
pyproject.toml) gets one error diagnostic where the error is, never a crash.
Like `check`, the server never imports torch (`accelmigrate/status` says so).

The features are in `server_lsp.py`, imported when the server starts: pygls
is an optional extra, and without it the command says how to install it.
"""

from __future__ import annotations

import click

INSTALL_HINT = "`accelmigrate server` needs pygls: pip install 'accelmigrate[server]'"


@click.command("server")
def server_command() -> None:
    """Run the language server: speaks LSP over stdio, for an editor to start
    (the findings of `check` as diagnostics, the fixes of `apply` as code actions)."""
    try:
        from accelmigrate.server_lsp import server
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] not in ("pygls", "lsprotocol", "cattrs", "attrs"):
            raise
        raise click.ClickException(f"{INSTALL_HINT} ({error.name.partition('.')[0]} is not installed)") from None
    server.start_io()


if __name__ == "__main__":
    server_command()
