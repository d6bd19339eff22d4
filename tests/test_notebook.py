"""Notebooks: code cells to one Python source and back, byte for byte where
nothing changed; IPython syntax left alone; findings placed in their cells."""

import ast
import json

import pytest

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.files.notebook import CELL_MARKER, PLACEHOLDER, NotebookError, _split_cells as split_cells, parse_notebook


def code(source, count=None, outputs=(), **metadata):
    return {
        "cell_type": "code",
        "execution_count": count,
        "metadata": metadata,
        "outputs": list(outputs),
        "source": source,
    }


def markdown(source):
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def notebook(*cells, language="python"):
    return {
        "cells": list(cells),
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": language, "name": "python3"},
            "language_info": {"name": language, "version": "3.11.4"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def lines(text):
    """A cell's source as Jupyter stores it: lines, the last without its newline."""
    return text.splitlines(keepends=True)


STREAM = {"name": "stdout", "output_type": "stream", "text": ["epoch 0: loss 0.93\n", "épreuve ✓\n"]}
PICTURE = {
    "data": {"image/png": "iVBORw0KGgo=\n", "text/plain": ["<Figure>"]},
    "metadata": {},
    "output_type": "display_data",
}

SETUP = """\
%matplotlib inline
%load_ext autoreload
!pip install --quiet tqdm
import torch
from torch.utils.data import DataLoader, Dataset"""

DATASET = """\
class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        x = torch.tensor([float(open(f"squares/{index}.txt").read())])  # each item read from its own file
        return x, x**2"""

TRAINING = """\
def train(epochs):
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Squares(), batch_size=32, shuffle=True)
    for epoch in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.2f}")


if __name__ == "__main__":
    train(2)"""

TIMED = "%%time\ntrain(1)\n"


def training_notebook():
    return notebook(
        markdown(["# Squares\n", "A tiny regression."]),
        code(lines(SETUP), 1, tags=["setup"]),
        code(lines(DATASET), 2),
        code(lines(TRAINING), 3, outputs=[STREAM, PICTURE], collapsed=False),
        code(TIMED, 4),  # a source stored as one string
        code([], None),
    )


# Layouts notebooks are saved with: nbformat's (indent 1, sorted keys, non-ASCII
# kept), and ones with other indentation, ASCII escapes, CRLF, key order.
LAYOUTS = {
    "nbformat": lambda nb: json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
    "indent 2, ascii, file order": lambda nb: json.dumps(nb, indent=2),
    "indent 4, crlf": lambda nb: json.dumps(nb, indent=4, ensure_ascii=False).replace("\n", "\r\n") + "\r\n",
    "one line": lambda nb: json.dumps(nb, separators=(",", ":")),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_notebook_with_nothing_changed_comes_back_byte_identical(layout):
    text = LAYOUTS[layout](training_notebook())
    parsed = parse_notebook(text)
    assert parsed.with_source(parsed.source) is parsed.text
    assert parsed.with_source(parsed.source) == text
    # and split at its markers, the source gives back every cell's text exactly
    assert split_cells(parsed.source, parsed.cells) == [cell.text for cell in parsed.cells]


def test_the_source_holds_the_code_cells_with_ipython_lines_inert():
    parsed = parse_notebook(json.dumps(training_notebook(), indent=1))
    assert [cell.index for cell in parsed.cells] == [1, 2, 3, 4, 5]
    compile(parsed.source, "<notebook>", "exec")  # plain Python for the codemods
    setup = parsed.cells[0]
    assert setup.ipython_lines == ("%matplotlib inline\n", "%load_ext autoreload\n", "!pip install --quiet tqdm\n")
    assert parsed.source.splitlines()[1:4] == [PLACEHOLDER] * 3
    assert parsed.cells[3].ipython_lines == ("%%time\n",)  # `%%time` runs its cell as the notebook's Python
    # line counts are kept: each cell's lines sit after its marker, one for one
    source_lines = parsed.source.splitlines()
    for cell in parsed.cells:
        assert cell.line_count == len(cell.text.splitlines())
        assert source_lines[cell.first_line - 1 : cell.first_line - 1 + cell.line_count][-1:] in (
            cell.text.splitlines()[-1:],
            [PLACEHOLDER],
        )


@pytest.mark.parametrize(
    "cell, replaced",
    [
        ("files = !ls data/\nprint(files)", ["files = !ls data/\n"]),
        ("model?\nmodel.forward??", ["model?\n", "model.forward??"]),
        ("for seed in range(3):\n    !python train.py --seed {seed}\n", ["    !python train.py --seed {seed}\n"]),
        # Python's own `%` and `!`: an operator inside brackets or after a
        # backslash, text inside a string, a comment
        ("total = (steps\n         % 7)\nok = (a\n      != b)\n", []),
        ('doc = """\n%not a magic\n!nor a shell line\n"""\n', []),
        ("share = 10 \\\n    % 3\n", []),
        ("x = 1  # what?\n", []),
    ],
)
def test_only_ipython_syntax_is_replaced(cell, replaced):
    parsed = parse_notebook(json.dumps(notebook(code(lines(cell)))))
    assert list(parsed.cells[0].ipython_lines) == replaced
    compile(parsed.source, "<notebook>", "exec")
    assert parsed.with_source(parsed.source) == parsed.text


def test_a_cell_migrated_with_workers_comes_back_in_its_cell():
    original = training_notebook()
    text = json.dumps(original, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    parsed = parse_notebook(text)
    migration = migrate_source(parsed.source, [("workers", {})], "squares.ipynb")
    assert migration.code != parsed.source

    migrated = json.loads(parsed.with_source(migration.code))
    cells = migrated["cells"]
    training = "".join(cells[3]["source"])
    loader = loader_call(training)
    assert [keyword.arg for keyword in loader.keywords][:3] == ["batch_size", "shuffle", "num_workers"]
    assert without_loader(training) == without_loader(TRAINING)  # the rest of the cell as it was
    setup = "".join(cells[1]["source"])  # the new import lands in a code cell above, magics kept
    assert "from accelmigrate.runtime.data import default_num_workers" in setup
    assert [line for line in setup.splitlines() if line and "default_num_workers" not in line] == SETUP.splitlines()
    # everything else as it was: other cells, outputs, metadata, nbformat
    for index in (0, 2, 4, 5):
        assert cells[index] == original["cells"][index]
    assert {key: value for key, value in cells[3].items() if key != "source"} == {
        key: value for key, value in original["cells"][3].items() if key != "source"
    }
    assert {key: value for key, value in migrated.items() if key != "cells"} == {
        key: value for key, value in original.items() if key != "cells"
    }


def loader_call(cell_text):
    return next(
        node
        for node in ast.walk(ast.parse(cell_text))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DataLoader"
    )


def without_loader(cell_text):
    """The cell's lines but those of the statement that builds the DataLoader."""
    [statement] = [
        node
        for node in ast.walk(ast.parse(cell_text))
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", "") == "DataLoader"
    ]
    lines = cell_text.splitlines()
    return lines[: statement.lineno - 1] + lines[statement.end_lineno :]


def test_only_the_changed_sources_differ_in_the_text():
    text = json.dumps(training_notebook(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    parsed = parse_notebook(text)
    migrated = parsed.with_source(migrate_source(parsed.source, [("workers", {})]).code)
    removed = [line for line in text.splitlines() if line not in migrated.splitlines()]
    added = [line for line in migrated.splitlines() if line not in text.splitlines()]
    assert removed == ['    "    loader = DataLoader(Squares(), batch_size=32, shuffle=True)\\n",']
    assert '    "from accelmigrate.runtime.data import default_num_workers\\n",' in added
    assert all(line.startswith('    "') for line in added)  # nbformat's layout for list items
    assert "épreuve ✓" in migrated  # non-ASCII text stays as written


def test_a_finding_is_placed_in_its_cell():
    parsed = parse_notebook(json.dumps(training_notebook()))
    loader_line = next(n for n, line in enumerate(parsed.source.splitlines(), 1) if "DataLoader(Squares()" in line)
    assert parsed.cell_position(loader_line) == (3, 4)
    findings = migrate_source(parsed.source, [("workers", {})], check_only=True).findings
    # the DataLoader's, and the `train(1)` under `%%time` (module-level code going through a DataLoader)
    assert [(parsed.cell_position(f.line), f.code) for f in findings] == [((3, 4), "AM101"), ((4, 2), "AM123")]
    assert parsed.cell_position(1) == (1, 1)  # the first marker: the first line of its cell


def test_a_migration_that_mixes_cells_is_refused():
    parsed = parse_notebook(json.dumps(training_notebook()))
    indented = "\n".join("    " + line for line in parsed.source.splitlines())  # as if wrapped in a function
    with pytest.raises(NotebookError, match="moved code across notebook cells"):
        parsed.with_source("def main():\n" + indented + "\n")
    without_magic = parsed.source.replace(PLACEHOLDER + "\n", "", 1)
    with pytest.raises(NotebookError, match="IPython lines"):
        parsed.with_source(without_magic)


def test_another_language_has_nothing_to_migrate():
    text = json.dumps(notebook(code(["println(1)"]), language="julia"))
    parsed = parse_notebook(text)
    assert (parsed.is_python, parsed.source, parsed.with_source("")) == (False, "", text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not JSON"),
        (json.dumps({"nbformat": 3, "worksheets": []}), "not an nbformat 4 notebook"),
        (json.dumps([1, 2]), "not an nbformat 4 notebook"),
    ],
)
def test_what_is_not_a_notebook_is_refused(text, message):
    with pytest.raises(NotebookError, match=message):
        parse_notebook(text)


# --- notebooks through the engine, the file walk and the command line ------------------------

from pathlib import Path  # noqa: E402

from accelmigrate.engine.migrate import NOT_IN_NOTEBOOK, process_file  # noqa: E402
from accelmigrate.files.notebook import finding_position  # noqa: E402
from accelmigrate.files.sources import iter_python_files  # noqa: E402

from conftest import run_cli  # noqa: E402

DEFAULT_PLAN = [(word, {}) for word in ("modernize", "workers", "item", "empty-cache")]

LOOP = """\
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Squares(), batch_size=32, shuffle=True)
history = []
for epoch in range(3):
    running = 0.0
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        running += loss
        torch.cuda.empty_cache()
    history.append(running / len(loader))"""

SUMMARY = "%%time\nprint(history)\n"


def loop_notebook():
    return notebook(
        markdown(["# Squares\n", "Kept losses and a cache flush in the loop."]),
        code(lines(SETUP), 1, tags=["setup"]),
        code(lines(DATASET), 2),
        code(lines(LOOP), 3, outputs=[STREAM, PICTURE]),
        code(SUMMARY, 4),
    )


def saved(folder: Path, document, name="squares.ipynb") -> Path:
    path = folder / name
    path.write_text(json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def test_folders_yield_notebooks_beside_scripts_but_not_checkpoints(tmp_path: Path):
    saved(tmp_path, loop_notebook())
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    saved(tmp_path / ".ipynb_checkpoints", loop_notebook(), "squares-checkpoint.ipynb")
    assert sorted(p.name for p in iter_python_files([str(tmp_path)])) == ["squares.ipynb", "train.py"]


def test_apply_migrates_a_notebooks_code_cells_and_nothing_else(tmp_path: Path):
    original = loop_notebook()
    path = saved(tmp_path, original)
    result = process_file(str(path), DEFAULT_PLAN, write=True)
    assert result.error is None and result.written
    migrated = json.loads(path.read_text(encoding="utf-8"))
    loop = "".join(migrated["cells"][3]["source"])
    assert "running += loss.item()" in loop and "empty_cache" not in loop
    assert [c for i, c in enumerate(migrated["cells"]) if i != 3] == [c for i, c in enumerate(original["cells"]) if i != 3]
    assert migrated["cells"][3]["outputs"] == original["cells"][3]["outputs"]
    assert {k: v for k, v in migrated.items() if k != "cells"} == {k: v for k, v in original.items() if k != "cells"}
    # a second run changes nothing: the notebook stays byte for byte as the first run left it
    before = path.read_bytes()
    again = process_file(str(path), DEFAULT_PLAN, write=True)
    assert (again.changed, again.written, path.read_bytes()) == (False, False, before)


def test_a_notebook_with_nothing_to_change_is_not_rewritten(tmp_path: Path):
    path = saved(tmp_path, training_notebook())
    data = path.read_bytes()
    result = process_file(str(path), [("item", {}), ("empty-cache", {})], write=True)
    assert (result.error, result.changed, result.written) == (None, False, False)
    assert path.read_bytes() == data


def test_findings_are_placed_in_their_cells(tmp_path: Path):
    path = saved(tmp_path, loop_notebook())
    result = process_file(str(path), DEFAULT_PLAN, check_only=True)
    assert result.error is None and not result.changed
    placed = {f.code: finding_position(f) for f in result.findings}
    # the loop is the notebook's fourth cell; `running += loss` its line 12, the flush its line 13
    assert placed["AM201"] == "cell 4:12:9"
    assert placed["AM210"] == "cell 4:13:9"
    assert all(f.cell for f in result.findings)


def test_main_guard_ddp_and_what_needs_them_leave_a_notebook_alone_with_one_note(tmp_path: Path):
    document = loop_notebook()
    path = saved(tmp_path, document)
    data = path.read_bytes()
    result = process_file(str(path), [("main-guard", {}), ("workers", {}), ("sync-bn", {})], write=True)
    assert (result.error, result.written, path.read_bytes()) == (None, False, data)
    [note] = result.findings
    assert (note.code, note.fixed, finding_position(note)) == (NOT_IN_NOTEBOOK, False, "cell 2:1:1")
    assert "main-guard, workers" in note.message and ".py script" in note.message


def test_a_syntax_error_names_its_cell(tmp_path: Path):
    path = saved(tmp_path, notebook(code(lines(SETUP)), code(["x = (1,\n", "print(x)"])))
    result = process_file(str(path), DEFAULT_PLAN)
    (finding,) = [f for f in result.findings if f.code == "AM007"]
    assert result.error is None and (finding.cell, finding.line) == (2, 1) and "1:5: syntax error" in finding.message


def test_a_notebook_that_is_not_json_is_that_files_error(tmp_path: Path):
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [', encoding="utf-8")
    result = process_file(str(path), DEFAULT_PLAN, write=True)
    assert result.error is not None and "not JSON" in result.error and not result.written


def test_the_command_line_applies_checks_and_diffs_notebooks(tmp_path: Path):
    path = saved(tmp_path, loop_notebook())
    untouched = saved(tmp_path, training_notebook(), "untouched.ipynb")
    untouched_data = untouched.read_bytes()
    checked = run_cli("check", "--no-cache", "--to", "item,empty-cache", str(tmp_path))
    assert checked.returncode == 1, checked.stderr
    assert "AM201" in checked.stdout and "AM210" in checked.stdout
    diffed = run_cli("apply", "--no-cache", "--diff", str(tmp_path))
    assert diffed.returncode == 1, diffed.stderr
    assert '-    "        running += loss\\n",' in diffed.stdout
    assert '+    "        running += loss.item()\\n",' in diffed.stdout
    applied = run_cli("apply", "--no-cache", str(tmp_path))
    assert applied.returncode == 0, applied.stderr
    assert "running += loss.item()" in "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][3]["source"])
    assert untouched.read_bytes() == untouched_data


def test_new_imports_join_the_first_cells_imports_below_its_magics(tmp_path: Path):
    setup = "%matplotlib inline\nimport os\n\nimport torch\nfrom torch.utils.data import DataLoader, Dataset"
    on_gpu = LOOP.replace("torch.nn.Linear(1, 1)", "torch.nn.Linear(1, 1).cuda()")
    path = saved(tmp_path, notebook(code(lines(setup), 1), code(lines(DATASET), 2), code(lines(on_gpu), 3)))
    result = process_file(str(path), [("device", {})], write=True, runtime=True)
    assert result.error is None and result.written
    cells = ["".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]]
    assert cells[0] == (
        "%matplotlib inline\nimport os\n\nimport torch\nfrom accelmigrate.runtime.device import get_device\n"
        "from torch.utils.data import DataLoader, Dataset\n\ndevice = get_device()"
    )
    assert cells[1] == DATASET
    assert "model = torch.nn.Linear(1, 1).to(device)" in cells[2]


def test_plain_definitions_go_into_the_first_cell_after_its_imports(tmp_path: Path):
    setup = "%matplotlib inline\nimport os\n\nimport torch\nfrom torch.utils.data import DataLoader, Dataset"
    on_gpu = LOOP.replace("torch.nn.Linear(1, 1)", "torch.nn.Linear(1, 1).cuda()")
    path = saved(tmp_path, notebook(code(lines(setup), 1), code(lines(DATASET), 2), code(lines(on_gpu), 3)))
    result = process_file(str(path), [("device", {})], write=True)
    assert result.error is None and result.written
    cells = ["".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]]
    assert cells[0].startswith(setup + "\n\n\ndef get_device():\n")
    assert cells[0].endswith("return torch.device(\"cpu\")\n\n\ndevice = get_device()")
    assert "accelmigrate" not in "".join(cells)
    assert cells[1] == DATASET
    again = process_file(str(path), [("device", {})], write=True)
    assert again.error is None and not again.changed


def test_the_pre_commit_hooks_run_on_notebooks_too():
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((Path(__file__).resolve().parent.parent / ".pre-commit-hooks.yaml").read_text())
    assert [hook["id"] for hook in hooks] == ["accelmigrate-check", "accelmigrate-apply"]
    assert all(hook["types_or"] == ["python", "jupyter"] and "types" not in hook for hook in hooks)


def test_check_names_the_cell_of_each_finding_in_every_format(tmp_path: Path):
    path = saved(tmp_path, loop_notebook())
    text = run_cli("check", "--no-cache", "--to", "item,empty-cache", str(path))
    assert text.returncode == 1, text.stderr
    assert f"{path}:cell 4:" in text.stdout  # the loop is the fourth cell (a markdown cell comes first)
    github = run_cli("check", "--no-cache", "--format", "github", "--to", "item", str(path))
    annotation = next(line for line in github.stdout.splitlines() if "AM20" in line)
    assert ",line=" not in annotation and "cell 4, line " in annotation
    sarif = json.loads(run_cli("check", "--no-cache", "--format", "sarif", "--to", "item", str(path)).stdout)
    result = sarif["runs"][0]["results"][0]
    assert "region" not in result["locations"][0]["physicalLocation"]
    assert result["message"]["text"].startswith("cell 4, line ")


def test_the_notebook_note_does_not_fail_check(tmp_path: Path):
    path = saved(tmp_path, loop_notebook())
    applied = run_cli("apply", "--no-cache", str(path))
    assert applied.returncode == 0, applied.stderr
    checked = run_cli("check", "--no-cache", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = run_cli("check", "--no-cache", "--show-notes", str(path))
    assert NOT_IN_NOTEBOOK in shown.stdout


# --- each cell parses on its own, as Jupyter runs it ------------------------------------------


@pytest.mark.parametrize(
    "first, second",
    [
        (["for step in range(3):\n"], ["    print(step)"]),  # a block that the next cell holds
        (["x = (1,\n"], ["2)"]),  # a bracket that the next cell closes
        (["try:\n", "    import tqdm\n"], ["except ImportError:\n", "    tqdm = None"]),  # a statement split
    ],
)
def test_a_cell_that_parses_only_joined_to_the_next_is_left_and_the_others_migrated(tmp_path: Path, first, second):
    training = TRAINING.replace("            optimizer.step()\n", "            optimizer.step()\n            torch.cuda.empty_cache()\n")
    path = saved(tmp_path, notebook(code(lines(SETUP)), code(lines(training)), markdown(["# Steps"]), code(first), code(second)))
    result = process_file(str(path), DEFAULT_PLAN, write=True)
    assert result.error is None and result.written, result.error
    unparsed = [f for f in result.findings if f.code == "AM007"]
    assert [f.cell for f in unparsed][:1] == [4] and all(not f.fixed for f in unparsed), result.findings
    assert "syntax error" in unparsed[0].message and "(each cell must parse on its own)" in unparsed[0].message
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells[2]["source"] == first and cells[3]["source"] == second  # left exactly as written
    assert "empty_cache" not in "".join(cells[1]["source"])  # the training cell is migrated


def test_a_notebook_with_a_cell_that_does_not_parse_alone_fails_the_check_at_that_cell(tmp_path: Path):
    saved(tmp_path, notebook(code(["for step in range(3):\n"]), code(["    print(step)"])), "split.ipynb")
    (tmp_path / "train.py").write_text("import torch\n\nfor step in range(3):\n    torch.cuda.empty_cache()\n")
    checked = run_cli("check", "--no-cache", "--to", "empty-cache", str(tmp_path))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"{tmp_path / 'split.ipynb'}:cell 1:1:1: AM007 this cell does not parse" in checked.stdout
    assert "train.py:4:5: AM210" in checked.stdout


def test_a_timed_cell_is_the_notebooks_own_python_under_its_magic_and_another_magics_cell_its_input():
    parsed = parse_notebook(json.dumps(notebook(
        code(["%%time\n", "loss = train(1)\n", "!nvidia-smi\n"]), code(["%%capture log\n", "train(2)\n"]), code(["%%bash\n", "echo done\n"]),
    )))
    assert [cell.ipython_lines for cell in parsed.cells] == [("%%time\n", "!nvidia-smi\n"), ("%%capture log\n",), ("%%bash\n", "echo done\n")]
    assert "loss = train(1)\n" in parsed.source and "train(2)\n" in parsed.source and "echo" not in parsed.source
    # a line a migration puts at the top of the cell goes under the magic, which must stay its first line
    marker = CELL_MARKER.format(index=0) + "\n"
    migrated = parsed.source.replace(marker, marker + "started = True\n")
    assert split_cells(migrated, parsed.cells)[0] == "%%time\nstarted = True\nloss = train(1)\n!nvidia-smi\n"


def test_a_training_loop_under_time_is_migrated_with_the_magic_kept_first(tmp_path: Path):
    original = loop_notebook()
    original["cells"][3]["source"] = ["%%time\n", *original["cells"][3]["source"]]
    path = saved(tmp_path, original)
    result = process_file(str(path), DEFAULT_PLAN, write=True)
    assert result.error is None and result.written
    loop = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][3]["source"])
    assert loop.startswith("%%time\nmodel = ") and "running += loss.item()" in loop and "empty_cache" not in loop


def test_ipython_lines_still_parse_in_a_cell_of_their_own():
    parsed = parse_notebook(json.dumps(notebook(code(["%%time\n", "for x in y:\n"]), code(["!ls\n", "%pwd"]))))
    assert parsed.source.count(PLACEHOLDER) == 4


def test_a_notebook_nested_too_deeply_is_not_json():
    with pytest.raises(NotebookError, match="not JSON"):
        parse_notebook("[" * 100_000 + "]" * 100_000)


def test_a_deeply_nested_notebook_is_that_files_not_json_error(tmp_path: Path):
    path = tmp_path / "deep.ipynb"
    path.write_text('{"cells": ' + "[" * 100_000 + "]" * 100_000 + ', "nbformat": 4}', encoding="utf-8")
    result = process_file(str(path), DEFAULT_PLAN, write=True)
    assert result.error is not None and "not JSON" in result.error and "internal error" not in result.error


# --- a change at a cell's boundary stays within its cell ------------------------------------------
# The marker that opens a cell sits in the comment lines above the cell's first
# statement: a codemod that removes that statement, or wraps it with statements
# of the cell before, would take the boundary with it.

OPENED_BY_AN_IMPORT = notebook(
    code(lines("import torch\nfrom torch import nn\nnet = nn.Linear(4, 2)\n# ready to train"), 1),
    code(lines("from torch.autograd import Variable"), 2),
    markdown(["Train a few steps"]),
    code(lines(
        "from torch.autograd import Variable\n\nfor step in range(3):\n"
        "    sample = Variable(torch.randn(8, 4))\n    out = net(sample)\n    print(out.data[0])"
    ), 3),
    code(lines("%matplotlib inline\nfrom torch.autograd import Variable\nprobe = Variable(torch.ones(1, 4))"), 4),
)


def sources(path: Path) -> list:
    return [cell["source"] for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def assert_settled(path: Path, plan) -> None:
    """The migrated notebook parses cell by cell, and a second run changes nothing."""
    parse_notebook(path.read_text(encoding="utf-8"))  # each cell must parse on its own
    before = path.read_bytes()
    again = process_file(str(path), plan, write=True)
    assert (again.error, again.changed, again.written, path.read_bytes()) == (None, False, False, before)


def test_an_import_removed_from_the_top_of_a_cell_leaves_each_cell_its_own_code(tmp_path: Path):
    path = saved(tmp_path, OPENED_BY_AN_IMPORT)
    plan = [("modernize", {})]
    result = process_file(str(path), plan, write=True)
    assert result.error is None and result.written
    assert sources(path) == [
        ["import torch\n", "from torch import nn\n", "net = nn.Linear(4, 2)\n", "# ready to train"],  # its last comment stays
        [],  # the cell held the import alone
        ["Train a few steps"],
        ["for step in range(3):\n", "    sample = torch.randn(8, 4)\n", "    out = net(sample)\n", "    print(out.data[0])"],
        ["%matplotlib inline\n", "probe = torch.ones(1, 4)"],
    ]
    assert [(f.cell, f.line, f.code) for f in result.findings] == [(4, 4, "AM221"), (5, 3, "AM221")]
    assert_settled(path, plan)


def one_step_notebook(first_lines="import torch\nfrom torch import nn\n", features="torch.randn(8, 4)"):
    return notebook(
        code(lines(first_lines + "net = nn.Linear(4, 2)\noptimizer = torch.optim.SGD(net.parameters(), lr=0.1)\nloss_fn = nn.MSELoss()"), 1),
        markdown(["One batch by hand"]),
        code(lines(f"features = {features}\ngoals = torch.randn(8, 2)\n# shapes are checked below"), 2),
        code(lines("guess = net(features)\nprint(guess.shape)"), 3),
        code(lines("# how far off\nerror = loss_fn(guess, goals)\nerror.backward()\noptimizer.step()"), 4),
    )


def test_an_autocast_region_takes_in_only_statements_of_its_own_cell(tmp_path: Path):
    original = one_step_notebook()
    path = saved(tmp_path, original)
    plan = [("amp", {})]
    result = process_file(str(path), plan, write=True, runtime=True)
    assert result.error is None and result.written
    migrated = sources(path)
    assert "".join(migrated[0]) == (
        "import torch\nfrom accelmigrate.runtime.precision import autocast_dtype, grad_scaler\nfrom torch import nn\n\n"
        'amp_dtype = autocast_dtype("cpu")\nnet = nn.Linear(4, 2)\noptimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n'
        'scaler = grad_scaler("cpu", amp_dtype)\nloss_fn = nn.MSELoss()'
    )
    assert migrated[1:4] == [cell["source"] for cell in original["cells"][1:4]]  # the forward's cells as they were
    assert "".join(migrated[4]) == (
        "# how far off\n"
        'with torch.autocast(\n    device_type="cpu", dtype=amp_dtype, enabled=amp_dtype != torch.float32\n):\n'
        "    error = loss_fn(guess, goals)\n"
        "scaler.scale(error).backward()\nscaler.step(optimizer)\nscaler.update()"
    )
    assert [(f.cell, f.code) for f in result.findings] == [(5, "AM401")]
    assert_settled(path, plan)


def test_a_codemod_that_would_move_code_across_cells_is_a_finding_and_the_others_still_migrate(tmp_path: Path, monkeypatch):
    from accelmigrate.codemods._amp import regions

    monkeypatch.setattr(regions, "starts_cell", lambda statement: False)  # amp's region as if cells were one script
    path = saved(tmp_path, one_step_notebook(
        "import torch\nfrom torch import nn\nfrom torch.autograd import Variable\n", "Variable(torch.randn(8, 4))"
    ))
    plan = [("modernize", {}), ("amp", {})]
    result = process_file(str(path), plan, write=True)
    assert result.error is None and result.written
    migrated = ["".join(source) for source in sources(path)]
    assert "Variable" not in "".join(migrated) and "features = torch.randn(8, 4)\n" in migrated[2]  # modernize applied
    assert "autocast" not in "".join(migrated) and "scaler" not in "".join(migrated)  # amp left out entirely
    failed = [f for f in result.findings if f.code == "AM000"]
    assert [(f.word, f.cell, f.fixed) for f in failed] == [("amp", 3, False)]
    assert "across notebook cells" in failed[0].message
    assert not any(f.word == "amp" and f.fixed for f in result.findings)
    parse_notebook(path.read_text(encoding="utf-8"))


def test_a_percent_cell_marker_above_a_removed_import_stays_in_a_script():
    script = "import torch\n# %% training\n# old autograd\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\n"
    migrated = migrate_source(script, [("modernize", {})]).code
    assert migrated == "import torch\n# %% training\nx = torch.ones(2)\n"
