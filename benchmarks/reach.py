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
    python benchmarks/reach.py --words ddp --words accelerate --parity
    python benchmarks/reach.py --runtime       # the copies import accelmigrate.runtime

The last lines count, per set of words, the scripts with no manual step
(verdict full). `--parity` also launches each copy of the multi-process
words (`ddp`, `accelerate`, `fabric`) on 2 gloo processes (`python -m
torch.distributed.run --nproc-per-node 2`, CPU) and compares the parameters
every optimizer ends with, watched from outside by
fixtures/scripts/ddp_rank_weights.py, with the original's in one process:
the ranks must agree within 1e-6 and match the one process within 1e-5
(float sums in another order). A final loss printed by one rank is that
rank's share of the batch, so weights are what is compared.
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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from accelmigrate.codemods import all_codemods, parse_words, resolve
from accelmigrate.engine.migrate import NOTES as ENGINE_NOTES
from accelmigrate.engine.migrate import plan_of, process_file

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "reach"
EVERY_WORD = "modernize,main-guard,workers,item,empty-cache,device,amp,ddp,sync-bn,accumulate=2"
# name -> (words, whether the migrated script computes exactly what the original does)
WORD_SETS = {
    "default": ("modernize,workers,item,empty-cache", True),
    "checklist": ("checklist", True),  # amp computes in float32 on a CPU
    "every": (EVERY_WORD, False),  # accumulate=2 takes one step per two batches
    "device,amp": ("device,amp", True),  # amp computes in float32 on a CPU
    "ddp": ("ddp", True),  # one process draws the original's order
    "accelerate": ("accelerate", True),  # a world of one computes as the original
    "fabric": ("fabric", True),  # a world of one computes as the original
    # The exact-parity forms, which --parity holds to the one-process weights on 2 processes (the default forms
    # give each process the loader's batch: the original with twice the batch, which `verify` compares).
    "accelerate=parity": ("accelerate=parity", True),
    "fabric=parity": ("fabric=parity", True),
}
TOLERANCE = 1e-6
RUN_TIMEOUT_S = 180
# --parity: the watcher that keeps what each rank's optimizers trained
WATCHER = HERE.parent / "fixtures" / "scripts" / "ddp_rank_weights.py"
# --parity: the words whose copies run on 2 processes, and what their launch needs
MULTI_PROCESS = {"ddp": {}, "accelerate=parity": {"ACCELERATE_USE_CPU": "true"}, "fabric=parity": {}}
# Notes that say a copy on N processes trains as well but not to the same numbers:
# draws per process (dropout, noise), BatchNorm over each share, Fabric's shuffled order.
OTHER_NUMBERS_NOTES = frozenset({"AM535", "AM538", "AM816", "AM817", "AM910", "AM916", "AM917"})
RANK_TOLERANCE = 1e-6  # both ranks apply the same all-reduced gradients
ONE_PROCESS_TOLERANCE = 1e-5  # half batches on two processes: float sums in another order
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELMIGRATE_PRECISION")
FINAL_LOSS = re.compile(r"^final loss: (\S+)\s*$", re.MULTILINE)
# A gloo process group can abort a process as it ends, its work done (a
# torch/gloo teardown race), and a rank's first connection to its peer can be
# closed before the group is up (both rare, more often on a loaded machine):
# such a run is launched again, up to this many times.
GLOO_FLAKES = ("terminate called without an active exception", "Gloo connectFullMesh failed")
GLOO_FLAKE_RERUNS = 3


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


def migrate(path: Path, words: str, folder: Path, runtime: bool = False):
    """The migrated copy (written into `folder`), its unfixed findings, and
    what is wrong with the output itself, if anything. With `runtime` the
    copy imports the runtime's helpers (`apply --runtime`), else it carries
    their plain definitions."""
    plan = plan_for(words)
    result = process_file(str(path), plan, runtime=runtime)
    if result.error:
        return None, [], f"migration failed: {result.error}"
    copy = folder / path.name
    copy.write_text(result.migrated, encoding="utf-8")
    try:
        ast.parse(result.migrated)
    except SyntaxError as error:
        return None, [], f"output does not parse: {error}"
    again = process_file(str(copy), plan, runtime=runtime)
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
    noted: frozenset = frozenset()  # the notes it reported


