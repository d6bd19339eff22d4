import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SCRIPTS = FIXTURES / "scripts"

# The result cache lives outside the folders that tests list and compare.
os.environ.setdefault("ACCELMIGRATE_CACHE_DIR", tempfile.mkdtemp(prefix="accelmigrate-cache-"))


def run_python(script: Path, *args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 300):
    """Run a Python script in a fresh interpreter on the CPU; returns the CompletedProcess."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True, text=True, env=full_env, cwd=cwd or script.parent, timeout=timeout,
    )


def run_cli(*args: str, cwd: Path | None = None, input: str | None = None, env: dict | None = None):
    """Run `python -m accelmigrate ...` in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "accelmigrate", *args],
        capture_output=True, text=True, cwd=cwd, input=input, env=full_env, timeout=300,
    )


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
