"""The property tests of tests/test_properties.py at benchmark scale: for any
source that CPython accepts, no codemod crashes (an exception or an AM000
finding), the output parses, and a second run changes nothing.

Runs, with a fresh random seed unless --seed is given:
  - generated: hypothesmith programs (`from_grammar`, and `from_node` with
    --from-node: far slower to generate) through every codemod at once;
  - rebound: the training skeleton with statements that rebind or reuse its
    names, through each codemod alone and all together;
  - spliced: the skeleton with hypothesmith statements inserted;
  - mutated: every bundled script and fixture input under every
    parse-preserving mutation, through each codemod alone and all together.
Every problem is printed with the source that shows it (not shrunk: reduce it
by hand), and the counts at the end.

    python benchmarks/fuzz.py --examples 2000
    python benchmarks/fuzz.py --examples 500 --only generated,rebound --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import hypothesmith  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzzing import (  # noqa: E402
    MUTATION_NAMES, all_words_plan, generated_programs, mutated_inputs, plans, problems_of,
    spliced_scripts, statements, trigger_comment, word_plan,
)

from accelmigrate.codemods import all_codemods  # noqa: E402

SUITES = ("generated", "rebound", "spliced", "mutated")


class Tally:
    def __init__(self) -> None:
        self.cases = 0
        self.problems: list[tuple[str, object, str]] = []  # (suite, problem, source)

    def check(self, suite: str, source: str, plan) -> None:
        self.cases += 1
        for problem in problems_of(source, plan, f"<{suite}>")[0]:
            self.problems.append((suite, problem, source))
            print(f"\n=== {suite}: {problem}\n{source}", flush=True)


def run_strategy(tally: Tally, suite: str, strategy, examples: int, seed_value: int, fixed_plan=None) -> None:
    """Draws `examples` cases and checks each; no shrinking, every failure kept."""

    @seed(seed_value)
    @settings(
        max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(source=strategy, plan=plans())
    def draw(source, plan):
        tally.check(suite, source, fixed_plan or plan)

    draw()


def run_mutations(tally: Tally, per_word: bool) -> None:
    plans_ = [all_words_plan(), *(word_plan(w) for w in all_codemods())] if per_word else [all_words_plan()]
    for name in MUTATION_NAMES:
        before = tally.cases
        for path, source in mutated_inputs(name):
            for plan in plans_:
                tally.check(f"mutated {name} {path.relative_to(path.parents[1])}", source, plan)
        print(f"  mutation {name}: {tally.cases - before} case(s)", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000, help="examples per generated suite (default 1000)")
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: random, printed)")
    parser.add_argument("--only", default=",".join(SUITES), help=f"comma-separated suites: {', '.join(SUITES)}")
    parser.add_argument("--from-node", action="store_true", help="also hypothesmith.from_node() programs")
    parser.add_argument("--all-words-only", action="store_true", help="mutated: only every codemod at once")
    args = parser.parse_args()
    seed_value = args.seed if args.seed is not None else random.randrange(2**32)
    suites = args.only.split(",")
    print(f"seed {seed_value}; suites {', '.join(suites)}; {args.examples} examples each", flush=True)

    tally = Tally()
    start, cpu = time.perf_counter(), time.process_time()
    if "generated" in suites:
        run_strategy(tally, "generated", generated_programs(), args.examples, seed_value, all_words_plan())
        if args.from_node:
            from_node = hypothesmith.from_node().map(lambda source: trigger_comment() + source)
            run_strategy(tally, "generated from_node", from_node, args.examples, seed_value, all_words_plan())
    if "rebound" in suites:
        run_strategy(tally, "rebound", spliced_scripts(statements()), args.examples, seed_value)
    if "spliced" in suites:
        run_strategy(tally, "spliced", spliced_scripts(hypothesmith.from_grammar()), args.examples, seed_value)
    if "mutated" in suites:
        run_mutations(tally, per_word=not args.all_words_only)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu

    kinds: dict[str, int] = {}
    for _, problem, _ in tally.problems:
        kinds[problem.kind] = kinds.get(problem.kind, 0) + 1
    print(f"\n{tally.cases} case(s), {len(tally.problems)} problem(s) {kinds or ''}; wall {wall:.1f} s, CPU {cpu:.1f} s; seed {seed_value}")
    sys.exit(1 if tally.problems else 0)


if __name__ == "__main__":
    main()
