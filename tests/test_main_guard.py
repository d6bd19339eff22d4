"""main-guard: flat scripts get `if __name__ == "__main__":` around the code they run.

- what stays at module level (imports, definitions, cheap constants, process
  set-up) and what moves, by meaning;
- the order of execution is kept: a definition moves above running code only
  when the two are independent;
- refusals (AM121, AM122, AM123) leave the file unchanged;
- migrated flat scripts print exactly what the originals print, import
  without running anything, and run their DataLoader in spawned worker
  processes (with `workers`) or their mp.spawn children.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelmigrate.codemods import ORDER, all_codemods, find
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, SCRIPTS, run_python

GUARD = 'if __name__ == "__main__":'


def migrate(source: str, words=("main-guard",), check_only=False):
    plan = [(word, {}) for word in words]
    return migrate_source(textwrap.dedent(source), plan, "train.py", check_only=check_only)


def codes(migration):
    return [(f.code, f.fixed) for f in migration.findings]


def module_level(code: str) -> list[str]:
    """The first line of every module-level statement (not blank, not a comment)."""
    return [line for line in code.splitlines() if line and not line[0].isspace() and not line.startswith(("#", ")"))]


def guarded(code: str) -> str:
    """The text under the (last) main guard."""
    return code.rsplit(GUARD, 1)[1]


# -- registration -------------------------------------------------------------------------


def test_registered_between_modernize_and_workers():
    registry = all_codemods()
    assert "main-guard" in registry
    assert ORDER.index("main-guard") == ORDER.index("workers") - 1
    assert find("AM120") is registry["main-guard"]
    assert set(registry["main-guard"].codes) == {"AM120", "AM121", "AM122", "AM123"}


# -- what stays, what moves -----------------------------------------------------------------

FLAT = """
    import argparse
    import os
    from pathlib import Path

    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader

    ROOT = Path(__file__).resolve().parent
    DATA = os.path.join(ROOT, "data")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    augment = T.Compose([T.RandomCrop(28, padding=2), T.ToTensor()])
    SIZES = {"small": 32, "large": 128}
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    lr = args.lr * 2
    log = open("train.log", "w")
    torch.multiprocessing.set_start_method("spawn")
    model = torch.nn.Linear(2, 1).to(device)
    for x in DataLoader(torch.randn(8, 2), batch_size=4):
        model(x).sum().backward()
