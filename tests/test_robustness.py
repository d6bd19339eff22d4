"""Never wrong, never crash: odd encodings, odd files, odd configuration,
deep nesting, odd indentation, links and permissions, syntax-error positions,
temporary files left by a killed run, and `kill -9` in the middle of `apply`."""

import ast
import multiprocessing
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelmigrate.cli import main
from accelmigrate.codemods import all_codemods
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.migrate import migrate_source

LOOP = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2)
        torch.cuda.empty_cache()
    """
)
MIGRATED = LOOP.replace("    torch.cuda.empty_cache()\n", "")


def invoke(*args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def run_cli_within(seconds: float, *args, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI in a subprocess that must end by itself within `seconds`."""
    return subprocess.run(
        [sys.executable, "-m", "accelmigrate", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=seconds
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LOOP)
    return tmp_path


# -- 5 and 20: encodings that CPython refuses ------------------------------------------


@pytest.mark.parametrize("codec", ["rot13", "hex", "base64", "zlib", "bz2", "uu", "punycode"])
def test_a_coding_line_naming_a_codec_that_is_not_text_is_that_files_error(project: Path, codec: str):
    content = f"# -*- coding: {codec} -*-\nimport torch\nfor i in range(2):\n    torch.cuda.empty_cache()\n".encode()
    (project / "odd.py").write_bytes(content)
    result = invoke("apply", "odd.py", "train.py", cwd=project)
    assert result.exit_code == 2
    (line,) = error_lines(result.stderr)
    assert line.startswith("error: odd.py: Python cannot decode this file with its coding line: ") and codec in line
    assert (project / "odd.py").read_bytes() == content
    assert (project / "train.py").read_text() == MIGRATED


def test_a_bom_with_a_latin_1_coding_line_is_reported_not_rewritten(project: Path):
    content = b"\xef\xbb\xbf# -*- coding: latin-1 -*-\nimport torch\nfor i in range(2):\n    torch.cuda.empty_cache()\n"
    with pytest.raises(SyntaxError):
        compile(content, "bom.py", "exec")  # CPython refuses it
    (project / "bom.py").write_bytes(content)
    result = invoke("apply", "bom.py", "train.py", cwd=project)
    assert result.exit_code == 2
    assert "error: bom.py:1: a UTF-8 BOM and a coding line naming another encoding" in result.stderr
    assert (project / "bom.py").read_bytes() == content
    assert (project / "train.py").read_text() == MIGRATED


def _fail_on(name: str):
    real = engine.migrate_source

    def migrate(source, plan, path="<string>", **kwargs):
        if Path(path).name == name:
            raise RuntimeError("an unforeseen failure")
        return real(source, plan, path, **kwargs)

    return migrate


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_unexpected_exception_in_one_file_is_that_files_error(project: Path, monkeypatch, jobs: str):
    """In the process itself and in forked worker processes alike."""
    if jobs != "1" and multiprocessing.get_start_method() != "fork":
        pytest.skip("the failure is injected into forked workers")
    for i in range(5):
        (project / f"copy{i}.py").write_text(LOOP)
    monkeypatch.setattr(engine, "migrate_source", _fail_on("copy2.py"))
    result = invoke("apply", ".", "--jobs", jobs, cwd=project)
    assert result.exit_code == 2
    assert error_lines(result.stderr) == ["error: copy2.py: internal error, file left unchanged: RuntimeError: an unforeseen failure"]
    assert (project / "copy2.py").read_text() == LOOP
    assert all((project / f"copy{i}.py").read_text() == MIGRATED for i in (0, 1, 3, 4))


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the failure is injected into forked workers")
def test_a_worker_process_that_dies_costs_only_its_file(project: Path, monkeypatch):
    real = engine.process_file

    def process_file(path, plan, **kwargs):
        if Path(path).name == "copy5.py":
            os._exit(9)  # as if killed, or out of memory
        return real(path, plan, **kwargs)

    for i in range(12):
        (project / f"copy{i}.py").write_text(LOOP)
    monkeypatch.setattr(engine, "process_file", process_file)
    result = invoke("apply", ".", "--jobs", "2", cwd=project)
    assert result.exit_code == 2
    assert error_lines(result.stderr) == ["error: copy5.py: the process migrating this file died (killed, or out of memory); file left unchanged"]
    assert all((project / f"copy{i}.py").read_text() == MIGRATED for i in range(12) if i != 5)


# -- 6: files that are not regular files -------------------------------------------------


def _special_files(folder: Path) -> None:
    os.mkfifo(folder / "fifo.py")
    (folder / "zero.py").symlink_to("/dev/zero")  # reading it would never end
    (folder / "null.py").symlink_to("/dev/null")


@pytest.mark.parametrize("command", [["apply"], ["apply", "--diff"], ["check"]])
def test_fifos_and_devices_are_not_regular_files_and_never_hang(project: Path, command):
    _special_files(project)
    completed = run_cli_within(60, *command, ".", cwd=project)
    assert completed.returncode == 2
    # The links lead out of the folder: not followed (and said so); named, each is read and refused.
    assert error_lines(completed.stderr) == ["error: fifo.py: not a regular file (a FIFO); skipped"]
    assert "null.py: a link to /dev/null, outside .; skipped" in completed.stderr
    named = run_cli_within(60, *command, "fifo.py", "null.py", "zero.py", cwd=project)
    assert named.returncode == 2
    assert sorted(error_lines(named.stderr)) == [
        "error: fifo.py: not a regular file (a FIFO); skipped",
        "error: null.py: not a regular file (a character device); skipped",
        "error: zero.py: not a regular file (a character device); skipped",
    ]
    if command == ["apply"]:
        assert (project / "train.py").read_text() == MIGRATED
        assert (project / "zero.py").is_symlink() and stat.S_ISFIFO((project / "fifo.py").lstat().st_mode)


# -- 7: wrongly typed configuration ------------------------------------------------------


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[tool.accelmigrate]\nexclude = 5\n", "[tool.accelmigrate] 'exclude' must be a string or an array of strings, not an integer"),
        ("[tool.accelmigrate]\nexclude = [1, 2]\n", "[tool.accelmigrate] 'exclude' must be a string or an array of strings, not an array"),
        ("[tool.accelmigrate]\noptions = \"x\"\n", "[tool.accelmigrate] 'options' must be a table, not a string"),
        ("[tool.accelmigrate.options]\nworkers = 3\n", "[tool.accelmigrate.options] 'workers' must be a table, not an integer"),
        ("[tool.accelmigrate.options.workers]\nmax_workers = [8]\n", "'max_workers' must be a string, a number or a boolean, not an array"),
        ("[tool]\naccelmigrate = 5\n", "[tool] 'accelmigrate' must be a table, not an integer"),
        ("tool = \"x\"\n", "'tool' must be a table, not a string"),
        ("[tool]\nblack = 3\n", "[tool] 'black' must be a table, not an integer"),
        ("[tool.black]\nline-length = \"wide\"\n", "[tool.black] 'line-length' must be an integer, not a string"),
        ("[tool.accelmigrate]\nto = 3\n", "[tool.accelmigrate] 'to' must be a string or an array of strings, not an integer"),
        ("[tool.accelmigrate]\nto = " + "[" * 1000 + "]" * 1000 + "\n", "pyproject.toml: cannot read the configuration: nested too deeply"),
    ],
)
def test_wrongly_typed_configuration_is_a_usage_error_naming_the_key(project: Path, toml: str, message: str):
    (project / "pyproject.toml").write_text(toml)
    for command in (["apply"], ["check"]):
        completed = run_cli_within(120, *command, "train.py", cwd=project)
        assert completed.returncode == 2, completed.stderr
        assert message in completed.stderr and "Traceback" not in completed.stderr
    assert (project / "train.py").read_text() == LOOP


