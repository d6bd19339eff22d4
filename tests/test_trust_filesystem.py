"""The file system's odd corners on the command line: folders that cannot be
entered or listed, file names that look like options, file names that hold
terminal escape sequences or line breaks."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelmigrate.cli import main

LOOP_WITH_EMPTY_CACHE = "import torch\n\nfor step in range(3):\n    torch.cuda.empty_cache()\n"
MIGRATED = "import torch\n\nfor step in range(3):\n    pass\n"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# --- folders that cannot be entered (mode 000) or listed (mode 311) ----------------------------
#
# Permissions stop no one running as root: there the command runs without the
# two capabilities that override them (dropped from its bounding set by
# util-linux's setpriv before the interpreter starts), so root meets these
# folders as their owner would, in this very interpreter and environment.

OVERRIDES = "-dac_override,-dac_read_search"


def _permissions_enforced() -> list:
    """The prefix that makes the command obey permission bits: none for a
    user who is not root; for root, setpriv without the overriding capabilities."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and util-linux's setpriv (to drop the overriding capabilities) is missing")
    return [setpriv, f"--bounding-set={OVERRIDES}", f"--inh-caps={OVERRIDES}"]


@pytest.fixture
def locked_tree(tmp_path):
    """A project with `ok/train.py`, `locked/` (mode 000) and `unlisted/`
    (mode 311), each holding a script with a finding; yields (run, project),
    run(*args) running the command there with permissions enforced."""
    project = tmp_path / "project"
    for folder in ("ok", "locked", "unlisted"):
        (project / folder).mkdir(parents=True)
        (project / folder / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
    prefix = _permissions_enforced()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "accelmigrate", *args],
            cwd=project, env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=300,
        )

    (project / "locked").chmod(0)
    (project / "unlisted").chmod(0o311)
    try:
        yield run, project
    finally:
        for folder in ("locked", "unlisted"):
            (project / folder).chmod(0o755)


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr


