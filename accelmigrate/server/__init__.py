"""`accelmigrate server`, the editor's language server: the process (`serve.py`), its LSP handlers (`lsp.py`), and
what they are made of without LSP types: an open document's findings and migrated text (`documents.py`), findings
as diagnostics (`diagnostics.py`), the fewest edits for a code action (`edits.py`), notebook documents
(`notebooks.py`)."""
