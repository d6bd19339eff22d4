"""`accelmigrate verify`: does the migrated script still train the same?

    accelmigrate verify train.py --to workers,item --steps 10 -- --epochs 1

Migrates a copy of SCRIPT, with the modules of its project that the
migration changes as `apply SCRIPT` would (the engine in engine.py, the
loaders in data.py; nothing of the project is written), runs the
original and the copy for K optimizer steps each, both seeded alike and
measured from outside (`accelmigrate.runtime.verifying`), and prints the loss
of each step side by side with a verdict: "same" (exit 0) or the first step
where they part (exit 1). A migration that changes nothing is "unchanged"
(exit 0, nothing is run). A script that fails, a migration that cannot be
made, or runs in which no optimizer stepped exit 2 (could not verify).
The words and their options are read as `apply` reads them: --to, else
`[tool.accelmigrate]` of the nearest pyproject.toml. Each run has a folder of
its own (`verify_runs`); on a machine without CUDA the original's CUDA
placements run on this machine's device, as the verdict then says.

What "the same" means depends on the words:
- most words (workers, item, empty-cache, modernize, main-guard, device, and
  amp where the runtime keeps fp32, as on a CPU): the same losses and weights
  up to float rounding;
- amp in 16-bit precision (bf16 or fp16 autocast ran): a relative tolerance;
- accumulate=N: the migrated script (N micro-batches per step) against the
  original with N times larger batches: the same big-batch steps;
- ddp, accelerate and fabric: the migrated script on N processes (`--nproc-per-node`, torchrun over
  gloo or NCCL; each rank loads its share of the original batch) against the
  original: the mean of the ranks' losses (their sum where the migration
  adds the ranks' gradients up, for a loss summed over the batch), and every
  rank ending each step with the same weights.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from accelmigrate.codemods import DEFAULT_WORDS
from accelmigrate.codemods._options import ddp_batch_mode, exact_parity
from accelmigrate.engine.migrate import process_files
from accelmigrate.engine.selection import config_for, plan_for
from accelmigrate.files.sources import InputError, SourceText, read_source
from accelmigrate.launch.frameworks import tell_frameworks
from accelmigrate.launch.torch_check import require_torch
from accelmigrate.launch.verify_runs import RECORDER, RunFailed, Stopped, Workspace, stop_on_signals

# 2: could not verify (a run or the migration failed, or nothing was
# compared); 130: interrupted (Ctrl-C); 128 + N: stopped by signal N.
EXIT_SAME, EXIT_DIFFER, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

# Relative tolerances. Float rounding: the same arithmetic in another order
# (a sum over ranks or micro-batches); 16-bit autocast: a loss within a few
# percent of fp32's over the first steps of training.
ROUNDING_RTOL = 1e-4
EXACT_RTOL = 1e-6
LOW_PRECISION_RTOL = {"bfloat16": 0.05, "float16": 0.02}
ABSOLUTE_FLOOR = 1e-6  # differences below it are equal, whatever the scale


class VerifyError(Exception):
    """A run or a migration that could not be made; the message says which."""


class NotVerified(VerifyError):
    """Both runs ended, but nothing they did can be compared."""


@dataclasses.dataclass
class Comparison:
    """Two runs' steps side by side, and where they part."""

    rows: list[dict[str, Any]]
    rtol: float
    first_difference: Optional[int] = None  # 1-based step
    reason: Optional[str] = None

    @property
    def same(self) -> bool:
        return self.first_difference is None


# --- what to run --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    """How the reference and the migrated run are made comparable."""

    batch_scale: int  # the reference's DataLoaders yield this many times larger batches
    processes: int  # the migrated script runs on this many processes (1: plain python)
    rtol: float


