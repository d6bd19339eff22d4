"""What a check costs as a hook or an editor sees it, side by side in one run.

    python benchmarks/instant.py [--runs N]

CPU time (user + system of the child process, median of N runs) of:
`accelmigrate check` on a clean file (one the pre-check rejects: LibCST is
never imported) and on a training script (fixtures/scripts/char_lstm.py),
each with the result cache off (every run does the work) and on (what a
hook's second run costs); a bare `python -c "import ast"` (Python's own
start-up); and `ruff check` on the same files, when ruff is installed. Then
the language server's time from didChange to its diagnostics on the training
script (benchmarks/server_latency.py), when it can be measured. The
children run with Python's bytecode cache, as an installed tool does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINING_SCRIPT = ROOT / "fixtures" / "scripts" / "char_lstm.py"
CLEAN = 'import os\n\n\ndef joined(folder, name):\n    return os.path.join(folder, name)\n'


def child_cpu(command: list[str], cwd: Path, env: dict) -> float:
    """User + system CPU seconds of one run of `command` (and its children)."""
    before = os.times()
    subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def median_cpu(command: list[str], cwd: Path, env: dict, runs: int) -> float:
    child_cpu(command, cwd, env)  # warm the file system cache (and, with the cache on, the result cache)
    return statistics.median(child_cpu(command, cwd, env) for _ in range(runs))


def ruff_command() -> list[str] | None:
    found = shutil.which("ruff") or (str(Path(sys.executable).parent / "ruff") if (Path(sys.executable).parent / "ruff").exists() else None)
    return [found, "check", "--no-cache", "--quiet"] if found else None


def server_latency() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from server_latency import measure_did_change_latency
    except ImportError:
        return "server: not measured (benchmarks/server_latency.py not importable)"
    try:
        seconds = measure_did_change_latency()
    except Exception as error:  # a server that cannot start here is reported, not fatal
        return f"server: not measured ({type(error).__name__}: {error})"
    return f"server: didChange -> diagnostics on {TRAINING_SCRIPT.name}: {seconds * 1000:.0f} ms (median)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (the median is shown)")
    parser.add_argument("--no-server", action="store_true", help="leave out the server's latency")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="accelmigrate-instant-") as folder:
        work = Path(folder)
        (work / "clean.py").write_text(CLEAN)
        shutil.copy(TRAINING_SCRIPT, work / "train.py")
        # As an installed tool runs: with Python's bytecode cache (a machine that
        # sets PYTHONDONTWRITEBYTECODE would recompile every module at every run).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["ACCELMIGRATE_CACHE_DIR"] = str(work / "cache")
        tool = [sys.executable, "-m", "accelmigrate", "check"]
        rows = [
            ('python -c "import ast"', [sys.executable, "-c", "import ast"], None),
            ("accelmigrate check clean.py --no-cache", [*tool, "--no-cache", "clean.py"], "clean.py"),
            ("accelmigrate check clean.py (cache on)", [*tool, "clean.py"], "clean.py"),
            ("accelmigrate check train.py --no-cache", [*tool, "--no-cache", "train.py"], "train.py"),
            ("accelmigrate check train.py (cache on)", [*tool, "train.py"], "train.py"),
        ]
        ruff = ruff_command()
        if ruff is not None:
            rows += [("ruff check clean.py", [*ruff, "clean.py"], None), ("ruff check train.py", [*ruff, "train.py"], None)]
        print(f"CPU seconds (user+sys of the child), median of {args.runs} runs, {os.cpu_count()} CPUs")
        width = max(len(name) for name, _, _ in rows)
        for name, command, _ in rows:
            print(f"  {name:<{width}}  {median_cpu(command, work, env, args.runs):7.3f} s")
        if ruff is None:
            print("  ruff: not installed")
    print(server_latency() if not args.no_server else "server: not measured (--no-server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
