"""Training throughput of a small conv net in float32 and after `--to device,amp`.

A training script written for one CUDA GPU in float32 (`.cuda()` everywhere)
is migrated with the `device` and `amp` codemods; the original and the
migrated script then run side by side in fresh processes, on the same
synthetic batch, for the same number of steps, alternating (`--repeats`).
The migrated one runs twice: in the precision the runtime picks (bfloat16 on
Ampere and later) and forced to float16 (with the GradScaler enabled).
Prints images/s for each, the best of the repeats, and the speed-up over
float32.

Needs CUDA. Without it, it says so and exits 0; `--cpu` runs a tiny version
on the CPU instead, which only checks that the pipeline works (CPU speed-ups
mean nothing here).

    python benchmarks/amp_gpu.py                 # about two minutes on one GPU
    python benchmarks/amp_gpu.py --cpu           # seconds, no GPU needed
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from accelmigrate.engine.migrate import migrate_source

TRAIN_SCRIPT = '''\
"""A small conv net trained in float32 on one CUDA GPU; prints its throughput."""

import argparse
import time

import torch
import torch.nn as nn


def conv_block(inputs, outputs, stride=1):
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU(inplace=True),
    )


class ConvNet(nn.Module):
    def __init__(self, width=64, classes=100):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(3, width),
            conv_block(width, width),
            conv_block(width, 2 * width, stride=2),
            conv_block(2 * width, 2 * width),
            conv_block(2 * width, 4 * width, stride=2),
            conv_block(4 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        return self.head(self.features(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = ConvNet(args.width).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, 3, args.size, args.size).cuda()
    labels = torch.randint(0, 100, (args.batch,)).cuda()

    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            loss.item()  # waits for the warm-up steps to finish
            start = time.perf_counter()
        optimizer.zero_grad()
        output = model(images)
        loss = criterion(output, labels)
        loss.backward()
        optimizer.step()
    final = loss.item()  # waits for the timed steps to finish
    elapsed = time.perf_counter() - start
    print(f"throughput: {args.steps * args.batch / elapsed:.1f} images/s (final loss {final:.4f})")


if __name__ == "__main__":
    main()
'''

THROUGHPUT = re.compile(r"throughput: (\S+) images/s")
TINY = ["--batch", "8", "--size", "16", "--width", "8", "--warmup", "2", "--steps", "5"]


def cuda_available() -> bool:
    import torch  # the tool never imports torch; a benchmark may

    return torch.cuda.is_available()


def write_scripts(folder: Path) -> tuple[Path, Path]:
    original = folder / "train_fp32.py"
    original.write_text(TRAIN_SCRIPT, encoding="utf-8")
    migration = migrate_source(TRAIN_SCRIPT, [("device", {}), ("amp", {})], str(original))
    if "torch.autocast(" not in migration.code or "scaler.scale(loss).backward()" not in migration.code:
        sys.exit("the amp codemod did not migrate the benchmark script:\n" + "\n".join(f.message for f in migration.findings))
    migrated = folder / "train_amp.py"
    migrated.write_text(migration.code, encoding="utf-8")
    return original, migrated


def throughput(script: Path, arguments: list[str], precision: str, cpu: bool) -> float:
    env = {**os.environ, "ACCELMIGRATE_PRECISION": precision}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        script = patched_for_cpu(script)
    completed = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, env=env, timeout=600)
    match = THROUGHPUT.search(completed.stdout)
    if completed.returncode != 0 or match is None:
        sys.exit(f"{script.name} failed:\n{completed.stdout}\n{completed.stderr[-3000:]}")
    return float(match.group(1))


def patched_for_cpu(script: Path) -> Path:
    """The float32 original hard-codes `.cuda()`; on the CPU it runs with the
    placement stripped (the migrated script needs no change)."""
    text = script.read_text(encoding="utf-8")
    if ".cuda()" not in text:
        return script
    cpu_copy = script.with_name(script.stem + "_cpu.py")
    cpu_copy.write_text(text.replace(".cuda()", ""), encoding="utf-8")
    return cpu_copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run a tiny version on the CPU (checks the pipeline only)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each variant; the best one counts")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: arguments for the training script")
    args = parser.parse_args()
    if not args.cpu and not cuda_available():
        print("CUDA is not available: this benchmark measures GPU training throughput. Run it on a GPU machine, or with --cpu for a tiny pipeline check.")
        return 0
    arguments = TINY if args.cpu else [a for a in args.script_args if a != "--"]
    variants = [("fp32 (original)", 0, "fp32"), ("amp, runtime dtype", 1, ""), ("amp, fp16 + GradScaler", 1, "fp16")]
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        scripts = write_scripts(Path(folder))
        for repeat in range(args.repeats):
            for name, which, precision in variants:
                value = throughput(scripts[which], arguments, precision, args.cpu)
                best[name] = max(best.get(name, 0.0), value)
                print(f"  run {repeat + 1} {name:<24} {value:12.1f} images/s", flush=True)
    baseline = best[variants[0][0]]
    print("\nbest of runs" + (" (CPU: checks the pipeline, the ratios mean nothing)" if args.cpu else ""))
    for name, _, _ in variants:
        print(f"{name:<26} {best[name]:12.1f} images/s   x{best[name] / baseline:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