def test_well_typed_options_still_reach_the_codemods(project: Path):
    (project / "pyproject.toml").write_text("[tool.accelmigrate]\nto = [\"empty-cache\"]\nexclude = \"skipped.py\"\n")
    (project / "skipped.py").write_text(LOOP)
    assert invoke("apply", ".", cwd=project).exit_code == 0
    assert (project / "train.py").read_text() == MIGRATED and (project / "skipped.py").read_text() == LOOP


# -- 8: deep nesting, long modules, and a codemod that fails -----------------------------

SCRIPT_WITH_GPU = textwrap.dedent(
    """\
    import torch

    model = torch.nn.Linear(2, 2).cuda()
    for step in range(3):
        x = torch.ones(2).cuda()
        torch.cuda.empty_cache()
    """
)


@pytest.mark.parametrize(
    "extra",
    [
        "total = " + " + ".join(["1"] * 600) + "\n",  # a left-nested chain of 600 additions
        "sign = " + "-" * 600 + "1\n",
        "".join(f"value{i} = {i}\n" for i in range(1500)),  # AddImportsVisitor recursed once per statement
    ],
    ids=["sum", "unary", "long-module"],
)
def test_deep_nesting_and_long_modules_are_migrated(project: Path, extra: str):
    source = '"""A script."""\n' + SCRIPT_WITH_GPU + extra
    (project / "deep.py").write_text(source)
    result = invoke("apply", "--to", "device,empty-cache", "deep.py", cwd=project)
    assert "AM000" not in result.stdout + result.stderr
    assert result.exit_code == 0
    migrated = (project / "deep.py").read_text()
    assert ".to(device)" in migrated and "empty_cache" not in migrated and migrated.endswith(extra)
    assert invoke("apply", "--to", "device,empty-cache", "deep.py", cwd=project).exit_code == 0
    assert (project / "deep.py").read_text() == migrated


