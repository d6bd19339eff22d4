"""A notebook that an editor holds as a notebook document (VS Code's
notebook editor sends its cells, not the .ipynb file) as the nbformat 4 JSON
text that `check` and `apply` read, and the cells' texts back out of a
migrated one. The engine then treats an open notebook exactly as the file:
the code cells migrated together, in order, as Jupyter runs them."""

from __future__ import annotations

import json
from typing import Sequence

PYTHON_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def notebook_json(cells: Sequence[tuple[bool, str]]) -> str:
    """The notebook of CELLS, each (is Python code, text), in order; the other cells keep their places as markdown."""
    made = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": text.splitlines(keepends=True)}
        if is_code
        else {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}
        for is_code, text in cells
    ]
    return json.dumps({"cells": made, "metadata": PYTHON_METADATA, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def cell_texts(text: str) -> list[str]:
    """The text of each cell of a notebook's JSON TEXT, in order."""
    sources = (cell.get("source", "") for cell in json.loads(text)["cells"])
    return ["".join(source) if isinstance(source, list) else source for source in sources]
