"""The command line: every exit code, every kind of bad input, config,
suppression, byte-for-byte preservation and atomic writes."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelmigrate.cli import main

from conftest import ROOT, run_cli

LOOP_WITH_EMPTY_CACHE = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2)
        torch.cuda.empty_cache()
    """
)
MIGRATED = LOOP_WITH_EMPTY_CACHE.replace("    torch.cuda.empty_cache()\n", "")
CLEAN = "import torch\n\nx = torch.ones(2)\n"


def invoke(*args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_diff_writes_nothing_and_exits_1(project: Path):
    result = invoke("apply", "--diff", "--to", "empty-cache", "train.py", cwd=project)
    assert result.exit_code == 1
    assert "-    torch.cuda.empty_cache()" in result.stdout
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert (project / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE


def test_apply_rewrites_in_place_and_exits_0(project: Path):
    result = invoke("apply", "train.py", "clean.py", cwd=project)
    assert result.exit_code == 0
    assert (project / "train.py").read_text() == MIGRATED
    assert (project / "clean.py").read_text() == CLEAN
    assert "1 file(s) changed, 1 unchanged" in result.stderr


def test_nothing_to_do_exits_0(project: Path):
    assert invoke("apply", "--diff", "clean.py", cwd=project).exit_code == 0
    assert invoke("check", "clean.py", cwd=project).exit_code == 0


def test_check_reports_findings_with_codes_and_exits_1(project: Path):
    result = invoke("check", ".", cwd=project)
    assert result.exit_code == 1
    assert "train.py:5:5: AM210 [*] " in result.stdout
    assert "(fixable with `accelmigrate apply --to empty-cache`)" in result.stdout
    assert (project / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE


def test_check_json(project: Path):
    result = invoke("check", "--format", "json", "train.py", cwd=project)
    payload = json.loads(result.stdout)
    assert payload[0]["path"] == "train.py"
    assert payload[0]["findings"][0]["code"] == "AM210"
    assert result.exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "--to", "no-such-codemod", "train.py"],
        ["apply"],
        ["apply", "--bogus-flag", "train.py"],
        ["explain", "AM999"],
    ],
)
def test_usage_errors_exit_2(project: Path, args):
    result = invoke(*args, cwd=project)
    assert result.exit_code == 2
    assert (project / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE


BAD_INPUTS = {
    "syntax.py": (b"import torch\ndef broken(:\n    pass\n", "syntax.py:2:12: syntax error"),
    "latin1.py": ("x = 'caf\u00e9'\n".encode("latin-1"), "latin1.py:1: not valid UTF-8"),
    "binary.py": (b"\x00\x01\x02torch\x00", "binary.py: binary file"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_reported_left_untouched_and_others_still_migrated(project: Path, name: str):
    content, message = BAD_INPUTS[name]
    (project / name).write_bytes(content)
    result = invoke("apply", "train.py", name, "clean.py", cwd=project)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1
    assert (project / name).read_bytes() == content
    assert (project / "train.py").read_text() == MIGRATED


def test_missing_path_is_an_input_error(project: Path):
    result = invoke("apply", "train.py", "nowhere.py", cwd=project)
    assert result.exit_code == 2
    assert "nowhere.py: no such file" in result.stderr
    assert (project / "train.py").read_text() == MIGRATED


def test_unreadable_file_is_an_input_error(project: Path, monkeypatch):
    (project / "secret.py").write_text(CLEAN)
    real_open = os.open

    def open_(path, flags, *args, **kwargs):  # permissions cannot stop root, who runs CI
        if os.path.basename(path) == "secret.py":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    result = invoke("apply", "secret.py", "train.py", cwd=project)
    assert result.exit_code == 2
    assert "secret.py: cannot read: Permission denied" in result.stderr
    assert (project / "train.py").read_text() == MIGRATED


def test_declared_encoding_is_kept(project: Path):
    content = "# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\u00e9'\nfor i in range(2):\n    torch.cuda.empty_cache()\n"
    (project / "legacy.py").write_bytes(content.encode("latin-1"))
    assert invoke("apply", "legacy.py", cwd=project).exit_code == 0
    assert (project / "legacy.py").read_bytes() == content.replace("    torch.cuda.empty_cache()\n", "    pass\n").encode("latin-1")


def test_crlf_and_bom_are_kept_byte_for_byte(project: Path):
    content = ("\ufeff" + LOOP_WITH_EMPTY_CACHE.replace("\n", "\r\n")).encode("utf-8")
    (project / "windows.py").write_bytes(content)
    assert invoke("apply", "windows.py", cwd=project).exit_code == 0
    expected = ("\ufeff" + MIGRATED.replace("\n", "\r\n")).encode("utf-8")
    assert (project / "windows.py").read_bytes() == expected


def test_write_keeps_permissions_and_leaves_no_temporary_files(project: Path):
    (project / "train.py").chmod(0o751)
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    assert stat.S_IMODE((project / "train.py").stat().st_mode) == 0o751
    assert sorted(p.name for p in project.iterdir()) == ["clean.py", "train.py"]


def test_suppression_comment_leaves_the_line_alone(project: Path):
    source = LOOP_WITH_EMPTY_CACHE.replace("empty_cache()", "empty_cache()  # accelmigrate: skip[AM210]")
    (project / "train.py").write_text(source)
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 0
    assert invoke("check", "train.py", cwd=project).exit_code == 0
    other_code = LOOP_WITH_EMPTY_CACHE.replace("empty_cache()", "empty_cache()  # accelmigrate: skip[AM101]")
    (project / "train.py").write_text(other_code)
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 1


def test_folders_are_searched_recursively_skipping_environments_and_excludes(project: Path):
    for folder in ["pkg/sub", ".git", ".venv", "build", "env_like"]:
        (project / folder).mkdir(parents=True)
        (project / folder / "loop.py").write_text(LOOP_WITH_EMPTY_CACHE)
    (project / "env_like" / "pyvenv.cfg").write_text("home = /usr\n")
    (project / "pkg" / "legacy.py").write_text(LOOP_WITH_EMPTY_CACHE)
    result = invoke("apply", ".", "--exclude", "pkg/legacy.py", cwd=project)
    assert result.exit_code == 0
    assert (project / "pkg/sub/loop.py").read_text() == MIGRATED
    for untouched in [".git/loop.py", ".venv/loop.py", "build/loop.py", "env_like/loop.py", "pkg/legacy.py"]:
        assert (project / untouched).read_text() == LOOP_WITH_EMPTY_CACHE, untouched


def test_many_files_are_processed_in_parallel_with_the_same_result(project: Path):
    for i in range(12):
        (project / f"copy{i}.py").write_text(LOOP_WITH_EMPTY_CACHE)
    result = invoke("apply", ".", "--jobs", "2", cwd=project)
    assert result.exit_code == 0
    assert all((project / f"copy{i}.py").read_text() == MIGRATED for i in range(12))


def test_config_sets_the_default_words_and_excludes_and_flags_win(project: Path):
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nto = "workers"\nexclude = ["skipped/*"]\n')
    (project / "skipped").mkdir()
    (project / "skipped" / "loop.py").write_text(LOOP_WITH_EMPTY_CACHE)
    assert invoke("apply", "--diff", ".", cwd=project).exit_code == 0  # workers only: nothing to do
    result = invoke("apply", "--to", "empty-cache", ".", cwd=project)
    assert result.exit_code == 0
    assert (project / "train.py").read_text() == MIGRATED
    assert (project / "skipped" / "loop.py").read_text() == LOOP_WITH_EMPTY_CACHE


def test_broken_config_is_a_usage_error(project: Path):
    (project / "pyproject.toml").write_text("[tool.accelmigrate\n")
    result = invoke("apply", "train.py", cwd=project)
    assert result.exit_code == 2 and "pyproject.toml" in result.stderr


def test_black_formatted_input_stays_black_formatted(project: Path):
    import black

    source = textwrap.dedent(
        """\
        import torch

        for step in range(3):
            torch.cuda.empty_cache()
        value = 1
        """
    )
    assert black.format_str(source, mode=black.Mode()) == source
    (project / "formatted.py").write_text(source)
    (project / "unformatted.py").write_text(source.replace("value = 1", "value=[1,2]"))
    assert invoke("apply", "formatted.py", "unformatted.py", cwd=project).exit_code == 0
    formatted = (project / "formatted.py").read_text()
    assert black.format_str(formatted, mode=black.Mode()) == formatted
    assert "value=[1,2]" in (project / "unformatted.py").read_text()


def test_list_and_explain():
    runner = CliRunner()
    listing = runner.invoke(main, ["list"])
    assert listing.exit_code == 0 and "empty-cache" in listing.stdout and "AM210" in listing.stdout
    by_code = runner.invoke(main, ["explain", "AM210"])
    by_word = runner.invoke(main, ["explain", "empty-cache"])
    assert by_code.exit_code == by_word.exit_code == 0
    assert "Example" in by_word.stdout and "AM211" in by_word.stdout


def test_help_documents_exit_codes():
    result = CliRunner().invoke(main, ["apply", "--help"])
    assert "Exit codes" in result.stdout and "2  usage error" in result.stdout


def test_the_tool_never_imports_torch(project: Path):
    script = (
        "import sys\n"
        "from accelmigrate.cli import main\n"
        "for args in (['check', '.'], ['check', '--format', 'sarif', '.'], ['apply', '--diff', '--format', 'json', '.'],\n"
        "             ['list', '--format', 'json'], ['explain', 'AM210'], ['explain', 'accumulate=4']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], cwd=project, capture_output=True, text=True)
    assert "torch not imported" in completed.stdout, completed.stdout + completed.stderr


def test_python_dash_m_entry_point(project: Path):
    completed = run_cli("check", "train.py", cwd=project)
    assert completed.returncode == 1 and "AM210" in completed.stdout


@pytest.mark.slow
def test_pre_commit_hooks(tmp_path: Path):
    """`pre-commit try-repo` against a temporary git repository: check fails on
    findings; apply rewrites the file and fails because it changed it."""
    if shutil.which("pre-commit") is None and subprocess.run([sys.executable, "-m", "pre_commit", "--version"]).returncode:
        pytest.skip("pre-commit is not installed (pip install -e '.[dev]')")
    repo = tmp_path / "user-repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "user@example.com")
    git("config", "user.name", "User")
    (repo / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
    git("add", "train.py")
    # The hook's environment sees the already-installed torch instead of
    # downloading one; PRE_COMMIT_HOME keeps the test's caches out of ~.
    import importlib.metadata

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={importlib.metadata.version('torch')}\n")
    env = {
        **os.environ,
        "VIRTUALENV_SYSTEM_SITE_PACKAGES": "1",
        "PIP_CONSTRAINT": str(constraints),
        "PRE_COMMIT_HOME": str(tmp_path / "cache"),
    }
    try_repo = [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT)]

    check = subprocess.run([*try_repo, "accelmigrate-check", "--all-files"], cwd=repo, env=env, capture_output=True, text=True)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "AM210" in check.stdout
    assert (repo / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE

    apply = subprocess.run([*try_repo, "accelmigrate-apply", "--all-files"], cwd=repo, env=env, capture_output=True, text=True)
    assert apply.returncode == 1, apply.stdout + apply.stderr
    assert "files were modified by this hook" in apply.stdout
    assert (repo / "train.py").read_text() == MIGRATED
