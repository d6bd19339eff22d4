"""Every codemod over the installed torch package's own sources: thousands of
real files, nearly none of them a training script.

Each file is read (never written: the migration runs in memory, on a copy of
its text) and migrated with each codemod alone (with the codemods it needs
first); a changed output must parse and a second run must change nothing.
Prints, per codemod: files changed, crashes (an exception or an AM000
finding), unparsable outputs, non-idempotent outputs, valid files refused as
syntax errors; then every problem and the list of changed files, so that a
reviewer can judge each change to a file without a training loop; then wall
and CPU time.

    python benchmarks/torch_corpus.py                 # every file, every codemod, 2 processes
    python benchmarks/torch_corpus.py --limit 300     # 300 files spread evenly
    python benchmarks/torch_corpus.py --words device,ddp --diffs /tmp/diffs
    python benchmarks/torch_corpus.py --words all     # every codemod in one plan
"""

from __future__ import annotations

import argparse
import collections
import difflib
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzing import all_words_plan, plan_name, problems_of, spread, word_plan  # noqa: E402

from accelmigrate.codemods import all_codemods  # noqa: E402
from accelmigrate.files.sources import InputError, read_source  # noqa: E402

KINDS = ("crash", "unparsable", "not idempotent", "refused")


def torch_root() -> Path:
    """The folder of `torch.__file__`, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise SystemExit("torch is not installed")
    return Path(spec.origin).parent


def plans_for(words: list[str]) -> dict[str, list]:
    return {word: (all_words_plan() if word == "all" else word_plan(word)) for word in words}


def changed_lines(before: str, after: str) -> int:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
    return sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


def migrate_file(job: tuple[str, str, dict]) -> dict:
    """One file through every plan: {word: {"changed", "lines", "problems", "diff"}}."""
    path, relative, plans = job
    try:
        source = read_source(Path(path)).text
    except InputError as error:
        return {"file": relative, "unreadable": str(error), "words": {}}
    outcome = {}
    for word, plan in plans.items():
        problems, code = problems_of(source, plan, relative)
        changed = code is not None and code != source
        outcome[word] = {
            "changed": changed,
            "lines": changed_lines(source, code) if changed else 0,
            "problems": [[p.kind, p.detail] for p in problems],
            "diff": "".join(difflib.unified_diff(
                source.splitlines(True), code.splitlines(True), f"a/{relative}", f"b/{relative}"
            )) if changed else "",
            "trains": "backward(" in source,  # a hint for the reviewer, not a judgement
        }
    return {"file": relative, "words": outcome}


def run(files: list[Path], root: Path, plans: dict, jobs: int) -> list[dict]:
    jobs_list = [(str(f), str(f.relative_to(root)), plans) for f in files]
    results = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for done, result in enumerate(pool.map(migrate_file, jobs_list, chunksize=1), 1):
            results.append(result)
            for word, w in result["words"].items():  # as they come, for a run cut short
                for kind, detail in w["problems"]:
                    print(f"  {kind} [{word}] {result['file']}: {detail}", file=sys.stderr, flush=True)
            if done % 50 == 0 or done == len(files):
                print(f"  {done}/{len(files)} files", file=sys.stderr, flush=True)
    return results


def report(results: list[dict], words: list[str]) -> int:
    """Prints the tables and lists; returns the number of problems."""
    print(f"\n| word | files changed | crashes | unparsable | not idempotent | refused |")
    print("| --- | --- | --- | --- | --- | --- |")
    total = 0
    for word in words:
        per = [r["words"][word] for r in results if word in r["words"]]
        kinds = collections.Counter(kind for w in per for kind, _ in w["problems"])
        total += sum(kinds.values())
        print(f"| {word} | {sum(w['changed'] for w in per)} | " + " | ".join(str(kinds[k]) for k in KINDS) + " |")
    unreadable = [r for r in results if "unreadable" in r]
    if unreadable:
        print(f"\n{len(unreadable)} unreadable file(s):")
        for r in unreadable:
            print(f"  {r['unreadable']}")
    print("\nProblems:" if total else "\nProblems: none")
    for r in results:
        for word, w in r["words"].items():
            for kind, detail in w["problems"]:
                print(f"  {kind} [{word}] {r['file']}: {detail}")
    print("\nChanged files (lines changed; * = no `backward(` in the file):")
    for word in words:
        changed = [(r["file"], r["words"][word]) for r in results if r["words"].get(word, {}).get("changed")]
        print(f"  {word}: {len(changed)}")
        for name, w in changed:
            print(f"    {'*' if not w['trains'] else ' '} {name} ({w['lines']})")
    return total


def write_diffs(results: list[dict], folder: Path) -> None:
    for r in results:
        for word, w in r["words"].items():
            if w["diff"]:
                target = folder / word / (r["file"] + ".diff")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(w["diff"], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, help="this many files, spread evenly over the sorted list")
    parser.add_argument("--words", default=",".join(all_codemods()), help="comma-separated words; `all` = every codemod in one plan")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--diffs", type=Path, help="write each change as WORD/FILE.diff under this folder")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()

    root = torch_root()
    files = sorted(root.rglob("*.py"))
    if args.limit:
        files = spread(files, args.limit)
    words = [w.strip() for w in args.words.split(",") if w.strip()]
    plans = plans_for(words)
    print(f"{len(files)} files under {root}; plans: " + "; ".join(f"{w}: {plan_name(p)}" for w, p in plans.items()))

    wall, cpu = time.perf_counter(), os.times()
    results = run(files, root, plans, args.jobs)
    wall, after = time.perf_counter() - wall, os.times()
    cpu_used = sum(getattr(after, f) - getattr(cpu, f) for f in ("user", "system", "children_user", "children_system"))

    problems = report(results, words)
    if args.diffs:
        write_diffs(results, args.diffs)
    if args.json:
        args.json.write_text(json.dumps(results), encoding="utf-8")
    print(f"\n{len(files)} files x {len(words)} plan(s): wall {wall:.1f} s, CPU {cpu_used:.1f} s ({args.jobs} processes); {problems} problem(s)")


if __name__ == "__main__":
    main()
