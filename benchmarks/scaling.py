"""How the cost of analysing one file grows with its size.

Builds one file of about 10 KB, 100 KB, 1 MB and 5 MB of training code and
prints, for each size, the CPU time and peak memory of the stages below.
Three shapes of file: `functions` (copies of a small realistic script, each
with its own function and class names), `flat` (copies of a flat
tutorial-style block at module level, which binds the same names again in
every copy: the worst case for any look-up that goes over a name's bindings)
and `one-line` (a short training loop after a table of numbers written on
one line, as generated code or an embedded look-up table is):

  (a) ast.parse + the pre-check (`accelmigrate.codemods.script.precheck`),
  (b) libcst.parse_module + the script model (`ScriptModel.of`),
  (c) the current `accelmigrate.engine.migrate.migrate_source` with every codemod, in
      check mode (what `accelmigrate check` runs),
  (d) what `accelmigrate apply --to empty-cache --diff` runs on the file:
      the codemod, then fitting the output to the file's style (black
      deciding whether the file is black-formatted, the new lines fitted).

Each measurement runs in a fresh interpreter, so peak memory
(`ru_maxrss`) is that one stage's, over an interpreter that has only
imported the tool. Stage (c) skips the sizes after one that ran past the
budget ("skipped: over budget"). Time per KB should stay about constant
for (a) and (b).

    python benchmarks/scaling.py [--sizes 10,100,1000,5000] [--budget 120] [--shape functions|flat|one-line] [--stages abcd]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

TEMPLATE = '''

class Net{i}(nn.Module):
    """A small classifier ({i})."""

    def __init__(self, features=20, hidden=64, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def make_data{i}(n=512, features=20, classes=4):
    x = torch.randn(n, features)
    y = (x @ torch.randn(features, classes)).argmax(dim=1)
    return TensorDataset(x, y)


def train{i}(args, model, device, train_loader, optimizer, epoch):
    model.train()
    losses = []
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss)
        if batch_idx % args.log_interval == 0:
            print(f"epoch {{epoch}} batch {{batch_idx}}: {{loss.item():.4f}}")
    return losses


def test{i}(model, device, test_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data.to(device))
            correct += output.argmax(dim=1).eq(target.to(device)).sum().item()
    return correct / len(test_loader.dataset)


def main{i}(args):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(make_data{i}(), batch_size=32, shuffle=True)
    test_loader = DataLoader(make_data{i}(128), batch_size=128)
    model = Net{i}().to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train{i}(args, model, device, train_loader, optimizer, epoch)
        test{i}(model, device, test_loader)
        scheduler.step()
    torch.save(model.state_dict(), "model{i}.pt")
'''

FLAT_BLOCK = '''

# -- run {i} --
train_data{i} = TensorDataset(torch.randn(256, 20), torch.randint(0, 4, (256,)))
train_loader = DataLoader(train_data{i}, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
optimizer = optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
losses = []
for epoch in range(2):
    for data, target in train_loader:
        data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    print("run {i} epoch", epoch, loss.item())
torch.save(model.state_dict(), "model{i}.pt")
'''

HEADER = '''"""Generated training code for the scaling benchmark."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
'''

FOOTER = '''

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    main0(parser.parse_args())
'''

ONE_LINE_LOOP = '''

model = nn.Linear(20, 4)
optimizer = optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(torch.randn(8, 20)), torch.randint(0, 4, (8,)))
    loss.backward()
    optimizer.step()
    torch.cuda.empty_cache()
