"""device on two shapes of the reach scripts (issue 20).

`self.device = "cuda" if ... else "cpu"`, bound once in its class and read
only there, becomes get_device(), its comparisons `self.device.type == ...`;
the migrated trainer prints what the original printed on a CPU. Read on an
instance outside the class (`trainer.device == "cuda"`), it is left alone.

`.cuda(args.gpu)` in flat code under the main guard: `device =
device_at(args.gpu)` is bound once inside the guard, and the migrated script
runs on a CPU (the original fails there at the first `.cuda()`)."""

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, run_python

COMPARED = FIXTURES / "device" / "self_device_string_compared.py"
READ_OUTSIDE = FIXTURES / "device" / "self_device_read_on_instance.py"
UNDER_GUARD = FIXTURES / "device" / "gpu_flag_under_main_guard.py"


def migrated(case):
    return migrate_source(case.read_text(encoding="utf-8"), [("device", {})], str(case))


def test_the_comparisons_read_the_type():
    code = migrated(COMPARED).code
    assert "self.device = get_device()" in code
    assert 'if self.device.type == "cuda":' in code and '"cuda" in self.device.type' in code


def test_a_read_on_an_instance_keeps_the_string():
    migration = migrated(READ_OUTSIDE)
    assert migration.code == READ_OUTSIDE.read_text(encoding="utf-8")
    assert [(f.code, f.fixed) for f in migration.findings] == [("AM303", False)]


@pytest.mark.slow
def test_the_migrated_trainer_prints_what_the_original_printed(tmp_path):
    original = run_python(COMPARED, cwd=tmp_path)
    script = tmp_path / COMPARED.name
    script.write_text(migrated(COMPARED).code, encoding="utf-8")
    after = run_python(script, cwd=tmp_path)
    assert original.returncode == 0 and after.returncode == 0, after.stderr[-2000:]
    assert after.stdout == original.stdout


@pytest.mark.slow
def test_the_gpu_flag_under_the_main_guard_runs_on_a_cpu(tmp_path):
    script = tmp_path / UNDER_GUARD.name
    script.write_text(migrated(UNDER_GUARD).code, encoding="utf-8")
    assert "    device = device_at(args.gpu)\n" in script.read_text(encoding="utf-8")
    after = run_python(script, "--gpu", "1", cwd=tmp_path)
    assert after.returncode == 0, after.stderr[-2000:]
    assert "final loss:" in after.stdout
