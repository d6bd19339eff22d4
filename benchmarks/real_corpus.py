"""The corpus benchmark: the codemods over real training code from public
repositories that nobody here wrote.

benchmarks/real_corpus.tsv is the manifest, one entry script or notebook a
line: the repository, the commit its snapshot is pinned at, the entry's path,
the first-party files and folders of the training path beside it, the
arguments it needs, its kind of training, the year of the code, where its data
comes from, and a note in our own words. The repositories' code is never part
of this project: each one is checked out, at its commit, into a folder
outside it (`--repos`), from a bare git directory of the snapshot where one is
at hand (`--mirror DIR` holding DIR/OWNER+NAME/repo).

For each entry and each set of words, on a copy of the entry and its
siblings in a scratch folder:
  applied     the migration ran without an error and without a codemod's failure (AM000);
  parses      the output parses (each code cell of a notebook);
  idempotent  a second run over the output changes nothing;
  no manual   no finding is left but notes;
  silent      the word that acts on the training (amp for checklist and fast,
              ddp, accelerate, fabric) changed nothing and said nothing, not
              even a note, on a script that trains: the user would believe it
              migrated (not counted for the default words, which may rightly
              find nothing to do where a script already loads and logs well);
then the scripts whose migrated files still import accelmigrate (a helper
with no plain definition yet; with `--runtime`, every use of a helper), and
the codes left, counted in scripts. An entry whose own code does not parse
(Python 2) is left out and counted apart.

    python benchmarks/real_corpus.py --repos /tmp/corpus                    # every word set
    python benchmarks/real_corpus.py --repos /tmp/corpus --mirror /work/.mirror
    python benchmarks/real_corpus.py --repos /tmp/corpus --words ddp --codes  # each entry's codes
    python benchmarks/real_corpus.py --repos /tmp/corpus --runtime           # as `apply --runtime` writes
    python benchmarks/real_corpus.py --repos /tmp/corpus --run               # also run them (CPU)
    python benchmarks/real_corpus.py --repos /tmp/corpus --run --parity      # and on 2 gloo processes

`--run` runs the original and each migrated copy with `python ENTRY ARGS` on
the CPU, offline, for the entries whose data is generated or a torchvision
data set (the latter replaced by small generated data of the same shape), with
benchmarks/corpus_run/sitecustomize.py loaded into each run: one seed, and a
cap of a few optimizer steps, after which the run prints a checksum of the
trained parameters and ends. It counts regressions (the original reached the
cap, the copy did not), rescues (the other way round) and copies that end on
the same checksum. `--parity` launches each ddp/accelerate/fabric copy that
ran on 2 gloo processes and compares the weights with the original's
(reach.py's comparison).
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import csv
import dataclasses
import math
import os
import shutil
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reach import MULTI_PROCESS, notes_of_every_codemod, parity_on_two, plan_for, top_codes  # noqa: E402

from accelmigrate.engine.migrate import NOT_IN_NOTEBOOK, process_files  # noqa: E402
from accelmigrate.files.notebook import is_notebook, parse_notebook  # noqa: E402

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "real_corpus.tsv"
RUN_SHIM = HERE / "corpus_run"
COLUMNS = ("repo", "commit", "entry", "siblings", "args", "kind", "era", "data", "note")
# name -> (words, whether the migrated copy computes what the original does in
# one CPU process, the words whose silence counts: those that act on the training)
WORD_SETS = {
    "default": ("modernize,workers,item,empty-cache", True, ()),  # may rightly find nothing to do
    "checklist": ("checklist", True, ("amp",)),  # amp computes in float32 on a CPU
    "ddp": ("ddp", True, ("ddp",)),  # a world of one draws the original's order
    "accelerate": ("accelerate", True, ("accelerate",)),
    "fabric": ("fabric", True, ("fabric",)),
    "accelerate=parity": ("accelerate=parity", True, ("accelerate",)),  # --parity holds these to one process's weights
    "fabric=parity": ("fabric=parity", True, ("fabric",)),
    "fast": ("fast", False, ("amp",)),  # compile and fused kernels change the last bits
}
STEP_CAP = 3
RUN_TIMEOUT_S = 240
CHECKSUM_TOLERANCE = 1e-5  # relative: the same arithmetic, perhaps summed in another order


@dataclasses.dataclass(frozen=True)
class Entry:
    repo: str
    commit: str
    entry: str
    siblings: tuple[str, ...]
    args: tuple[str, ...]
    kind: str
    era: str
    data: str
    note: str

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.entry}"

    @property
    def folder(self) -> str:
        return self.repo.replace("/", "+")

    @property
    def runnable_offline(self) -> bool:
        return self.data == "synthetic" or self.data.startswith("torchvision:")


def read_manifest(path: Path) -> list[Entry]:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    entries = []
    for line, row in enumerate(rows, start=2):
        if None in row or any(row.get(c) is None for c in COLUMNS):
            raise SystemExit(f"{path}:{line}: expected the {len(COLUMNS)} columns {', '.join(COLUMNS)}")
        siblings = tuple(s.strip() for s in row["siblings"].split(",") if s.strip() not in ("", "-"))
        args = () if row["args"].strip() in ("", "-") else tuple(row["args"].split())
        entries.append(Entry(row["repo"], row["commit"], row["entry"], siblings, args, row["kind"], row["era"], row["data"], row["note"]))
    return entries


def check_out(entry: Entry, repos: Path, mirror: Optional[Path]) -> Optional[Path]:
    """The repository's checkout at the entry's commit, extracted from its bare
    snapshot under `mirror` if it is not there yet; None if neither exists."""
    root = repos / entry.folder
    if root.is_dir():
        return root
    bare = mirror / entry.folder / "repo" if mirror else None
    if bare is not None and (bare / ".git").is_dir():  # a snapshot taken as a clone with a work tree
        bare = bare / ".git"
    if not bare or not bare.is_dir():
        return None
    partial = repos / f".{entry.folder}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    extract(bare, entry.commit, partial)
    partial.rename(root)
    return root


def extract(bare: Path, commit: str, into: Path) -> None:
    """Every file of `commit` that the snapshot holds, written under `into`.
    A snapshot lacks its largest files (data, weights): `git archive` stops
    at the first one, so the blobs are read one by one and the absent ones skipped."""
    git = ["git", "--git-dir", str(bare)]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", commit], capture_output=True, check=True).stdout
    blobs = []
    for item in filter(None, listing.split(b"\0")):
        meta, path = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode != b"120000":  # links are left out: they may point anywhere
            blobs.append((sha, path.decode("utf-8", "surrogateescape")))
    batch = subprocess.run([*git, "cat-file", "--batch"], input=b"".join(sha + b"\n" for sha, _ in blobs), capture_output=True, check=True).stdout
    position = 0
    for _, path in blobs:
        header_end = batch.index(b"\n", position)
        header = batch[position:header_end].split()
        position = header_end + 1
        if header[-1] == b"missing":
            continue
        size = int(header[2])
        target = into / path
        if ".." in Path(path).parts:
            raise ValueError(f"{bare}: a path that leaves the checkout: {path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(batch[position:position + size])
        position += size + 1


def stage(entry: Entry, checkout: Path, folder: Path) -> Path:
    """Copy the entry and its siblings into `folder`, keeping their paths in
    the repository; the copy of the entry."""
    for relative in (entry.entry, *entry.siblings):
        source, target = checkout / relative, folder / relative
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "*.pyc", "__pycache__"))
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder / entry.entry


@dataclasses.dataclass
class Migration:
    entry: Entry
    words: str
    copy: Optional[Path] = None  # the migrated entry, if the migration produced one
    wrong: str = ""  # not applied, output does not parse, not idempotent
    changed: bool = False
    left: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    noted: frozenset = frozenset()
    spoke: frozenset = frozenset()  # the words that changed or reported something
    needs_tool: bool = False  # a migrated file imports accelmigrate (its runtime)

    @property
    def no_manual_step(self) -> bool:
        return not self.wrong and not self.left

    @property
    def silent(self) -> bool:
        return not self.wrong and any(word not in self.spoke for word in WORD_SETS[self.words][2])


def parses(path: Path, text: str) -> str:
    """Why `text` (the file at `path`) does not parse, or ''."""
    try:
        if is_notebook(str(path)):
            parse_notebook(text, str(path))
        else:
            ast.parse(text)
    except Exception as error:  # SyntaxError, or a notebook's cell that does not parse
        return f"output does not parse: {error}"
    return ""


def words_of(finding) -> list[str]:
    """The words a finding speaks for: its own, and for the notebook note
    (AM001) every word it names as not applied in a notebook."""
    if finding.code == NOT_IN_NOTEBOOK:
        named = finding.message.split(": ", 1)[-1].split(" (", 1)[0]
        return [finding.word, *(w.strip() for w in named.split(","))]
    return [finding.word]


def own_code_parses(entry: Entry, checkout: Path) -> bool:
    """Whether the entry, as its repository has it, is Python 3 that parses."""
    path = checkout / entry.entry
    return not parses(path, path.read_text(encoding="utf-8", errors="surrogateescape"))


def migrate(entry: Entry, name: str, checkout: Path, folder: Path, notes: frozenset, runtime: bool = False) -> Migration:
    """The words over the copy of the entry and the modules of its project
    that it reaches (as `apply ENTRY` migrates them, or `apply --runtime`)."""
    copy = stage(entry, checkout, folder)
    done = Migration(entry, name)
    plan = plan_for(WORD_SETS[name][0])
    results = process_files([str(copy)], plan, jobs=1, follow_imports=True, runtime=runtime)
    failed = [f for r in results for f in r.findings if f.code == "AM000"]
    error = next((r.error for r in results if r.error), None)
    if error or failed:
        done.wrong = f"not applied: {(error or failed[0].message)[:200]}"
        return done
    for result in results:
        if result.changed and (why := parses(Path(result.path), result.migrated)):
            done.wrong = why
            return done
    for result in results:
        if result.changed:
            Path(result.path).write_text(result.migrated, encoding="utf-8")
    if any(again.error or again.changed for again in process_files([str(copy)], plan, jobs=1, follow_imports=True, runtime=runtime)):
        done.wrong = "not idempotent: a second run changes the output"
        return done
    unfixed = [f for result in results for f in result.findings if not f.fixed]
    done.copy, done.changed = copy, any(result.changed for result in results)
    done.left = collections.Counter(f.code for f in unfixed if f.code not in notes)
    done.noted = frozenset(f.code for f in unfixed if f.code in notes)
    done.spoke = frozenset(word for result in results for f in result.findings for word in words_of(f))
    done.needs_tool = any(result.changed and IMPORTS_THE_TOOL.search(result.migrated) for result in results)
    return done


# An import of accelmigrate in migrated code (its runtime's helpers).
IMPORTS_THE_TOOL = re.compile(r"^\s*(?:from|import)\s+accelmigrate\b", re.MULTILINE)


def migrate_entry(job: tuple[Entry, Path, list[str], Path, bool]) -> list[Migration]:
    """Every set of words over one entry (in a process of its own)."""
    entry, checkout, names, scratch, runtime = job
    notes = notes_of_every_codemod()
    done = []
    for name in names:
        folder = scratch / name
        folder.mkdir(parents=True)
        try:
            done.append(migrate(entry, name, checkout, folder, notes, runtime))
        except Exception as error:  # the benchmark goes on; the entry counts as not applied
            done.append(Migration(entry, name, wrong=f"not applied: {type(error).__name__}: {error}"[:200]))
    return done


# ---- --run: the original and the copies on the CPU, offline, a few steps each


@dataclasses.dataclass
class Run:
    reached: bool  # the cap of optimizer steps, or the script's own clean end after at least one step
    checksum: Optional[float] = None
    why: str = ""


def run_copy(script: Path, args: tuple[str, ...], data: str) -> Run:
    report = script.parent / f".corpus-run-{script.stem}.txt"
    report.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(filter(None, [str(RUN_SHIM), env.get("PYTHONPATH")])),
        CORPUS_STEP_CAP=str(STEP_CAP),
        CORPUS_REPORT=str(report),
        CORPUS_DATA=data,
        MPLBACKEND="Agg",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
    )
    try:
        done = subprocess.run(
            [sys.executable, runnable(script).name, *args], cwd=script.parent, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return Run(False, why=f"timed out after {RUN_TIMEOUT_S} s")
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    if done.returncode != 0:  # a failure after some steps is a failure: the report was written at exit
        return Run(False, why=f"exit {done.returncode}: {last[:160]}")
    steps, checksum = report.read_text().split() if report.is_file() else ("0", "nan")
    return Run(True, float(checksum)) if int(steps) > 0 else Run(False, why="no optimizer step")


def runnable(script: Path) -> Path:
    """The file `python` runs: a notebook's code cells as a script beside it
    (its IPython lines inert), any other script itself."""
    if not is_notebook(str(script)):
        return script
    cells = script.with_name(f".corpus-run-{script.stem}.py")
    cells.write_text(parse_notebook(script.read_text(encoding="utf-8"), str(script)).source, encoding="utf-8")
    return cells


def why_not_reached(ran: dict) -> str:
    """The originals that did not reach the cap, counted by their last error's
    kind (a missing module by its name), a time-out, or no optimizer step."""
    kinds = collections.Counter()
    for outcome in ran.values():
        if not outcome.original.reached:
            why = outcome.original.why
            text = why.split(": ", 1)[1] if why.startswith("exit ") and ": " in why else why
            kind = text.partition(": ")[0]
            kinds[text if kind == "ModuleNotFoundError" else kind] += 1
    return ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(12)) or "-"


def same_checksum(before: Run, after: Run) -> bool:
    return math.isclose(before.checksum, after.checksum, rel_tol=CHECKSUM_TOLERANCE, abs_tol=1e-8)


@dataclasses.dataclass
class Ran:
    original: Run
    copies: dict  # word-set name -> Run


def run_entry(entry: Entry, checkout: Path, migrations: list[Migration], scratch: Path) -> Ran:
    original = run_copy(stage(entry, checkout, scratch / "original"), entry.args, entry.data)
    return Ran(original, {m.words: run_copy(m.copy, entry.args, entry.data) for m in migrations if m.copy and m.changed})


# ---- the report


def summary(migrations: list[Migration], names: list[str], ran: dict) -> str:
    lines = [
        "| words | scripts | applied | parses | idempotent | no manual step | silent | needs accelmigrate | regressions | rescues | same numbers | top codes left (scripts) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        mine = [m for m in migrations if m.words == name]
        applied = [m for m in mine if not m.wrong.startswith("not applied")]
        parsed = [m for m in applied if not m.wrong.startswith("output does not parse")]
        idempotent = [m for m in parsed if not m.wrong]
        full = sum(m.no_manual_step for m in mine)
        top = top_codes([m.left for m in mine], 6)
        regressions, rescues, same = run_counts(mine, name, ran)
        lines.append(
            f"| `{name}` | {len(mine)} | {len(applied)} | {len(parsed)} | {len(idempotent)} | {full} ({100 * full / max(len(mine), 1):.0f}%) "
            f"| {sum(m.silent for m in mine)} | {sum(m.needs_tool for m in mine)} | {regressions} | {rescues} | {same} | {top} |"
        )
    return "\n".join(lines)


def run_counts(mine: list[Migration], name: str, ran: dict) -> tuple[str, str, str]:
    if not ran:
        return "-", "-", "-"
    regressions = rescues = same = compared = 0
    for m in mine:
        outcome = ran.get(m.entry.name)
        after = outcome and outcome.copies.get(name)
        if after is None:
            continue
        regressions += outcome.original.reached and not after.reached
        rescues += after.reached and not outcome.original.reached
        if outcome.original.reached and after.reached and WORD_SETS[name][1]:
            compared += 1
            same += same_checksum(outcome.original, after)
    return str(regressions), str(rescues), f"{same} of {compared}"


def per_entry(migrations: list[Migration], names: list[str]) -> str:
    by_entry = collections.defaultdict(dict)
    for m in migrations:
        by_entry[m.entry.name][m.words] = m
    lines = ["| entry | kind | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for name, done in sorted(by_entry.items()):
        cells = []
        for words in names:
            m = done[words]
            cell = "broke" if m.wrong else "silent" if m.silent else ", ".join(sorted(m.left)) or "full"
            cells.append(cell)
        lines.append(f"| {name} | {next(iter(done.values())).entry.kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def problems(migrations: list[Migration], ran: dict, parity: dict) -> list[str]:
    found = [f"- {m.entry.name} `{m.words}`: {m.wrong}" for m in migrations if m.wrong]
    found += [f"- {m.entry.name} `{m.words}`: silent ({', '.join(WORD_SETS[m.words][2])} changed nothing, said nothing)" for m in migrations if m.silent]
    for name, outcome in sorted(ran.items()):
        for words, after in outcome.copies.items():
            if outcome.original.reached and not after.reached:
                found.append(f"- {name} `{words}`: regression: {after.why}")
            elif outcome.original.reached and WORD_SETS[words][1] and not same_checksum(outcome.original, after):
                found.append(f"- {name} `{words}`: other numbers: {outcome.original.checksum!r} before, {after.checksum!r} after")
    found += [f"- {name} `{words}` on 2 processes: {p.verdict}: {p.why}" for (name, words), p in sorted(parity.items()) if p.verdict != "same"]
    return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repos", type=Path, required=True, help="the folder holding a checkout per repository (OWNER+NAME)")
    parser.add_argument("--mirror", type=Path, help="a folder of bare snapshots (OWNER+NAME/repo) to check out missing repositories from")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--words", action="append", choices=list(WORD_SETS), help="a set of words (repeatable; default: all)")
    parser.add_argument("--only", action="append", default=[], help="entries whose repo:path contains this text (repeatable)")
    parser.add_argument("--codes", action="store_true", help="also print each entry's verdict per set of words")
    parser.add_argument("--runtime", action="store_true", help="migrate as `apply --runtime` (the copies import accelmigrate.runtime)")
    parser.add_argument("--run", action="store_true", help="run the originals and the copies on the CPU, offline, a few steps")
    parser.add_argument("--parity", action="store_true", help="with --run: each ddp/accelerate/fabric copy on 2 gloo processes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.parity and not args.run:
        parser.error("--parity needs --run")
    names = args.words or list(WORD_SETS)
    entries = [e for e in read_manifest(args.manifest) if not args.only or any(o in e.name for o in args.only)]
    started = time.perf_counter()
    args.repos.mkdir(parents=True, exist_ok=True)
    checkouts = {e: check_out(e, args.repos.resolve(), args.mirror) for e in entries}
    missing = [e for e, c in checkouts.items() if c is None or not (c / e.entry).is_file()]
    for e in missing:
        print(f"missing: {e.name} (no checkout under {args.repos}, or no such file)", file=sys.stderr)
    entries = [e for e in entries if e not in missing]
    python2 = [e for e in entries if not own_code_parses(e, checkouts[e])]
    entries = [e for e in entries if e not in python2]
    with tempfile.TemporaryDirectory() as root:
        jobs = [(e, checkouts[e], names, Path(root) / str(i), args.runtime) for i, e in enumerate(entries)]
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
            migrations = [m for done in pool.map(migrate_entry, jobs) for m in done]
        ran, parity = {}, {}
        if args.run:
            by_entry = collections.defaultdict(list)
            for m in migrations:
                by_entry[m.entry].append(m)
            runnable = [e for e in entries if e.runnable_offline]
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is its own process
                outcomes = pool.map(lambda i_e: run_entry(i_e[1], checkouts[i_e[1]], by_entry[i_e[1]], Path(root) / f"run-{i_e[0]}"), enumerate(runnable))
                ran = {e.name: outcome for e, outcome in zip(runnable, outcomes)}
            if args.parity:
                parity = parity_of(migrations, ran, checkouts, Path(root))
    repositories = len({e.repo for e in entries})
    print(f"{len(entries)} entries from {repositories} repositories" + (f" ({len(python2)} more whose own code does not parse left out)" if python2 else ""))
    print()
    print(summary(migrations, names, ran))
    if args.run:
        reached = sum(r.original.reached for r in ran.values())
        print(f"\n--run: {len(ran)} entries run offline, {reached} originals reached {STEP_CAP} optimizer steps")
        print(f"the others stopped at: {why_not_reached(ran)}")
    if args.codes:
        print()
        print(per_entry(migrations, names))
    found = problems(migrations, ran, parity)
    if found:
        print()
        print("\n".join(found))
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 1 if any(m.wrong for m in migrations) or any(p.verdict in ("differ", "failed") for p in parity.values()) else 0


def parity_of(migrations: list[Migration], ran: dict, checkouts: dict, root: Path) -> dict:
    """(entry name, words) -> Parity for the multi-process copies whose
    original ran and that take no arguments (the watcher passes none)."""
    jobs = [
        m for m in migrations
        if m.words in MULTI_PROCESS and m.copy and m.changed and not m.entry.args and ran.get(m.entry.name) and ran[m.entry.name].original.reached
    ]
    found = {}
    for index, m in enumerate(jobs):
        original = stage(m.entry, checkouts[m.entry], root / f"parity-original-{index}")
        found[m.entry.name, m.words] = parity_on_two(runnable(original), runnable(m.copy), root / f"parity-{index}", MULTI_PROCESS[m.words])
    return found


if __name__ == "__main__":
    sys.exit(main())
