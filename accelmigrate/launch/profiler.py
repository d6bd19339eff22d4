"""`accelmigrate profile`: where does a training script's time go.

    accelmigrate profile train.py --steps 20 -- --epochs 1
    accelmigrate profile train.py --format json     (or --json)

Runs the script unchanged in a child process for a bounded number of
training steps, with probes installed from outside
(`accelmigrate.runtime.profiling`), then says, per step: how long it waits on
each DataLoader versus the rest (forward, backward, optimizer and the script's
own work), whether memory grows every step and whether losses stay alive as
tensors (the retained-graph symptom), and on CUDA the host-device
synchronisations and device utilisation. From that it names the codemods to
apply (`workers` when data waits dominate, `item` when memory grows, `amp`
when compute dominates, ...).

The first steps (worker start-up, lazy initialisation, optimizer state) are
warm-up and not counted. This process never imports torch; only the child
running the script does; without torch installed the command stops at once
and names the install command.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

import click

from accelmigrate.launch.torch_check import require_torch

MIB = 1024 * 1024

# A step is data-bound when at least this share of it waits on DataLoaders;
# below the second threshold, data loading is not worth a change.
DATA_BOUND_SHARE = 0.3
DATA_WORTH_FIXING_SHARE = 0.1
# Memory "grows every step" when the median growth between two steps is at
# least this: allocators keep freed memory, so one jump is no trend.
MIN_GROWTH_PER_STEP = {"host RSS": 1 * MIB, "CUDA allocated": 64 * 1024}
MANY_SYNCS_PER_STEP = 2


# --- analysis (pure: the child's raw numbers in, a report out) ----------------------


def warmup_steps(step_count: int) -> int:
    """Steps left out of the averages: the first two when there are enough."""
    if step_count >= 5:
        return 2
    return 1 if step_count >= 3 else 0


def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one profile run: time shares, memory trend, advice."""
    steps = raw.get("steps") or []
    warmup = warmup_steps(len(steps))
    measured = steps[warmup:] or ([raw["tail"]] if raw.get("tail") else [])
    report: dict[str, Any] = {
        "script": raw.get("script"),
        "status": raw.get("status"),
        "exit_code": raw.get("exit_code", 0),
        "device": raw.get("device") or "cpu",
        "cuda_mapped_to": raw.get("cuda_mapped_to"),
        "steps_measured": len(steps[warmup:]),
        "warmup_steps": warmup,
        "optimizer_steps_seen": bool(steps),
        "time": time_shares(measured, raw.get("loaders") or {}),
        "memory": memory_trend(steps[warmup:], raw),
        "kept_losses": kept_losses(steps[warmup:]),
        "syncs": sync_counts(steps[warmup:], raw),
        "utilization_percent": _mean([s.get("utilization_percent") for s in steps[warmup:]]),
        "empty_cache_per_step": _mean([s.get("empty_cache_calls") for s in steps[warmup:]]) or 0.0,
    }
    report["bottleneck"] = bottleneck(report["time"]["data_share"]) if measured else None
    if not steps and report["bottleneck"] == "compute":
        report["bottleneck"] = None  # without training steps, "the rest" is not compute we can speak of
    report["advice"] = advice(report, raw)
    report["raw"] = raw
    return report


def time_shares(steps: list[dict[str, Any]], loaders: dict[str, Any]) -> dict[str, Any]:
    total = sum(step["seconds"] for step in steps)
    waits: dict[str, float] = {}
    for step in steps:
        for key, seconds in step.get("data_wait", {}).items():
            waits[key] = waits.get(key, 0.0) + seconds
    data = sum(waits.values())
    count = max(1, len(steps))
    return {
        "step_seconds": total / count,
        "data_seconds": data / count,
        "rest_seconds": (total - data) / count,
        "data_share": data / total if total > 0 else 0.0,
        "loaders": [
            {
                "site": key,
                **loaders.get(key, {}),
                "wait_seconds": seconds / count,
                "share": seconds / total if total > 0 else 0.0,
            }
            for key, seconds in sorted(waits.items(), key=lambda item: -item[1])
        ],
    }


def memory_trend(steps: list[dict[str, Any]], raw: dict[str, Any]) -> dict[str, Any]:
    on_device = any(step.get("device_allocated_bytes") is not None for step in steps)
    source = "CUDA allocated" if on_device else "host RSS"
    field = "device_allocated_bytes" if on_device else "host_rss_bytes"
    values = [step[field] for step in steps if step.get(field) is not None]
    deltas = [after - before for before, after in zip(values, values[1:])]
    typical = statistics.median(deltas) if deltas else 0
    return {
        "source": source,
        "first_bytes": values[0] if values else None,
        "last_bytes": values[-1] if values else None,
        "growth_per_step_bytes": typical,
        "grows_every_step": len(deltas) >= 3 and typical >= MIN_GROWTH_PER_STEP[source],
    }


