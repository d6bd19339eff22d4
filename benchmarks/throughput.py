"""How fast is `accelmigrate check` with every codemod, next to bare LibCST parsing?

Runs over the installed torch package's own source files (thousands of real,
varied Python files) and prints, side by side in one run:
  - bare parsing: `libcst.parse_module` of every file, one process;
  - `accelmigrate check` with every codemod (the CLI's code path, all cores),
and their files-per-second rates and ratio.

    python benchmarks/throughput.py            # an evenly spread sample of 400 files
    python benchmarks/throughput.py --all      # every file (bare parsing alone takes minutes)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import libcst

from accelmigrate.codemods import all_codemods, resolve
from accelmigrate.engine import plan_of, process_files


def torch_sources() -> list[str]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    return sorted(str(p) for p in root.rglob("*.py"))


def bare_parse(files: list[str]) -> float:
    start = time.perf_counter()
    for path in files:
        try:
            libcst.parse_module(Path(path).read_bytes())
        except Exception:
            pass
    return time.perf_counter() - start


# The codemods that need a value get a typical one, so that every codemod runs.
VALUES = {"accumulate": {"value": "4"}, "batch-scale": {"value": "2"}}


def check_all(files: list[str], jobs: int) -> tuple[float, int, int]:
    plan = plan_of(resolve({word: VALUES.get(word, {}) for word in all_codemods()}))
    start = time.perf_counter()
    results = process_files(files, plan, check_only=True, jobs=jobs)
    elapsed = time.perf_counter() - start
    findings = sum(len(r.findings) for r in results)
    errors = sum(1 for r in results if r.error)
    return elapsed, findings, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="every torch source file, not a sample")
    parser.add_argument("--sample", type=int, default=400, help="files in the sample (default 400)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    files = torch_sources()
    if not args.all and len(files) > args.sample:
        step = len(files) / args.sample
        files = [files[int(i * step)] for i in range(args.sample)]
    print(f"{len(files)} torch source files; codemods: {', '.join(all_codemods())}; {args.jobs} worker process(es)")

    checked, findings, errors = check_all(files, args.jobs)
    parsed = bare_parse(files)
    print(f"bare libcst.parse_module, 1 process : {parsed:8.1f} s  {len(files) / parsed:8.1f} files/s")
    print(f"accelmigrate check, {args.jobs} process(es)  : {checked:8.1f} s  {len(files) / checked:8.1f} files/s"
          f"  ({findings} findings, {errors} files not processed)")
    print(f"check time / bare-parse time: {checked / parsed:.2f}  (below 1: the whole check is faster than parsing alone)")


if __name__ == "__main__":
    main()
