"""Entry points as scripts write them, under accelerate and fabric:

- training that runs in the `__main__` block itself (no `main()` to call):
  the Accelerator (or Fabric) is made at the top of the block, the script's
  entry point; its loss lines and weights on 2 gloo processes are the
  one-process run's;
- a device chosen at the top of the module by CUDA's availability
  (`torch.device("cuda" if torch.cuda.is_available() else "cpu")`) and read
  only in functions stays as it is: "cuda" without an index is each
  process's own GPU once Accelerate has made it the current one; read at
  import (a model placed there), it is refused as before (AM827)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, PARITY, exact_options
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two

SCRIPT = FIXTURES / "accelerate" / "main_block_training.py"
MADE = {"accelerate": '    accelerator = Accelerator(cpu=not torch.cuda.is_available(), dataloader_config=DataLoaderConfiguration(split_batches=True))\n',
        "fabric": "    fabric.launch()\n"}


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_the_main_block_is_the_entry_point(word):
    migrated = migrate_source(SCRIPT.read_text(), [(word, exact_options(word))], "train.py").code
    guard = migrated.index('if __name__ == "__main__":\n')
    assert migrated.index(MADE[word]) > guard


@pytest.mark.slow
@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_two_processes_train_as_the_one_process_original(tmp_path, word):
    (tmp_path / "original").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "original" / "train.py").write_text(SCRIPT.read_text())
    (tmp_path / "two" / "train.py").write_text(migrate_source(SCRIPT.read_text(), [(word, exact_options(word))], "train.py").code)
    original = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp_path / "original", env=cpu_env(), timeout=600)
    assert original.returncode == 0, original.stderr[-3000:]
    Launch(tmp_path, "launch", on_two(tmp_path / "two" / "train.py"), cpu_env(), tmp_path / "two").wait().succeeded()
    printed = [line for line in (tmp_path / "launch.out").read_text().splitlines() if line.startswith("epoch")]
    expected = original.stdout.splitlines()
    assert len(printed) == len(expected) == 3
    for got, want in zip(printed, expected):
        assert float(got.split()[-1]) == pytest.approx(float(want.split()[-1]), abs=2e-6)
    one, two = torch.load(tmp_path / "original" / "regressor.pt"), torch.load(tmp_path / "two" / "regressor.pt")
    assert max((one[k] - two[k]).abs().max().item() for k in one) <= ONE_PROCESS_TOLERANCE


DEVICE_AT_TOP = FIXTURES / "accelerate" / "module_level_device.py"


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_a_device_chosen_by_availability_at_the_top_stays(word):
    source = DEVICE_AT_TOP.read_text()
    result = migrate_source(source, [(word, exact_options(word))], "train.py")
    assert 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n' in result.code
    assert "prepare(" in result.code or "setup(" in result.code
    assert not [f.code for f in result.findings if not f.fixed and f.code.endswith(("27", "20"))]


@pytest.mark.parametrize(
    "change",
    [
        ("epochs = 2\n", "epochs = 2\nprobe = torch.zeros(1).to(device)\n"),  # read at import
        ('"cuda" if', '"cuda:0" if'),  # the first GPU in every process
    ],
)
def test_a_device_at_the_top_read_at_import_or_indexed_is_refused(change):
    source = DEVICE_AT_TOP.read_text().replace(*change)
    result = migrate_source(source, [("accelerate", PARITY)], "train.py")
    assert "AM827" in {f.code for f in result.findings} and "Accelerator(" not in result.code