"""


def test_constants_stay_and_the_run_moves():
    code = migrate(FLAT).code
    stays = ["ROOT = ", "DATA = ", "device = ", "augment = ", "SIZES = "]
    moves = ["parser = ", "parser.add_argument", "args = ", "lr = ", "log = ", "torch.multiprocessing.set_start_method", "model = ", "for x in"]
    top = module_level(code)
    assert all(any(line.startswith(s) for line in top) for s in stays), code
    assert not any(line.startswith(tuple(moves)) for line in top), code
    assert all(f"    {m}" in guarded(code) for m in moves)


def test_a_value_computed_from_moved_code_moves_too():
    code = migrate("""
        import torch
        args = torch.load("config.pt")
        steps = args["steps"] * 2
        HALF = 0.5
        scaled = steps * HALF
        for _ in range(scaled):
            next(iter(torch.utils.data.DataLoader([1.0])))
    """).code
    assert module_level(code) == ["import torch", "HALF = 0.5", GUARD]


def test_process_set_up_stays_where_it_is():
    """sys.path and os.environ changes, warning filters, matplotlib.use: later
    imports (and spawned workers, which import the file) depend on them."""
    code = migrate("""
        import os
        import sys
        import warnings
        sys.path.insert(0, os.path.dirname(__file__))
        os.environ["OMP_NUM_THREADS"] = "1"
        warnings.filterwarnings("ignore")
        import matplotlib
        matplotlib.use("Agg")
        import torch
        from helpers import make_loader
        for batch in make_loader():
            next(iter(torch.utils.data.DataLoader([1.0])))
    """).code
    assert module_level(code)[:10] == [
        "import os", "import sys", "import warnings", "sys.path.insert(0, os.path.dirname(__file__))",
        'os.environ["OMP_NUM_THREADS"] = "1"', 'warnings.filterwarnings("ignore")', "import matplotlib",
        'matplotlib.use("Agg")', "import torch", "from helpers import make_loader",
    ]
    assert module_level(code)[10:] == [GUARD]


def test_an_import_does_not_move_above_code_that_changes_sys_path():
    code = migrate("""
        import json
        import sys
        import torch
        config = json.load(open("config.json"))
        sys.path.append(config["plugins"])
        from plugins import extra
        for _ in range(2):
            next(iter(torch.utils.data.DataLoader([1.0])))
    """).code
    assert module_level(code) == ["import json", "import sys", "import torch", GUARD, "from plugins import extra", GUARD]


def test_set_up_from_the_command_line_stays():
    """Spawned processes get the parent's sys.argv: set-up computed from it
    stays at module level, and the imports after it stay after it."""
    code = migrate("""
        import sys
        import torch
        sys.path.append(sys.argv[1])
        print("loading")
        from plugins import extra
        next(iter(torch.utils.data.DataLoader([1.0])))
    """).code
    assert module_level(code) == ["import sys", "import torch", "sys.path.append(sys.argv[1])", "from plugins import extra", GUARD]


def test_a_redefined_function_keeps_the_calls_before_it():
    code = migrate("""
        import torch

        def evaluate():
            return 1

        loader = torch.utils.data.DataLoader([1.0])
        print(evaluate())
        print(len(loader))

        def evaluate():
            return 2

        print(evaluate())
    """).code
    assert module_level(code) == ["import torch", "def evaluate():", GUARD, "def evaluate():", GUARD]


def test_a_rebound_constant_stays_after_the_calls_that_read_it():
    """`report()` reads SCALE when it runs: the second SCALE must come after it."""
    code = migrate("""
        import torch
        SCALE = 1
        def report():
            print(SCALE)
        report()
        SCALE = 2
        next(iter(torch.utils.data.DataLoader([1.0])))
    """).code
    assert module_level(code) == ["import torch", "SCALE = 1", "def report():", GUARD, "SCALE = 2", GUARD]


def test_module_globals_stay_module_globals():
    """Functions keep reading what the guarded code binds: it is not moved into a function."""
    code = migrate("""
        import torch
        model = torch.nn.Linear(1, 1)
        def step():
            for x in torch.utils.data.DataLoader([torch.ones(1)]):
                model(x).sum().backward()
        step()
    """).code
    assert "def main" not in code and "global" not in code
    assert "    model = torch.nn.Linear(1, 1)" in code


# -- layout --------------------------------------------------------------------------------------


def test_moved_lines_are_only_reindented():
    source = textwrap.dedent('''
        import torch

        # the model
        model = torch.nn.Linear(  # 2 inputs
            2,
            1,
        )
        print("""
        kept as written
        """)
        for x in torch.utils.data.DataLoader([torch.ones(2)]): model(x).sum().backward()  # one step
    ''')
    code = migrate(source).code
    assert code.endswith(textwrap.dedent('''
        if __name__ == "__main__":
            # the model
            model = torch.nn.Linear(  # 2 inputs
                2,
                1,
            )
            print("""
        kept as written
        """)
            for x in torch.utils.data.DataLoader([torch.ones(2)]): model(x).sum().backward()  # one step
    '''))


def test_crlf_line_endings_are_kept():
    source = "import torch\r\nloader = torch.utils.data.DataLoader([1.0])\r\nprint(len(loader))\r\n"
    code = migrate_source(source, [("main-guard", {})], "train.py").code
    assert code == 'import torch\r\n\r\nif __name__ == "__main__":\r\n    loader = torch.utils.data.DataLoader([1.0])\r\n    print(len(loader))\r\n'


def test_no_blank_line_inside_the_guard_carries_indentation():
    code = migrate(FLAT).code
    assert not [line for line in code.splitlines() if line.strip() == "" and line]


# -- when it acts -------------------------------------------------------------------------------


@pytest.mark.parametrize("use", ["for x in loader:\n    pass", "batch = next(iter(loader))", "print(len(loader))"])
def test_a_loader_used_at_import_needs_the_guard(use):
    source = "from torch.utils.data import DataLoader\nloader = DataLoader([1, 2, 3])\n" + use + "\n"
    assert codes(migrate(source)) == [("AM120", True)]


def test_a_module_that_only_builds_loaders_is_a_library():
    source = "from torch.utils.data import DataLoader\ntrain_loader = DataLoader([1, 2, 3])\n"
    migration = migrate(source)
    assert migration.code == source and migration.findings == []


def test_a_script_that_trains_with_no_loader_and_starts_no_process_needs_no_guard():
    """No process it starts imports it again: a guard would only move its code (issue 29, item 16)."""
    source = textwrap.dedent("""
        import torch
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
    """)
    migration = migrate(source)
    assert migration.code == source and migration.findings == []


def test_a_function_called_at_import_that_goes_through_a_loader_needs_the_guard():
    migration = migrate("""
        import torch
        def fit():
            next(iter(torch.utils.data.DataLoader([1.0])))
        fit()
    """)
    assert codes(migration) == [("AM120", True)]


def test_check_mode_reports_without_rewriting():
    migration = migrate(FLAT, check_only=True)
    assert migration.code == textwrap.dedent(FLAT)
    assert codes(migration) == [("AM120", True)]


def test_a_skip_comment_keeps_the_file():
    source = """
        import torch
        loader = torch.utils.data.DataLoader([1.0])  # accelmigrate: skip[AM120]
        print(len(loader))
    """
    migration = migrate(source)
    assert migration.code == textwrap.dedent(source) and migration.findings == []


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "definition",
    [
        "def train(steps=args.steps):\n    pass",
        "@torch.jit.script_if_tracing if args.trace else torch.no_grad()\ndef infer():\n    pass",
        "class Net(torch.nn.Module):\n    width = args.width",
        "class Net(bases[args.kind]):\n    pass",
        "def train(config: args.Config):\n    pass",
    ],
)
def test_a_definition_reading_moved_names_at_import_is_refused(definition):
    source = "import torch\nargs = torch.load('args.pt')\nbases = {}\n" + definition + "\nnext(iter(torch.utils.data.DataLoader([1.0])))\n"
    migration = migrate_source(source, [("main-guard", {})], "train.py")
    assert migration.code == source
    assert codes(migration) == [("AM121", False)]
    assert "`args`" in migration.findings[0].message and "migrate again" in migration.findings[0].message


def test_postponed_annotations_are_not_read_at_import():
    source = (
        "from __future__ import annotations\nimport torch\nargs = torch.load('args.pt')\n"
        "def train(config: args.Config) -> args.Result:\n    pass\nnext(iter(torch.utils.data.DataLoader([1.0])))\n"
    )
    assert codes(migrate_source(source, [("main-guard", {})], "train.py")) == [("AM120", True)]


def test_a_function_a_transform_runs_in_the_workers_is_checked():
    source = """
        import torch
        import torchvision.transforms as T
        from torch.utils.data import DataLoader
        from torchvision.datasets import MNIST
        mean = torch.load("mean.pt")
        def center(image):
            return image - mean
        data = MNIST("data", transform=T.Compose([T.ToTensor(), T.Lambda(center)]))
        for x, y in DataLoader(data):
            x.sum().backward()
    """
    migration = migrate(source)
    assert migration.code == textwrap.dedent(source)
    assert codes(migration) == [("AM122", False)]
    assert "`center`" in migration.findings[0].message and "`mean`" in migration.findings[0].message


def test_a_dataset_defined_inside_moved_code_is_refused():
    source = """
        import sys
        from torch.utils.data import DataLoader, Dataset
        if len(sys.argv) > 1:
            print("custom data")
            class Items(Dataset):
                def __len__(self):
                    return 2
                def __getitem__(self, i):
                    return i
        for batch in DataLoader(Items()):
            pass
    """
    migration = migrate(source)
    assert codes(migration) == [("AM122", False)]
    assert "defined inside code that runs the script" in migration.findings[0].message


def test_functions_only_the_main_process_runs_may_read_moved_names():
    migration = migrate("""
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Items(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.tensor([float(i)])
        model = torch.nn.Linear(1, 1)
        def train(loader):
            for x in loader:
                model(x).sum().backward()
        train(DataLoader(Items()))
    """)
    assert codes(migration) == [("AM120", True)]


# -- migrated scripts, run ----------------------------------------------------------------------


FLAT_TUTORIAL = SCRIPTS / "flat_tutorial.py"


def migrate_file(script: Path, folder: Path, words: str) -> Path:
    plan = [(w.partition("=")[0], {"value": w.partition("=")[2]} if "=" in w else {}) for w in words.split(",")]
    migration = migrate_source(script.read_text(encoding="utf-8"), plan, str(script))
    assert any(f.fixed and f.code == "AM120" for f in migration.findings), migration.findings
    folder.mkdir(exist_ok=True)
    target = folder / script.name
    target.write_text(migration.code, encoding="utf-8")
    return target


def import_in(folder: Path, module: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(folder)}
    return subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=folder, env=env, timeout=300
    )


@pytest.mark.slow
def test_a_migrated_flat_tutorial_prints_the_same_and_imports_quietly(tmp_path):
    """With `workers`, the loader runs in spawned worker processes (the script
    sets the spawn start method), which import the file: only the guard keeps
    them from training. One worker keeps the test short."""
    original_folder = tmp_path / "original"
    original_folder.mkdir()
    original = original_folder / FLAT_TUTORIAL.name
    # Each item also opens a file, as a reader would: workers pay for such a
    # dataset (its points alone are computed in memory, and get none).
    original.write_text(FLAT_TUTORIAL.read_text().replace(
        "        label = i % 2\n", "        label = i % 2\n        open(__file__).close()\n",
    ))
    migrated = migrate_file(original, tmp_path / "migrated", "main-guard,workers=1")
    assert "num_workers=default_num_workers(max_workers=1)" in migrated.read_text()

    before, after = run_python(original), run_python(migrated)
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert "epoch 1: loss" in before.stdout
    assert after.stdout == before.stdout

    assert "epoch 0: loss" in import_in(original_folder, "flat_tutorial").stdout  # the original trains on import
    quiet = import_in(migrated.parent, "flat_tutorial")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_migrated_mp_spawn_script_runs_its_processes(tmp_path):
    """mp.spawn at module level: each child imports the file; with the guard
    the two gloo ranks run once each and all-reduce."""
    migrated = migrate_file(FIXTURES / "main-guard" / "spawn_flat.py", tmp_path, "main-guard")
    done = run_python(migrated, env={"MASTER_PORT": str(free_port())})
    assert done.returncode == 0, done.stderr
    # Two processes print to one pipe: a line's text and its newline are two
    # writes, so one rank's line may run into the other's.
    assert sorted(re.findall(r"rank (\d): sum ([0-9]+\.[0-9]+)", done.stdout)) == [("0", "1.0"), ("1", "1.0")]
