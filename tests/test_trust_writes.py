"""What `apply` writes: never over a save made while it ran (the file is
checked before the rename, and the loser of two runs at once refuses),
old Mac line ends kept, and sizes it cannot migrate safely refused."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import MAX_SOURCE_BYTES, process_file

LOOP = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2).cuda()
        torch.cuda.empty_cache()
    """
)
SAVED = LOOP + "print('saved by the editor')\n"
CHANGED = "changed while it was being migrated; not written"

# `accelmigrate ...` that, for the file named $PAUSE_ON, stops between
# reading and writing: it touches $READY, then waits for $GO.
PAUSED_CLI = textwrap.dedent(
    """\
    import os, sys, time
    from pathlib import Path
    from accelmigrate.engine import migrate as engine
    from accelmigrate.cli import main

    real = engine.write_atomically

    def paused(path, *args, **kwargs):
        if Path(path).name == os.environ["PAUSE_ON"]:
            Path(os.environ["READY"]).touch()
            while not Path(os.environ["GO"]).exists():
                time.sleep(0.01)
        return real(path, *args, **kwargs)

    engine.write_atomically = paused
    sys.argv = ["accelmigrate", *sys.argv[1:]]
    main()
    """
)


def start_paused(folder: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    driver = folder.parent / "paused_cli.py"
    driver.write_text(PAUSED_CLI)
    ready = folder.parent / f"ready-{name}"
    env = {**os.environ, "PAUSE_ON": "train.py", "READY": str(ready), "GO": str(folder.parent / "go")}
    command = [sys.executable, str(driver), "apply", "--no-cache", "--jobs", "1", *args]
    return subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), ready


def wait_for(ready: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "never reached the write"
        time.sleep(0.02)


def migrated(tmp_path: Path, text: str, words: str) -> str:
    copy = tmp_path / "expected" / words / "train.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(text)
    return process_file(str(copy), [(words, {})]).migrated


def test_a_save_made_while_apply_runs_survives(tmp_path: Path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(LOOP)
    (folder / "other.py").write_text(LOOP)
    process, ready = start_paused(folder, "apply", "--to", "empty-cache", "other.py", "train.py")
    wait_for(ready, process)
    (folder / "train.py").write_text(SAVED)  # the editor's save, after apply read the file
    (tmp_path / "go").touch()
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, (out, err)
    assert f"train.py: {CHANGED}" in err
    assert (folder / "train.py").read_text() == SAVED
    assert (folder / "other.py").read_text() == migrated(tmp_path, LOOP, "empty-cache")  # the other file is written
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_of_two_applies_at_once_on_one_file_the_later_refuses(tmp_path: Path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(LOOP)
    runs = {words: start_paused(folder, words, "--to", words, "train.py") for words in ("empty-cache", "device")}
    for process, ready in runs.values():
        wait_for(ready, process)  # both have read the same file
    (tmp_path / "go").touch()  # and now both write
    done = {words: (process, *process.communicate(timeout=120)) for words, (process, _) in runs.items()}
    codes = sorted(process.returncode for process, _, _ in done.values())
    assert codes == [0, 2], done
    (winner,) = [words for words, (process, _, _) in done.items() if process.returncode == 0]
    (loser,) = [words for words, (process, _, _) in done.items() if process.returncode == 2]
    assert CHANGED in done[loser][2]
    assert (folder / "train.py").read_text() == migrated(tmp_path, LOOP, winner)  # whole, not a mix


def test_a_file_read_but_not_changed_meanwhile_is_written(tmp_path: Path):
    (tmp_path / "train.py").write_text(LOOP)
    result = process_file(str(tmp_path / "train.py"), [("empty-cache", {})], write=True)
    assert result.written and result.error is None


# -- old Mac line ends --------------------------------------------------------------------------


def test_old_mac_line_ends_are_migrated_and_kept(tmp_path: Path):
    """CPython reads a file whose lines end in "\r" alone: it is migrated as
    the same file with "\n" would be, its line ends kept."""
    plan = [("empty-cache", {}), ("device", {})]
    (tmp_path / "unix.py").write_text(LOOP)
    expected = process_file(str(tmp_path / "unix.py"), plan)
    file = tmp_path / "train.py"
    file.write_bytes(LOOP.replace("\n", "\r").encode())
    result = process_file(str(file), plan, write=True)
    assert result.error is None and result.written
    assert file.read_bytes().decode() == expected.migrated.replace("\n", "\r")
    assert result.findings == expected.findings and expected.migrated != LOOP


# -- sizes --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_file_whose_one_line_is_a_megabyte_is_answered(tmp_path: Path):
    """Generated code or an embedded table: the cost stays linear (some 40 s
    of CPU for this megabyte, most of it black deciding whether the file is
    black-formatted), so it ends well within the timeout."""
    table = ", ".join(str(i) for i in range(150_000))  # about 1 MB on one line
    (tmp_path / "table.py").write_text(f"import torch\n\nTABLE = [{table}]\n\n" + LOOP.split("\n", 2)[2])
    done = subprocess.run(
        [sys.executable, "-m", "accelmigrate", "apply", "--no-cache", "--to", "empty-cache", "table.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "table.py").read_text()
    assert "empty_cache" not in written and f"TABLE = [{table}]\n" in written


def test_a_file_over_the_size_limit_is_refused_and_the_others_processed(tmp_path: Path):
    big = tmp_path / "generated.py"
    big.write_text("import torch\n" + "x = 1\n" * (MAX_SOURCE_BYTES // 6) + LOOP)
    (tmp_path / "train.py").write_text(LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "accelmigrate", "apply", "--no-cache", "--to", "empty-cache", "generated.py", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    line = next(line for line in done.stderr.splitlines() if "generated.py" in line)
    assert "over the 2 MB that can be migrated safely; skipped" in line
    assert big.read_text().endswith(LOOP) and "empty_cache" not in (tmp_path / "train.py").read_text()


def test_a_notebook_is_measured_by_its_code_cells_not_its_outputs(tmp_path: Path):
    """Plots saved in a notebook make it megabytes; its code is what costs."""
    from test_notebook import code, lines, notebook

    picture = {"data": {"image/png": "A" * (3 * MAX_SOURCE_BYTES // 2)}, "metadata": {}, "output_type": "display_data"}
    file = tmp_path / "train.ipynb"
    file.write_text(json.dumps(notebook(code(lines(LOOP), 1, [picture]))))
    result = process_file(str(file), [("empty-cache", {})], write=True)
    assert result.error is None and result.written
    assert "empty_cache" not in "".join(json.loads(file.read_text())["cells"][0]["source"])
    big = tmp_path / "generated.ipynb"
    big.write_text(json.dumps(notebook(code(lines("x = 1\n" * (MAX_SOURCE_BYTES // 6 + 1))))))
    assert "code cells of 2.0 MB, over the 2 MB" in process_file(str(big), [("empty-cache", {})]).error
