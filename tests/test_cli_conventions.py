"""The conventions a hook and an editor need, through the real command line:
`-` with --stdin-filename, --select/--ignore and the config's select, ignore
and per-file-ignores, skip-file marks, --exit-zero, and the reports of
unknown codes (AM002, AM003) and of marks that silence nothing (AM004)."""

import textwrap
from pathlib import Path

import pytest

from conftest import run_cli

LOOP = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2)
        torch.cuda.empty_cache()
    """
)
MIGRATED = LOOP.replace("    torch.cuda.empty_cache()\n", "")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate]\n")
    (tmp_path / "train.py").write_text(LOOP)
    return tmp_path


def test_check_reads_stdin_under_its_name(project: Path):
    done = run_cli("check", "--no-cache", "-", "--stdin-filename", "sub/train.py", cwd=project, input=LOOP)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("sub/train.py:5:5: AM210 [*]")


def test_apply_dash_prints_the_migrated_text(project: Path):
    done = run_cli("apply", "-", "--stdin-filename", "train.py", cwd=project, input=LOOP)
    assert done.returncode == 0, done.stderr
    assert done.stdout == MIGRATED
    assert (project / "train.py").read_text() == LOOP  # nothing written


@pytest.mark.parametrize(
    "given",
    [
        b"# -*- coding: latin-1 -*-\n" + LOOP.replace("x = torch.ones(2)", 'x = "caf\xe9"').encode("latin-1"),
        b"\xef\xbb\xbf" + LOOP.encode(),  # a UTF-8 BOM
    ],
)
def test_apply_dash_prints_the_migrated_text_in_the_encoding_it_was_given_in(project: Path, given: bytes):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "accelmigrate", "apply", "-"], cwd=project, input=given, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == given.replace(b"    torch.cuda.empty_cache()\n", b"")


def test_apply_dash_prints_nothing_on_a_syntax_error(project: Path):
    done = run_cli("apply", "-", cwd=project, input="def broken(:\n")
    assert done.returncode == 2
    assert done.stdout == "" and "syntax error" in done.stderr


def test_stdin_filename_without_dash_is_a_usage_error(project: Path):
    done = run_cli("check", "--stdin-filename", "x.py", "train.py", cwd=project)
    assert done.returncode == 2 and "--stdin-filename" in done.stderr


def test_ignore_on_the_command_line_leaves_the_code_alone(project: Path):
    assert run_cli("check", "--no-cache", "--ignore", "AM21", "train.py", cwd=project).returncode == 0
    done = run_cli("apply", "--ignore", "AM210", "train.py", cwd=project)
    assert done.returncode == 0
    assert (project / "train.py").read_text() == LOOP  # apply does not fix what is ignored


def test_select_keeps_only_its_codes_and_a_longer_prefix_wins(project: Path):
    assert run_cli("check", "--no-cache", "--select", "AM1", "train.py", cwd=project).returncode == 0
    done = run_cli("check", "--no-cache", "--select", "AM210", "--ignore", "AM2", "train.py", cwd=project)
    assert done.returncode == 1 and "AM210" in done.stdout


def test_unknown_code_on_the_command_line_is_a_usage_error(project: Path):
    done = run_cli("check", "--select", "AM999", "train.py", cwd=project)
    assert done.returncode == 2 and "AM999" in done.stderr


def test_config_ignore_and_per_file_ignores(project: Path):
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nignore = ["AM210"]\n')
    assert run_cli("check", "--no-cache", "train.py", cwd=project).returncode == 0
    (project / "pyproject.toml").write_text('[tool.accelmigrate.per-file-ignores]\n"legacy/*" = ["AM2"]\n')
    (project / "legacy").mkdir()
    (project / "legacy" / "old.py").write_text(LOOP)
    done = run_cli("check", "--no-cache", ".", cwd=project)
    assert done.returncode == 1
    assert "train.py:5:5: AM210" in done.stdout and "old.py" not in done.stdout


def test_unknown_code_in_the_config_is_reported(project: Path):
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nignore = ["AM2100"]\n')
    done = run_cli("check", "--no-cache", "--ignore", "AM21", "train.py", cwd=project)
    assert done.returncode == 1
    assert "pyproject.toml:2:11: AM003" in done.stdout and "AM2100" in done.stdout


def test_skip_file_mark_skips_the_whole_file(project: Path):
    (project / "train.py").write_text("# accelmigrate: skip-file\n" + LOOP)
    assert run_cli("check", "--no-cache", "train.py", cwd=project).returncode == 0
    assert run_cli("apply", "train.py", cwd=project).returncode == 0
    assert (project / "train.py").read_text() == "# accelmigrate: skip-file\n" + LOOP


def test_skip_file_with_codes_silences_them_everywhere(project: Path):
    source = "# accelmigrate: skip-file[AM210]\n" + LOOP
    (project / "train.py").write_text(source)
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert done.returncode == 0, done.stdout
    run_cli("apply", "train.py", cwd=project)
    assert (project / "train.py").read_text() == source


def test_exit_zero_reports_but_passes(project: Path):
    done = run_cli("check", "--no-cache", "--exit-zero", "train.py", cwd=project)
    assert done.returncode == 0
    assert "AM210" in done.stdout


def test_unknown_code_in_a_mark_is_reported(project: Path):
    (project / "train.py").write_text(LOOP.replace("empty_cache()", "empty_cache()  # accelmigrate: skip[AM210, AM9999]"))
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert done.returncode == 1
    assert "train.py:5:31: AM002" in done.stdout and "AM9999" in done.stdout
    assert "AM004" not in done.stdout and "AM210 " not in done.stdout  # the known code silenced its finding


def test_a_mark_that_silences_nothing_is_reported(project: Path):
    source = LOOP.replace("x = torch.ones(2)", "x = torch.ones(2)  # accelmigrate: skip[AM210]")
    (project / "train.py").write_text(source)
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert done.returncode == 1
    assert "train.py:4:24: AM004" in done.stdout and "train.py:5:5: AM210" in done.stdout
    # A code of a codemod that did not run is not judged.
    assert "AM004" not in run_cli("check", "--no-cache", "--to", "workers", "train.py", cwd=project).stdout


def test_engine_codes_are_explained(project: Path):
    for code in ("AM002", "AM003", "AM004"):
        done = run_cli("explain", code, cwd=project)
        assert done.returncode == 0 and done.stdout.startswith(code)


# -- small conventions that must not let a check pass having checked nothing -----------------


def test_after_double_dash_a_dash_is_the_file_of_that_name(tmp_path):
    from conftest import run_cli

    (tmp_path / "-").write_text("import torch\nfor i in range(3):\n    torch.cuda.empty_cache()\n")
    done = run_cli("check", "--no-cache", "--", "-", cwd=tmp_path, input="")
    assert done.returncode == 1 and ":3:5: AM210" in done.stdout, done.stdout + done.stderr


def test_a_select_that_names_no_code_is_a_usage_error(tmp_path):
    from conftest import run_cli

    (tmp_path / "train.py").write_text("import torch\nfor i in range(3):\n    torch.cuda.empty_cache()\n")
    done = run_cli("check", "--no-cache", "--select", "", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and "--select: names no code" in done.stderr, done.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate]\nselect = []\n")
    done = run_cli("check", "--no-cache", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and "'select' names no code" in done.stderr, done.stderr


def test_a_skip_mark_left_open_names_its_codes_and_silences_no_other(tmp_path):
    from conftest import run_cli

    (tmp_path / "train.py").write_text("import torch\nfor i in range(3):\n    torch.cuda.empty_cache()  # accelmigrate: skip[AM101\n")
    done = run_cli("check", "--no-cache", "train.py", cwd=tmp_path)
    assert "train.py:3:5: AM210" in done.stdout and "AM004" in done.stdout, done.stdout


def test_a_notebook_cell_without_a_cell_type_is_an_error_naming_it(tmp_path):
    import json

    from accelmigrate.engine.migrate import process_file

    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "source": ["import torch"]}, {"metadata": {}, "source": ["x = 1"]}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    result = process_file(str(path), [("empty-cache", {})])
    assert result.error is not None and "cell 2: no `cell_type`" in result.error
