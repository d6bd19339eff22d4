"""String devices compared or printed (`device = "cuda" if ... else "cpu"`,
`"cuda" in device`, `device == "cuda"`): the definition becomes the runtime's
torch.device, the comparisons read `device.type`, and the migrated script
prints what the original printed on a CPU.

The fixture pairs (fixtures/device/string_*) are run by test_fixture_pairs.py.
"""

import shutil

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, run_cli, run_python

PLAN = [("device", {})]


def migrate(source: str) -> str:
    return migrate_source(source, PLAN, "train.py").code


@pytest.mark.parametrize("compared", ['device == "cuda"', 'device != "cpu"', '"cuda" in device', '"cpu" not in device'])
def test_a_comparison_with_a_type_name_reads_the_devices_type(compared):
    source = f'import torch\ndevice = "cuda" if torch.cuda.is_available() else "cpu"\nflag = {compared}\nx = torch.ones(1).to(device)\n'
    migrated = migrate(source)
    assert "device = get_device()" in migrated
    assert f"flag = {compared.replace('device', 'device.type')}" in migrated


@pytest.mark.parametrize(
    "compared",
    [
        'device == "cuda:0"',  # a torch.device's type never holds an index
        'device == other',  # not a type name
        '"cpu" < device',  # an ordering, not a comparison of names
        'device.startswith("cuda")',  # a string method
    ],
)
def test_other_reads_of_a_string_device_keep_the_manual_step(compared):
    source = f'import torch\nother = "cpu"\ndevice = "cuda" if torch.cuda.is_available() else "cpu"\nflag = {compared}\nx = torch.ones(1).to(device)\n'
    result = migrate_source(source, PLAN, "train.py")
    assert result.code == source
    assert [f.code for f in result.findings if not f.fixed] == ["AM303"]


def test_a_string_bound_twice_keeps_its_comparisons_and_the_manual_step():
    source = (
        'import torch\ndevice = "cuda"\nif torch.cuda.device_count() == 0:\n    device = "cpu"\n'
        'flag = device == "cuda"\nx = torch.ones(1).to(device)\n'
    )
    assert 'flag = device == "cuda"' in migrate(source)


def test_a_type_name_given_to_autocast_is_not_a_device():
    source = (
        'import torch\ndevice_type = "cuda" if torch.cuda.is_available() else "cpu"\n'
        'ctx = torch.amp.autocast(device_type=device_type) if device_type != "cpu" else None\n'
    )
    result = migrate_source(source, PLAN, "train.py")
    assert result.code == source and not result.findings


def test_a_type_name_passed_on_where_its_reads_cannot_be_seen_is_not_a_device():
    source = (
        'import torch\ndevice = "cuda"\ndevice_type = "cuda" if "cuda" in device else "cpu"\n'
        "opt = make_optimizer(device_type)\nx = torch.ones(1).to(device)\n"
    )
    result = migrate_source(source, PLAN, "train.py")
    assert 'device_type = "cuda" if "cuda" in device.type else "cpu"' in result.code
    assert all(f.fixed for f in result.findings)


@pytest.mark.slow
def test_a_configured_cuda_string_runs_on_a_cpu_as_the_original_would_with_cpu(tmp_path):
    original = FIXTURES / "device" / "string_device_type_passed_on.py"
    migrated = tmp_path / original.name
    shutil.copy(original, migrated)
    applied = run_cli("apply", str(migrated), "--to", "device")
    assert applied.returncode == 0, applied.stderr + applied.stdout
    # The reference: the original as its author would configure it for a CPU.
    reference = tmp_path / "configured_for_cpu.py"
    reference.write_text(original.read_text().replace('device = "cuda"\n', 'device = "cpu"\n', 1))

    before, after = run_python(reference), run_python(migrated)
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and "iter 2 on cpu" in after.stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", ["string_device_type_idiom", "string_device_compared"])
def test_migrated_string_device_script_prints_what_the_original_prints_on_a_cpu(tmp_path, case):
    original = FIXTURES / "device" / f"{case}.py"
    migrated = tmp_path / f"{case}.py"
    shutil.copy(original, migrated)
    applied = run_cli("apply", str(migrated), "--to", "device")
    assert applied.returncode == 0, applied.stderr + applied.stdout
    assert migrated.read_text() != original.read_text()

    before, after = run_python(original, cwd=tmp_path), run_python(migrated)
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout  # the same numbers, and "cpu" printed as before
