"""The `device` codemod end to end: a script written for one CUDA GPU cannot
run on a CPU; migrated, it runs there and computes what the original would
have computed, and a checkpoint saved on a GPU loads. Plus the contract the
`ddp` codemod builds on, the runtime's choice of device, and the guarantees
every codemod gives (torch-free import, triggers, idempotency, check mode).

The fixture pairs in fixtures/device/ are run by test_fixture_pairs.py.
"""

import importlib.util
import io
import math
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from accelmigrate.codemods.device import Device
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, ON_EMULATED_CUDA, SCRIPTS, run_cli, run_python

CUDA_ONLY = SCRIPTS / "cuda_only.py"
PLAN = [("device", {})]

# Runs the migrated script, then the original one with CUDA emulated by the
# CPU (placements become no-ops, "cuda" devices the CPU): an independent
# reference for what the migrated script must compute, which owes nothing to
# the codemod. One interpreter for both saves an import of torch.


def migrate(source: str, path: str = "train.py") -> str:
    return migrate_source(source, PLAN, path).code


def without_docstring(code: str) -> str:
    return code.split('"""', 2)[2]


def losses(stdout: str) -> list[float]:
    return [float(value) for value in re.findall(r"loss: (\S+)", stdout)]


# -- the script written for one GPU ------------------------------------------------------


@pytest.mark.slow
def test_cuda_only_script_fails_on_a_cpu_before_migration():
    result = run_python(CUDA_ONLY)
    assert result.returncode != 0
    assert "final loss" not in result.stdout
    assert "cuda" in result.stderr.lower()  # it dies placing the model on a GPU


@pytest.mark.slow
def test_migrated_script_runs_on_a_cpu_and_computes_what_the_original_would(tmp_path):
    migrated = tmp_path / "cuda_only.py"
    migrated.write_text(CUDA_ONLY.read_text())
    applied = run_cli("apply", str(migrated), "--to", "device", "--runtime")
    assert applied.returncode == 0, applied.stderr + applied.stdout
    assert "cuda" not in without_docstring(migrated.read_text())

    after = run_python(migrated)
    assert after.returncode == 0, after.stderr
    before = run_python(ON_EMULATED_CUDA, str(CUDA_ONLY))
    assert before.returncode == 0, before.stderr
    result, reference = after.stdout, before.stdout

    assert result == reference  # the same losses, to the last printed digit
    per_epoch, final = losses(result)[:-1], losses(result)[-1]
    assert len(per_epoch) >= 2 and all(math.isfinite(value) for value in [*per_epoch, final])
    assert per_epoch[-1] < per_epoch[0] / 4  # it trains
    assert result.splitlines()[-1].startswith("final loss: ")


def test_migrated_script_has_the_form_the_ddp_codemod_builds_on():
    code = migrate(CUDA_ONLY.read_text())
    lines = code.splitlines()
    assert "from accelmigrate.runtime.device import get_device" in lines
    assert lines.count("device = get_device()") == 1  # bound once, at module level
    last_import = max(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    assert lines.index("device = get_device()") > last_import
    assert "Net().to(device)" in code
    assert "cuda" not in without_docstring(code)


@pytest.mark.slow
def test_a_checkpoint_saved_on_a_gpu_loads_on_a_cpu_once_migrated(tmp_path):
    _save_as_if_on_gpu({"weight": [[1.0, 2.0], [3.0, 4.0]], "bias": [0.5, -0.5]}, tmp_path / "gpu.pt")
    script = tmp_path / "resume.py"
    script.write_text(
        "import torch\n"
        "\n"
        "model = torch.nn.Linear(2, 2).cuda()\n"
        'model.load_state_dict(torch.load("gpu.pt"))\n'
        'print("weight sum:", model.weight.sum().item())\n'
    )
    script.write_text(migrate(script.read_text()))
    assert 'torch.load("gpu.pt", map_location=device)' in script.read_text()
    after = run_python(script)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "weight sum: 10.0"


def _save_as_if_on_gpu(state: dict, path: Path) -> None:
    """A checkpoint whose storages say they were saved on cuda:0, made without
    a GPU: torch.save on the CPU, then the location tag in the pickle changed.
    A plain torch.load of it fails on a CPU exactly as a real one does."""
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save({name: torch.tensor(value) for name, value in state.items()}, buffer)
    original = zipfile.ZipFile(buffer)
    with zipfile.ZipFile(path, "w") as relocated:
        for info in original.infolist():
            data = original.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            relocated.writestr(info, data)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path)  # what the script did before migration


# -- the codemod's guarantees -----------------------------------------------------------


