"""accelerate and fabric log on the main process only, as they print: a
logging call on a line of its own (the logging module's functions, a logger
made by `logging.getLogger`) goes under `if accelerator.is_main_process:`
(`fabric.is_global_zero`), AM807/AM907. On 2 gloo processes each line is
logged once, as the original logs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import PARITY
from launching import Launch, cpu_env, on_two

LOGGED = """\\
import logging
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
logger = logging.getLogger("train")
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, drop_last=True)
model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    logging.info("epoch %d", epoch)
    logger.info("trained %d", epoch)
"""
GUARD = {"accelerate": "if accelerator.is_main_process:", "fabric": "if fabric.is_global_zero:"}


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_logging_lines_go_under_the_main_process(word):
    result = migrate_source(LOGGED, [(word, {})], "train.py")
    assert f'    {GUARD[word]}\n        logging.info("epoch %d", epoch)\n        logger.info("trained %d", epoch)\n' in result.code
    assert [f.code for f in result.findings if f.code.endswith("07")] == [("AM807" if word == "accelerate" else "AM907")]


@pytest.mark.slow
@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_two_processes_log_each_line_once(tmp_path, word):
    (tmp_path / "original.py").write_text(LOGGED)
    (tmp_path / "migrated.py").write_text(migrate_source(LOGGED, [(word, PARITY)], "train.py").code)
    original = subprocess.run([sys.executable, "original.py"], capture_output=True, text=True, cwd=tmp_path, env=cpu_env(), timeout=600)
    assert original.returncode == 0, original.stderr[-3000:]
    Launch(tmp_path, "two", on_two(tmp_path / "migrated.py"), cpu_env(), tmp_path).wait().succeeded()
    logged = [line for line in (tmp_path / "two.out").read_text().splitlines() if line.startswith(("epoch", "trained"))]
    assert logged == original.stdout.splitlines() and len(logged) == 6
