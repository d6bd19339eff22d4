"""The conventions a ruff user reaches for, through the real command line:
`check` with no path, what git ignores, `# noqa: AMnnn`, a did-you-mean for
words and codes, `--config FILE`, check's JSON in check's words, a hook's
`args:`, `run -m`, `profile` of a CUDA-only script on a CPU, and NVIDIA
apex's amp named by the default `check`."""

import json
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli

LOOP = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2)
        torch.cuda.empty_cache()
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate]\n")
    (tmp_path / "train.py").write_text(LOOP)
    return tmp_path


def checked_paths(done) -> set[str]:
    return {entry["path"] for entry in json.loads(done.stdout)}


def test_check_without_a_path_checks_the_current_folder(project: Path):
    done = run_cli("check", "--no-cache", cwd=project)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("train.py:5:5: AM210 [*]")


def test_apply_without_a_path_rewrites_nothing(project: Path):
    done = run_cli("apply", cwd=project)
    assert done.returncode == 2
    assert "Missing argument" in done.stderr
    assert (project / "train.py").read_text() == LOOP


# --- .gitignore ------------------------------------------------------------------------


def test_what_git_ignores_is_not_walked(project: Path):
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("generated/\n*_copy.py\n!keep_copy.py\n")
    for name in ("generated/train.py", "train_copy.py", "keep_copy.py", "sub/deep.py", "sub/local.py"):
        (project / name).parent.mkdir(exist_ok=True)
        (project / name).write_text(LOOP)
    (project / "sub" / ".gitignore").write_text("local.py\n")
    (project / ".git" / "info").mkdir()
    (project / ".git" / "info" / "exclude").write_text("sub/deep.py\n")
    done = run_cli("check", "--no-cache", "--format", "json", ".", cwd=project)
    assert checked_paths(done) == {"keep_copy.py", "train.py"}
    # Walked from a folder below the repository's root, the root's rules still hold.
    done = run_cli("check", "--no-cache", "--format", "json", "sub", cwd=project)
    assert "error" in done.stderr and not done.stdout.strip("[]\n")  # no Python file left there
    # A file named on the command line is checked whatever git ignores.
    done = run_cli("check", "--no-cache", "--format", "json", "train_copy.py", cwd=project)
    assert checked_paths(done) == {"train_copy.py"}


def test_respect_gitignore_false_walks_everything(project: Path):
    (project / ".gitignore").write_text("ignored.py\n")
    (project / "ignored.py").write_text(LOOP)
    (project / "pyproject.toml").write_text("[tool.accelmigrate]\nrespect-gitignore = false\n")
    done = run_cli("check", "--no-cache", "--format", "json", ".", cwd=project)
    assert checked_paths(done) == {"ignored.py", "train.py"}
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nrespect-gitignore = "no"\n')
    done = run_cli("check", "--no-cache", ".", cwd=project)
    assert done.returncode == 2 and "'respect-gitignore' must be a boolean" in done.stderr


# --- noqa ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "comment, silenced",
    [
        ("# noqa: AM210", True),
        ("# NOQA:AM210,E501", True),
        ("# type: ignore  # noqa: E501, AM210", True),
        ("# noqa", False),  # the other linters' blanket mark
        ("# noqa: E501", False),
        ("# noqa: AM101", False),
    ],
)
def test_noqa_with_our_codes_is_a_skip_mark(project: Path, comment: str, silenced: bool):
    source = LOOP.replace("empty_cache()", f"empty_cache()  {comment}")
    (project / "train.py").write_text(source)
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert ("AM210" in done.stdout) is not silenced, done.stdout
    run_cli("apply", "--no-cache", "train.py", cwd=project)
    assert ("empty_cache" in (project / "train.py").read_text()) is silenced


def test_noqa_naming_an_unknown_code_is_reported(project: Path):
    (project / "train.py").write_text(LOOP.replace("empty_cache()", "empty_cache()  # noqa: AM2100"))
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert "AM002 skip mark names unknown code(s) AM2100 (did you mean 'AM210'?)" in done.stdout


# --- did you mean -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, said",
    [
        (("apply", "--diff", "--to", "dpp", "train.py"), "unknown codemod 'dpp' (did you mean 'ddp'?)"),
        (("check", "--to", "checklst", "train.py"), "(did you mean 'checklist'?)"),
        (("check", "--select", "AM2100", "train.py"), "unknown code(s) AM2100 (did you mean 'AM210'?)"),
        (("explain", "wokers"), "no codemod or finding code 'wokers' (did you mean 'workers'?)"),
        (("explain", "am1011"), "(did you mean 'AM101'?)"),
    ],
)
def test_a_near_miss_is_told_the_close_name(project: Path, args, said: str):
    done = run_cli(*args, cwd=project)
    assert done.returncode == 2
    assert said in done.stderr


def test_an_unknown_code_in_the_config_is_told_the_close_one(project: Path):
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nignore = ["AM2100"]\n')
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert "AM003 [tool.accelmigrate] ignore: unknown code 'AM2100' (did you mean 'AM210'?)" in done.stdout


