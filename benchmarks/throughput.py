"""How fast is `accelmigrate check` with every codemod, next to bare LibCST parsing?

Runs over the installed torch package's own source files (thousands of real,
varied Python files, read in place and never written) and prints, side by
side in one run:
  - bare parsing: `libcst.parse_module` of every file, one process;
  - the engine's work before LibCST alone (each codemod's text trigger, then
    the `ast` pre-check), one process, and how many files pass it for some
    codemod (only those reach LibCST);
  - `accelmigrate check` with every codemod (`accumulate=4`, `batch-scale=2`),
    the CLI's code path in worker processes: with the cache off; again,
    filling a cache; and a re-check of the unchanged files with the cache
    warm, as a percentage of the first check;
  - peak memory: of the one process that parses, and of the largest worker
    (ru_maxrss of the worker processes).
Each measurement runs in a process of its own, forked from this one, so
that one's memory does not weigh on the next.

    python benchmarks/throughput.py             # an evenly spread sample of 400 files
    python benchmarks/throughput.py --limit 300 # a sample of 300
    python benchmarks/throughput.py --all       # every file (bare parsing alone takes minutes)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import libcst

from accelmigrate.codemods import all_codemods, resolve
from accelmigrate.engine.cache import tool_version
from accelmigrate.engine.migrate import MigrationError, codemods_that_may_apply, plan_of, process_files
from accelmigrate.files.sources import InputError, read_source

# The codemods that need a value get a typical one, so that every codemod runs.
VALUES = {"accumulate": {"value": "4"}, "batch-scale": {"value": "2"}}


def torch_sources() -> list[str]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    return sorted(str(p) for p in root.rglob("*.py"))


def evenly_spread(files: list[str], count: int) -> list[str]:
    if len(files) <= count:
        return files
    step = len(files) / count
    return [files[int(i * step)] for i in range(count)]


# -- what is measured ---------------------------------------------------------------------


def bare_parse(files: list[str]) -> int:
    """LibCST's parser alone; returns the files it refused."""
    refused = 0
    for path in files:
        try:
            libcst.parse_module(Path(path).read_bytes())
        except Exception:
            refused += 1
    return refused


def every_codemod() -> list:
    return plan_of(resolve({word: VALUES.get(word, {}) for word in all_codemods()}))


def engine_precheck(files: list[str]) -> int:
    """The engine's work before LibCST (reading, text triggers, the `ast`
    pre-check) alone; returns the files that some codemod may apply to."""
    plan, passing = every_codemod(), 0
    for path in files:
        try:
            passing += bool(codemods_that_may_apply(read_source(Path(path)).text, plan, path))
        except (InputError, MigrationError):
            pass
    return passing


def check(files: list[str], jobs: int, cache_folder: Optional[Path]) -> tuple[int, int, str]:
    """`check` with every codemod: (findings, files not processed, a digest of all results)."""
    plan = every_codemod()
    results = process_files(files, plan, check_only=True, jobs=jobs, cache_folder=cache_folder)
    digest = hashlib.sha256(repr([(r.path, r.error, r.findings) for r in results]).encode()).hexdigest()
    return sum(len(r.findings) for r in results), sum(1 for r in results if r.error), digest


# -- measuring ------------------------------------------------------------------------------


class Measured:
    def __init__(self, value, seconds: float, own_peak_kib: int, worker_peak_kib: int) -> None:
        self.value, self.seconds = value, seconds
        self.own_peak_mib, self.worker_peak_mib = own_peak_kib / 1024, worker_peak_kib / 1024


def in_a_fresh_process(function: Callable, *args) -> Measured:
    """`function(*args)` in a forked process: its wall time, its own peak
    memory and that of the largest process it started (ru_maxrss)."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def run() -> None:
        start = time.perf_counter()
        value = function(*args)
        seconds = time.perf_counter() - start
        own, children = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        send.send((value, seconds, own, children))

    process = context.Process(target=run)
    process.start()
    value, seconds, own, children = receive.recv()
    process.join()
    return Measured(value, seconds, own, children)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="every torch source file, not a sample")
    parser.add_argument("--limit", "--sample", type=int, default=400, help="files in the sample (default 400)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for check (default 2)")
    args = parser.parse_args()

    files = torch_sources()
    if not args.all:
        files = evenly_spread(files, args.limit)
    words = list(all_codemods())
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    shown = ", ".join(f"{w}={VALUES[w]['value']}" if w in VALUES else w for w in words)
    print(f"{len(files)} torch source files ({size:.1f} MiB); codemods: {shown}; check with {args.jobs} worker process(es)", flush=True)

    def line(label: str, m: Measured, note: str) -> None:
        print(f"{label:<40} {m.seconds:8.1f} s {len(files) / m.seconds:8.1f} files/s  {note}", flush=True)

    tool_version()  # once, here: every measurement forked from now on uses the same cache namespace
    parsed = in_a_fresh_process(bare_parse, files)
    line("bare libcst.parse_module, 1 process", parsed, f"peak {parsed.own_peak_mib:.0f} MiB; {parsed.value} file(s) refused")
    screened = in_a_fresh_process(engine_precheck, files)
    line("pre-checks alone (text, ast), 1 process", screened, f"{screened.value} file(s) pass them for some codemod and reach LibCST")
    cache = Path(tempfile.mkdtemp(prefix="accelmigrate-throughput-")) / ".accelmigrate_cache"
    try:
        cold = in_a_fresh_process(check, files, args.jobs, None)
        findings, errors, digest = cold.value
        line(f"check, {args.jobs} processes, cache off", cold,
             f"{cold.seconds / parsed.seconds:.2f} x bare parse; {findings} findings, {errors} files not processed")
        filling = in_a_fresh_process(check, files, args.jobs, cache)
        line(f"check, {args.jobs} processes, filling the cache", filling, f"{filling.seconds / cold.seconds:.2f} x cache off")
        warm = in_a_fresh_process(check, files, args.jobs, cache)
        line("re-check, cache warm", warm, f"{100 * warm.seconds / cold.seconds:.1f}% of the check with the cache off")
    finally:
        shutil.rmtree(cache.parent, ignore_errors=True)
    same = digest == filling.value[2] == warm.value[2]
    print(f"same findings and errors in all three checks: {'yes' if same else 'NO'}")
    print(f"peak memory per worker (ru_maxrss): {cold.worker_peak_mib:.0f} MiB cache off, "
          f"{filling.worker_peak_mib:.0f} MiB filling, {warm.worker_peak_mib:.0f} MiB warm")
    print(f"check time / bare-parse time: {cold.seconds / parsed.seconds:.2f}  (below 1: the whole check is faster than parsing alone)")

if __name__ == "__main__":
    main()
