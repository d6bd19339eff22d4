"""Reach: how much of each script in benchmarks/reach/ the codemods migrate.

The scripts are written in the shapes public training code takes (flat
tutorials, `train(args, model, device, ...)`, GANs, RNN and GPT language
models, RL, VAEs, trainer classes, 2017-2018 CUDA-only and pre-0.4 code,
apex, code already distributed). Each prints `final loss: X` last.

For each script and each set of words:
  1. migrate it as `accelmigrate apply --to WORDS` would;
  2. check that the output parses and that a second run changes nothing;
  3. run the original and the migrated copy with `python script.py` on the
     CPU (once per script for the original);
  4. classify:
       full    no finding left but notes, and it runs as well as before
       partly  findings left (counted by code), and it runs as well as before
       broke   the original ran, the copy fails or prints another final loss
               (beyond 1e-6, for the words that keep the arithmetic), or the
               output does not parse or is not idempotent.
     An original that fails on a CPU (CUDA only, apex missing, pre-0.4 code)
     "did not run before"; the table says whether the copy runs now.

    python benchmarks/reach.py                 # every set of words
    python benchmarks/reach.py --words ddp     # one set (a key of WORD_SETS)
    python benchmarks/reach.py --no-run        # migrate and classify by findings only
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from accelmigrate.codemods import all_codemods, parse_words, resolve
from accelmigrate.engine import NOTES as ENGINE_NOTES
from accelmigrate.engine import plan_of, process_file

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "reach"
EVERY_WORD = "modernize,main-guard,workers,item,empty-cache,device,amp,ddp,sync-bn,accumulate=2"
# name -> (words, whether the migrated script computes exactly what the original does)
WORD_SETS = {
    "default": ("modernize,workers,item,empty-cache", True),
    "every": (EVERY_WORD, False),  # accumulate=2 takes one step per two batches
    "device,amp": ("device,amp", True),  # amp computes in float32 on a CPU
    "ddp": ("ddp", True),  # one process draws the original's order
}
TOLERANCE = 1e-6
RUN_TIMEOUT_S = 180
FINAL_LOSS = re.compile(r"^final loss: (\S+)\s*$", re.MULTILINE)


@dataclasses.dataclass
class Run:
    ok: bool
    loss: Optional[float] = None
    why: str = ""


@dataclasses.dataclass
class Outcome:
    script: str
    words: str
    verdict: str  # full, partly, broke
    left: collections.Counter
    ran_before: bool
    runs_after: Optional[bool]
    why: str = ""


def plan_for(words: str):
    return plan_of(resolve(parse_words(words)))


def notes_of_every_codemod() -> frozenset:
    return frozenset().union(ENGINE_NOTES, *(cls.notes for cls in all_codemods().values()))


def run_script(path: Path) -> Run:
    """`python script.py` on the CPU, in the script's own folder."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for name in ("ACCELMIGRATE_PRECISION", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    try:
        done = subprocess.run(
            [sys.executable, path.name], cwd=path.parent, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return Run(False, why=f"timed out after {RUN_TIMEOUT_S} s")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Run(False, why=f"exit {done.returncode}: {last[:160]}")
    found = FINAL_LOSS.findall(done.stdout)
    if not found:
        return Run(False, why="no `final loss:` line")
    return Run(True, float(found[-1]))


def migrate(path: Path, words: str, folder: Path):
    """The migrated copy (written into `folder`), its unfixed findings, and
    what is wrong with the output itself, if anything."""
    plan = plan_for(words)
    result = process_file(str(path), plan)
    if result.error:
        return None, [], f"migration failed: {result.error}"
    copy = folder / path.name
    copy.write_text(result.migrated, encoding="utf-8")
    try:
        ast.parse(result.migrated)
    except SyntaxError as error:
        return None, [], f"output does not parse: {error}"
    again = process_file(str(copy), plan)
    if again.error or again.migrated != result.migrated:
        return None, [], "not idempotent: a second run changes the output"
    failed = [f for f in result.findings if f.code == "AM000"]
    if failed:
        return None, [], f"a codemod failed: {failed[0].message[:160]}"
    return copy, [f for f in result.findings if not f.fixed], ""


def same_loss(before: Run, after: Run) -> bool:
    return math.isclose(before.loss, after.loss, rel_tol=0.0, abs_tol=TOLERANCE)


@dataclasses.dataclass
class Migrated:
    script: Path
    name: str
    copy: Optional[Path]
    left: collections.Counter
    wrong: str


def migrate_all(jobs, notes: frozenset, root: Path) -> list[Migrated]:
    """One after the other, in this thread: the engine's deep-stack and
    recursion-limit handling is per process, not per thread."""
    done = []
    for index, (script, name) in enumerate(jobs):
        folder = root / str(index)
        folder.mkdir()
        copy, unfixed, wrong = migrate(script, WORD_SETS[name][0], folder)
        left = collections.Counter(f.code for f in unfixed if f.code not in notes)
        done.append(Migrated(script, name, copy, left, wrong))
    return done


def classify(job: Migrated, original: Optional[Run], after: Optional[Run]) -> Outcome:
    exact = WORD_SETS[job.name][1]
    ran_before = original is not None and original.ok
    name, left = job.name, job.left
    if job.wrong:
        return Outcome(job.script.name, name, "broke", left, ran_before, None, job.wrong)
    runs_after = None if after is None else after.ok
    if ran_before and after is not None:
        if not after.ok:
            return Outcome(job.script.name, name, "broke", left, True, False, after.why)
        if exact and not same_loss(original, after):
            why = f"final loss {original.loss!r} before, {after.loss!r} after"
            return Outcome(job.script.name, name, "broke", left, True, True, why)
        if not math.isfinite(after.loss):
            return Outcome(job.script.name, name, "broke", left, True, True, f"final loss {after.loss}")
    why = "" if after is None or after.ok else after.why
    return Outcome(job.script.name, name, "partly" if left else "full", left, ran_before, runs_after, why)


def table(outcomes: list[Outcome], names: list[str], ran: bool) -> str:
    by_script = collections.defaultdict(dict)
    for outcome in outcomes:
        by_script[outcome.script][outcome.words] = outcome
    lines = ["| script | ran before | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for script in sorted(by_script):
        cells = []
        for name in names:
            outcome = by_script[script][name]
            cell = outcome.verdict
            if outcome.left:
                cell += " (" + ", ".join(sorted(outcome.left)) + ")"
            if not outcome.ran_before and outcome.runs_after is not None:
                cell += ", runs now" if outcome.runs_after else ", still fails"
            cells.append(cell)
        first = next(iter(by_script[script].values()))
        lines.append(f"| {script} | {('yes' if first.ran_before else 'no') if ran else '-'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def totals(outcomes: list[Outcome], names: list[str], ran: bool) -> str:
    lines = [
        "| words | full | partly | broke | did not run before: runs now | top codes left |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        mine = [o for o in outcomes if o.words == name]
        count = collections.Counter(o.verdict for o in mine)
        before_failed = [o for o in mine if not o.ran_before]
        now = f"{sum(bool(o.runs_after) for o in before_failed)} of {len(before_failed)}" if ran else "-"
        codes = collections.Counter()
        for o in mine:
            codes.update(set(o.left))  # scripts left with each code
        top = ", ".join(f"{code} {n}" for code, n in codes.most_common(5)) or "-"
        lines.append(f"| `{name}` | {count['full']} | {count['partly']} | {count['broke']} | {now} | {top} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", action="append", choices=list(WORD_SETS), help="a set of words (repeatable)")
    parser.add_argument("--no-run", action="store_true", help="classify by findings only, run nothing")
    parser.add_argument("scripts", nargs="*", type=Path, help="scripts (default: benchmarks/reach/*.py)")
    args = parser.parse_args(argv)
    names = args.words or list(WORD_SETS)
    scripts = args.scripts or sorted(CORPUS.glob("*.py"))
    started = time.perf_counter()
    jobs = [(script, name) for script in scripts for name in names]
    with tempfile.TemporaryDirectory() as root:
        migrated = migrate_all(jobs, notes_of_every_codemod(), Path(root))
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # each run is its own process
            originals = {} if args.no_run else dict(zip(scripts, pool.map(run_script, scripts)))
            runnable = [job.copy if job.copy and not args.no_run else None for job in migrated]
            afters = list(pool.map(lambda copy: copy and run_script(copy), runnable))
        outcomes = [classify(job, originals.get(job.script), after) for job, after in zip(migrated, afters)]
    print(table(outcomes, names, not args.no_run))
    print()
    print(totals(outcomes, names, not args.no_run))
    problems = [o for o in outcomes if o.why]
    if problems:
        print()
        for o in problems:
            print(f"- {o.script} `{o.words}`: {o.verdict}: {o.why}")
    print(f"({len(scripts)} scripts, {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 1 if any(o.verdict == "broke" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