'''

STAGES = {
    "a": "ast.parse + precheck",
    "b": "libcst.parse_module + ScriptModel",
    "c": "migrate_source, every codemod (check mode)",
    "d": "apply --to empty-cache (codemod + fitting)",
}


def training_code(kilobytes: int, shape: str = "functions") -> str:
    """About `kilobytes` KB of training code: copies of TEMPLATE (with a main
    guard), of FLAT_BLOCK, or one line of numbers before ONE_LINE_LOOP."""
    if shape == "one-line":
        numbers, count = [], 0
        while count < kilobytes * 1024:
            numbers.append(str(len(numbers)))
            count += len(numbers[-1]) + 2
        return f"{HEADER}\nTABLE = [{', '.join(numbers)}]\n{ONE_LINE_LOOP}"
    block = TEMPLATE if shape == "functions" else FLAT_BLOCK
    parts = [HEADER]
    size, i = len(HEADER), 0
    while size < kilobytes * 1024:
        copy = block.format(i=i)
        parts.append(copy)
        size += len(copy)
        i += 1
    if shape == "functions":
        parts.append(FOOTER)
    return "".join(parts)


# -- one measurement (in a fresh interpreter) ------------------------------------


def measure(stage: str, kilobytes: int, shape: str) -> dict:
    import resource

    source = training_code(kilobytes, shape)
    run = _stage(stage)
    start = time.process_time()
    detail = run(source)
    cpu = time.process_time() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"stage": stage, "kb": len(source) / 1024, "cpu": cpu, "peak_mb": peak_kb / 1024, "detail": detail}


def _stage(stage: str):
    if stage == "a":
        from accelmigrate.codemods.script import precheck

        def run(source):
            facts = precheck(source)  # one ast.parse and one walk
            return f"{facts.backward_calls} backward calls"

    elif stage == "b":
        import libcst

        from accelmigrate.codemods.script import ScriptModel

        def run(source):
            model = ScriptModel.of(libcst.parse_module(source))
            return f"{len(model.training_steps)} training steps"

    elif stage == "d":
        import os
        import tempfile

        from accelmigrate.engine.migrate import process_file

        def run(source):
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "generated.py")
                with open(path, "w", encoding="utf-8") as file:
                    file.write(source)
                result = process_file(path, [("empty-cache", {})], black_config={})
            return "changed" if result.changed else f"unchanged {result.error or ''}".strip()

    else:
        from accelmigrate.codemods import resolve
        from accelmigrate.engine.migrate import migrate_source

        plan = [(cls.word, options) for cls, options in resolve(_all_words())]

        def run(source):
            return f"{len(migrate_source(source, plan, 'generated.py', check_only=True).findings)} findings"

    return run


def _all_words() -> dict:
    from accelmigrate.codemods import all_codemods, words_without_values

    words = {word: {} for word in words_without_values()}
    for word in all_codemods():
        words.setdefault(word, {"value": "2"})  # accumulate=2, batch-scale=2
    return words


# -- the driver ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000,5000", help="file sizes in KB")
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds (c) may take before larger sizes are skipped")
    parser.add_argument("--stages", default="abc")
    parser.add_argument("--shape", choices=("functions", "flat", "one-line"), default="functions")
    parser.add_argument("--child", nargs=2, metavar=("STAGE", "KB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.shape)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"shape: {args.shape}")
    print(f"{'stage':44} {'size KB':>9} {'CPU s':>8} {'ms/KB':>7} {'peak MB':>8}  result")
    for stage in args.stages:
        over = False
        for kilobytes in sizes:
            label = f"({stage}) {STAGES[stage]}"
            if over:
                print(f"{label:44} {kilobytes:>9} skipped: over budget")
                continue
            limit = args.budget * 2 + 30 if stage in "cd" else 1200.0  # wall-clock seconds
            result = _child(stage, kilobytes, limit, args.shape)
            if result is None:
                print(f"{label:44} {kilobytes:>9} skipped: over budget (stopped after {limit:.0f} s)")
                over = True
                continue
            per_kb = 1000 * result["cpu"] / result["kb"]
            print(f"{label:44} {result['kb']:>9.0f} {result['cpu']:>8.2f} {per_kb:>7.2f} {result['peak_mb']:>8.0f}  {result['detail']}")
            over = stage in "cd" and result["cpu"] > args.budget
        sys.stdout.flush()


def _child(stage: str, kilobytes: int, limit: float, shape: str):
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", stage, str(kilobytes), "--shape", shape],
            capture_output=True, text=True, timeout=limit, check=True,
        )
    except subprocess.TimeoutExpired:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
