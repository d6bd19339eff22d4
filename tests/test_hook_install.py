"""What installing accelmigrate brings: the pre-commit hooks' environment
holds no torch (the tool never imports it; `run` and `profile` ask for the
`torch` extra), and every package of the project is installed."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# Where pre-commit and pip would take the CUDA build of torch from.
TORCH_DISTRIBUTIONS = ("torch", "triton", "nvidia-")


def requirement_names(requirements):
    return {
        requirement.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
        for requirement in requirements
    }


def test_torch_is_an_extra_not_a_dependency():
    project = PYPROJECT["project"]
    assert "torch" not in requirement_names(project["dependencies"])
    assert project["optional-dependencies"]["torch"] == ["torch>=2.3"]
    dev = next(r for r in project["optional-dependencies"]["dev"] if r.startswith("accelmigrate["))
    assert "torch" in dev[len("accelmigrate["):-1].split(",")  # the tests run scripts


def test_every_package_of_the_project_is_installed():
    """A subpackage missing from the explicit list works in an editable
    checkout and is absent from every real install (the hooks' included)."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    on_disk = set()
    for package, folder in folders.items():
        for module in (ROOT / folder).rglob("*.py"):  # a folder without __init__.py imports too
            relative = module.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join([package, *relative]))
    assert on_disk <= set(setuptools["packages"]), "add to [tool.setuptools] packages"


# --- the real thing: pre-commit builds the hooks' environment -----------------------------------


def _working_tree_as_a_repository(destination: Path) -> str:
    """The project as it is now (tracked and untracked files that git does not
    ignore) committed in a repository of its own; its commit id."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    _git(destination, "init", "-q")
    _git(destination, "add", "-A")
    _git(destination, "commit", "-qm", "the working tree")
    return _git(destination, "rev-parse", "HEAD").strip()


def _git(folder: Path, *args: str) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *identity, *args], cwd=folder, capture_output=True, text=True, check=True).stdout


def _package_index_reachable(folder: Path) -> bool:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-cache-dir",
            "-d",
            str(folder),
            "setuptools>=64",
        ],
        capture_output=True,
        timeout=120,
    )
    return done.returncode == 0


@pytest.mark.slow
def test_the_pre_commit_hooks_install_without_torch(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    pre_commit = shutil.which("pre-commit", path=os.path.dirname(sys.executable)) or shutil.which("pre-commit")
    if pre_commit is None:
        pytest.skip("needs pre-commit (pip install -e '.[dev]')")
    if not _package_index_reachable(tmp_path / "probe"):
        pytest.skip("no package index reachable: pre-commit installs the hooks' environment from it")

    hooks_repository = tmp_path / "accelmigrate"
    hooks_repository.mkdir()
    revision = _working_tree_as_a_repository(hooks_repository)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import torch\n\nprint(torch.__version__)\n")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hooks_repository}\n  rev: {revision}\n  hooks:\n  - id: accelmigrate-check\n"
    )
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    home = tmp_path / "pre-commit-home"
    environment = {**os.environ, "PRE_COMMIT_HOME": str(home), "PIP_NO_CACHE_DIR": "1"}

    run = subprocess.run(
        [pre_commit, "run", "--all-files"], cwd=project, env=environment, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr  # the hook ran, and found nothing in a clean file

    [python] = home.glob("repo*/py_env-*/bin/python")
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    names = [line.split("==")[0] for line in installed.split()]
    assert "accelmigrate" in names and "libcst" in names
    assert not [name for name in names if name.startswith(TORCH_DISTRIBUTIONS)], names


# --- the hooks' command lines: pre-commit appends the file names to the entry ----------------------

LOOP_WITH_EMPTY_CACHE = "#!/usr/bin/env python\nimport torch\n\nfor step in range(3):\n    torch.cuda.empty_cache()\n"


def _hook_command(hook_id: str, files: list) -> list:
    """What pre-commit runs for the hook: its entry, then the file names."""
    yaml = pytest.importorskip("yaml")
    hooks = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
    program, *arguments = shlex.split(hooks[hook_id]["entry"])
    assert program == "accelmigrate"
    return [sys.executable, "-m", "accelmigrate", *arguments, *files]


def _script_named(folder: Path, name: str) -> Path:
    """An executable script (pre-commit takes it for Python by its shebang)."""
    path = folder / name
    path.write_text(LOOP_WITH_EMPTY_CACHE, encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", ["--help", "--version", "-h", "--to=nothing"])
def test_the_check_hook_checks_a_file_named_like_an_option(tmp_path: Path, name: str):
    _script_named(tmp_path, name)
    done = subprocess.run(_hook_command("accelmigrate-check", [name]), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # a finding, not a help screen that exits 0
    assert f"{name}:5:5: AM210" in done.stdout


def test_the_apply_hook_applies_to_files_named_like_options(tmp_path: Path):
    names = ["--help", "-x.py", "train.py"]
    for name in names:
        _script_named(tmp_path, name)
    done = subprocess.run(_hook_command("accelmigrate-apply", names), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 file(s) changed" in done.stderr
    assert all("empty_cache" not in (tmp_path / name).read_text(encoding="utf-8") for name in names)
