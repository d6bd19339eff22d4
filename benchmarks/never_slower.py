"""Never slower: every bundled script and reach script, timed on the CPU
before and after the default words and `checklist`.

For each script of fixtures/scripts/ and benchmarks/reach/ that runs on this
machine (`python script.py` exits 0 on the CPU), three copies of its folder
are made: the original, the script migrated by the default words (`apply`
with no `--to`), and by `--to checklist`. The copies are then run in turn,
`--repeats` rounds of all three (interleaved, so that a slow moment of the
machine weighs on each alike), and the best wall time of each is kept. The
table prints each migration's time as a ratio to the original's; a ratio
above 1.05 is marked SLOWER and counted at the end. One process at a time:
run it on an otherwise idle machine.

    python benchmarks/never_slower.py                     # every script, 3 rounds
    python benchmarks/never_slower.py --repeats 1 --only char_lstm,flat_tutorial
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from accelmigrate.codemods import DEFAULT_WORDS, parse_words, resolve
from accelmigrate.engine.migrate import migrate_source, plan_of

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = (ROOT / "fixtures" / "scripts", ROOT / "benchmarks" / "reach")
VARIANTS = {"default": ",".join(DEFAULT_WORDS), "checklist": "checklist"}
SLOWER = 1.05
TIMEOUT_S = 120


def timed_run(script: Path) -> Optional[float]:
    """Wall seconds of `python script.py` on the CPU, None when it fails."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for name in ("ACCELMIGRATE_PRECISION", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env, capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return time.perf_counter() - start if done.returncode == 0 else None


def copies(script: Path, work: Path) -> dict[str, Path]:
    """The original's folder and one migrated copy of it per variant."""
    made = {}
    for variant in ("original", *VARIANTS):
        folder = work / script.stem / variant
        shutil.copytree(script.parent, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pt", "*.png"))
        copy = folder / script.name
        if variant != "original":
            plan = plan_of(resolve(parse_words(VARIANTS[variant])))
            copy.write_text(migrate_source(copy.read_text(encoding="utf-8"), plan, str(copy)).code, encoding="utf-8")
        made[variant] = copy
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of runs; the best time of each copy is kept")
    parser.add_argument("--only", default="", help="comma-separated script names (without .py)")
    args = parser.parse_args()
    wanted = {name for name in args.only.split(",") if name}
    scripts = [p for folder in FOLDERS for p in sorted(folder.glob("*.py")) if not wanted or p.stem in wanted]
    slower, timed = [], 0
    print(f"{'script':<44} {'original s':>10} {'default':>8} {'checklist':>9}")
    with tempfile.TemporaryDirectory() as temporary:
        for script in scripts:
            made = copies(script, Path(temporary))
            best: dict[str, float] = {}
            for _ in range(args.repeats):
                for variant, copy in made.items():
                    seconds = timed_run(copy)
                    if seconds is not None:
                        best[variant] = min(seconds, best.get(variant, seconds))
            if "original" not in best:
                continue  # does not run on this machine (CUDA only, apex, arguments it needs)
            timed += 1
            ratios = {v: best[v] / best["original"] if v in best else None for v in VARIANTS}
            cells = [f"{r:.2f}x" if r is not None else "fails" for r in ratios.values()]
            marks = [v for v, r in ratios.items() if r is not None and r > SLOWER]
            slower += [(script.stem, v, ratios[v]) for v in marks]
            print(f"{script.stem:<44} {best['original']:>10.2f} {cells[0]:>8} {cells[1]:>9}" + ("  SLOWER: " + ", ".join(marks) if marks else ""))
    print(f"\n{timed} scripts timed; {len(slower)} migrations more than {SLOWER - 1:.0%} slower than the original")
    for name, variant, ratio in slower:
        print(f"  {name} ({variant}): {ratio:.2f}x")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
