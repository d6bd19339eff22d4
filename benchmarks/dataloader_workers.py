"""The `workers` codemod on a data-bound script: loop time before and after.

Migrates fixtures/scripts/data_bound.py (each sample costs a few milliseconds
of CPU, the model is tiny) with `workers` into a temporary folder, then runs
the original and the migrated script one after the other, as subprocesses on
the CPU, and prints both loop times and their ratio. With `--repeat N` the
two alternate N times and the best time of each counts, which steadies the
numbers on a busy machine.

With W worker processes on W free cores the migrated loop can approach 1/W
of the original's time, less the workers' start (a fraction of a second).
On 2 cores the bound is one half: all the work is CPU work, and the two
workers share the two cores with the training loop itself. Workers only
speed up with idle cores: where other jobs keep the cores busy (Linux shares
CPU time between sessions, not between processes), both runs crawl alike.

    python benchmarks/dataloader_workers.py [--repeat 2] [--samples N --epochs E --passes P]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.data import available_cores, default_num_workers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripts" / "data_bound.py"


def migrate(into: Path) -> Path:
    migration = migrate_source(SCRIPT.read_text(encoding="utf-8"), [("workers", {})], str(SCRIPT))
    if not any(f.fixed and f.code == "AM101" for f in migration.findings):
        raise SystemExit(f"the workers codemod did not rewrite {SCRIPT.name}: {migration.findings}")
    target = into / SCRIPT.name
    target.write_text(migration.code, encoding="utf-8")
    return target


def run(script: Path, script_args: list[str]) -> tuple[float, str, float]:
    """(loop time in seconds, final loss) as the script prints them, and the
    cores its processes kept busy on average over the whole run (imports
    included): about 1 for one process, more with workers on idle cores."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    cpu_before, start = _children_cpu_seconds(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(script), *script_args],
        capture_output=True, text=True, env=env, cwd=script.parent, timeout=600,
    )
    cores_busy = (_children_cpu_seconds() - cpu_before) / (time.perf_counter() - start)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    loop = re.search(r"^loop time: ([0-9.]+) s$", done.stdout, re.MULTILINE)
    loss = re.search(r"^final loss: (\S+)$", done.stdout, re.MULTILINE)
    if not (loop and loss):
        raise SystemExit(f"{script} printed no loop time or final loss:\n{done.stdout}")
    return float(loop.group(1)), loss.group(1), cores_busy


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load_average():
    """Runnable processes over the last minute (None where unknown)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="run each script N times, alternating; keep the best")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--passes", type=int, default=40, help="CPU cost of one sample (filtering passes)")
    args = parser.parse_args()
    script_args = ["--samples", str(args.samples), "--epochs", str(args.epochs), "--passes", str(args.passes)]
    load_before = _load_average()
    with tempfile.TemporaryDirectory(prefix="accelmigrate-workers-") as folder:
        migrated = migrate(Path(folder))
        times: dict[str, list[float]] = {"original": [], "migrated": []}
        losses: dict[str, str] = {}
        busy: dict[str, list[float]] = {"original": [], "migrated": []}
        for _ in range(max(1, args.repeat)):
            for name, script in (("original", SCRIPT), ("migrated", migrated)):
                seconds, losses[name], cores_busy = run(script, script_args)
                times[name].append(seconds)
                busy[name].append(cores_busy)

    original, after = min(times["original"]), min(times["migrated"])
    print(f"data-bound script: {args.samples} samples x {args.epochs} epochs, {available_cores()} CPU cores, "
          f"{default_num_workers()} workers after migration")
    if load_before is not None:
        print(f"load average before the runs: {load_before:.2f} (other work on these cores slows both runs, "
              "and not equally; compare runs made on an idle machine)")
    for name, best in (("original", original), ("migrated", after)):
        cores_busy = busy[name][times[name].index(best)]
        print(f"{name} loop: {best:8.3f} s   (final loss {losses[name]}; its processes kept "
              f"{cores_busy:.2f} cores busy on average)")
    print(f"ratio migrated/original: {after / original:.3f}   speed-up: {original / after:.2f}x")
    if losses["original"] != losses["migrated"]:
        print("WARNING: the final losses differ; the dataset is deterministic, so the migration changed the result")
    if args.repeat > 1:
        print("all runs (s): " + "; ".join(f"{k}: {', '.join(f'{t:.3f}' for t in v)}" for k, v in times.items()))


if __name__ == "__main__":
    main()
