"""The `workers` codemod beyond its fixture pairs, and its runtime helper.

- `default_num_workers()`: cores of this process / processes of the launch on
  this machine, at least 1, capped;
- the codemod's options, its check mode and its findings' messages;
- migrated scripts run on the CPU with real worker processes, also when the
  workers are spawned (as on macOS and Windows); a seeded script prints the
  same numbers, unless the `persistent` option was chosen (its documented cost).
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper

from accelmigrate.codemods import UnknownCodemod, find
from accelmigrate.codemods.workers import Workers
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime import data

from conftest import SCRIPTS, run_cli, run_python

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
SLURM_ENV = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def migrate(source: str, **options):
    return migrate_source(textwrap.dedent(source), [("workers", options)], "train.py")


def workers_alone(source: str) -> list:
    """The findings of the workers codemod run without the main guard it
    requires: what it reports of a flat script on its own (AM104)."""
    wrapper = MetadataWrapper(cst.parse_module(textwrap.dedent(source)), unsafe_skip_copy=True)
    codemod = Workers(CodemodContext(filename="train.py", wrapper=wrapper))
    wrapper.visit(codemod)
    return codemod.findings


def codes(migration):
    return [(f.code, f.fixed) for f in migration.findings]


# -- the runtime helper ----------------------------------------------------------


@pytest.fixture
def single_process(monkeypatch):
    for name in (*TORCHRUN_ENV, *SLURM_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def cores(single_process):
    def set_cores(count: int) -> None:
        single_process.setattr(os, "sched_getaffinity", lambda pid: set(range(count)), raising=False)

    return set_cores


def launched_by_torchrun(monkeypatch, local_world_size: int) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(local_world_size))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))


def test_one_process_gets_its_cores(cores):
    cores(6)
    assert data.default_num_workers() == 6


def test_processes_of_a_launch_share_the_cores(cores, single_process):
    cores(16)
    launched_by_torchrun(single_process, 4)
    assert data.default_num_workers() == 4


def test_at_least_one_worker(cores, single_process):
    cores(2)
    launched_by_torchrun(single_process, 8)
    assert data.default_num_workers() == 1


def test_capped_at_eight_by_default(cores):
    cores(96)
    assert data.default_num_workers() == data.DEFAULT_MAX_WORKERS == 8


def test_the_cap_can_be_set_or_removed(cores):
    cores(96)
    assert data.default_num_workers(max_workers=3) == 3
    assert data.default_num_workers(max_workers=None) == 96


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        data.default_num_workers(max_workers=0)


def test_without_affinity_the_cpu_count_counts(single_process):
    single_process.delattr(os, "sched_getaffinity", raising=False)
    single_process.setattr(os, "cpu_count", lambda: 5)
    assert data.available_cores() == 5


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_cores_follow_the_affinity_mask():
    """A process pinned to one core (taskset, a container's cpuset) gets one worker."""
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from accelmigrate.runtime.data import default_num_workers; print(default_num_workers())"
    )
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV + SLURM_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_the_helper_does_not_import_torch():
    code = "import sys, accelmigrate.runtime.data; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# -- the codemod -------------------------------------------------------------------

LOADER = """
    from torch.utils.data import DataLoader

    def main(dataset):
        return DataLoader(dataset, batch_size=4)

    if __name__ == "__main__":
        main([])
"""


def test_registered_with_its_codes():
    cls = find("workers")
    assert cls is not None and find("AM104") is cls
    assert cls.triggers == ("DataLoader",)