# --- --config FILE -----------------------------------------------------------------------


def test_config_names_the_settings_file(project: Path, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("settings") / "accelmigrate.toml"
    elsewhere.write_text('[tool.accelmigrate]\nignore = ["AM210"]\n')
    assert run_cli("check", "--no-cache", "train.py", cwd=project).returncode == 1
    done = run_cli("check", "--no-cache", "--config", str(elsewhere), "train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run_cli("check", "--config", "missing.toml", "train.py", cwd=project)
    assert done.returncode == 2 and "missing.toml: no such configuration file" in done.stderr


# --- JSON of check ---------------------------------------------------------------------


def test_checks_json_says_what_to_do_not_what_apply_did(project: Path):
    done = run_cli("check", "--no-cache", "--format", "json", "train.py", cwd=project)
    (finding,) = json.loads(done.stdout)[0]["findings"]
    assert finding["message"].endswith("(fixable with `accelmigrate apply --to empty-cache`)")
    assert not finding["message"].startswith("removed")
    done = run_cli("apply", "--diff", "--no-cache", "--format", "json", "train.py", cwd=project)
    assert json.loads(done.stdout)[0]["findings"][0]["message"].startswith("removed")


# --- a hook's args --------------------------------------------------------------------


def test_a_hooks_args_after_the_entry_are_options(project: Path):
    """pre-commit runs `entry args files`: with entry `accelmigrate check --`
    and `args: [--to, empty-cache, --select, AM2]`."""
    done = run_cli("check", "--no-follow-imports", "--", "--to", "empty-cache", "--select", "AM2", "train.py", cwd=project)
    assert done.returncode == 1, done.stderr
    assert "train.py:5:5: AM210" in done.stdout
    # A file that is named like an option is still a file.
    (project / "--to").write_text(LOOP)
    done = run_cli("check", "--no-cache", "--", "--to", cwd=project)
    assert done.returncode == 1 and "--to:5:5: AM210" in done.stdout


# --- run -m ----------------------------------------------------------------------------


@pytest.mark.slow
def test_run_takes_a_module_as_python_m_does(tmp_path: Path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text("WIDTH = 3\n")
    (package / "distributed.py").write_text('import torch.distributed as dist\n\n\ndef join():\n    dist.init_process_group("gloo")\n')
    (package / "main.py").write_text(textwrap.dedent(
        """\
        import sys

        import torch.distributed as dist

        from trainer.distributed import join
        from trainer.settings import WIDTH

        join()  # the group is joined in a module of the package: seen, so the launch is not refused
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {sys.argv[1:]} {WIDTH} {__name__}")
        dist.destroy_process_group()
        """
    ))
    done = run_cli("run", "--nproc-per-node", "2", "-m", "trainer.main", "--", "--lr", "0.1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"rank {rank} of 2: ['--lr', '0.1'] 3 __main__" in done.stdout
    done = run_cli("run", "-m", "trainer.absent", cwd=tmp_path)
    assert done.returncode == 2 and "no module 'trainer.absent'" in done.stderr


# --- profile of a CUDA-only script ------------------------------------------------------


@pytest.mark.slow
def test_profile_runs_a_cuda_only_script_on_this_machine(tmp_path: Path):
    script = tmp_path / "cuda_only.py"
    script.write_text(textwrap.dedent(
        """\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        model = nn.Linear(4, 1).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """
    ))
    done = run_cli("profile", str(script), "--steps", "4")
    assert done.returncode == 0, done.stderr
    assert "No NVIDIA driver" not in done.stderr
    assert "No CUDA here: the script's CUDA placements ran on cpu" in done.stdout


# --- apex amp ---------------------------------------------------------------------------


APEX = textwrap.dedent(
    """\
    import torch
    from apex import amp

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for step in range(3):
        loss = model(torch.ones(1, 2)).sum()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    """
)


def test_the_default_check_names_apex_amp_and_the_word_that_moves_it(project: Path):
    (project / "train.py").write_text(APEX)
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert done.returncode == 1
    assert "train.py:2:18: AM227 `apex.amp`: NVIDIA apex's amp is deprecated" in done.stdout
    assert "`accelmigrate apply --to amp`" in done.stdout
    # Where amp runs too, amp makes the change: no finding is left for modernize's.
    done = run_cli("apply", "--no-cache", "--to", "modernize,amp", "train.py", cwd=project)
    assert done.returncode == 0 and "AM227" not in done.stderr + done.stdout
    assert "apex" not in (project / "train.py").read_text()


@pytest.mark.parametrize(
    "imports, reported",
    [
        ("try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n", False),  # runs without apex
        ("try:\n    from apex import amp\nexcept ImportError:\n    raise SystemExit('install apex')\n", True),
        ("try:\n    import torch.cuda.amp\nexcept ImportError:\n    from apex import amp\n", True),
    ],
)
def test_an_apex_import_the_script_runs_without_is_no_finding(project: Path, imports: str, reported: bool):
    (project / "train.py").write_text(imports)
    done = run_cli("check", "--no-cache", "train.py", cwd=project)
    assert ("AM227" in done.stdout) is reported, done.stdout