def test_importing_the_codemod_does_not_import_torch():
    code = "import sys, accelmigrate.codemods.device; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "source",
    [
        "from torch import load as restore\nstate = restore('ckpt.pt')\n",
        "import torch as t\nm = t.nn.Linear(2, 2).cuda()\n",
        "from torch import cuda\ncuda.set_device(0)\n",
        "import torch\nx = torch.zeros(2, device='cuda')\n",
    ],
)
def test_every_spelling_passes_the_cheap_pre_check(source):
    assert Device.wants(source)
    assert migrate_source(source, PLAN).findings


def test_check_mode_reports_the_same_findings_and_changes_nothing():
    source = CUDA_ONLY.read_text()
    applied = migrate_source(source, PLAN)
    checked = migrate_source(source, PLAN, check_only=True)
    assert checked.code == source
    assert [(f.line, f.column, f.code) for f in checked.findings] == [(f.line, f.column, f.code) for f in applied.findings]


def test_second_run_changes_nothing():
    once = migrate(CUDA_ONLY.read_text())
    twice = migrate_source(once, PLAN)
    assert twice.code == once
    assert not twice.findings


def test_code_outside_the_rewritten_nodes_is_kept_byte_for_byte():
    source = "import torch\n\nx  =  torch.ones( 3 ).cuda()   # keep me\ny = [1,2 ,3]\n"
    assert migrate(source) == (
        "import torch\nfrom accelmigrate.runtime.device import get_device\n\ndevice = get_device()\n"
        "\nx  =  torch.ones( 3 ).to(device)   # keep me\ny = [1,2 ,3]\n"
    )


def test_every_fixture_case_names_its_codes():
    codes = set(Device.codes)
    for findings in (FIXTURES / "device").glob("*.findings"):
        for line in findings.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                assert line.split()[1] in codes, f"{findings.name}: {line}"


# -- the runtime ------------------------------------------------------------------------


def test_get_device_is_the_cpu_without_a_gpu_and_can_be_forced(monkeypatch):
    torch = pytest.importorskip("torch")
    from accelmigrate.runtime.device import get_device

    monkeypatch.delenv("ACCELMIGRATE_DEVICE", raising=False)
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert get_device() == torch.device("cpu")
    monkeypatch.setenv("ACCELMIGRATE_DEVICE", "meta")
    assert get_device() == torch.device("meta")


