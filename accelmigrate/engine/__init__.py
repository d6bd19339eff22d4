"""The engine: codemods run over one source or many files (`migrate.py`), and what it keeps true around them.

- `migrate.py`: one file from read to result (pre-check, parse, the codemods in order, the checks after), files in
  a pool, the all-or-nothing write of a project's files;
- `line_map.py`: each line of a rewritten version mapped back to the original, so findings point at the user's lines;
- `formatting.py`, `import_order.py`, `indentation.py`: what the codemods wrote, fitted to the file's own style;
- `cache.py`: results of unchanged files answered without parsing them again;
- `config.py`, `selection.py`: `[tool.accelmigrate]` and the codemods a command runs.
"""
