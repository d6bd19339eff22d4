"""Inserted code fits the file: long inserted or rewritten statements wrapped as
black would wrap them at the project's line length, in files that black does
not format too, touching nothing else; new imports in their isort sections,
so that `ruff check --select I` passes on the output where it passed on the input."""

import ast
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelmigrate.engine.formatting import fit_changed_statements, parenthesized_long_tuples, project_line_length, project_python
from accelmigrate.engine.import_order import place_new_imports
from accelmigrate.engine.migrate import process_file

from conftest import FIXTURES, run_cli

# Not black-formatted: single quotes, a hand-aligned call, two-argument lines.
# Only its DataLoader line is longer than 88 characters.
CLASSIFIER = """\
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from model import Classifier


class Shards(Dataset):
    def __init__(self, root):
        self.root = root
        self.files = sorted(os.listdir(root))
    def __len__(self):
        return len(self.files)
    def __getitem__(self, index):
        path = os.path.join(self.root, self.files[index])
        sample = torch.load(path, map_location='cpu')
        return sample['x'], sample['y']


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--data', default='shards')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=128)
    args = parser.parse_args()
    model = nn.DataParallel(Classifier())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
    train_loader = DataLoader(Shards(os.path.join(args.data, 'train')), batch_size=args.batch_size, shuffle=True, drop_last=True, timeout=120)
    val_loader = DataLoader(Shards(os.path.join(args.data, 'val')),
                            batch_size=256)
    for epoch in range(args.epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print('epoch %d: loss %.3f' % (epoch, loss.item()))
    torch.save(model.state_dict(), 'classifier.pt')


if __name__ == '__main__':
    main()
"""

DDP_AND_WORKERS = [("ddp", {}), ("workers", {})]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project of the user's: its pyproject.toml, a first-party module and the script."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "classifier"\n')
    (tmp_path / "model.py").write_text("import torch\n\nClassifier = torch.nn.Linear\n")
    return tmp_path


def migrated(project: Path, source: str, plan=DDP_AND_WORKERS, **kwargs) -> str:
    script = project / "train.py"
    script.write_text(source)
    result = process_file(str(script), plan, **kwargs)
    assert result.error is None and result.changed
    ast.parse(result.migrated)
    return result.migrated


def new_lines(before: str, after: str) -> list[str]:
    old = set(before.splitlines())
    return [line for line in after.splitlines() if line not in old]


def test_without_fitting_the_migration_writes_the_long_lines_of_the_report():
    """The reproduction: what the codemods alone write for this script."""
    from accelmigrate.engine.migrate import migrate_source

    code = migrate_source(CLASSIFIER, DDP_AND_WORKERS, "train.py").code
    lengths = sorted(len(line) for line in code.splitlines())
    assert lengths[-1] > 250 and lengths[-2] > 150  # the DataLoader call and the runtime import


def test_inserted_and_rewritten_lines_fit_the_default_line_length(project: Path):
    output = migrated(project, CLASSIFIER, runtime=True)  # the long runtime import too
    assert max(len(line) for line in output.splitlines()) <= 88
    assert "from accelmigrate.runtime.distributed import (\n    SeededDistributedSampler,\n" in output
    assert max(len(line) for line in migrated(project, CLASSIFIER).splitlines()) <= 88  # and the plain definitions
    # the long DataLoader call is black's: one argument a line, a trailing comma, the file's quotes kept
    assert "    train_loader = DataLoader(\n        train_dataset,\n" in output
    assert "        sampler=SeededDistributedSampler(train_dataset, shuffle=True),\n        drop_last=True,\n" in output
    assert "os.path.join(args.data, 'train')" in output


def test_lines_no_codemod_rewrote_stay_byte_for_byte(project: Path):
    output = migrated(project, CLASSIFIER)
    kept = set(output.splitlines()) | {line.strip() for line in output.splitlines()}
    gone = [line for line in CLASSIFIER.splitlines() if line not in kept]
    # what ddp and workers rewrite, and nothing else: the DataParallel wrap, both
    # DataLoaders, the save (rank 0's), the print (rank 0's)
    assert gone == [
        "    model = nn.DataParallel(Classifier())",
        "    train_loader = DataLoader(Shards(os.path.join(args.data, 'train')), batch_size=args.batch_size, shuffle=True, drop_last=True, timeout=120)",
        "                            batch_size=256)",
        "        print('epoch %d: loss %.3f' % (epoch, loss.item()))",
        "    torch.save(model.state_dict(), 'classifier.pt')",
    ]
    # the methods that black would space differently stay as they are
    assert "        self.files = sorted(os.listdir(root))\n    def __len__(self):\n" in output