def test_default_backend_is_nccl_only_where_the_device_is_a_gpu_and_selects_nothing(monkeypatch):
    torch = pytest.importorskip("torch")
    from accelmigrate.runtime.backend import default_backend

    def no_selection(*args):
        raise AssertionError("choosing a backend must leave the current GPU as the script set it")

    monkeypatch.setattr(torch.cuda, "set_device", no_selection)
    monkeypatch.delenv("ACCELMIGRATE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert default_backend() == "nccl"
    monkeypatch.setenv("ACCELMIGRATE_DEVICE", "cpu")
    assert default_backend() == "gloo"


def test_tensor_type_is_the_legacy_type_on_the_cpu_and_builds_on_any_other_device():
    torch = pytest.importorskip("torch")
    from accelmigrate.runtime.legacy import tensor_type

    assert tensor_type(torch.float32, "cpu") is torch.FloatTensor
    assert tensor_type(torch.int64, torch.device("cpu")) is torch.LongTensor
    on_meta = tensor_type(torch.int64, "meta")([1, 2, 3])
    assert (on_meta.device.type, on_meta.dtype, tuple(on_meta.shape)) == ("meta", torch.int64, (3,))


# -- a GPU index known only at run time ---------------------------------------------------

SPAWNED = '''import torch
import torch.multiprocessing as mp


def run(rank, world_size):
    {line}


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
'''


BOUND = "    device = device_at(rank)\n"


@pytest.mark.parametrize(
    "line, migrated",
    [
        ("model = torch.nn.Linear(2, 2).cuda(rank)", BOUND + "    model = torch.nn.Linear(2, 2).to(device)"),
        ("x = torch.zeros(2).to(f'cuda:{rank}')", BOUND + "    x = torch.zeros(2).to(device)"),
        ("x = torch.zeros(2).to('cuda:%d' % rank)", BOUND + "    x = torch.zeros(2).to(device)"),
        ("x = torch.zeros(2, device=torch.device('cuda', rank))", BOUND + "    x = torch.zeros(2, device=device)"),
        ("device = torch.device('cuda', rank)", "    device = device_at(rank)"),  # the script's own binding
        (  # a loop's index is not the function's: each placement names its own
            "models = [torch.nn.Linear(2, 2).cuda(i) for i in range(world_size)]",
            "    models = [torch.nn.Linear(2, 2).to(device_at(i)) for i in range(world_size)]",
        ),
    ],
)
def test_a_computed_gpu_index_keeps_its_gpu_per_process_and_runs_without_cuda(line, migrated):
    source = SPAWNED.format(line=line)
    result = migrate_source(source, PLAN)
    assert f"def run(rank, world_size):\n{migrated}\n" in result.code  # never collapsed onto one device
    assert "from accelmigrate.runtime.device import device_at\n" in result.code
    assert "get_device" not in result.code  # no module-level choice that a spawned worker would repeat
    assert [(f.code, f.fixed) for f in result.findings] == [("AM313", True)]


def test_device_at_is_the_named_gpu_with_cuda_and_the_runtime_device_without(monkeypatch):
    import torch

    from accelmigrate.runtime.device import device_at

    monkeypatch.delenv("ACCELMIGRATE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_at(1) == device_at() == torch.device("cpu") or device_at(1).type == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_at(1) == torch.device("cuda", 1)  # what `.cuda(1)` means
    assert device_at() == torch.device("cuda")  # the current GPU, as `.cuda()` means
    monkeypatch.setenv("ACCELMIGRATE_DEVICE", "cpu")
    assert device_at(1) == torch.device("cpu")


def test_a_passed_in_device_that_may_be_none_is_not_moved_with_to():
    # `.to(None)` moves nothing: the helper would silently stop moving data.
    source = SPAWNED.format(line="return [t.cuda(device) for t in batch]").replace("run(rank, world_size)", "to_gpu(batch, device=None)")
    result = migrate_source(source, PLAN)
    assert result.code == source
    assert [f.code for f in result.findings] == ["AM313"]
    assert "may be None" in result.findings[0].message


def test_after_set_device_with_a_rank_plain_cuda_means_that_gpu():
    source = SPAWNED.format(line="torch.cuda.set_device(rank)\n    model = torch.nn.Linear(2, 2).cuda()\n    x = torch.zeros(2, device='cuda')")
    result = migrate_source(source, PLAN)
    assert (  # device_at() is torch.device("cuda") with CUDA: the current GPU when it is used
        "    device = device_at()\n    if torch.cuda.is_available():\n        torch.cuda.set_device(rank)\n"
        "    model = torch.nn.Linear(2, 2).to(device)\n    x = torch.zeros(2, device=device)\n"
    ) in result.code
    assert [(f.code, f.fixed) for f in result.findings] == [("AM307", True), ("AM301", True), ("AM302", True)]


@pytest.mark.parametrize(
    "index",
    ['local_rank', 'int(os.environ["LOCAL_RANK"])', 'int(os.environ.get("LOCAL_RANK", 0))', 'int(os.getenv("LOCAL_RANK", "0"))', 'args.local_rank'],
)
def test_the_launchers_local_rank_is_the_run_time_device(index):
    source = (
        "import argparse\nimport os\n\nimport torch\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--local_rank', type=int, default=0)\nargs = parser.parse_args()\n"
        "local_rank = int(os.environ['LOCAL_RANK'])\n\n\n"
        f"def main():\n    model = torch.nn.Linear(2, 2).cuda({index})\n    x = torch.zeros(2).to(f'cuda:{{{index}}}')\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    code = migrate(source)
    assert "model = torch.nn.Linear(2, 2).to(device)" in code  # get_device() is cuda:<LOCAL_RANK>
    assert "x = torch.zeros(2).to(device)" in code


# -- library modules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "def to_gpu(*tensors):\n    return [t.cuda() for t in tensors]\n",
        "def mask(n):\n    return torch.ones(n, n, device='cuda').tril()\n",
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.register_buffer('scale', torch.ones(4).cuda())\n",
        "DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "def load(path):\n    return torch.load(path)\n",
    ],
)
def test_a_library_module_is_not_given_a_device_chosen_at_import(body):
    source = "import torch\n\n\n" + body
    result = migrate_source(source, PLAN)
    assert result.code == source  # no `device = get_device()`: it would set the GPU when imported
    assert result.findings and not any(f.fixed for f in result.findings)


def test_the_same_placements_in_a_script_are_migrated():
    source = "import torch\n\n\ndef to_gpu(*tensors):\n    return [t.cuda() for t in tensors]\n\n\nif __name__ == '__main__':\n    to_gpu(torch.ones(2))\n"
    code = migrate(source)
    assert "device = get_device()" in code and "t.to(device)" in code


def test_parameter_defaults_are_never_rewritten_to_the_run_time_device():
    source = "import torch\n\n\ndef buffer(n, device='cuda'):\n    return torch.zeros(n, device=device)\n\n\nif __name__ == '__main__':\n    buffer(2)\n"
    result = migrate_source(source, PLAN)
    assert result.code == source  # a default is evaluated at import
    assert [(f.code, f.fixed) for f in result.findings] == [("AM302", False)]


def test_calls_that_a_test_expects_to_raise_are_left_alone():
    source = (
        "import unittest\n\nimport torch\n\n\nclass T(unittest.TestCase):\n    def test_refused(self):\n"
        "        with self.assertRaises(RuntimeError):\n            torch.nn.Linear(2, 2).cuda()\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    )
    result = migrate_source(source, PLAN)
    assert result.code == source
    assert not result.findings


# A library that also runs something under `if __name__ == "__main__":` is
# imported far more often than it is run: the guard's own code may choose the
# device, inside the guard; the library's functions follow their callers.
LIBRARY_WITH_BENCHMARK = FIXTURES / "device" / "library_self_test.py"


@pytest.mark.slow
def test_importing_a_migrated_library_whose_main_guard_benchmarks_it_chooses_no_device(tmp_path):
    library = tmp_path / "softmax_kernels.py"
    library.write_text(migrate(LIBRARY_WITH_BENCHMARK.read_text()))
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "import softmax_kernels\n"
        "print(hasattr(softmax_kernels, 'device'), 'accelmigrate.runtime.device' in sys.modules)\n"
        "print(softmax_kernels.stable_softmax(softmax_kernels.torch.ones(2, 3)).sum().item())\n"
    )
    result = run_python(probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "2.0"]  # no device bound, the runtime not even imported


TEST_SUITE = (
    "import unittest\n\nimport torch\n\n\nclass TestDoubling(unittest.TestCase):\n"
    "    def test_double(self):\n        x = torch.ones(2).cuda()\n        self.assertEqual((x + x).sum().item(), 4.0)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)


def test_a_main_guard_that_runs_no_function_with_placements_adds_no_module_level_device():
    result = migrate_source(TEST_SUITE, PLAN)
    assert result.code == TEST_SUITE  # the test methods run under unittest's discovery, not from the guard
    assert [(f.line, f.code, f.fixed) for f in result.findings] == [(8, "AM311", False)]


def test_a_model_module_whose_main_guard_smoke_tests_it_binds_the_device_inside_the_guard():
    source = (
        "import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n        return self.fc(x)\n\n\n"
        "if __name__ == '__main__':\n    net = Net().cuda()\n    print(net(torch.randn(3, 4).cuda()).shape)\n"
    )
    assert migrate(source) == source.replace(
        "if __name__ == '__main__':\n",
        "if __name__ == '__main__':\n    from accelmigrate.runtime.device import get_device\n\n    device = get_device()\n",
    ).replace(".cuda()", ".to(device)")  # importing the module imports and chooses nothing


@pytest.mark.parametrize("guard", ["main()", "torch.multiprocessing.spawn(main, nprocs=1)", "threading.Thread(target=main).start()"])
def test_functions_that_the_main_guard_calls_or_passes_on_place_on_the_scripts_device(guard):
    source = (
        "import threading\n\nimport torch\n\n\ndef main(*_):\n    print(torch.ones(2).cuda().sum())\n\n\n"
        f"if __name__ == '__main__':\n    {guard}\n"
    )
    code = migrate(source)
    assert "\ndevice = get_device()\n" in code and "torch.ones(2).to(device)" in code


# Files of the installed torch that the codemod used to change although they hold
# no training loop: `Module.cuda(device=None)` became a no-op `.to(device)`, a
# test's `remote_module.cuda()` inside assertRaises got a device bound at import,
# and library functions' `torch.device("cuda")` became get_device().
TORCH_LIBRARY_FILES = [
    "nn/modules/module.py",
    "testing/_internal/distributed/nn/api/remote_module_test.py",
    "_inductor/comm_analysis.py",
    "distributed/_dist2.py",
    "_vendor/quack/gemm_blockscaled_interface.py",
]


@pytest.mark.parametrize("relative", TORCH_LIBRARY_FILES)
def test_torchs_own_library_modules_are_left_unchanged(relative):
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed")
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.exists():
        pytest.skip(f"this torch has no {relative}")
    source = path.read_text(encoding="utf-8")
    result = migrate_source(source, PLAN, str(path))
    assert result.code == source
    assert not any(f.fixed for f in result.findings)
