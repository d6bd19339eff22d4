"""Findings point at the original file, whatever an earlier codemod did to it:
main-guard moves a flat script's code under its guard (one level deeper,
sometimes in another order), and a later codemod reports on that moved code."""

import ast
import textwrap

import pytest

from accelmigrate.engine.migrate import migrate_source

FLAT = textwrap.dedent(
    """\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset


    class Squares(Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, index):
            x = torch.tensor([float(open(f"squares/{index}.txt").read())])  # each item read from its own file
            return x, x**2


    train_loader = DataLoader(Squares(), batch_size=32, shuffle=True)
    val_loader = DataLoader(Squares(), batch_size=64)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.DataParallel(nn.Linear(1, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in train_loader:
            optimizer.zero_grad()
            x, y = x.to(device), y.to(device)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        print(f"epoch {epoch} done")
    """
)
FIRST_MOVED_LINE = 15  # `train_loader = ...`, where the guard begins
EPOCH_LOOP_TARGET = (21, 5)  # `epoch` in `for epoch in range(3):`


def position_of_call(source: str, name: str, occurrence: int = 0) -> tuple[int, int]:
    """(line, column), 1-based, of the `occurrence`-th call to `name` in `source`."""
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    ]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    return calls[occurrence].lineno, calls[occurrence].col_offset + 1


@pytest.mark.parametrize("check_only", [False, True], ids=["apply", "check"])
def test_findings_on_code_that_main_guard_moved_point_at_the_original_lines(check_only):
    migration = migrate_source(FLAT, [("workers", {})], "train.py", check_only=check_only)
    loaders = [(f.line, f.column) for f in migration.findings if f.code == "AM101"]
    assert loaders == [position_of_call(FLAT, "DataLoader", 0), position_of_call(FLAT, "DataLoader", 1)]
    assert [f.line for f in migration.findings if f.code == "AM120"] == [FIRST_MOVED_LINE]


def test_ddp_findings_on_moved_code_point_at_the_original_lines():
    findings = {f.code: (f.line, f.column) for f in migrate_source(FLAT, [("ddp", {})], "train.py").findings}
    assert findings["AM502"] == position_of_call(FLAT.replace("nn.DataParallel(", "DataParallel("), "DataParallel")
    assert findings["AM504"] == position_of_call(FLAT, "DataLoader", 0)
    assert findings["AM505"] == EPOCH_LOOP_TARGET


def test_check_with_a_codemod_whose_prerequisites_do_not_need_each_other():
    """ddp needs device and main-guard, neither of which needs the other: in
    check mode ddp sees the file as both leave it, and each finding is
    reported once, where apply reports it."""
    applied = migrate_source(FLAT, [("ddp", {})], "train.py")
    checked = migrate_source(FLAT, [("ddp", {})], "train.py", check_only=True)
    assert checked.code == FLAT
    as_positions = lambda findings: [(f.line, f.column, f.code) for f in findings]  # noqa: E731
    assert as_positions(checked.findings) == as_positions(applied.findings)