def test_nesting_deeper_than_python_accepts_is_an_input_error(project: Path):
    (project / "deeper.py").write_text(LOOP + "total = " + " + ".join(["1"] * 5000) + "\n")
    with pytest.raises(RecursionError):
        compile((project / "deeper.py").read_text(), "deeper.py", "exec")
    result = invoke("apply", "deeper.py", "train.py", cwd=project)
    assert result.exit_code == 2
    assert "error: deeper.py: nested too deeply for Python's own parser; file left unchanged" in result.stderr
    assert (project / "train.py").read_text() == MIGRATED


def _recurse_forever(*args, **kwargs):
    raise RecursionError("maximum recursion depth exceeded")


# A codemod fails in its planning (every command runs it) or, in apply, in the
# import bookkeeping after it (a check that only wants findings skips that).
FAILURES = {
    "apply, imports": (["apply"], "AddImportsVisitor"),
    "diff, imports": (["apply", "--diff"], "AddImportsVisitor"),
    "apply, planning": (["apply"], "planning"),
    "check, planning": (["check"], "planning"),
}


def test_a_codemod_failure_keeps_to_one_short_line_that_names_where_accelmigrate_raised_it(monkeypatch):
    """A KeyError of a syntax node would print the whole tree: the finding
    keeps the first DETAIL_LIMIT characters; an error raised through
    accelmigrate's own code names that line (the report a bug needs)."""
    import libcst

    from accelmigrate.codemods._syntax import code_of

    node = libcst.parse_module("x = 1\n" * 50)
    failures = {"tree": lambda self, module: {}[node], "own code": lambda self, module: code_of(5)}
    found = {}
    for name, failure in failures.items():
        monkeypatch.setattr(all_codemods()["device"], "visit_Module", failure)
        (found[name],) = migrate_source(SCRIPT_WITH_GPU, [("device", {})], "gpu.py").findings
    tree = found["tree"].message.rsplit(" (at codemods/", 1)[0]
    assert tree.startswith("codemod 'device' failed and changed nothing: KeyError: Module(") and tree.endswith("...")
    assert len(tree.split(": ", 1)[1]) == engine.DETAIL_LIMIT + 3 and "\n" not in tree
    assert found["own code"].message.endswith("(at codemods/_syntax.py:%d)" % (code_of.__code__.co_firstlineno + 2)), found["own code"].message


