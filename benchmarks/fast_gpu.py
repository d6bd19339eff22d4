"""Training throughput of plain float32 scripts and of their `--to fast` migration.

Two small training scripts written the plain way (float32, `.cuda()`, no
speed settings): a conv net and a transformer encoder. Each is migrated with
the `fast` preset (the classic checklist plus the speed codemods: compile,
tf32, cudnn-benchmark, channels-last, fused-optim, ...); the original and the
migrated script then run side by side in fresh processes, alternating
(`--repeats`), on the same synthetic batch for the same number of steps.
Prints samples/s of each, the best of the repeats, and the speed-up.

Needs CUDA. Without it, it says so and exits 0; `--cpu` runs a tiny version
on the CPU instead, which only checks that the pipeline works (CPU speed-ups
mean nothing here).

    python benchmarks/fast_gpu.py          # a few minutes on one GPU
    python benchmarks/fast_gpu.py --cpu    # a pipeline check, no GPU needed
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.engine.migrate import migrate_source, plan_of

COMMON = '''
def timed_training(model, batch, labels, criterion, optimizer, warmup, steps):
    start = None
    for step in range(warmup + steps):
        if step == warmup:
            loss.item()  # waits for the warm-up steps to finish
            start = time.perf_counter()
        optimizer.zero_grad()
        output = model(batch)
        loss = criterion(output, labels)
        loss.backward()
        optimizer.step()
    final = loss.item()  # waits for the timed steps to finish
    return steps * batch.shape[0] / (time.perf_counter() - start), final
'''

CONV_SCRIPT = '''\
"""A small conv net trained in float32 on one CUDA GPU; prints its throughput."""

import argparse
import time

import torch
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, width=64, classes=100):
        super().__init__()
        layers, channels = [], 3
        for out, stride in [(width, 1), (width, 1), (2 * width, 2), (2 * width, 1), (4 * width, 2), (4 * width, 1)]:
            layers += [nn.Conv2d(channels, out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            channels = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.features(x))
''' + COMMON + '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ConvNet(args.width).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(args.batch, 3, args.size, args.size).cuda()
    labels = torch.randint(0, 100, (args.batch,)).cuda()
    rate, final = timed_training(model, images, labels, criterion, optimizer, args.warmup, args.steps)
    print(f"throughput: {rate:.1f} samples/s (final loss {final:.4f})")


if __name__ == "__main__":
    main()
'''

TRANSFORMER_SCRIPT = '''\
"""A small transformer encoder classifier trained in float32 on one CUDA GPU; prints its throughput."""

import argparse
import time

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self, vocab=8000, width=256, layers=4, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        block = nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))
''' + COMMON + '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Classifier(width=args.width).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 8000, (args.batch, args.length)).cuda()
    labels = torch.randint(0, 10, (args.batch,)).cuda()
    rate, final = timed_training(model, tokens, labels, criterion, optimizer, args.warmup, args.steps)
    print(f"throughput: {rate:.1f} samples/s (final loss {final:.4f})")


if __name__ == "__main__":
    main()
'''

SCRIPTS = {"conv net": (CONV_SCRIPT, ["--batch", "4", "--size", "8", "--width", "4"]), "transformer": (TRANSFORMER_SCRIPT, ["--batch", "2", "--length", "8", "--width", "16"])}
TINY_STEPS = ["--warmup", "2", "--steps", "3"]
THROUGHPUT = re.compile(r"throughput: (\S+) samples/s")


def migrate(name: str, text: str, folder: Path) -> tuple[Path, Path, list[str]]:
    original = folder / f"{name.replace(' ', '_')}.py"
    original.write_text(text, encoding="utf-8")
    plan = plan_of(resolve(parse_words("fast")))
    migration = migrate_source(text, plan, str(original))
    migrated = folder / f"{original.stem}_fast.py"
    migrated.write_text(migration.code, encoding="utf-8")
    changed_by = sorted({f.word for f in migration.findings if f.fixed})
    return original, migrated, changed_by


def throughput(script: Path, arguments: list[str], cpu: bool) -> float:
    env = dict(os.environ)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        if script.read_text(encoding="utf-8").count(".cuda()"):
            cpu_copy = script.with_name(script.stem + "_cpu.py")  # the float32 original hard-codes CUDA
            cpu_copy.write_text(script.read_text(encoding="utf-8").replace(".cuda()", ""), encoding="utf-8")
            script = cpu_copy
    completed = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, env=env, timeout=900)
    match = THROUGHPUT.search(completed.stdout)
    if completed.returncode != 0 or match is None:
        sys.exit(f"{script.name} failed:\n{completed.stdout}\n{completed.stderr[-3000:]}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run a tiny version on the CPU (checks the pipeline only)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each variant; the best one counts")
    args = parser.parse_args()
    import torch  # the tool never imports torch; a benchmark may

    if not args.cpu and not torch.cuda.is_available():
        print("CUDA is not available: this benchmark measures GPU training throughput. Run it on a GPU machine, or with --cpu for a tiny pipeline check.")
        return 0
    device = "CPU (checks the pipeline, the ratios mean nothing)" if args.cpu else torch.cuda.get_device_name()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (text, tiny) in SCRIPTS.items():
            original, migrated, words = migrate(name, text, Path(folder))
            arguments = tiny + TINY_STEPS if args.cpu else []
            best = {"fp32 original": 0.0, "--to fast": 0.0}
            for repeat in range(args.repeats):
                for variant, script in (("fp32 original", original), ("--to fast", migrated)):
                    value = throughput(script, arguments, args.cpu)
                    best[variant] = max(best[variant], value)
                    print(f"  {name}: run {repeat + 1} {variant:<14} {value:12.1f} samples/s", flush=True)
            rows.append((name, best["fp32 original"], best["--to fast"], ", ".join(words)))
    print(f"\nbest of {args.repeats} runs on {device}")
    print(f"{'script':<12} {'fp32 original':>14} {'--to fast':>12} {'speed-up':>9}  codemods that changed it")
    for name, before, after, words in rows:
        print(f"{name:<12} {before:>14.1f} {after:>12.1f} {after / before:>8.2f}x  {words}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
