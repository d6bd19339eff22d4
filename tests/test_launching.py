"""The tests' launcher reruns a run that gloo's teardown aborted: in a
working folder of its own it starts clean, in a shared one it touches
nothing another launch wrote."""

import sys

from conftest import TEARDOWN_ABORT
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
