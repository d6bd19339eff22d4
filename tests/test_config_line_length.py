"""Inserted code is wrapped at the project's line length: black's, else ruff's."""

from pathlib import Path

from accelmigrate.engine.config import load_config
from conftest import run_cli

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        with open(f"noise/{index}.pt", "rb") as item:
            return torch.load(item), torch.randn(1)


def main():
    data = Noise()
    loader = DataLoader(data, batch_size=16, shuffle=True)
    for x, y in loader:
        print(x.shape)


if __name__ == "__main__":
    main()
"""


def test_the_line_length_comes_from_black_else_ruff(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 60\n")
    assert load_config(tmp_path).line_length == 60
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 60\n\n[tool.black]\nline-length = 70\n")
    assert load_config(tmp_path).line_length == 70


def test_apply_wraps_inserted_code_at_ruffs_line_length(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 60\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    applied = run_cli("apply", "--no-cache", "--to", "workers", str(script), cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    migrated = script.read_text()
    assert "num_workers=" in migrated
    assert max(len(line) for line in migrated.splitlines()) <= 60
