"""`accelmigrate profile`: the verdict on real scripts run for a few steps on the
CPU (a few seconds each), and the analysis of per-step numbers."""

import json
import subprocess
import sys

import pytest

from accelmigrate.launch.profiler import MIB, analyse, warmup_steps

from conftest import SCRIPTS, run_cli

STEPS = "8"


def profile_json(script, *extra):
    done = run_cli("profile", str(script), "--steps", STEPS, "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_format_json_is_the_same_report_as_json():
    done = run_cli("profile", str(SCRIPTS / "profile_data_bound.py"), "--steps", STEPS, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout).keys() == profile_json(SCRIPTS / "profile_data_bound.py").keys()


def line_of(path, text):
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def words(report):
    return [item["codemod"] for item in report["advice"]]


# --- real scripts -------------------------------------------------------------------


@pytest.mark.slow
def test_a_data_bound_script_is_told_to_use_workers():
    script = SCRIPTS / "profile_data_bound.py"
    done = run_cli("profile", str(script), "--steps", STEPS)
    assert done.returncode == 0, done.stderr
    assert "Bottleneck: data loading" in done.stdout
    assert (
        f"waiting for DataLoader at profile_data_bound.py:{line_of(script, 'DataLoader(SlowImages()')}" in done.stdout
    )
    assert "apply `workers`" in done.stdout
    assert "--to workers" in done.stdout
    assert "epoch 0" not in done.stdout  # stopped after the steps asked for, long before an epoch ends


@pytest.mark.slow
def test_a_compute_bound_script_is_not_told_to_fix_its_data_loading():
    report = profile_json(SCRIPTS / "profile_compute_bound.py")
    assert report["status"] == "stopped" and report["steps_measured"] == int(STEPS) - 2
    assert report["bottleneck"] == "compute"
    assert report["time"]["data_share"] < 0.3
    assert "workers" not in words(report)
    assert "amp" in words(report)
    assert not report["memory"]["grows_every_step"] and not report["kept_losses"]["growing"]
    assert report["syncs"] == {"measurable": False, "per_step": None}


@pytest.mark.slow
def test_losses_kept_as_tensors_show_as_memory_growth_and_call_for_item():
    report = profile_json(SCRIPTS / "profile_kept_losses.py")
    assert report["memory"]["grows_every_step"]
    assert report["memory"]["growth_per_step_bytes"] >= MIB
    assert report["kept_losses"]["growing"]
    assert report["raw"]["optimizers_seen"] == 2  # generator and discriminator: one step per iteration
    assert "item" in words(report)


@pytest.mark.slow
def test_a_script_that_fails_makes_profile_fail(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(100):\n"
        "    model(torch.randn(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
        "    if step == 3:\n"
        "        raise RuntimeError('diverged')\n"
    )
    done = run_cli("profile", str(script), "--steps", "50")
    assert done.returncode == 1
    assert "RuntimeError: diverged" in done.stderr
    assert "the script failed (exit code 1) after 4 steps" in done.stderr


def test_the_tool_side_does_not_import_torch():
    code = "import sys, accelmigrate.launch.profiler, accelmigrate.launch.runner, accelmigrate.launch.slurm; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# --- the analysis of per-step numbers ---------------------------------------------------


def step(seconds=0.1, wait=0.0, rss=500 * MIB, kept=0, **extra):
    return {
        "seconds": seconds,
        "data_wait": {"train.py:10": wait} if wait else {},
        "host_rss_bytes": rss,
        "device_allocated_bytes": None,
        "syncs": None,
        "empty_cache_calls": 0,
        "kept_backward_roots": kept,
        "utilization_percent": None,
        **extra,
    }


def raw_run(steps, loaders=None, **extra):
    return {
        "script": "train.py",
        "status": "stopped",
        "exit_code": 0,
        "device": "cpu",
        "cuda_available": False,
        "gpu_count": 0,
        "syncs_measurable": False,
        "autocast_used": False,
        "low_precision_params": False,
        "loaders": loaders if loaders is not None else {"train.py:10": {"num_workers": 0, "batch_size": 32}},
        "steps": steps,
        "tail": {"seconds": 0.0, "data_wait": {}},
        **extra,
    }


def test_warmup_leaves_out_the_first_steps_when_there_are_enough():
    assert [warmup_steps(n) for n in (1, 2, 3, 4, 5, 20)] == [0, 0, 1, 1, 2, 2]


def test_the_warmup_steps_do_not_count():
    report = analyse(raw_run([step(seconds=5.0, wait=4.9)] * 2 + [step(wait=0.001)] * 6))
    assert report["bottleneck"] == "compute"
    assert report["time"]["step_seconds"] == pytest.approx(0.1)


def test_data_waits_with_workers_already_call_for_manual_tuning():
    loaders = {"train.py:10": {"num_workers": 4, "batch_size": 32}}
    report = analyse(raw_run([step(wait=0.08)] * 8, loaders=loaders))
    assert report["bottleneck"] == "data loading"
    assert words(report) == [None]
    assert "raise num_workers" in report["advice"][0]["reason"]


def test_one_jump_of_the_allocator_is_not_growth():
    rss = [500, 520, 540, 560, 560, 560, 561, 561]
    report = analyse(raw_run([step(rss=r * MIB) for r in rss]))
    assert not report["memory"]["grows_every_step"]
    assert "item" not in words(report)


def test_steady_growth_on_the_device_calls_for_item():
    steps = [step(device_allocated_bytes=1000 * MIB + i * 256 * 1024) for i in range(8)]
    report = analyse(raw_run(steps))
    assert report["memory"]["source"] == "CUDA allocated" and report["memory"]["grows_every_step"]
    assert "item" in words(report)


def test_gpu_specific_advice():
    steps = [step(syncs=12, empty_cache_calls=1, utilization_percent=40.0) for _ in range(8)]
    report = analyse(raw_run(steps, cuda_available=True, gpu_count=4, syncs_measurable=True, device="cpu"))
    assert words(report)[:2] == ["device", "empty-cache"]
    assert "ddp" in words(report) and "amp" in words(report)
    assert report["syncs"]["per_step"] == 12 and report["utilization_percent"] == 40.0
    assert any("synchronisations" in item["reason"] for item in report["advice"] if item["codemod"] is None)


def test_amp_is_not_advised_twice():
    report = analyse(raw_run([step()] * 8, autocast_used=True))
    assert "amp" not in words(report)


def test_without_optimizer_steps_the_whole_run_is_measured():
    report = analyse(raw_run([], tail={"seconds": 2.0, "data_wait": {"train.py:10": 1.5}}))
    assert not report["optimizer_steps_seen"] and report["steps_measured"] == 0
    assert report["bottleneck"] == "data loading" and "workers" in words(report)
    assert "amp" not in words(report)