def test_the_pre_check_sees_every_spelling():
    cls = find("workers")
    assert not cls.wants("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    for spelling in ("DataLoader(x)", "data.DataLoader(x)", "from torch.utils.data import DataLoader as DL"):
        assert cls.wants(spelling)


@pytest.mark.parametrize("option, expected", [
    ({"max_workers": "4"}, "default_num_workers(max_workers=4)"),
    ({"value": "2"}, "default_num_workers(max_workers=2)"),
    ({"max_workers": "none"}, "default_num_workers(max_workers=None)"),
    ({"max_workers": 6}, "default_num_workers(max_workers=6)"),
])
def test_the_cap_option(option, expected):
    assert f"num_workers={expected}," in migrate(LOADER, **option).code


@pytest.mark.parametrize("bad", ["0", "-1", "many", "2.5"])
def test_a_bad_cap_option_is_refused_up_front(bad):
    with pytest.raises(UnknownCodemod, match="workers: max_workers must be a whole number"):
        migrate(LOADER, max_workers=bad)


@pytest.mark.parametrize("option", [{}, {"persistent": "false"}, {"persistent": "no"}])
def test_workers_are_not_persistent_by_default(option):
    assert "persistent_workers" not in migrate(LOADER, **option).code


@pytest.mark.parametrize("value", ["true", "True", "yes", "1", True])
def test_the_persistent_option_adds_persistent_workers(value):
    code = migrate(LOADER, persistent=value).code
    assert "pin_memory=torch.cuda.is_available(), persistent_workers=True)" in code


def test_the_persistent_option_keeps_the_users_choice():
    source = LOADER.replace("batch_size=4)", "batch_size=4, persistent_workers=False)")
    code = migrate(source, persistent="true").code
    assert "persistent_workers=False, num_workers=default_num_workers()" in code
    assert "persistent_workers=True" not in code


@pytest.mark.parametrize("bad", ["maybe", "2", ""])
def test_a_bad_persistent_option_is_refused_up_front(bad):
    with pytest.raises(UnknownCodemod, match="workers: persistent must be true or false"):
        migrate(LOADER, persistent=bad)


def test_the_persistent_option_from_the_configuration(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate.options.workers]\npersistent = true\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(LOADER))
    done = run_cli("apply", "--diff", "--to", "workers", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "persistent_workers=True" in done.stdout


def test_check_mode_reports_without_rewriting():
    source = textwrap.dedent(LOADER)
    migration = migrate_source(source, [("workers", {})], "train.py", check_only=True)
    assert migration.code == source
    assert codes(migration) == [("AM101", True)]


def test_the_fix_names_only_what_it_adds():
    migration = migrate("""
        import torch
        from torch.utils.data import DataLoader

        def main(dataset):
            return DataLoader(dataset, num_workers=0, pin_memory=False)

        if __name__ == "__main__":
            main([])
    """)
    (finding,) = migration.findings
    assert "num_workers=default_num_workers()" in finding.message
    assert "pin_memory" not in finding.message
    expected = "DataLoader(dataset, num_workers=default_num_workers(), pin_memory=False)"
    assert expected in migration.code


def test_messages_say_what_to_do():
    migration = migrate("""
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        class Stream(IterableDataset):
            def __iter__(self):
                yield 1

        loader = DataLoader(Stream(), collate_fn=lambda b: b)
        dataset = [1, 2]
        other = DataLoader(dataset)
        dataset.append(3)
    """)
    by_code = {f.code: f.message for f in migration.findings}
    assert sorted(by_code) == ["AM103", "AM104", "AM105", "AM106"]
    assert "get_worker_info()" in by_code["AM103"]
    assert 'if __name__ == "__main__":' in by_code["AM104"]
    assert "def` at module level" in by_code["AM105"]
    assert "line 12: `dataset.append(3)`" in by_code["AM106"]
    assert not any(f.fixed for f in migration.findings)


def test_a_function_called_by_top_level_code_runs_at_import():
    migration = workers_alone("""
        from torch.utils.data import DataLoader

        def loaders(dataset):
            return [DataLoader(dataset)]

        def train(dataset):
            for loader in loaders(dataset):
                pass

        def never_called(dataset):
            return DataLoader(dataset)

        train([1, 2, 3])
    """)
    assert [(f.line, f.code) for f in migration] == [(5, "AM104"), (12, "AM101")]


def test_user_pin_memory_and_torch_alias():
    migration = migrate("""
        import torch as th
        from torch.utils.data import DataLoader

        def main(dataset):
            return DataLoader(dataset, 8, True)

        if __name__ == "__main__":
            main([])
    """)
    expected = "DataLoader(dataset, 8, True, num_workers=default_num_workers(), pin_memory=th.cuda.is_available())"
    assert expected in migration.code
    assert "\nimport torch\n" not in migration.code


def test_the_codemod_does_not_import_torch():
    code = (
        "import sys; from accelmigrate.engine.migrate import migrate_source; "
        "migrate_source(open(sys.argv[1]).read(), [('workers', {})]); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(SCRIPTS / "data_bound.py")], capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.strip() == "False", done.stderr


# -- migrated scripts, run --------------------------------------------------------------


def migrate_script(script: Path, into: Path) -> Path:
    migration = migrate_source(script.read_text(encoding="utf-8"), [("workers", {})], str(script))
    assert any(f.fixed for f in migration.findings), migration.findings
    target = into / script.name
    target.write_text(migration.code, encoding="utf-8")
    return target


def out_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "migrated"
    folder.mkdir()
    return folder


def lines_starting(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_migrated_script_works_with_spawned_workers(tmp_path):
    """What macOS and Windows do: workers are spawned and re-import the script."""
    script = tmp_path / "spawned.py"
    script.write_text(textwrap.dedent("""
        import torch
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader, Dataset


        def decode(value, source=__file__):
            with open(source, "rb") as stream:  # each item's own read
                stream.read(16)
            return torch.tensor([float(value)])


        class Squares(Dataset):
            def __len__(self):
                return 40

            def __getitem__(self, i):
                return decode(i * i)


        def collate(batch):
            return torch.cat(batch)


        def main():
            mp.set_start_method("spawn", force=True)
            loader = DataLoader(Squares(), batch_size=8, collate_fn=collate)
            for epoch in range(2):
                total = sum(float(batch.sum()) for batch in loader)
            print(f"total: {total:.0f}", loader.num_workers, loader.persistent_workers)


        if __name__ == "__main__":
            main()
    """))
    migrated = migrate_script(script, out_folder(tmp_path))
    done = run_python(migrated)
    assert done.returncode == 0, done.stderr
    total, workers, persistent = done.stdout.split()[1:]
    assert total == str(sum(i * i for i in range(40)))
    assert int(workers) >= 1 and persistent == "False"


@pytest.mark.slow
def test_migrated_script_under_torchrun_sizes_its_share(tmp_path):
    """Two processes of a launch on this machine: each gets half the cores."""
    script = tmp_path / "share.py"
    script.write_text(textwrap.dedent("""
        from torch.utils.data import DataLoader

        def main():
            loader = DataLoader(list(range(10)), batch_size=5)
            print(loader.num_workers, sum(len(b) for b in loader))

        if __name__ == "__main__":
            main()
    """))
    migrated = migrate_script(script, out_folder(tmp_path))
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    done = run_python(migrated, env=env)
    assert done.returncode == 0, done.stderr
    workers, items = done.stdout.split()
    assert int(workers) == max(1, min(8, data.available_cores() // 2))
    assert items == "10"


SEEDED = SCRIPTS / "workers_seeded_epochs.py"


def apply_workers(script: Path, folder: Path, config: str = "") -> Path:
    """`accelmigrate apply --to workers` on a copy of the script in `folder`
    (with `config` as its pyproject.toml)."""
    folder.mkdir()
    target = folder / script.name
    shutil.copy(script, target)
    if config:
        (folder / "pyproject.toml").write_text(config)
    done = run_cli("apply", "--to", "workers", str(target), cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


@pytest.mark.slow
def test_a_seeded_multi_epoch_script_keeps_its_results(tmp_path):
    """Shuffled training and ordered evaluation loaders, dropout, four epochs:
    with workers every epoch prints the same numbers (to 12 digits) as before."""
    migrated = apply_workers(SEEDED, tmp_path / "migrated")
    code = migrated.read_text()
    assert code.count("num_workers=default_num_workers()") == 2 and "persistent_workers" not in code
    original_run = run_python(SEEDED)
    migrated_run = run_python(migrated)
    assert original_run.returncode == 0, original_run.stderr
    assert migrated_run.returncode == 0, migrated_run.stderr
    assert lines_starting(original_run.stdout, "epoch 3 ") and lines_starting(original_run.stdout, "final loss: ")
    assert migrated_run.stdout == original_run.stdout


@pytest.mark.slow
def test_persistent_workers_change_later_epochs_as_documented(tmp_path):
    """The cost `explain workers` states for `persistent = true`: the first
    epoch is the same, the final loss is not."""
    config = "[tool.accelmigrate.options.workers]\npersistent = true\n"
    migrated = apply_workers(SEEDED, tmp_path / "persistent", config)
    assert migrated.read_text().count("persistent_workers=True") == 2
    original_run = run_python(SEEDED)
    migrated_run = run_python(migrated)
    assert migrated_run.returncode == 0, migrated_run.stderr
    first_epoch = lines_starting(original_run.stdout, "epoch 0 ")
    assert first_epoch and lines_starting(migrated_run.stdout, "epoch 0 ") == first_epoch
    assert lines_starting(migrated_run.stdout, "final loss: ") != lines_starting(original_run.stdout, "final loss: ")


def test_a_class_called_at_import_runs_every_method():
    # `Trainer().fit()`: the class runs, so does `fit`, and `make` with it. The
    # main guard (which workers requires) is not added here, so AM104 stays.
    migration = migrate("""
        from torch.utils.data import DataLoader

        def make(dataset):
            return DataLoader(dataset)

        class Trainer:
            def fit(self):
                self.loader = make([1, 2])

        Trainer().fit()
    """)
    assert [(f.line, f.code) for f in migration.findings] == [(5, "AM104")]


def test_a_method_called_through_an_instance_runs_at_import():
    migration = workers_alone("""
        from torch.utils.data import DataLoader

        class Trainer:
            def __init__(self, dataset):
                self.dataset = dataset

            def fit(self):
                self.loader = DataLoader(self.dataset)

        def never_called(dataset):
            return DataLoader(dataset)

        trainer = Trainer([1, 2])
        trainer.fit()
    """)
    assert [(f.line, f.code) for f in migration] == [(9, "AM104"), (12, "AM101")]


def test_torch_imported_only_under_a_condition_is_imported_again():
    migration = migrate("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import torch
        from torch.utils.data import DataLoader

        def main():
            return DataLoader([1, 2])

        if __name__ == "__main__":
            main()
    """)
    assert "\nimport torch\n" in migration.code and "pin_memory=torch.cuda.is_available()" in migration.code


# -- silenced notes --------------------------------------------------------------------


def test_the_in_memory_note_is_a_note():
    assert Workers.notes == {"AM107"}
    assert "AM108" in Workers.codes and "AM108" not in Workers.notes  # a GPU dataset needs action


def test_a_silenced_note_keeps_the_loader_without_workers():
    """`skip[AM107]` hides the note; it does not turn workers on."""
    migration = migrate("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def main():
            return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)  # accelmigrate: skip[AM107]

        if __name__ == "__main__":
            main()
    """)
    assert migration.findings == []
    assert "num_workers" not in migration.code


# -- loader arguments in a dict ------------------------------------------------------------


def test_a_key_the_call_gives_is_not_added_to_its_dict():
    """`DataLoader(data, pin_memory=False, **options)`: pin_memory in `options`
    too would raise "got multiple values for keyword argument"."""
    migration = migrate("""
        from torch.utils.data import DataLoader

        def main(dataset):
            options = {"batch_size": 8}
            return DataLoader(dataset, pin_memory=False, **options)

        if __name__ == "__main__":
            main([])
    """)
    assert 'options = {"batch_size": 8, "num_workers": default_num_workers()}' in migration.code
    assert codes(migration) == [("AM101", True)]


def test_a_call_with_num_workers_keeps_a_shared_dict_unchanged():
    migration = migrate("""
        from torch.utils.data import DataLoader

        def main(train_set, test_set):
            options = {"batch_size": 8}
            return DataLoader(train_set, **options), DataLoader(test_set, num_workers=0, **options)

        if __name__ == "__main__":
            main([], [])
    """)
    assert "num_workers=default" not in migration.code and '"num_workers"' not in migration.code
    assert [f.code for f in migration.findings] == ["AM102", "AM102"]
    assert "sets num_workers itself" in migration.findings[0].message


MNIST_SHAPED = """
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def augment(point, source=__file__):
    with open(source, "rb") as stream:  # each item's own work (reading, decoding): here, a read
        stream.read(16)
    return point.clone()


class Points(Dataset):
    def __init__(self, count, seed):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, 6, generator=generator)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        return augment(self.x[index]), self.y[index]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(1)
    train_kwargs = {"batch_size": 16, "shuffle": True}
    test_kwargs = {"batch_size": 64}
    if args.cuda:
        cuda_kwargs = {"num_workers": 1, "pin_memory": True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)
    train_loader = DataLoader(Points(256, 0), **train_kwargs)
    test_loader = DataLoader(Points(128, 1), **test_kwargs)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            test_loss = sum(F.cross_entropy(model(x), y, reduction="sum").item() for x, y in test_loader)
        print(f"epoch {epoch} train {loss.item():.6f} test {test_loss:.6f}")


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_a_script_with_its_loader_settings_in_dicts_gets_workers_and_the_same_numbers(tmp_path):
    """The MNIST example's shape: both dicts get the settings, the CUDA update
    still wins, and the seeded run prints exactly the same losses."""
    script = tmp_path / "mnist_shaped.py"
    script.write_text(MNIST_SHAPED)
    migrated = migrate_script(script, out_folder(tmp_path))
    code = migrated.read_text()
    assert code.count('"num_workers": default_num_workers()') == 2
    assert code.count('"pin_memory": torch.cuda.is_available()') == 2
    original_run = run_python(script)
    migrated_run = run_python(migrated)
    assert original_run.returncode == 0, original_run.stderr
    assert migrated_run.returncode == 0, migrated_run.stderr
    assert lines_starting(original_run.stdout, "epoch 1 ")
    assert migrated_run.stdout == original_run.stdout
