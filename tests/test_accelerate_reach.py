"""`--to accelerate` of the shapes that the reach benchmark found refused
(fixtures/accelerate/reach_*.py).

- fast: `--device cpu` still keeps the run on the CPU (the Accelerator reads
  the flag) and `device = args.device` becomes `accelerator.device`, whose
  comparisons with "cpu" read its type; `torch.cuda.set_device(args.gpu)`
  goes and `.cuda(args.gpu)` becomes `.to(accelerator.device)`; so for a
  flag parsed in the `__main__` block before `main(args)` runs (not one
  parsed again after it); a flag read anywhere else is refused; a device the `__main__` block chooses for the
  function that makes the Accelerator is refused with the manual step
  (a `main()`) that migrates;
- end to end (slow): each migrated fixture run with plain `python` and on 2
  CPU processes under torchrun (ACCELERATE_USE_CPU) ends with the one-process
  original's weights within 1e-5, watched from outside by
  fixtures/scripts/ddp_rank_weights.py, and prints each epoch's line once.
  The CUDA-only `--gpu` original runs on the CPU with its CUDA placement
  dropped (`torch.cuda.set_device(...)`, `.cuda(args.gpu...)`): nothing else
  of it changes.
"""

from __future__ import annotations

import sys

import pytest
from conftest import FIXTURES, PARITY
from launching import (
    ONE_PROCESS_TOLERANCE,
    RANK_WEIGHTS,
    assert_ranks_agree,
    cpu_env,
    largest_parameter_difference,
    launch_all,
    on_two,
    rank_weights,
)

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.output.lint import is_note

REACH = FIXTURES / "accelerate"
DEVICE_FLAG = REACH / "reach_device_flag.py"
GPU_INDEX_FLAG = REACH / "reach_gpu_index_flag.py"


def _migrate(source: str):
    return migrate_source(source, [("accelerate", PARITY)], "train.py")


def _refusals(result) -> list[str]:
    """The findings that need a manual step (not the notes, such as AM811's on an uneven last batch)."""
    return [f.code for f in result.findings if not f.fixed and not is_note(f)]


def test_the_device_flag_keeps_the_cpu_and_the_device_is_the_accelerators():
    result = _migrate(DEVICE_FLAG.read_text())
    code = result.code
    assert _refusals(result) == []
    assert 'Accelerator(cpu=args.device == "cpu" or not torch.cuda.is_available(),' in code
    assert "    device = accelerator.device\n" in code and 'pin = device.type != "cpu"' in code
    assert code.index("args = parser.parse_args()") < code.index("accelerator = Accelerator(")


def test_a_device_flag_typed_as_a_string_is_read_the_same():
    source = DEVICE_FLAG.read_text().replace('parser.add_argument("--device", default=', 'parser.add_argument("--device", type=str, default=')
    assert "type=str" in source
    result = _migrate(source)
    assert _refusals(result) == [] and 'Accelerator(cpu=args.device == "cpu" or' in result.code


def _parsed_in_the_main_block(source: str) -> str:
    """The device flag's fixture with its arguments parsed in the `__main__` block, then `main(args)`."""
    parsing = source[source.index("    parser = argparse.ArgumentParser("):source.index("    args = parser.parse_args()\n") + len("    args = parser.parse_args()\n")]
    source = source.replace(parsing, "").replace("def main():", "def main(args):").replace("    main()", parsing + "    main(args)")
    assert "    args = parser.parse_args()\n    main(args)" in source
    return source


def test_a_device_flag_parsed_in_the_main_block_before_main_runs_is_read_the_same():
    result = _migrate(_parsed_in_the_main_block(DEVICE_FLAG.read_text()))
    assert _refusals(result) == [] and 'Accelerator(cpu=args.device == "cpu" or' in result.code


def test_a_device_flag_parsed_in_the_main_block_after_main_runs_is_refused():
    source = _parsed_in_the_main_block(DEVICE_FLAG.read_text()).replace("    main(args)", "    main(args)\n    args = parser.parse_args()\n    main(args)")
    result = _migrate(source)
    assert _refusals(result) == ["AM827"] and result.code == source


def test_the_gpu_index_flag_gives_way_to_each_processs_device():
    result = _migrate(GPU_INDEX_FLAG.read_text())
    code = result.code
    assert _refusals(result) == []
    body = code.split('"""', 2)[2]  # past the docstring, which names them
    assert "set_device(" not in body and ".cuda(" not in body
    assert "images.to(accelerator.device, non_blocking=True)" in code
    assert '"--gpu"' in code  # the flag is still accepted, and read by nothing


