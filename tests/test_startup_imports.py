"""Pay only for what runs: the registry's manifest matches the codemod
classes, and a check of a file no codemod can touch imports neither LibCST,
black, rich nor torch (nor the commands that run scripts)."""

import json
import subprocess
import sys
import textwrap

import pytest

from accelmigrate.codemods import _manifest, _options, all_codemods

from conftest import ROOT

HEAVY = ("libcst", "black", "rich", "torch", "accelmigrate.launch.runner", "accelmigrate.launch.profiler", "accelmigrate.launch.verify")
REGENERATE = "python -m accelmigrate.codemods._manifest"
CLEAN = 'import os\n\n\ndef joined(folder):\n    return os.path.join(folder, "a")\n'


def modules_after(*args: str, cwd, stdin: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the CLI in a fresh interpreter; the heavy modules loaded when it exits."""
    code = textwrap.dedent(
        f"""\
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps(sorted(
            m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r})), file=sys.stderr))
        sys.argv = ["accelmigrate", *{list(args)!r}]
        from accelmigrate.cli import main
        main()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120)
    return done, json.loads(done.stderr.strip().splitlines()[-1])


def test_manifest_matches_the_classes():
    expected = _manifest.generated()
    assert list(_manifest.CODEMODS) == list(expected), f"codemods added or renamed: run `{REGENERATE}`"
    for word, entry in expected.items():
        assert _manifest.CODEMODS[word] == entry, f"{word}: the manifest differs from its class: run `{REGENERATE}`"


SAMPLE_OPTIONS = [
    {}, {"value": ""}, {"value": "x"}, {"value": "1"}, {"value": "4"}, {"value": "per-process"}, {"value": "global"},
    {"value": "per_process"}, {"value": "none"}, {"value": "0"}, {"max_workers": "8"}, {"max_workers": "none"},
    {"max_workers": "-1"}, {"persistent": "true"}, {"persistent": "maybe"}, {"value": "3", "persistent": "off"},
]


@pytest.mark.parametrize("word", sorted(all_codemods()))
def test_option_checks_answer_as_the_class_does(word):
    """The registry checks options without the classes: the same errors, the same keys read."""
    from accelmigrate.engine.config import _ReadKeys

    cls = all_codemods()[word]
    for options in SAMPLE_OPTIONS:
        answers = []
        for check in (cls.check_options, lambda o: _options.check(word, o)):
            recorded = _ReadKeys(options)
            try:
                check(recorded)
                answers.append((None, recorded.read))
            except ValueError as error:
                answers.append((str(error), recorded.read))
        assert answers[0] == answers[1], f"{word} {options}: codemods/_options.py answers differently from the class"


def test_clean_file_check_imports_nothing_heavy(tmp_path):
    (tmp_path / "clean.py").write_text(CLEAN)
    done, heavy = modules_after("check", "clean.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert heavy == []


def test_clean_file_from_stdin_and_apply_import_nothing_heavy(tmp_path):
    (tmp_path / "clean.py").write_text(CLEAN)
    done, heavy = modules_after("check", "-", "--stdin-filename", "clean.py", cwd=tmp_path, stdin=CLEAN)
    assert done.returncode == 0, done.stderr
    assert heavy == []
    done, heavy = modules_after("apply", "clean.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert heavy == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["check", "--help"]])
def test_version_and_help_import_nothing_heavy(tmp_path, args):
    done, heavy = modules_after(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert heavy == []


def test_help_lists_the_lazy_commands(tmp_path):
    done, heavy = modules_after("--help", cwd=tmp_path)
    for name in ("run", "profile", "verify", "check", "apply"):
        assert f"  {name} " in done.stdout


def test_a_lazy_command_is_imported_when_its_help_is_asked(tmp_path):
    done, heavy = modules_after("verify", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "accelmigrate.launch.verify" in heavy and "torch" not in heavy


def test_training_script_check_still_finds_what_it_did(tmp_path):
    done, heavy = modules_after("check", str(ROOT / "fixtures" / "scripts" / "char_lstm.py"), cwd=tmp_path)
    assert done.returncode == 1
    assert "AM201" in done.stdout and "libcst" in heavy and "torch" not in heavy