def test_the_configured_line_length_is_used(project: Path):
    loader = "    train_loader = DataLoader(train_dataset, batch_size=per_process_batch_size(args.batch_size),"
    assert loader not in migrated(project, CLASSIFIER)  # wrapped at 88
    wide = migrated(project, CLASSIFIER, line_length=300)
    assert loader in wide  # one line of 265 characters fits in 300
    assert max(len(line) for line in wide.splitlines()) <= 300


def test_the_line_length_comes_from_black_else_ruff():
    assert project_line_length({"black": {"line-length": 100}, "ruff": {"line-length": 120}}) == 100
    assert project_line_length({"ruff": {"line-length": 120}}) == 120
    assert project_line_length({"isort": {"line_length": 70}}) is None


def test_a_multi_line_call_whose_first_line_grew_is_laid_out_again(project: Path):
    source = textwrap.dedent(
        """\
        import torch

        layer = torch.nn.Linear(16, 16)
        torch.nn.init.xavier_uniform(layer.weight,
                                     gain=torch.nn.init.calculate_gain('relu'))
        bias = torch.nn.init.constant(layer.bias,
                                      0.0)
        """
    )
    output = migrated(project, source, [("modernize", {})])
    assert output == textwrap.dedent(
        """\
        import torch

        layer = torch.nn.Linear(16, 16)
        torch.nn.init.xavier_uniform_(layer.weight, gain=torch.nn.init.calculate_gain('relu'))
        bias = torch.nn.init.constant_(layer.bias, 0.0)
        """
    )


def test_a_continuation_that_still_lines_up_is_left_alone():
    original = "loader = DataLoader(data,\n                    batch_size=8)\n"
    grown = "loader = DataLoader(data,\n                    batch_size=8, num_workers=2)\n"
    assert fit_changed_statements(original, grown, 88) == grown


def test_a_long_statement_holding_a_string_over_lines_is_left_as_written():
    original = 'print("""a\nb""")\n'
    grown = 'print("""a\nb""", file=open("a_file_with_a_rather_long_name_that_goes_past_the_line_length_of_the_project.txt", "w"))\n'
    assert fit_changed_statements(original, grown, 88) == grown


def test_a_long_inserted_comment_is_wrapped_at_its_indentation():
    original = "for x in xs:\n    step(x)\n"
    grown = "for x in xs:\n    # " + "a codemod's explanation of what it inserted " * 3 + "\n    step(x)\n"
    fitted = fit_changed_statements(original, grown, 60)
    assert all(len(line) <= 60 and line.startswith("    # ") for line in fitted.splitlines()[1:-1])
    assert " ".join(line[6:] for line in fitted.splitlines()[1:-1]) == grown.splitlines()[1][6:].strip()


def test_crlf_line_ends_are_kept_in_what_is_wrapped(project: Path):
    output = migrated(project, CLASSIFIER.replace("\n", "\r\n"))
    assert "\n" not in output.replace("\r\n", "")
    assert max(len(line) for line in output.split("\r\n")) <= 88


def test_new_imports_go_to_their_isort_sections(project: Path):
    original = "import os\n\nfrom model import Classifier\n\nx = 1\n"
    # as LibCST leaves them: after the last import, in the order they were asked for
    grown = (
        "import os\n\nfrom model import Classifier\n"
        "import torch\nfrom accelmigrate.runtime.data import default_num_workers\nimport sys\n\nx = 1\n"
    )
    # model.py is in the project: first party, after the third-party section that torch opens
    assert place_new_imports(original, grown, str(project / "train.py")) == (
        "import os\nimport sys\n\n"
        "import torch\nfrom accelmigrate.runtime.data import default_num_workers\n\n"
        "from model import Classifier\n\nx = 1\n"
    )