@pytest.mark.parametrize(
    "old, new",
    [
        ("inputs.to(device), wanted", "inputs.to(args.device), wanted"),
        ("    device = args.device\n", "    device = args.device\n    print(torch.zeros(1, device=args.device))\n"),
    ],
)
def test_a_device_flag_read_past_device_is_refused(old, new):
    source = DEVICE_FLAG.read_text()
    assert old in source
    source = source.replace(old, new)
    result = _migrate(source)
    assert _refusals(result) == ["AM827"] and result.code == source
    assert "`args.device` read here" in next(f.message for f in result.findings if not f.fixed)


def test_a_gpu_index_read_in_a_test_is_refused():
    source = GPU_INDEX_FLAG.read_text().replace("torch.cuda.set_device(args.gpu)\n", "if args.gpu >= 0:\n    torch.cuda.set_device(args.gpu)\n")
    result = _migrate(source)
    assert _refusals(result) == ["AM827"] and result.code == source


def test_a_device_chosen_in_the_main_block_is_refused_with_a_step_that_works():
    source = (REACH / "reach_refused_device_in_main_block.py").read_text()
    result = _migrate(source)
    assert _refusals(result) == ["AM827"] and result.code == source
    assert "move the block's code into a function `main()`" in result.findings[0].message
    head, block = source.split('if __name__ == "__main__":\n')
    moved = _migrate(head + "def main():\n" + block + '\n\nif __name__ == "__main__":\n    main()\n')
    assert _refusals(moved) == []
    assert "def fit(big, small, loader, optimizer, device, rounds, accelerator):" in moved.code


def _cpu_original_of_gpu_index_flag() -> str:
    """The CUDA-only original with its CUDA placement dropped, so that it runs here as it would on one GPU."""
    source = GPU_INDEX_FLAG.read_text()
    dropped = source.replace("torch.cuda.set_device(args.gpu)\n", "").replace(".cuda(args.gpu, non_blocking=True)", "").replace(".cuda(args.gpu)", "")
    assert ".cuda(" not in dropped.split('"""', 2)[2] and "set_device(" not in dropped.split('"""', 2)[2]
    return dropped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("accelerate_reach")
    scripts = {}
    in_block = work / "device_flag_in_block_original.py"
    in_block.write_text(_parsed_in_the_main_block(DEVICE_FLAG.read_text()))
    for name, original in [("device_flag", DEVICE_FLAG), ("gpu_index", GPU_INDEX_FLAG), ("device_flag_in_block", in_block)]:
        migrated = work / f"{name}_migrated.py"
        migrated.write_text(_migrate(original.read_text()).code)
        scripts[name] = migrated
    cpu_original = work / "gpu_index_original.py"
    cpu_original.write_text(_cpu_original_of_gpu_index_flag())
    originals = {"device_flag": (DEVICE_FLAG, ["--device", "cpu"]), "gpu_index": (cpu_original, []), "device_flag_in_block": (in_block, ["--device", "cpu"])}
    plans = {}
    for name, (original, args) in originals.items():
        plans[f"{name}_original"] = [sys.executable, str(RANK_WEIGHTS), "{folder}", str(original), *args]
        plans[f"{name}_plain"] = [sys.executable, str(RANK_WEIGHTS), "{folder}", str(scripts[name]), *args]
        plans[f"{name}_two"] = on_two(RANK_WEIGHTS, "{folder}", str(scripts[name]), *args)
    launches, folders = launch_all(work, plans, cpu_env(ACCELERATE_USE_CPU="true"))
    for launch in launches.values():
        launch.succeeded()
    return launches, folders


@pytest.mark.slow
@pytest.mark.parametrize("name, epochs", [("device_flag", 3), ("gpu_index", 2), ("device_flag_in_block", 3)])
def test_migrated_reach_fixtures_end_with_the_originals_weights(runs, name, epochs):
    launches, folders = runs
    (original,) = rank_weights(folders[f"{name}_original"])
    (plain,) = rank_weights(folders[f"{name}_plain"])
    two = assert_ranks_agree(launches[f"{name}_two"], folders[f"{name}_two"])
    assert largest_parameter_difference(original, plain) <= ONE_PROCESS_TOLERANCE
    assert largest_parameter_difference(original, two) <= ONE_PROCESS_TOLERANCE
    for run in ("plain", "two"):
        assert launches[f"{name}_{run}"].stdout.count("done") == epochs