@pytest.mark.parametrize("command, where", FAILURES.values(), ids=FAILURES.keys())
def test_a_codemod_that_fails_is_an_error_exit_with_a_summary(project: Path, monkeypatch, command, where):
    (project / "gpu.py").write_text(SCRIPT_WITH_GPU)
    if where == "planning":
        monkeypatch.setattr(all_codemods()["device"], "visit_Module", _recurse_forever)
    else:
        monkeypatch.setattr(engine, where, lambda context: type("Failing", (), {"transform_module": _recurse_forever})())
    result = invoke(*command, "--to", "device", "gpu.py", cwd=project)
    assert result.exit_code == 2
    assert "gpu.py:1:1: AM000 codemod 'device' failed and changed nothing: RecursionError" in result.stdout
    assert "a codemod failed on 1 file(s) (AM000) and migrated nothing there" in result.stderr
    assert (project / "gpu.py").read_text() == SCRIPT_WITH_GPU


# -- 9: form feeds and tabs in the first indented block ----------------------------------

DP_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader

    def helper():
    FIRST_BLOCK

    def main():
        model = nn.DataParallel(nn.Linear(2, 2).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader([torch.ones(2)] * 4, batch_size=2)
        for batch in loader:
            x = batch.cuda()
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(loss.item())
            torch.save(model.state_dict(), "model.pt")

    if __name__ == "__main__":
        main()
    """
)
FIRST_BLOCKS = {"form-feed": "\f    return 1", "tab": "\treturn 1", "space-tab": " \treturn 1"}


def _indentations(code: str) -> set[str]:
    return {line[: len(line) - len(line.lstrip(" \t\f"))] for line in code.splitlines() if line.strip()}


@pytest.mark.parametrize("words", ["ddp", "device", "workers", "amp", "device,amp,ddp,workers"])
@pytest.mark.parametrize("first_block", sorted(FIRST_BLOCKS))
def test_generated_blocks_get_clean_indentation(first_block: str, words: str):
    source = DP_SCRIPT.replace("FIRST_BLOCK", FIRST_BLOCKS[first_block])
    plan = [(word, {}) for word in words.split(",")]
    migration = migrate_source(source, plan, "odd.py")
    assert not [f for f in migration.findings if f.code == "AM000"], migration.findings
    ast.parse(migration.code)
    assert migrate_source(migration.code, plan, "odd.py").code == migration.code
    new_indentations = _indentations(migration.code) - _indentations(source)
    for indent in new_indentations:
        assert "\f" not in indent and not ("\t" in indent and " " in indent), repr(indent)
    if words != "workers":
        assert migration.code != source


def test_a_tab_indented_file_gets_tab_indented_blocks():
    source = DP_SCRIPT.replace("FIRST_BLOCK", "\treturn 1").replace("    ", "\t")
    migration = migrate_source(source, [("ddp", {})], "tabs.py")
    assert "if is_main_process():\n\t\t\tprint(loss.item())" in migration.code
    assert all(set(indent) <= {"\t"} for indent in _indentations(migration.code))


def test_a_form_feed_that_libcst_would_move_is_reported_not_rewritten(project: Path):
    source = "import torch\n\ndef helper():\n\f    a = 1\n    return a\n\nfor step in range(3):\n    torch.cuda.empty_cache()\n"
    (project / "feed.py").write_text(source)
    result = invoke("apply", "feed.py", cwd=project)
    assert result.exit_code == 2
    assert "error: feed.py:5: a form feed inside the indentation cannot be kept byte for byte" in result.stderr
    assert (project / "feed.py").read_text() == source


# -- 10: links, owners, read-only files --------------------------------------------------


def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path: Path):
    (tmp_path / "target").mkdir()
    (tmp_path / "project").mkdir()
    (tmp_path / "target" / "train.py").write_text(LOOP)
    link = tmp_path / "project" / "link.py"
    link.symlink_to("../target/train.py")
    assert invoke("apply", "link.py", cwd=tmp_path / "project").exit_code == 0
    assert link.is_symlink() and os.readlink(link) == "../target/train.py"
    assert (tmp_path / "target" / "train.py").read_text() == MIGRATED
    assert sorted(p.name for p in (tmp_path / "target").iterdir()) == ["train.py"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_the_owner_is_kept(project: Path):
    os.chown(project / "train.py", 4321, 4321)
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    status = (project / "train.py").stat()
    assert (status.st_uid, status.st_gid) == (4321, 4321)
    assert (project / "train.py").read_text() == MIGRATED


def test_a_hard_linked_file_is_refused_so_that_its_links_stay_one_file(project: Path):
    os.link(project / "train.py", project / "backup.txt")
    result = invoke("apply", "train.py", cwd=project)
    assert result.exit_code == 2
    assert "error: train.py: not written: the file has 2 hard links" in result.stderr
    assert (project / "train.py").read_text() == (project / "backup.txt").read_text() == LOOP
    assert (project / "train.py").stat().st_ino == (project / "backup.txt").stat().st_ino
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 1  # a dry run still shows the change


def test_a_read_only_file_is_refused(project: Path):
    (project / "train.py").chmod(0o444)
    (project / "other.py").write_text(LOOP)
    result = invoke("apply", "train.py", "other.py", cwd=project)
    assert result.exit_code == 2
    assert "error: train.py: not written: the file is read-only (mode 444)" in result.stderr
    assert (project / "train.py").read_text() == LOOP and stat.S_IMODE((project / "train.py").stat().st_mode) == 0o444
    assert (project / "other.py").read_text() == MIGRATED


# -- 11: syntax errors at CPython's position ---------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = (1,\nfor i in range(2):\n    torch.cuda.empty_cache()\n",
        "import torch\nfor i in range(2):\n    torch.cuda.empty_cache()\n  y = 1\n",
        "import torch\ndef f(:\n    torch.cuda.empty_cache()\n",
        "import torch\nfor i in range(2):\n    torch.cuda.empty_cache(]\n",
    ],
    ids=["unclosed", "dedent", "def", "bracket"],
)
def test_syntax_errors_are_reported_at_cpythons_position_with_its_message(project: Path, source: str):
    (project / "broken.py").write_text(source)
    with pytest.raises(SyntaxError) as raised:
        compile(source, "broken.py", "exec")
    error = raised.value
    expected = f"error: broken.py:{error.lineno}:{error.offset}: syntax error: {error.msg}"
    for command in (["apply"], ["check"]):
        result = invoke(*command, "broken.py", cwd=project)
        assert result.exit_code == 2
        assert error_lines(result.stderr) == [expected]


# -- 12: temporary files left by a killed run --------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _unreaped_child() -> subprocess.Popen:
    """A process that has ended but that its parent has not waited for (as a
    killed worker's, until someone reaps it): it still answers os.kill."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = Path(f"/proc/{child.pid}/stat").read_text()
        if state[state.rfind(")") + 2] == "Z":
            break
        time.sleep(0.01)
    return child


def test_a_later_apply_removes_the_temporary_files_it_can_prove_stale(project: Path):
    an_hour_and_more = time.time() - 2 * 3600
    two_minutes_ago = time.time() - 120
    dead = _dead_pid()
    stale = {
        f".train.py.{dead}.abcd_123.accelmigrate": two_minutes_ago,  # its writer is gone
        ".train.py.k2j4h5g6.accelmigrate": an_hour_and_more,  # no process id: old enough
    }
    if Path("/proc/self/stat").exists():
        unreaped = _unreaped_child()
        stale[f".train.py.{unreaped.pid}.zomb_123.accelmigrate"] = two_minutes_ago
    kept = {
        f".train.py.{os.getpid()}.efgh_456.accelmigrate": two_minutes_ago,  # its writer still runs
        f".train.py.{dead}.ijkl_789.accelmigrate": time.time(),  # too recent to be sure
        ".train.py.mnop_012.accelmigrate": two_minutes_ago,
        ".notes.txt.swp": an_hour_and_more,  # not ours
    }
    for name, when in {**stale, **kept}.items():
        (project / name).write_text("half a file")
        os.utime(project / name, (when, when))
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 1
    assert all((project / name).exists() for name in stale)  # a dry run writes and removes nothing
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    assert sorted(p.name for p in project.iterdir()) == sorted(["train.py", *kept])
    if Path("/proc/self/stat").exists():
        unreaped.wait()


# -- kill -9 in the middle of apply -------------------------------------------------------

KILL_TEST_FILES = 300


def _tree_of_copies(folder: Path, count: int) -> None:
    for i in range(count):
        sub = folder / f"pkg{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"train_{i:03d}.py").write_text(LOOP.replace("range(3)", f"range({i + 1})"))


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _apply(folder: Path, jobs: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "accelmigrate", "apply", ".", "--jobs", str(jobs)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def test_kill_9_during_apply_leaves_every_file_whole(tmp_path: Path):
    """SIGKILL to `apply` and its workers at random moments while it writes:
    every file is byte for byte its original or its migrated form, and a
    later run finishes the job and removes what the killed one left."""
    seed = random.randrange(2**32)
    chance = random.Random(seed)
    originals_folder, reference = tmp_path / "originals", tmp_path / "reference"
    _tree_of_copies(originals_folder, KILL_TEST_FILES)
    shutil.copytree(originals_folder, reference)
    started = time.monotonic()
    assert _apply(reference, 2).wait(timeout=300) == 0
    full_run = time.monotonic() - started
    originals, migrated = _contents(originals_folder), _contents(reference)
    assert all(migrated[name] != originals[name] for name in originals)

    mixed_trials = 0
    for trial in range(4):
        folder = tmp_path / f"trial{trial}"
        shutil.copytree(originals_folder, folder)
        first = folder / "pkg0" / "train_000.py"
        process = _apply(folder, jobs=1 + trial % 2)
        while first.read_bytes() == originals["pkg0/train_000.py"] and process.poll() is None:
            time.sleep(0.005)  # writing has begun
        time.sleep(chance.uniform(0, full_run / 3))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        after = _contents(folder)
        left_behind = [name for name in after if name not in originals]
        assert all(Path(name).name.endswith(".accelmigrate") and Path(name).name.startswith(".") for name in left_behind), (seed, left_behind)
        for name in originals:
            assert after[name] in (originals[name], migrated[name]), (seed, trial, name)
        done = sum(after[name] == migrated[name] for name in originals)
        mixed_trials += 0 < done < len(originals)
    assert mixed_trials >= 1, f"no kill landed in the middle of a run (seed {seed})"

    for name in left_behind:  # a minute on, as a later run would find them
        os.utime(folder / name, (time.time() - 120, time.time() - 120))
    assert _apply(folder, 2).wait(timeout=300) == 0
    assert _contents(folder) == migrated, seed


def test_a_diff_breaks_lines_where_python_does_not_at_form_feeds(project: Path):
    source = LOOP.replace("import torch\n", "import torch\n\f\n").replace("x = torch.ones(2)", "x = torch.ones(2)  # \f page")
    (project / "paged.py").write_text(source)
    result = invoke("apply", "--diff", "paged.py", cwd=project)
    assert result.exit_code == 1
    lines = result.stdout.split("\n")[:-1]
    assert all(line[:1] in " -+@" for line in lines[2:]), lines
    assert "@@ -3,4 +3,3 @@" in result.stdout and "     x = torch.ones(2)  # \f page" in lines


# -- lone carriage returns, which Python reads as line ends -------------------------------

LONE_CRS = {
    "in a comment": "# a\rb = 1\nimport torch\nfor step in range(2):\n    torch.cuda.empty_cache()\nprint(b)\n",
    "in a CRLF file": "x = 1\ry = 2\r\nimport torch\r\nfor step in range(2):\r\n    torch.cuda.empty_cache()\r\nprint(x, y)\r\n",
    "after a backslash in a string": 'import torch\ns = "a\\\rb"\nfor step in range(2):\n    torch.cuda.empty_cache()\nprint(s)\n',
}


@pytest.mark.parametrize("case", list(LONE_CRS))
def test_lone_carriage_returns_are_line_ends_as_python_reads_them(tmp_path, case):
    original = tmp_path / "original.py"
    original.write_bytes(LONE_CRS[case].encode())
    expected = subprocess.run([sys.executable, str(original)], capture_output=True, text=True, check=True).stdout
    for words in ("empty-cache", "device,amp"):
        script = tmp_path / f"train_{words.replace(',', '_')}.py"
        script.write_bytes(LONE_CRS[case].encode())
        result = invoke("apply", script.name, "--to", words, cwd=tmp_path)
        assert result.exit_code == 0, result.output
        assert "internal error" not in result.output
        ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert ran.returncode == 0 and ran.stdout == expected, ran.stderr
    assert "torch.cuda.empty_cache()" not in (tmp_path / "train_empty-cache.py").read_text()