def setup_for(words: dict[str, dict[str, str]], processes: int) -> Setup:
    if "batch-scale" in words:
        raise VerifyError("batch-scale changes the training on purpose (batch size and learning rate): nothing to compare")
    accumulate = int(words["accumulate"].get("value", "1")) if "accumulate" in words else 1
    processes = processes if words.keys() & {"ddp", "accelerate", "fabric"} else 1
    # ddp and accelerate=parity (fabric=parity) keep the global batch, each rank loading its share of it; Accelerate's
    # and Fabric's defaults (and ddp=per-process) give each rank a batch of the original's size: the reference
    # then loads N times larger batches.
    per_process = processes > 1 and any(_loads_per_process(word, options) for word, options in words.items())
    summed = accumulate > 1 or processes > 1
    return Setup(batch_scale=accumulate * (processes if per_process else 1), processes=processes, rtol=ROUNDING_RTOL if summed else EXACT_RTOL)


def _loads_per_process(word: str, options: dict[str, str]) -> bool:
    if word == "ddp":
        return ddp_batch_mode(options) == "per-process"
    return word in ("accelerate", "fabric") and not exact_parity(word, options)


@dataclasses.dataclass
class MigratedCopy:
    """SCRIPT before and after, the words with their options, and the modules
    of its project that the migration changed with it (resolved path ->
    migrated text), as `apply SCRIPT` would write them."""

    original: SourceText
    migrated: SourceText
    words: dict[str, dict[str, str]]
    modules: dict[Path, SourceText]
    notes: list = dataclasses.field(default_factory=list)  # (file name, Finding): the migration's notes


# The migration's notes that announce a difference from the one-process run,
# by what makes it: a batch shared out unevenly, statistics or random draws
# computed on each part of a split batch.
UNEVEN_NOTES = frozenset({"AM536", "AM811", "AM911"})
ORDER_NOTES = frozenset({"AM835", "AM910"})
STATISTICS_NOTES = frozenset({"AM538", "AM614", "AM817", "AM917"})
DRAW_NOTES = frozenset({"AM535", "AM816", "AM916"})


def migrated_copy(script: Path, words_spec: Optional[str], runtime: bool = False) -> MigratedCopy:
    """SCRIPT and its project migrated, nothing written: the words of --to,
    else of `[tool.accelmigrate]`, with its options, as `apply` takes them
    (importing the runtime's helpers with `runtime`, or where the configuration says so)."""
    config = config_for([str(script)])
    plan = plan_for(words_spec, config, DEFAULT_WORDS)
    try:
        source = read_source(script)
    except InputError as error:
        raise VerifyError(str(error)) from None
    results = process_files([str(script)], plan, jobs=1, follow_imports=True, runtime=runtime or config.runtime)
    failed = next((r for r in results if r.error is not None), None)
    if failed is not None:
        raise VerifyError(failed.error)
    own = results[0]  # the named file comes first, the modules it reaches after it
    modules = {Path(r.path).resolve(): SourceText(r.migrated, r.encoding) for r in results[1:] if r.changed}
    words = {word: dict(options) for word, options in plan}
    explaining = UNEVEN_NOTES | STATISTICS_NOTES | DRAW_NOTES | ORDER_NOTES
    notes = [(Path(r.path).name, f) for r in results for f in r.findings if f.code in explaining]
    return MigratedCopy(source, SourceText(own.migrated or source.text, source.encoding), words, modules, notes)


def _environment(steps: int, batch_scale: int = 1, map_cuda: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ACCELMIGRATE_VERIFY_STEPS=str(steps), ACCELMIGRATE_VERIFY_BATCH_SCALE=str(batch_scale))
    if map_cuda:
        env["ACCELMIGRATE_VERIFY_MAP_CUDA"] = "1"
    # One thread per process in both runs, as torchrun gives each rank: the
    # same order of float sums, so "exact" can mean exact.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _migrated_environment(steps: int, processes: int) -> dict[str, str]:
    import torch

    env = _environment(steps)
    tell_frameworks(env, processes, 1, torch.cuda.is_available())
    return env


# --- comparing ----------------------------------------------------------------------

SUMMING_HOOK = frozenset({"accelmigrate.runtime.gradients.sum_gradients_across_ranks"})


def _ranks_add_up(migrated: SourceText) -> bool:
    """The migration makes DDP add the ranks' gradients up (its loss sums over
    the batch): the ranks' losses then add up to the original's too."""
    import libcst

    from accelmigrate.codemods.script import ScriptModel

    script = ScriptModel.of(libcst.parse_module(migrated.text))
    return any(script.is_call_to(call, SUMMING_HOOK) for call in script.index.nodes_of(libcst.Call))