def kept_losses(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Tensors backpropagated in earlier steps that the script still holds."""
    counts = [step.get("kept_backward_roots", 0) for step in steps]
    growing = len(counts) >= 3 and counts[-1] > counts[0] and all(b >= a for a, b in zip(counts, counts[1:]))
    return {"alive": counts[-1] if counts else 0, "growing": growing}


def sync_counts(steps: list[dict[str, Any]], raw: dict[str, Any]) -> dict[str, Any]:
    if not raw.get("syncs_measurable"):
        return {"measurable": False, "per_step": None}
    return {"measurable": True, "per_step": _mean([step.get("syncs") for step in steps])}


def bottleneck(data_share: float) -> str:
    return "data loading" if data_share >= DATA_BOUND_SHARE else "compute"


def advice(report: dict[str, Any], raw: dict[str, Any]) -> list[dict[str, Optional[str]]]:
    """What to do, most useful first: a codemod word, or None for a manual step."""
    items: list[dict[str, Optional[str]]] = []

    def add(codemod: Optional[str], reason: str) -> None:
        items.append({"codemod": codemod, "reason": reason})

    timing, device = report["time"], report["device"]
    if raw.get("cuda_available") and device == "cpu":
        add("device", "a GPU is available but the model trains on the CPU")

    single_process_loaders = [
        loader
        for loader in timing["loaders"]
        if loader.get("num_workers") == 0 and loader["share"] >= DATA_WORTH_FIXING_SHARE / 2
    ]
    if timing["data_share"] >= DATA_WORTH_FIXING_SHARE and single_process_loaders:
        sites = ", ".join(loader["site"] for loader in single_process_loaders)
        add(
            "workers",
            f"{_percent(timing['data_share'])} of each step waits for data loaded in the main process ({sites})",
        )
    elif timing["data_share"] >= DATA_BOUND_SHARE:
        add(
            None,
            f"{_percent(timing['data_share'])} of each step waits for data although the DataLoaders have "
            "workers: raise num_workers, set pin_memory and persistent_workers (which changes a seeded run's "
            "later epochs), or make __getitem__ cheaper (decode once and cache)",
        )

    memory, kept = report["memory"], report["kept_losses"]
    if memory["grows_every_step"] or kept["growing"]:
        why = []
        if memory["grows_every_step"]:
            why.append(f"memory ({memory['source']}) grows by {_size(memory['growth_per_step_bytes'])} every step")
        if kept["growing"]:
            why.append(f"{kept['alive']} losses from earlier steps are still alive as tensors, with their graphs")
        add(
            "item",
            "; ".join(why) + " (e.g. `losses.append(loss)`, `total += loss`; also evaluate under torch.no_grad())",
        )

    if report["empty_cache_per_step"] >= 1:
        add("empty-cache", f"torch.cuda.empty_cache() runs {report['empty_cache_per_step']:.0f} time(s) every step")

    syncs = report["syncs"]
    if syncs["measurable"] and (syncs["per_step"] or 0) >= MANY_SYNCS_PER_STEP:
        add(
            None,
            f"{syncs['per_step']:.0f} host-device synchronisations per step (.item(), .cpu(), printing "
            "tensors, torch.nonzero, ...): keep values on the device and read them every N steps",
        )

    compute_bound = report["bottleneck"] == "compute" and report["optimizer_steps_seen"]
    if compute_bound and not raw.get("autocast_used") and not raw.get("low_precision_params"):
        where = (
            ""
            if device.startswith("cuda")
            else (
                " (on a GPU; on a CPU a migrated script stays in float32 unless ACCELMIGRATE_PRECISION=bf16, "
                "which pays off only on CPUs with bfloat16 units)"
            )
        )
        add("amp", f"compute takes {_percent(1 - timing['data_share'])} of each step: mixed precision{where}")
    if compute_bound and (raw.get("gpu_count") or 0) > 1:
        add(
            "ddp",
            f"{raw['gpu_count']} GPUs are visible and one is used: DistributedDataParallel, "
            "launched with `accelmigrate run`",
        )
    return items


def _mean(values: list[Any]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def _size(count: float) -> str:
    return f"{count / MIB:.1f} MiB" if abs(count) >= MIB / 10 else f"{count / 1024:.0f} KiB"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


# --- running the child ------------------------------------------------------------


def measure(script: str, script_args: tuple[str, ...], steps: int, output_to_stderr: bool) -> dict[str, Any]:
    """Run the script under the probes in a child interpreter; its raw numbers."""
    with tempfile.TemporaryDirectory(prefix="accelmigrate-profile-") as folder:
        out = os.path.join(folder, "result.json")
        command = [
            sys.executable,
            "-m",
            "accelmigrate.runtime.profiling",
            "--steps",
            str(steps),
            "--out",
            out,
            script,
            *script_args,
        ]
        child = subprocess.run(command, stdout=_stderr_fd() if output_to_stderr else None)
        if not os.path.exists(out):
            raise click.ClickException(f"the profiled process ended (exit code {child.returncode}) without results")
        with open(out, encoding="utf-8") as handle:
            return json.load(handle)


def _stderr_fd():
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


# --- rendering --------------------------------------------------------------------


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    timing = report["time"]
    console.print()
    counted = f"{report['steps_measured']} steps measured, {report['warmup_steps']} warm-up steps not counted"
    if not report["optimizer_steps_seen"]:
        counted = "no optimizer.step() seen: the whole run is measured as one block"
    console.print(
        Text(f"accelmigrate profile: {report['script']}  ({counted}; device {report['device']})", style="bold")
    )
    if report.get("cuda_mapped_to"):
        console.print(
            f"No CUDA here: the script's CUDA placements ran on {report['cuda_mapped_to']}; "
            "the device's own time and memory are not measured."
        )

    unit = "step" if report["optimizer_steps_seen"] else "run"
    table = Table(title=f"Where a {unit}'s time goes", title_justify="left")
    table.add_column("")
    table.add_column(f"per {unit}", justify="right")
    table.add_column("share", justify="right")
    for loader in timing["loaders"]:
        settings = f"num_workers={loader.get('num_workers', '?')}, batch_size={loader.get('batch_size', '?')}"
        table.add_row(
            f"waiting for DataLoader at {loader['site']} ({settings})",
            _ms(loader["wait_seconds"]),
            _percent(loader["share"]),
        )
    table.add_row(
        f"rest of the {unit} (forward, backward, optimizer, the script's own work)",
        _ms(timing["rest_seconds"]),
        _percent(1 - timing["data_share"]),
    )
    table.add_row(Text(f"whole {unit}", style="bold"), _ms(timing["step_seconds"]), "100%")
    console.print(table)

    details = Table(show_header=False, title="Memory and synchronisation", title_justify="left")
    details.add_column("")
    details.add_column("")
    memory = report["memory"]
    if memory["first_bytes"] is not None:
        trend = "grows every step" if memory["grows_every_step"] else "steady"
        details.add_row(
            f"memory ({memory['source']})",
            f"{_size(memory['first_bytes'])} -> {_size(memory['last_bytes'])}, "
            f"{_size(memory['growth_per_step_bytes'])} per step: {trend}",
        )
    kept = report["kept_losses"]
    details.add_row(
        "losses of earlier steps still alive", f"{kept['alive']}" + (" (growing)" if kept["growing"] else "")
    )
    syncs = report["syncs"]
    details.add_row(
        "host-device syncs per step",
        f"{syncs['per_step']:.1f}" if syncs["per_step"] is not None else "not measurable on CPU",
    )
    utilization = report["utilization_percent"]
    details.add_row("device utilisation", f"{utilization:.0f}%" if utilization is not None else "n/a (CPU, or no NVML)")
    console.print(details)

    if report["bottleneck"]:
        console.print(Text(f"Bottleneck: {report['bottleneck']}", style="bold"))
    _render_advice(console, report)


def _render_advice(console, report: dict[str, Any]) -> None:
    from rich.text import Text

    if not report["advice"]:
        console.print("Advice: nothing stands out.")
        return
    console.print(Text("Advice:", style="bold"))
    for item in report["advice"]:
        line = Text("  - ")
        if item["codemod"]:
            line.append(f"apply `{item['codemod']}`", style="bold green")
            line.append(": ")
        line.append(item["reason"])
        console.print(line)
    words = [item["codemod"] for item in report["advice"] if item["codemod"]]
    if words:
        console.print(f"\n  accelmigrate apply {report['script']} --to {','.join(words)} --diff")


# --- the command ------------------------------------------------------------------


@click.command(
    "profile",
    context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]},
)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Training steps to run (optimizer steps), warm-up included.",
)
@click.option(
    "--format", "output_format", type=click.Choice(["text", "json"]), default="text",
    help="json: the report as JSON on stdout (the script's output goes to stderr).",
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
def profile_command(script, script_args, steps, output_format, as_json):
    """Run SCRIPT for a few steps and say where its time and memory go.

    Options go before `--`; everything after it goes to the script.
    """
    require_torch("profile")
    as_json = as_json or output_format == "json"
    raw = measure(script, script_args, steps, output_to_stderr=as_json)
    report = analyse(raw)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    elif report["steps_measured"] or report["status"] in ("stopped", "finished"):
        render(report)
    if report["status"] not in ("stopped", "finished"):
        click.echo(
            f"accelmigrate profile: the script {report['status']} (exit code {report['exit_code']}) "
            f"after {len(raw.get('steps') or [])} steps",
            err=True,
        )
        sys.exit(report["exit_code"] or 1)
