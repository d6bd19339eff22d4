"""What only a GPU shows: bundled scripts, migrated, run on CUDA.

Each bundled training script is run as written (float32) and after migration
(`device,amp` in one process; `device,amp,ddp` under `accelmigrate run
--nproc-per-node 1`, which takes the NCCL backend on a GPU), all on the GPU,
and its `final loss` lines are printed side by side with the relative
difference. The migrated runs use the runtime's default precision there
(bf16 on GPUs that compute it) and forced fp16 (GradScaler enabled).

Needs CUDA; without it, it says so and exits 0.

    python benchmarks/gpu_smoke.py            # about a minute on one GPU
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from accelmigrate.engine.migrate import migrate_source

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
CASES = ["cuda_only.py", "mlp_classifier.py", "amp_old_api.py", "fp16_clip.py", "char_lstm.py"]
FINAL = re.compile(r"final loss:?\s*([-+0-9.eE]+)")


def migrated_copy(script: Path, words: str, folder: Path) -> Path:
    plan = [(word, {}) for word in words.split(",")]
    source = script.read_text(encoding="utf-8")
    copy = folder / f"{script.stem}__{words.replace(',', '_')}.py"
    copy.write_text(migrate_source(source, plan, str(script)).code, encoding="utf-8")
    return copy


def final_loss(command: list[str], precision: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if precision:
        env["ACCELMIGRATE_PRECISION"] = precision
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    match = FINAL.search(done.stdout)
    if done.returncode != 0 or match is None:
        return "FAILED: " + (done.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
    return match.group(1)


def relative(value: str, reference: str) -> str:
    try:
        return f"{abs(float(value) - float(reference)) / max(abs(float(reference)), 1e-12):.2%}"
    except ValueError:
        return "-"


def main() -> int:
    import torch  # the tool never imports torch; a benchmark may

    if not torch.cuda.is_available():
        print("CUDA is not available: this check runs migrated scripts on a GPU.")
        return 0
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    failures = 0
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for case in CASES:
            script = SCRIPTS / case
            original = final_loss([sys.executable, str(script)], "", SCRIPTS)
            print(f"\n{case}: original fp32 final loss {original}")
            amp = migrated_copy(script, "device,amp", folder)
            ddp = migrated_copy(script, "device,amp,ddp", folder)
            runs = [
                ("device,amp (runtime dtype)", [sys.executable, str(amp)], ""),
                ("device,amp (fp16 + scaler)", [sys.executable, str(amp)], "fp16"),
                ("device,amp,ddp under run -n 1", [sys.executable, "-m", "accelmigrate", "run", str(ddp), "--nproc-per-node", "1"], ""),
            ]
            for label, command, precision in runs:
                value = final_loss(command, precision, SCRIPTS)
                failures += value.startswith("FAILED")
                print(f"  {label:<32} {value:<14} {relative(value, original)} from fp32")
    print(f"\n{failures} failed run(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