def test_check_names_each_folder_it_cannot_list_and_checks_the_rest(locked_tree):
    run, _ = locked_tree
    done = run("check", "--no-cache", "--to", "empty-cache", ".")
    _no_traceback(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: locked: cannot list folder: Permission denied\n" in done.stderr
    assert "error: unlisted: cannot list folder: Permission denied\n" in done.stderr
    assert "ok/train.py:4:5: AM210" in done.stdout


def test_apply_migrates_the_rest_beside_folders_it_cannot_list(locked_tree):
    run, project = locked_tree
    done = run("apply", "--no-cache", "--to", "empty-cache", ".")
    _no_traceback(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "locked: cannot list folder" in done.stderr and "unlisted: cannot list folder" in done.stderr
    assert (project / "ok" / "train.py").read_text() == MIGRATED
    (project / "unlisted").chmod(0o755)
    assert (project / "unlisted" / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE


def test_paths_named_in_or_as_unreadable_folders_are_each_one_error(locked_tree):
    run, _ = locked_tree
    done = run("check", "--no-cache", "--to", "empty-cache", "locked", "locked/train.py", "ok")
    _no_traceback(done)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: locked: cannot list folder: Permission denied",  # once: not also "no Python files found"
        "error: locked/train.py: cannot read: Permission denied",
    ]
    assert "ok/train.py:4:5: AM210" in done.stdout


# --- file names that look like options ---------------------------------------------------------


@pytest.fixture
def dashed(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("-x.py", "train.py"):
        (tmp_path / name).write_text(LOOP_WITH_EMPTY_CACHE)
    return tmp_path


def test_a_file_named_like_an_option_after_the_options_is_a_path(dashed: Path):
    checked = invoke("check", "--no-cache", "--to", "empty-cache", "-x.py")
    assert checked.exit_code == 1, checked.output
    assert "-x.py:4:5: AM210" in checked.stdout
    applied = invoke("apply", "--no-cache", "--to", "empty-cache", "train.py", "-x.py")
    assert applied.exit_code == 0, applied.output
    assert (dashed / "-x.py").read_text() == MIGRATED and (dashed / "train.py").read_text() == MIGRATED


def test_options_still_read_around_such_a_path(dashed: Path):
    result = invoke("check", "-x.py", "--no-cache", "--to=empty-cache", "--format", "json", "-j1", "train.py")
    assert result.exit_code == 1, result.output
    assert [entry["path"] for entry in json.loads(result.stdout)] == ["-x.py", "train.py"]


def test_an_unknown_option_that_names_no_file_is_a_usage_error_naming_it(dashed: Path):
    result = invoke("check", "--no-cache", "-y.py", "train.py")
    assert result.exit_code == 2
    assert "No such option: -y.py" in result.output
    assert invoke("check", "--no-cache", "train.py", "--to").exit_code == 2  # a value still missing


def test_after_a_double_dash_everything_is_a_path(dashed: Path):
    result = invoke("check", "--no-cache", "--to", "empty-cache", "--", "-x.py", "--help", "train.py")
    assert result.exit_code == 2, result.output  # `--help` names no file: that file's error, not a help screen
    assert "error: --help: no such file" in result.stderr
    assert "-x.py:4:5: AM210" in result.stdout and "train.py:4:5: AM210" in result.stdout


# --- file names that a terminal would obey -------------------------------------------------------

ODD_NAMES = ["clear\x1b[2J.py", "two\nlines.py", "back\rover.py"]


@pytest.fixture
def oddly_named(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ODD_NAMES:
        (tmp_path / name).write_text(LOOP_WITH_EMPTY_CACHE)
    (tmp_path / "red\x1b[31m.py").write_text("def (:\n")
    return tmp_path


def _raw(text: str) -> bool:
    return any(c in text for c in "\x1b\r") or any(name in text for name in ODD_NAMES)


def test_text_output_quotes_names_with_escapes_and_line_breaks(oddly_named: Path):
    result = invoke("check", "--no-cache", "--to", "empty-cache", ".")
    assert result.exit_code == 2, result.output
    assert not _raw(result.stdout) and not _raw(result.stderr)
    for name in ODD_NAMES:
        assert f"{name!r}:4:5: AM210" in result.stdout
    assert "error: 'red\\x1b[31m.py':1:5: syntax error" in result.stderr
    assert len(result.stdout.splitlines()) == len(ODD_NAMES)  # one line a finding


def test_diffs_and_changed_lines_quote_them_too(oddly_named: Path):
    diffed = invoke("apply", "--no-cache", "--to", "empty-cache", "--diff", ".")
    assert not _raw(diffed.stdout) and not _raw(diffed.stderr)
    assert f"--- {'a/' + ODD_NAMES[0]!r}" in diffed.stdout
    applied = invoke("apply", "--no-cache", "--to", "empty-cache", ".")
    assert not _raw(applied.stderr)
    assert f"changed {ODD_NAMES[1]!r}: empty-cache" in applied.stderr
    assert all((oddly_named / name).read_text() == MIGRATED for name in ODD_NAMES)


def test_github_annotations_show_no_escape_sequence(oddly_named: Path):
    result = invoke("check", "--no-cache", "--to", "empty-cache", "--format", "github", ".")
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert errors and all("\x1b" not in line.split("::", 2)[2] for line in errors)


def test_json_keeps_the_real_names(oddly_named: Path):
    result = invoke("check", "--no-cache", "--to", "empty-cache", "--format", "json", ".")
    assert sorted(entry["path"] for entry in json.loads(result.stdout)) == sorted([*ODD_NAMES, "red\x1b[31m.py"])


# --- links that lead out of the folder walked ---------------------------------------------------


def test_a_link_to_a_file_outside_the_folder_walked_is_skipped_with_a_message(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere.py"
    outside.write_text(LOOP_WITH_EMPTY_CACHE)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
    (project / "linked.py").symlink_to(outside)
    (project / "same.py").symlink_to(project / "train.py")  # a link within the folder is still followed
    monkeypatch.chdir(tmp_path)
    result = invoke("apply", "project", "--to", "empty-cache")
    assert result.exit_code == 0, result.output
    assert outside.read_text() == LOOP_WITH_EMPTY_CACHE
    assert "project/linked.py: a link to" in result.output and "outside project; skipped" in result.output
    assert (project / "train.py").read_text() == MIGRATED
    named = invoke("apply", "project/linked.py", "--to", "empty-cache")  # named on the command line: followed
    assert named.exit_code == 0 and outside.read_text() == MIGRATED
