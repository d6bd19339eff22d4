"""The tests' launcher reruns a run that gloo's teardown aborted: in a
working folder of its own it starts clean, in a shared one it touches
nothing another launch wrote, and its own output folder (`--out`) starts
clean wherever it works."""

import sys

from conftest import GLOO_CONNECT_FAILURE, TEARDOWN_ABORT, run_launch
from launching import Launch, cpu_env

# Aborts as gloo's teardown does the first time (leaving a file behind), then succeeds.
ABORTS_ONCE = f"""\
import pathlib, sys
marker = pathlib.Path(sys.argv[1]) / "aborted-once"
if not marker.exists():
    marker.write_text("")
    pathlib.Path("half-written.txt").write_text("from the aborted run")
    sys.stderr.write({TEARDOWN_ABORT!r})
    sys.exit(134)
print("done")
"""


def _aborting_script(tmp_path):
    script, markers = tmp_path / "aborts_once.py", tmp_path / "markers"
    script.write_text(ABORTS_ONCE)
    markers.mkdir()
    return [sys.executable, str(script), str(markers)]


def test_a_rerun_in_its_own_folder_starts_clean(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    launch = Launch(tmp_path, "alone", _aborting_script(tmp_path), cpu_env(), own).wait().succeeded()
    assert launch.stdout == "done\n"
    assert not (own / "half-written.txt").exists()


def test_a_rerun_in_a_shared_folder_keeps_what_the_others_wrote(tmp_path):
    command = _aborting_script(tmp_path)
    first = Launch(tmp_path, "first", command, cpu_env(), tmp_path)
    second = Launch(tmp_path, "second", [sys.executable, "-c", "print('second')"], cpu_env(), tmp_path)
    assert first.wait().succeeded().stdout == "done\n"
    assert second.wait().succeeded().stdout == "second\n"



# Writes a checkpoint into its output folder each run, and aborts the first time.
WRITES_THEN_ABORTS_ONCE = f"""\
import os, pathlib, sys
markers, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(out / f"final-{{os.getpid()}}.pt").write_text("")
if not (markers / "aborted-once").exists():
    (markers / "aborted-once").write_text("")
    sys.stderr.write({TEARDOWN_ABORT!r})
    sys.exit(134)
"""


def test_a_rerun_clears_its_own_output_folder_in_a_shared_working_folder(tmp_path):
    script, markers, out = tmp_path / "writes.py", tmp_path / "markers", tmp_path / "out"
    script.write_text(WRITES_THEN_ABORTS_ONCE)
    markers.mkdir()
    out.mkdir()
    first = Launch(tmp_path, "first", [sys.executable, str(script), str(markers), str(out)], cpu_env(), tmp_path, outputs=out)
    other = Launch(tmp_path, "other", [sys.executable, "-c", "print('other')"], cpu_env(), tmp_path)
    first.wait().succeeded()
    assert other.wait().succeeded().stdout == "other\n"
    assert len(list(out.iterdir())) == 1  # the rerun's checkpoint alone


# Fails as gloo's first connection on a loaded machine can, once, then succeeds.
FAILS_TO_CONNECT_ONCE = f"""\
import pathlib, sys
marker = pathlib.Path(sys.argv[1]) / "failed-once"
if not marker.exists():
    marker.write_text("")
    sys.stderr.write("RuntimeError: " + {GLOO_CONNECT_FAILURE!r} + " with [pair.cc:553] Connection closed by peer")
    sys.exit(1)
print("done")
"""


def test_a_launch_whose_gloo_group_failed_to_connect_is_rerun(tmp_path):
    script, markers = tmp_path / "fails_once.py", tmp_path / "markers"
    script.write_text(FAILS_TO_CONNECT_ONCE)
    markers.mkdir()
    command = [sys.executable, str(script), str(markers)]
    assert Launch(tmp_path, "alone", command, cpu_env(), tmp_path).wait().succeeded().stdout == "done\n"
    (markers / "failed-once").unlink()
    assert run_launch(command, env=cpu_env(), cwd=tmp_path).stdout == "done\n"