def migrate_all(jobs, notes: frozenset, root: Path, runtime: bool = False) -> list[Migrated]:
    """One after the other, in this thread: the engine's deep-stack and
    recursion-limit handling is per process, not per thread."""
    done = []
    for index, (script, name) in enumerate(jobs):
        folder = root / str(index)
        folder.mkdir()
        copy, unfixed, wrong = migrate(script, WORD_SETS[name][0], folder, runtime)
        left = collections.Counter(f.code for f in unfixed if f.code not in notes)
        done.append(Migrated(script, name, copy, left, wrong, frozenset(f.code for f in unfixed if f.code in notes)))
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


@dataclasses.dataclass
class Parity:
    verdict: str  # same, expected (differs as a note says), differ, failed, n/a
    why: str


def _parity_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    # One thread per process, in both runs: two ranks share the cores, and the
    # one-process run then sums in the same order as each rank does.
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # the script's own error, not the launcher's summary after it ("[rank1]: ValueError: ...")
    errors = [line for line in lines if re.match(r"^(\[rank\d+\]:\s*)?\w*(Error|Exception)\b", line)]
    return ((errors or lines or ["(no output)"])[-1])[:160]


def _watched_weights(command: list[str], cwd: Path, out: Path, extra_env: dict):
    """Run `command` (the watcher, writing into `out`): the parameters each
    rank's optimizers ended with, rank by rank, or why there are none."""
    import torch  # only for --parity

    for _ in range(1 + GLOO_FLAKE_RERUNS):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        try:
            done = subprocess.run(command, cwd=cwd, env=_parity_env(extra_env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {RUN_TIMEOUT_S} s"
        if done.returncode == 0 or not any(flake in done.stderr for flake in GLOO_FLAKES):
            break
    if done.returncode != 0:
        return None, f"exit {done.returncode}: {_last_error(done.stderr)}"
    return [torch.load(f) for f in sorted(out.glob("weights-rank*.pt"))], ""


def _largest_difference(first: list, second: list) -> Optional[float]:
    if [p.shape for p in first] != [p.shape for p in second]:
        return None
    return max(((a - b).abs().max().item() for a, b in zip(first, second)), default=0.0)


def parity_on_two(original: Path, copy: Path, folder: Path, extra_env: Optional[dict] = None) -> Parity:
    """A multi-process word's copy on 2 gloo processes against the original on one."""
    folder, extra_env = folder.resolve(), extra_env or {}  # the runs start in the scripts' own folders
    alone, why = _watched_weights([sys.executable, str(WATCHER), str(folder / "one"), original.name], original.parent, folder / "one", extra_env)
    if why:
        return Parity("failed", f"the original under the watcher: {why}")
    if not alone[0]:  # weights updated by hand: the watcher sees no optimizer
        return Parity("n/a", "no torch.optim optimizer stepped in the original")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    ranks, why = _watched_weights([*torchrun, str(WATCHER), str(folder / "two"), copy.name], copy.parent, folder / "two", extra_env)
    if why:
        return Parity("failed", f"on 2 processes: {why}")
    if len(ranks) != 2:
        return Parity("failed", f"{len(ranks)} weights files from 2 ranks")
    between_ranks, from_one = _largest_difference(*ranks), _largest_difference(alone[0], ranks[0])
    if between_ranks is None or from_one is None:
        return Parity("differ", "other parameters than the original's optimizers train")
    if between_ranks > RANK_TOLERANCE:
        return Parity("differ", f"the ranks end {between_ranks:.1e} apart")
    if from_one > ONE_PROCESS_TOLERANCE:
        return Parity("differ", f"{from_one:.1e} from the one-process weights")
    return Parity("same", f"{from_one:.0e} from the one-process weights")


def no_manual_step(outcomes: list[Outcome], names: list[str]) -> str:
    """Per set of words, the scripts it leaves with no manual step."""
    lines = []
    for name in names:
        mine = [o for o in outcomes if o.words == name]
        full = sum(o.verdict == "full" for o in mine)
        lines.append(f"{name}: {full} of {len(mine)} scripts with no manual step ({100 * full / max(len(mine), 1):.0f}%)")
    return "\n".join(lines)


def table(outcomes: list[Outcome], names: list[str], ran: bool, parity: Optional[dict] = None) -> str:
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
            if parity and (script, name) in parity:
                cell += f"; 2 ranks: {parity[script, name].verdict}"
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
        top = top_codes([o.left for o in mine], 5)
        lines.append(f"| `{name}` | {count['full']} | {count['partly']} | {count['broke']} | {now} | {top} |")
    return "\n".join(lines)


def top_codes(lefts: list, count: int) -> str:
    """The codes left in most scripts ("AM521 3, AM520 2"), each script counted once per code."""
    codes = collections.Counter()
    for left in lefts:
        codes.update(set(left))
    return ", ".join(f"{code} {n}" for code, n in codes.most_common(count)) or "-"


def parity_of_copies(migrated: list[Migrated], originals: dict, root: Path) -> dict:
    """(script name, words) -> Parity, for each copy of a multi-process word whose original ran."""
    jobs = [j for j in migrated if j.name in MULTI_PROCESS and j.copy and originals[j.script].ok]
    folders = [root / f"parity-{index}" for index in range(len(jobs))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda job, folder: parity_on_two(job.script, job.copy, folder, MULTI_PROCESS[job.name]), jobs, folders)
        return {(job.script.name, job.name): announced(parity, job.noted) for job, parity in zip(jobs, found)}


def announced(parity: Parity, noted: frozenset) -> Parity:
    """A copy that differs as one of its notes says it will is `expected`, not a break."""
    said = sorted(noted & OTHER_NUMBERS_NOTES)
    if parity.verdict == "differ" and said:
        return Parity("expected", f"{parity.why}, as note {', '.join(said)} says")
    return parity


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", action="append", choices=list(WORD_SETS), help="a set of words (repeatable)")
    parser.add_argument("--no-run", action="store_true", help="classify by findings only, run nothing")
    parser.add_argument("--parity", "--ddp-parity", dest="parity", action="store_true", help="also run each copy of ddp, accelerate and fabric on 2 gloo processes against the original on one")
    parser.add_argument("--runtime", action="store_true", help="migrate as `apply --runtime` does (the copies import accelmigrate.runtime)")
    parser.add_argument("scripts", nargs="*", type=Path, help="scripts (default: benchmarks/reach/*.py)")
    args = parser.parse_args(argv)
    if args.parity and args.no_run:
        parser.error("--parity runs the scripts: it cannot go with --no-run")
    names = args.words or list(WORD_SETS)
    if args.parity and not MULTI_PROCESS.keys() & set(names):
        names.append("ddp")
    scripts = [script.resolve() for script in args.scripts] or sorted(CORPUS.glob("*.py"))
    started = time.perf_counter()
    jobs = [(script, name) for script in scripts for name in names]
    with tempfile.TemporaryDirectory() as root:
        migrated = migrate_all(jobs, notes_of_every_codemod(), Path(root), args.runtime)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # each run is its own process
            originals = {} if args.no_run else dict(zip(scripts, pool.map(run_script, scripts)))
            runnable = [job.copy if job.copy and not args.no_run else None for job in migrated]
            afters = list(pool.map(lambda copy: copy and run_script(copy), runnable))
        outcomes = [classify(job, originals.get(job.script), after) for job, after in zip(migrated, afters)]
        parity = parity_of_copies(migrated, originals, Path(root)) if args.parity else {}
    print(table(outcomes, names, not args.no_run, parity))
    print()
    print(totals(outcomes, names, not args.no_run))
    problems = [o for o in outcomes if o.why]
    if problems:
        print()
        for o in problems:
            print(f"- {o.script} `{o.words}`: {o.verdict}: {o.why}")
    for name in [n for n in names if n in MULTI_PROCESS and parity]:
        mine = {script: p for (script, words), p in parity.items() if words == name}
        same = sum(p.verdict == "same" for p in mine.values())
        compared = sum(p.verdict != "n/a" for p in mine.values())
        print()
        expected = sum(p.verdict == "expected" for p in mine.values())
        print(f"`{name}` on 2 gloo processes against the original on one: {same} of {compared} end with the same weights, {expected} differ as a note says")
        for script, p in sorted(mine.items()):
            if p.verdict != "same":
                print(f"- {script}: {p.verdict}: {p.why}")
    print()
    print(no_manual_step(outcomes, names))
    mode = "the runtime's imports (--runtime)" if args.runtime else "plain code"
    print(f"({len(scripts)} scripts, {mode}, {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    broke = any(o.verdict == "broke" for o in outcomes) or any(p.verdict in ("differ", "failed") for p in parity.values())
    return 1 if broke else 0

if __name__ == "__main__":
    sys.exit(main())
