"""A training DataLoader given `**kwargs` that hold only worker settings (the
VAE example's `{"num_workers": 1, "pin_memory": True} if args.cuda else {}`)
is sharded by ddp: the migrated script runs alone with the original's final
loss, and on two processes (gloo) prints it once."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.engine import plan_of, process_file

from conftest import run_launch
from test_ddp import _cpu_env

VAE = Path(__file__).resolve().parent.parent / "benchmarks" / "reach" / "vae_mnist_shape.py"
FINAL = re.compile(r"^final loss: (\S+)$", re.MULTILINE)


def _final_losses(command: list, folder: Path) -> list:
    done = run_launch(command, cwd=folder, env=_cpu_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [float(x) for x in FINAL.findall(done.stdout)]


def test_loader_with_worker_kwargs_is_sharded_and_runs(tmp_path):
    result = process_file(str(VAE), plan_of(resolve(parse_words("ddp"))))
    assert result.error is None
    assert "AM523" not in [f.code for f in result.findings]
    assert "sampler=SeededDistributedSampler(" in result.migrated
    migrated = tmp_path / VAE.name
    migrated.write_text(result.migrated)

    (original,) = _final_losses([sys.executable, str(VAE)], tmp_path)
    (alone,) = _final_losses([sys.executable, str(migrated)], tmp_path)
    assert math.isclose(original, alone, rel_tol=0, abs_tol=1e-6)
    on_two = _final_losses([sys.executable, "-m", "accelmigrate", "run", "--nproc-per-node", "2", str(migrated)], tmp_path)
    assert len(on_two) == 1 and math.isfinite(on_two[0])
