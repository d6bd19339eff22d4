"""NVIDIA apex's amp moved onto Accelerate's mixed precision by the accelerate
codemod (codemods/_accelerate/apex.py; fixtures/accelerate/apex_*).

- fast: what the migrated scripts say (the Accelerator's mixed precision, no
  apex left), and the shapes refused whole (AM821, the file unchanged);
- end to end (slow): apex has no build on PyPI and needs CUDA, so it cannot be
  installed here. The ORIGINAL scripts run against a small stand-in package,
  tests/data/apex_standin/apex/, put on PYTHONPATH for the originals' runs
  only: its `initialize` returns what it is given, `scale_loss` yields the
  loss and `master_params` the optimizer's parameters, the fp32 arithmetic
  apex's amp does where mixed precision is off, which is what the migrated
  script computes on a CPU (`mixed_precision="no"` there). The migrated
  copies, which must not import apex, run with plain `python` and on 2 CPU
  processes under torchrun (gloo, ACCELERATE_USE_CPU=true), each ending with
  the original's weights within 1e-5.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, PARITY, ROOT
from launching import ONE_PROCESS_TOLERANCE, cpu_env, launch_all, on_two

from accelmigrate.engine.migrate import migrate_source

STANDIN = ROOT / "tests" / "data" / "apex_standin"
CASES = FIXTURES / "accelerate"
TRAINED = ("apex_o1_main", "apex_o2_layernorm", "apex_flat_2019", "apex_master_params_clip")
REFUSED = ("apex_refused_o3", "apex_refused_checkpoint", "apex_refused_parallel", "apex_refused_flag",
           "apex_refused_opt_level_flag", "apex_refused_try_import")
FP16_ON_CUDA = 'Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no", '


def _migrate(source: str):
    return migrate_source(source, [("accelerate", PARITY)], "train.py")


def _apex_names(code: str) -> list[str]:
    """apex imported or `amp` / `apex` read anywhere in the code (comments aside)."""
    tree = ast.parse(code)
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name.split(".")[0] == "apex"]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "apex"]
    return imported + [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("amp", "apex")]


@pytest.mark.parametrize("case", TRAINED)
def test_apex_moves_onto_the_accelerators_mixed_precision(case):
    result = _migrate((CASES / f"{case}.py").read_text())
    assert FP16_ON_CUDA in result.code
    assert not _apex_names(result.code)
    assert "accelerator.backward(loss" in result.code
    assert not [f for f in result.findings if f.code == "AM821"]


def test_o2_is_told_that_accelerate_computes_as_o1():
    result = _migrate((CASES / "apex_o2_layernorm.py").read_text())
    (initialize,) = [f for f in result.findings if f.code == "AM812" and "amp.initialize" in f.message]
    assert "fp32 weights (O1's)" in initialize.message and "keep_batchnorm_fp32" in initialize.message


def test_o0_asks_for_no_mixed_precision():
    source = (CASES / "apex_o1_main.py").read_text().replace('opt_level="O1"', 'opt_level="O0"')
    migrated = _migrate(source).code
    assert "accelerator = Accelerator(cpu=" in migrated and not _apex_names(migrated)


def test_a_summed_loss_keeps_the_processes_factor():
    migrated = _migrate((CASES / "apex_flat_2019.py").read_text()).code
    assert "accelerator.backward(loss * accelerator.num_processes)" in migrated


@pytest.mark.parametrize("case", REFUSED)
def test_what_apex_cannot_become_is_refused_whole(case):
    source = (CASES / f"{case}.py").read_text()
    result = _migrate(source)
    assert result.code == source
    assert [f.code for f in result.findings] == ["AM821"]
    assert "by hand" in result.findings[0].message or "then run accelerate again" in result.findings[0].message


# -- end to end ---------------------------------------------------------------------------


def _weights(folder: Path) -> dict:
    import torch

    (checkpoint,) = sorted(folder.glob("*.pt"))
    return torch.load(checkpoint)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("apex")
    (work / "originals").mkdir()
    (work / "migrated").mkdir()
    plans = {}
    for case in TRAINED:
        migrated = work / f"{case}_migrated.py"
        migrated.write_text(_migrate((CASES / f"{case}.py").read_text()).code)
        plans[f"{case}-plain"] = [sys.executable, str(migrated)]
        plans[f"{case}-two"] = on_two(migrated)
    originals = {f"{case}-original": [sys.executable, str(CASES / f"{case}.py")] for case in TRAINED}
    # The stand-in apex is on the originals' path only: a migrated script that still imported apex would fail.
    original_runs, original_folders = launch_all(work / "originals", originals, cpu_env(PYTHONPATH=str(STANDIN)))
    migrated_runs, migrated_folders = launch_all(work / "migrated", plans, cpu_env(ACCELERATE_USE_CPU="true"))
    return {**original_runs, **migrated_runs}, {**original_folders, **migrated_folders}


@pytest.mark.slow
@pytest.mark.parametrize("case", TRAINED)
@pytest.mark.parametrize("launch", ["plain", "two"])
def test_migrated_script_ends_with_the_originals_weights(runs, case, launch):
    launches, folders = runs
    launches[f"{case}-original"].succeeded()
    launches[f"{case}-{launch}"].succeeded()
    original, migrated = _weights(folders[f"{case}-original"]), _weights(folders[f"{case}-{launch}"])
    assert set(original) == set(migrated)
    assert max((original[k] - migrated[k]).abs().max().item() for k in original) <= ONE_PROCESS_TOLERANCE
