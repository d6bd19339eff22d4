"""The file system's odd corners on the command line: folders that cannot be
entered or listed, file names that look like options, file names that hold
terminal escape sequences or line breaks."""

import json
import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
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
# Permissions stop no one running as root: there the command runs as `nobody`
# (its privileges dropped before the interpreter starts) on a tree that
# `nobody` owns, as a user meets these folders.

# Starts the command in an interpreter that may not be the virtual
# environment's own (nobody may be unable to execute that one): the
# environment's packages, the editable install's included, are added to it.
BOOT = (
    "import runpy, site, sys; [site.addsitedir(folder) for folder in sys.argv.pop(1).split(':')]; "
    "sys.argv[0] = 'accelmigrate'; runpy.run_module('accelmigrate', run_name='__main__')"
)


def _unprivileged_user():
    """(uid, gid) to run the command as, None for the current user (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root, and there is no user `nobody` to drop to")
    return entry.pw_uid, entry.pw_gid


def _as_user(user):
    if user is None:
        return None

    def drop() -> None:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])

    return drop


def _interpreters() -> list:
    """This interpreter, and the same Python version installed elsewhere."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which(version), f"/usr/bin/{version}"]
    return list(dict.fromkeys(path for path in found if path and os.path.exists(path)))


def _run(interpreter: str, user, args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [interpreter, "-c", BOOT, ":".join(site.getsitepackages()), *args],
        cwd=cwd, env={**os.environ, "HOME": str(cwd)}, capture_output=True, text=True, timeout=300,
        preexec_fn=_as_user(user),
    )


def _runner(user, cwd: Path):
    """`run(*args)`: the command as USER, in an interpreter that user can start
    and that imports the checkout; skips when there is none."""
    for interpreter in _interpreters():
        try:
            if _run(interpreter, user, ["--version"], cwd).returncode == 0:
                return lambda *args: _run(interpreter, user, args, cwd)
        except PermissionError:  # not executable by that user
            continue
    pytest.skip("no Python interpreter that the unprivileged user can run imports this checkout")


@pytest.fixture
def locked_tree():
    """A project (owned by the user the command runs as) with `ok/train.py`,
    `locked/` (mode 000) and `unlisted/` (mode 311), each holding a script
    with a finding; yields (run, project), run(*args) running the command
    there as that user."""
    user = _unprivileged_user()
    top = Path(tempfile.mkdtemp(prefix="accelmigrate-locked-"))  # not under pytest's root-only tmp folder
    project = top / "project"
    try:
        for folder in ("ok", "locked", "unlisted"):
            (project / folder).mkdir(parents=True)
            (project / folder / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
        if user is not None:
            for path in [top, project, *project.rglob("*")]:
                os.chown(path, *user)
        top.chmod(0o755)
        run = _runner(user, project)
        (project / "locked").chmod(0)
        (project / "unlisted").chmod(0o311)
        yield run, project
    finally:
        for folder in ("locked", "unlisted"):
            if (project / folder).exists():
                (project / folder).chmod(0o755)
        shutil.rmtree(top)


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
