"""The torch a project targets (accelmigrate/project/torch_version.py): read
from its requirements where they confine it to a torch line, else the
installed torch's metadata; words whose code needs a newer torch are left
out with AM008, and the plain definitions take the older spelling."""

from pathlib import Path

import pytest

from accelmigrate.engine.migrate import process_file
from accelmigrate.project import torch_version
from accelmigrate.project.torch_version import confined_to, targeted_torch

from conftest import SCRIPTS


@pytest.mark.parametrize(
    "requirement, expected",
    [
        ("torch==1.13.1+cu117", (1, 13)),
        ("torch>=1.8,<2", (1, 8)),
        ("torch~=1.13", (1, 13)),
        ("pytorch=1.12", (1, 12)),  # conda
        ("torch ^2.0", (2, 0)),  # poetry
        ("torch==2.*", (2, 0)),
        ("torch>=1.8", None),  # a bare minimum: a fresh install gets the newest torch
        ("torch!=1.9,>=1.7", None),
        ("torch<=2.0", None),
        ("torch", None),
        ("torch @ https://example.org/torch-1.8.0-cp38.whl", None),
        ("torchvision==0.9.0", None),
        ("pytorch-lightning==1.5", None),
    ],
)
def test_the_torch_line_a_requirement_confines_the_project_to(requirement, expected):
    assert confined_to(requirement) == expected


@pytest.fixture
def project(tmp_path: Path) -> Path:
    torch_version._declared.cache_clear()
    yield tmp_path
    torch_version._declared.cache_clear()


@pytest.mark.parametrize(
    "name, text",
    [
        ("requirements.txt", "numpy\n# the cluster's build\ntorch==1.13.1+cu117\n"),
        ("requirements/train.txt", "--extra-index-url https://download.pytorch.org/whl\ntorch==1.13.0\n"),
        ("pyproject.toml", '[project]\nname = "x"\ndependencies = ["numpy", "torch>=1.13,<2"]\n'),
        ("setup.py", 'from setuptools import setup\nsetup(name="x", install_requires=["torch==1.13.1"])\n'),
        ("environment.yml", "dependencies:\n  - python=3.9\n  - pytorch=1.13\n"),
    ],
)
def test_the_project_file_that_confines_torch_is_read_from_the_scripts_folder_up(project: Path, name: str, text: str):
    (project / name).parent.mkdir(parents=True, exist_ok=True)
    (project / name).write_text(text)
    (project / "src" / "train").mkdir(parents=True)
    target = targeted_torch(str(project / "src" / "train" / "main.py"))
    assert target is not None and target.version == (1, 13) and name in target.where


def test_the_main_requirements_file_is_read_before_the_others(project: Path):
    (project / "requirements.txt").write_text("torch==2.1.0\n")
    (project / "requirements-docs.txt").write_text("torch==1.13.1\n")
    assert targeted_torch(str(project / "train.py")).version == (2, 1)


def test_a_bare_minimum_leaves_the_installed_torch_the_target(project: Path):
    (project / "requirements.txt").write_text("torch>=1.4\n")
    assert targeted_torch(str(project / "train.py")) == torch_version.installed_torch()


def test_the_search_stops_at_the_projects_root(project: Path):
    (project / "requirements.txt").write_text("torch==1.13.1\n")
    (project / "inner" / ".git").mkdir(parents=True)  # a repository of its own inside
    assert targeted_torch(str(project / "inner" / "train.py")) == torch_version.installed_torch()


def migrated_for(project: Path, requirement: str, words: list[str], code: str = "AM008") -> tuple[str, str, object]:
    """char_lstm.py migrated with WORDS in a project that requires REQUIREMENT:
    the message of its CODE finding, the migrated text, and the result of a second run."""
    (project / "requirements.txt").write_text(requirement + "\n")
    script = project / "train.py"
    script.write_text((SCRIPTS / "char_lstm.py").read_text())
    plan = [(word, {}) for word in words]
    (finding,) = [f for f in process_file(str(script), plan, write=True).findings if f.code == code]
    migrated = script.read_text()
    return finding.message, migrated, process_file(str(script), plan, write=True)


def test_words_whose_code_needs_a_newer_torch_are_left_out_and_the_others_written_for_it(project: Path):
    message, migrated, again = migrated_for(project, "torch==1.13.1", ["device", "amp", "compile"])
    assert "compile (torch 2.0)" in message and "requirements.txt: `torch==1.13.1`" in message
    assert "torch.compile" not in migrated and "should_compile" not in migrated
    # torch.amp.GradScaler(device_type) arrived in 2.3: torch.cuda.amp's, as the plain definition for 1.13
    assert "torch.cuda.amp.GradScaler(" in migrated and "torch.amp.GradScaler(" not in migrated
    assert again.error is None and not again.written, "the older spelling is known again"


def test_a_pin_older_than_any_torch_the_words_write_for_is_migrated_for_a_current_torch_with_a_note(project: Path):
    """torch==0.4.1 installs on no current Python: the project trains with a
    newer torch today, and its requirement must rise."""
    message, migrated, _ = migrated_for(project, "torch==0.4.1", ["item", "device", "amp"], code="AM009")
    assert "(amp)" in message and "raise it to torch>=1.12" in message and "`torch==0.4.1`" in message
    assert ".item()" in migrated and "torch.autocast" in migrated and "torch.amp.GradScaler(" in migrated


def test_the_installed_torch_is_read_from_its_metadata_without_importing_it():
    import importlib.metadata
    import subprocess
    import sys

    assert torch_version._installed_version() == importlib.metadata.version("torch")
    probe = "from accelmigrate.project.torch_version import installed_torch as t; import sys; print(t().key(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [torch_version.installed_torch().key(), "False"]