def test_names_added_to_an_import_are_sorted_as_isort_sorts_them():
    original = "from torch.utils.data import DataLoader, TensorDataset\n\nx = 1\n"
    grown = "from torch.utils.data import DataLoader, TensorDataset, default_collate, DistributedSampler\n\nx = 1\n"
    assert place_new_imports(original, grown) == (
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_collate\n\nx = 1\n"
    )


def ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [shutil.which("ruff")] if shutil.which("ruff") else [sys.executable, "-m", "ruff"]
    probe = subprocess.run([*command, "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd)


SORTED_SCRIPTS = [
    pytest.param(CLASSIFIER, DDP_AND_WORKERS, id="classifier-ddp-workers"),
    pytest.param(
        CLASSIFIER.replace("import argparse\nimport os\n\n", ""), [("ddp", {}), ("amp", {})], id="no-stdlib-ddp-amp"
    ),
    pytest.param(
        CLASSIFIER.replace("from torch.utils.data import DataLoader, Dataset\n", "")
        .replace("import torch.nn as nn\n", "import torch.nn as nn\nfrom torch.utils.data import Dataset\n")
        .replace("DataLoader(", "torch.utils.data.DataLoader("),
        [("ddp", {}), ("sync-bn", {}), ("accumulate", {"value": "4"})],
        id="sync-bn-accumulate",
    ),
    # Two words add names to one new `from` import, in the order they run.
    pytest.param(CLASSIFIER, [("workers", {}), ("tf32", {}), ("fused-optim", {})], id="tf32-fused-optim"),
]


@pytest.mark.parametrize("source, plan", SORTED_SCRIPTS)
def test_ruff_isort_rules_pass_on_the_output_where_they_passed_on_the_input(project: Path, source: str, plan):
    script = project / "train.py"
    script.write_text(source)
    assert ruff("check", "--no-cache", "--select", "I", "train.py", cwd=project).returncode == 0
    result = process_file(str(script), plan, write=True)
    assert result.error is None and result.written
    checked = ruff("check", "--no-cache", "--select", "I,E501", "--output-format", "concise", "train.py", cwd=project)
    assert checked.returncode == 0, checked.stdout + script.read_text()


def test_a_black_formatted_file_stays_black_formatted_with_sorted_imports(project: Path):
    import black

    source = black.format_str(CLASSIFIER, mode=black.Mode())
    output = migrated(project, source, black_config={})
    assert black.format_str(output, mode=black.Mode()) == output
    (project / "train.py").write_text(output)
    assert ruff("check", "--no-cache", "--select", "I", "train.py", cwd=project).returncode == 0


def fixture_pairs():
    root = Path(__file__).resolve().parent.parent / "fixtures"
    for expected in sorted(root.glob("*/*.expected.py")):
        yield pytest.param(expected.with_name(expected.name.replace(".expected.py", ".py")), expected, id=expected.stem)


def top_level_without_imports(code: str) -> list[str]:
    return [ast.dump(node) for node in ast.parse(code).body if not isinstance(node, (ast.Import, ast.ImportFrom))]


def imported(code: str) -> list:
    return sorted(
        (type(node).__name__, getattr(node, "module", None), sorted((a.name, a.asname or "") for a in node.names))
        for node in ast.parse(code).body
        if isinstance(node, (ast.Import, ast.ImportFrom))
    )


@pytest.mark.parametrize("original, expected", list(fixture_pairs()))
def test_fitting_every_fixture_pair_keeps_its_meaning_and_is_stable(original: Path, expected: Path):
    """Over every migration the fixtures hold: the fitted output means what the
    codemods wrote (the same statements; the same imports, perhaps reordered),
    and fitting it again changes nothing."""
    before, after = original.read_text(encoding="utf-8"), expected.read_text(encoding="utf-8")
    fitted = fit_changed_statements(before, place_new_imports(before, after, str(original)), 88)
    assert top_level_without_imports(fitted) == top_level_without_imports(after)
    assert imported(fitted) == imported(after)
    assert fit_changed_statements(before, place_new_imports(before, fitted, str(original)), 88) == fitted


def test_a_file_above_the_black_check_limit_is_fitted_without_black_over_it(monkeypatch):
    """A generated table of a megabyte is not given to black whole (tens of
    seconds) to learn whether it is black-formatted: its changed statements
    are fitted instead."""
    from accelmigrate.engine import formatting

    source = "x = [1, 2, 3]\n"
    assert formatting.is_black_formatted(source, {})
    monkeypatch.setattr(formatting, "BLACK_CHECK_LIMIT", len(source) - 1)
    assert not formatting.is_black_formatted(source, {})


def ruff_failures(folder: Path) -> tuple[set[str], set[str]]:
    """The files of FOLDER that `ruff check --select I` and `ruff format --check`
    fail, each run with ruff's defaults (not this repository's settings)."""
    names = sorted(path.name for path in folder.glob("*.py"))
    checked = ruff("check", "--isolated", "--no-cache", "--select", "I", "--output-format", "json", *names, cwd=folder)
    unsorted = {Path(entry["filename"]).name for entry in json.loads(checked.stdout or "[]")}
    formatted = ruff("format", "--isolated", "--no-cache", "--check", *names, cwd=folder)
    # each file it would change is named ("Would reformat: a.py", or "--> a.py:3:1" in later versions)
    unformatted = {name for name in names if re.search(rf"(?<![\w./-]){re.escape(name)}\b", formatted.stdout)}
    return unsorted, unformatted


WORDS = sorted(folder.name for folder in FIXTURES.iterdir() if folder.is_dir() and folder.name not in ("projects", "scripts", "script"))


@pytest.mark.parametrize("word", WORDS)
def test_migrated_fixtures_pass_ruffs_import_and_format_checks_where_their_input_did(tmp_path: Path, word: str):
    """Every fixture input of a word migrated as `apply --to WORD` writes it
    (plain code): a file whose imports were in isort's order, or that `ruff
    format --check` passed, still passes after migration."""
    folder = tmp_path / f"cases_of_{word.replace('-', '_')}"  # a folder named `accelerate` would make that import first party
    folder.mkdir()
    for case in (FIXTURES / word).glob("*.py"):
        if not case.name.endswith(".expected.py"):
            shutil.copy(case, folder / case.name)
    unsorted, unformatted = ruff_failures(folder)
    run_cli("apply", "--no-cache", "--to", word, ".", cwd=folder)
    unsorted_after, unformatted_after = ruff_failures(folder)
    assert unsorted_after <= unsorted, f"imports out of isort's order after --to {word}: {sorted(unsorted_after - unsorted)}"
    assert unformatted_after <= unformatted, f"no longer ruff-formatted after --to {word}: {sorted(unformatted_after - unformatted)}"


def test_a_long_rewritten_tuple_assignment_is_split_one_item_a_line_as_ruff_splits_it():
    import black

    original = "def step(inputs, labels):\n    inputs, labels = inputs.cuda(), labels.cuda()\n    return inputs, labels\n"
    grown = original.replace("inputs.cuda(), labels.cuda()", "inputs.to(accelerator.device), labels.to(accelerator.device)")
    wrapped = parenthesized_long_tuples(original, grown, 60)
    assert "inputs, labels = (inputs.to(accelerator.device), labels.to(accelerator.device))" in wrapped
    assert "return inputs, labels\n" in wrapped, "an unchanged line stays as written"
    assert parenthesized_long_tuples(original, grown, 88) == grown, "a line that fits stays as written"
    assert black.format_str(wrapped, mode=black.Mode(line_length=60)) == (  # one item a line, as ruff writes it
        "def step(inputs, labels):\n"
        "    inputs, labels = (\n        inputs.to(accelerator.device),\n        labels.to(accelerator.device),\n    )\n"
        "    return inputs, labels\n"
    )


def test_the_python_a_project_targets_comes_from_black_ruff_or_requires_python():
    assert project_python({"tool": {"black": {"target-version": ["py38"]}, "ruff": {"target-version": "py311"}}}) == ["py38"]
    assert project_python({"tool": {"ruff": {"target-version": "py311"}}}) == ["py311"]
    assert project_python({"project": {"requires-python": ">=3.10"}})[0] == "py310"
    assert project_python({}) is None