def _close(a: Optional[float], b: Optional[float], rtol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(ABSOLUTE_FLOOR, rtol * max(abs(a), abs(b)))


def _relative(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return None
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def merge_ranks(records: list[dict], summed: bool = False) -> list[dict]:
    """One step list from every rank's: the mean loss (`summed`: the sum, for a
    loss summed over each rank's share of the batch), rank 0's weights, and
    the largest relative difference of any rank's weights from rank 0's."""
    merged = []
    for index, step in enumerate(records[0]["steps"]):
        peers = [r["steps"][index] for r in records if index < len(r["steps"])]
        losses = [p["loss"] for p in peers if p["loss"] is not None]
        spread = max(
            (_relative(p["params"][i], step["params"][i]) or 0.0 for p in peers for i in range(len(step["params"]))),
            default=0.0,
        )
        loss = sum(losses) / (1 if summed else len(losses)) if losses else None
        samples = [p.get("samples") for p in peers]
        merged.append({**step, "loss": loss, "rank_spread": spread, "ranks": len(peers), "rank_samples": samples})
    return merged


def compare(reference: list[dict], migrated: list[dict], rtol: float, processes: int = 1) -> Comparison:
    rows, comparison = [], Comparison(rows=[], rtol=rtol)
    for index in range(max(len(reference), len(migrated))):
        before = reference[index] if index < len(reference) else None
        after = migrated[index] if index < len(migrated) else None
        row = {
            "step": index + 1,
            "optimizer": (before or after)["optimizer"],
            "original_loss": before and before["loss"],
            "migrated_loss": after and after["loss"],
        }
        row["relative_difference"] = _relative(row["original_loss"], row["migrated_loss"])
        rows.append(row)
        if comparison.first_difference is None:
            reason = _difference(before, after, rtol, processes)
            if reason:
                comparison.first_difference, comparison.reason = index + 1, reason
    comparison.rows = rows
    return comparison


def _difference(before: Optional[dict], after: Optional[dict], rtol: float, processes: int) -> Optional[str]:
    if before is None or after is None:
        return "the original stopped earlier" if before is None else "the migrated script stopped earlier"
    if before["optimizer"] != after["optimizer"]:
        return f"optimizer {after['optimizer'] + 1} stepped where the original stepped optimizer {before['optimizer'] + 1}"
    if after.get("ranks", processes) < processes:
        return f"only {after['ranks']} of {processes} ranks reached this step"
    if after.get("rank_spread", 0.0) > EXACT_RTOL:
        return f"the ranks' weights differ (relative {after['rank_spread']:.1e}): gradients are not averaged across ranks"
    if not _close(before["loss"], after["loss"], rtol):
        return f"loss {_number(before['loss'])} against {_number(after['loss'])}"
    if not all(_close(a, b, rtol) for a, b in zip(before["params"], after["params"])):
        return "the weights after the step differ"
    return None


def _number(value: Optional[float]) -> str:
    return "none" if value is None else f"{value:.6g}"


# --- the command --------------------------------------------------------------------


def verify(
    script: Path, words_spec: Optional[str], steps: int, processes: int, script_args: Sequence[str], rtol: Optional[float], runtime: bool = False
) -> dict:
    """Run both and compare; the result as a dict (also the JSON output)."""
    copy = migrated_copy(script, words_spec, runtime)
    original, migrated_source, words = copy.original, copy.migrated, copy.words
    setup = setup_for(words, processes)
    if migrated_source.text == original.text and not copy.modules:
        return {"script": str(script), "words": list(words), "verdict": "unchanged", "steps": []}
    try:
        with Workspace(script, copy.modules) as workspace:
            # Only the original keeps CUDA placements that need mapping here:
            # the migration's whole point is that its copy needs none.
            reference = workspace.run("original", original, script_args, _environment(steps, setup.batch_scale, map_cuda=True))[0]
            migrated = workspace.run(
                "migrated", migrated_source, script_args, _migrated_environment(steps, setup.processes), setup.processes, copy.modules
            )
    except RunFailed as error:
        raise VerifyError(str(error)) from None
    if not reference["steps"] and not any(record["steps"] for record in migrated):
        raise NotVerified(
            f"no optimizer step was recorded: neither run of {script} called an optimizer's step() "
            "(the script ended before its first step, or updates its weights by hand), so there is nothing to compare"
        )
    low_precision = sorted({dtype for record in migrated for dtype in record["low_precision"]})
    tolerance = rtol if rtol is not None else max([setup.rtol, *(LOW_PRECISION_RTOL[d] for d in low_precision)])
    comparison = compare(reference["steps"], merge_ranks(migrated, _ranks_add_up(migrated_source)), tolerance, setup.processes)
    random_draws = sorted({name for record in [reference, *migrated] for name in record.get("random_per_forward", [])})
    evidence = Evidence(
        reference["steps"], merge_ranks(migrated, False), random_draws,
        any(record.get("batch_statistics") for record in [reference, *migrated]), copy.notes,
    )
    return {
        "script": str(script),
        "words": list(words),
        "steps": comparison.rows,
        "processes": setup.processes,
        "reference_batch_scale": setup.batch_scale,
        "low_precision": low_precision,
        "original_cuda_ran_on": reference.get("cuda_mapped_to"),
        "random_per_forward": random_draws,
        "rtol": tolerance,
        "verdict": "same" if comparison.same else "differ",
        "first_differing_step": comparison.first_difference,
        "reason": comparison.reason,
        "expected": _expected_difference(comparison, setup, evidence),
    }


@dataclasses.dataclass
class Evidence:
    """What the runs recorded and the migration noted that can explain a
    difference: each step's samples, random draws, BatchNorm statistics."""

    reference: list[dict]
    migrated: list[dict]  # merged over the ranks, with each rank's samples
    random_draws: list[str]
    batch_statistics: bool
    notes: list  # (file name, Finding)

    def noted(self, codes: frozenset) -> str:
        found = [f"{f.code} at {name}:{f.line}" for name, f in self.notes if f.code in codes]
        return f" (the migration's note {', '.join(found)})" if found else ""

    def uneven_share(self, step: int) -> Optional[str]:
        """Step `step` (1-based) where the ranks' shares of the batch are not
        an even split of the original's: its sizes, as a phrase."""
        if step > min(len(self.reference), len(self.migrated)):
            return None
        original, shares = self.reference[step - 1].get("samples"), self.migrated[step - 1].get("rank_samples") or []
        if original is None or None in shares or len(shares) < 2:
            return None
        if len(set(shares)) == 1 and sum(shares) == original:
            return None
        return f"step {step}'s batch of {original} samples ran as {' + '.join(map(str, shares))} on the ranks"


def _expected_difference(comparison: Comparison, setup: Setup, evidence: Evidence) -> Optional[str]:
    """Why a difference is what a correct migration shows, where it is and
    what shows it: a batch the ranks share out unevenly (each averages its
    own share), BatchNorm statistics and random draws (dropout masks, noise)
    computed on each part of a split batch. Each names the migration's note
    that announced it."""
    if comparison.same or (setup.batch_scale == 1 and setup.processes == 1):
        return None
    split = "into micro-batches" if setup.batch_scale > 1 else "across processes"
    reasons = []
    uneven = evidence.uneven_share(comparison.first_difference) if setup.processes > 1 else None
    if uneven is not None:
        reasons.append(f"{uneven}, each averaging its own share{evidence.noted(UNEVEN_NOTES)}")
    if setup.processes > 1 and evidence.noted(ORDER_NOTES):
        reasons.append(f"the ranks read the training data in the order their distributed sampler draws, not the original's{evidence.noted(ORDER_NOTES)}")
    if evidence.batch_statistics:
        reasons.append(f"BatchNorm normalises each part of the batch split {split} with its own statistics{evidence.noted(STATISTICS_NOTES)}")
    if evidence.random_draws:
        reasons.append(
            f"the model draws random numbers per forward ({', '.join(evidence.random_draws)}) and the migrated step, split {split}, "
            "draws them in another order; compare with dropout off (p=0, or the model in eval mode) to check the rest"
        )
    elif evidence.noted(DRAW_NOTES):
        reasons.append(f"random numbers drawn for the training step fall on other rows once the batch is split {split}{evidence.noted(DRAW_NOTES)}")
    return "; ".join(reasons) or None


def render(result: dict) -> None:
    if result["verdict"] == "unchanged":
        click.echo(f"unchanged: --to {','.join(result['words'])} changes nothing in {result['script']}; nothing to compare")
        return
    click.echo(f"{'step':>4}  {'opt':>3}  {'original loss':>14}  {'migrated loss':>14}  {'rel. diff':>9}")
    for row in result["steps"]:
        relative = row["relative_difference"]
        click.echo(
            f"{row['step']:>4}  {row['optimizer'] + 1:>3}  {_number(row['original_loss']):>14}  "
            f"{_number(row['migrated_loss']):>14}  {'-' if relative is None else f'{relative:.1e}':>9}"
        )
    how = _how(result)
    if result["verdict"] == "same":
        click.echo(f"same: {len(result['steps'])} steps agree within a relative {result['rtol']:.0e} ({how})")
    elif result["expected"]:
        click.echo(f"differ, expected: {result['expected']} (from step {result['first_differing_step']}: {result['reason']}; {how})")
    else:
        click.echo(f"differ: from step {result['first_differing_step']}: {result['reason']} ({how})")


def _how(result: dict) -> str:
    parts = [f"--to {','.join(result['words'])}"]
    if result["processes"] > 1:
        parts.append(f"{result['processes']} processes against one")
    if result["reference_batch_scale"] > 1:
        parts.append(f"the original with {result['reference_batch_scale']}x larger batches")
    if result["low_precision"]:
        parts.append(f"autocast in {', '.join(result['low_precision'])}")
    if result["original_cuda_ran_on"]:
        parts.append(f"the original's CUDA placements ran on {result['original_cuda_ran_on']}")
    return "; ".join(parts)


@click.command("verify", context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--to", "words", default=None, help="Codemods to verify, as for apply (e.g. workers,item or ddp; default: [tool.accelmigrate]'s, else apply's).")
@click.option("--steps", default=10, show_default=True, type=click.IntRange(min=1), help="Optimizer steps to compare.")
@click.option("--nproc-per-node", "processes", default=2, show_default=True, type=click.IntRange(min=2), help="Processes for ddp, accelerate and fabric.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance instead of the one the words call for.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--runtime", is_flag=True, help="Verify the copy `apply --runtime` writes (importing accelmigrate.runtime, whose ACCELMIGRATE_* switches then apply).")
def verify_command(script, script_args, words, steps, processes, rtol, output_format, as_json, runtime):
    """Run SCRIPT and a migrated copy of it for K steps each, and compare.

    Exit 0 when they train the same, 1 when they part (the first such step is
    named), 2 when it could not verify (a run or the migration failed, or no
    optimizer step was recorded), 130 on Ctrl-C. Arguments after `--` go to
    the script."""
    require_torch("verify")
    try:
        with stop_on_signals():
            result = verify(script, words, steps, processes, script_args, rtol, runtime)
    except VerifyError as error:
        click.echo(f"accelmigrate verify: {error}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("accelmigrate verify: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Stopped as stop:
        sys.exit(128 + stop.signum)
    if as_json or output_format == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        render(result)
    sys.exit(EXIT_DIFFER if result["verdict"] == "differ" else EXIT_SAME)


def _launch(processes: int, script: str, script_args: Sequence[str]) -> int:
    """The migrated copy on PROCESSES ranks, each under the recorder."""
    from accelmigrate.launch.runner import launch, torchrun_args

    return launch(torchrun_args(script, script_args, nproc_per_node=processes, entry_module=RECORDER))


if __name__ == "__main__":
    # python -m accelmigrate.launch.verify --launch N SCRIPT ARGS (started by `verify` for ddp)
    if len(sys.argv) < 4 or sys.argv[1] != "--launch":
        sys.exit("usage: python -m accelmigrate.launch.verify --launch N SCRIPT [ARGS...] (started by `accelmigrate verify`)")
    sys.exit(_launch(int(sys.argv[2]), sys.argv[3], sys.argv[4:]))
