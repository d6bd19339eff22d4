"""Running scripts: `run` through torchrun or SLURM (`runner.py`, `slurm.py`, `process_group.py`), `profile`
(`profiler.py`), and `verify`, the original and the migrated script trained side by side (`verify.py`,
`verify_runs.py`). The only part of the tool that imports torch (`torch_check.py`)."""
