"""`check` as a lint and the output formats: findings worded as what to act
on, notes hidden unless asked for, the files `apply` changed, JSON with
diffs, GitHub annotations, SARIF validated against the 2.1.0 schema,
`explain CODE`, `list`, and configuration mistakes reported where they were
made."""

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from conftest import ROOT, SCRIPTS
from test_cli import CLEAN, LOOP_WITH_EMPTY_CACHE, invoke

SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"
OUTSIDE_A_LOOP = "import torch\n\nx = torch.ones(2)\ntorch.cuda.empty_cache()\n"
# One line with two codes of two codemods: item's AM201 and empty-cache's AM212.
TWO_CODES_ON_ONE_LINE = """\
import torch

model = torch.nn.Linear(2, 1)
total = 0.0
for step in range(3):
    loss = model(torch.ones(2)).sum()
    loss.backward()
    total += loss; torch.cuda.empty_cache()  # accelmigrate: skip[CODE]
print(total / 3)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LOOP_WITH_EMPTY_CACHE)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


# -- check as a lint ---------------------------------------------------------------


def test_check_says_what_to_act_on_and_apply_what_it_did(project: Path):
    check = invoke("check", "train.py", cwd=project)
    assert check.exit_code == 1
    assert check.stdout == (
        "train.py:5:5: AM210 [*] torch.cuda.empty_cache() in a loop body synchronises the device every iteration "
        "(fixable with `accelmigrate apply --to empty-cache`)\n"
    )
    assert "[*] 1 fixable with `accelmigrate apply --to empty-cache`" in check.stderr
    apply = invoke("apply", "--show-fixes", "train.py", "clean.py", cwd=project)
    assert apply.exit_code == 0
    assert apply.stdout.startswith("train.py:5:5: AM210 removed torch.cuda.empty_cache() from a loop body")
    assert "changed train.py: empty-cache\n" in apply.stderr
    assert "clean.py" not in apply.stderr


def test_a_fixable_finding_names_the_value_it_was_checked_with(project: Path):
    (project / "loop.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloader = DataLoader(torch.ones(8, 2), batch_size=2)\n"
        "for x in loader:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n"
    )
    result = invoke("check", "--to", "accumulate=4", "loop.py", cwd=project)
    assert "fixable with `accelmigrate apply --to accumulate=4`" in result.stdout, result.stdout + result.stderr


def test_notes_are_hidden_unless_asked_for_and_never_fail(project: Path):
    (project / "once.py").write_text(OUTSIDE_A_LOOP)
    hidden = invoke("check", "once.py", cwd=project)
    assert hidden.exit_code == 0
    assert hidden.stdout == ""
    assert "1 note(s) hidden (--show-notes)" in hidden.stderr
    shown = invoke("check", "--show-notes", "once.py", cwd=project)
    assert shown.exit_code == 0
    assert shown.stdout.startswith("once.py:4:1: AM211 note: ")
    as_json = invoke("check", "--show-notes", "--format", "json", "once.py", cwd=project)
    assert [f["severity"] for f in json.loads(as_json.stdout)[0]["findings"]] == ["note"]
    assert json.loads(invoke("check", "--format", "json", "once.py", cwd=project).stdout)[0]["findings"] == []


@pytest.mark.parametrize("skipped, reported", [("AM212", "AM201"), ("AM201", "AM212")])
def test_skip_silences_exactly_the_code_named(project: Path, skipped: str, reported: str):
    (project / "both.py").write_text(TWO_CODES_ON_ONE_LINE.replace("CODE", skipped))
    result = invoke("check", "--to", "item,empty-cache", "--format", "json", "both.py", cwd=project)
    assert [f["code"] for f in json.loads(result.stdout)[0]["findings"]] == [reported]


@pytest.mark.parametrize("words", [None, "modernize,workers,item,empty-cache,device"])
def test_check_after_apply_with_the_same_words_passes_on_the_bundled_scripts(tmp_path: Path, words):
    scripts = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, scripts)
    chosen = ["--to", words] if words else []
    applied = invoke("apply", "--no-cache", "--format", "json", *chosen, ".", cwd=scripts)
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    left = sorted((r["path"], f["code"]) for r in json.loads(applied.stdout) for f in r["findings"] if not f["fixed"] and f["severity"] != "note")
    checked = invoke("check", "--no-cache", "--format", "json", *chosen, ".", cwd=scripts)
    # What check still reports is exactly what apply left for a manual step
    # (apex_script.py's apex amp, which `--to amp` moves): nothing it could fix.
    assert checked.exit_code == (1 if left else 0), checked.stdout + checked.stderr
    found = [(r["path"], f) for r in json.loads(checked.stdout) for f in r["findings"]]
    assert not [f for _, f in found if f["fixed"]]
    assert sorted((path, f["code"]) for path, f in found) == left


def test_a_file_that_cannot_be_checked_is_not_a_clean_file(project: Path):
    (project / "broken.py").write_text("def broken(:\n    pass\n")
    result = invoke("check", "broken.py", cwd=project)
    assert result.exit_code == 2
    assert "1 file could not be checked" in result.stderr
    assert "finding" not in result.stderr


# -- output formats ------------------------------------------------------------------


def test_apply_json_has_each_files_codemods_and_diff(project: Path):
    result = invoke("apply", "--diff", "--format", "json", "train.py", "clean.py", cwd=project)
    assert result.exit_code == 1
    train, clean = json.loads(result.stdout)
    assert train["codemods"] == ["empty-cache"] and train["changed"] and not train["written"]
    assert train["diff"].startswith("--- a/train.py\n+++ b/train.py\n") and "-    torch.cuda.empty_cache()\n" in train["diff"]
    assert clean["diff"] is None and clean["codemods"] == []
    [fix] = train["findings"]  # apply's record says what was done
    assert fix["fixed"] and fix["severity"] == "warning" and fix["message"].startswith("removed torch.cuda.empty_cache()")


def test_github_annotations(project: Path):
    (project / "broken.py").write_text("def broken(:\n")
    result = invoke("check", "--format", "github", "train.py", "broken.py", cwd=project)
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "::warning file=train.py,line=5,col=5,title=AM210::torch.cuda.empty_cache() in a loop body synchronises "
        "the device every iteration (fixable with `accelmigrate apply --to empty-cache`)"
    )
    assert lines[1].startswith("::error file=broken.py::broken.py:1:12: syntax error")


def test_sarif_validates_against_the_2_1_0_schema(project: Path):
    (project / "once.py").write_text(OUTSIDE_A_LOOP)
    (project / "broken.py").write_text("def broken(:\n")
    result = invoke("check", "--format", "sarif", "--show-notes", "train.py", "once.py", "broken.py", cwd=project)
    assert result.exit_code == 2
    log = json.loads(result.stdout)
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker()).validate(log)
    run = log["runs"][0]
    rules = {rule["id"]: rule for rule in run["tool"]["driver"]["rules"]}
    assert "accelmigrate apply --to empty-cache" in rules["AM210"]["help"]["text"]
    assert [(r["ruleId"], r["level"]) for r in run["results"]] == [("AM210", "warning"), ("AM211", "note")]
    location = run["results"][0]["locations"][0]["physicalLocation"]
    assert location == {"artifactLocation": {"uri": "train.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 5, "startColumn": 5}}
    assert all(run["results"][i]["ruleIndex"] == list(rules).index(run["results"][i]["ruleId"]) for i in range(2))
    assert not run["invocations"][0]["executionSuccessful"]


# -- explain and list -------------------------------------------------------------------


def test_explain_a_code_shows_its_entry_not_the_page(project: Path):
    entry = invoke("explain", "am211", cwd=project)
    assert entry.exit_code == 0
    assert entry.stdout.startswith("AM211  torch.cuda.empty_cache() outside a loop")
    assert "codemod: empty-cache" in entry.stdout and "severity: note" in entry.stdout
    assert "Example" not in entry.stdout  # the page's before/after stays on the page
    as_json = json.loads(invoke("explain", "--format", "json", "AM210", cwd=project).stdout)
    assert as_json["codemod"] == "empty-cache" and as_json["severity"] == "warning"


def test_explain_a_word_with_its_value(project: Path):
    result = invoke("explain", "accumulate=4", cwd=project)
    assert result.exit_code == 0 and "accumulate" in result.stdout and "AM600" in result.stdout


def test_list_json_and_presets(project: Path, monkeypatch):
    import accelmigrate.codemods as registry

    monkeypatch.setattr(registry, "PRESETS", {"everyday": ("workers", "item")}, raising=False)
    listing = json.loads(invoke("list", "--format", "json", cwd=project).stdout)
    assert listing["presets"] == {"everyday": ["workers", "item"]}
    empty_cache = next(c for c in listing["codemods"] if c["word"] == "empty-cache")
    assert empty_cache["notes"] == ["AM211"] and empty_cache["default"] is True
    assert "everyday: workers,item" in invoke("list", cwd=project).stdout


# -- configuration that talks back -------------------------------------------------------


@pytest.mark.parametrize(
    "config, words",
    [
        ('[tool.accelmigrate]\ntoo = ["workers"]\n', ["unknown key 'too' in [tool.accelmigrate]", "did you mean 'to'?"]),
        (
            "[tool.accelmigrate.options.workers]\nmax_wrkers = 8\n",
            ["unknown key 'max_wrkers' in [tool.accelmigrate.options.workers]", "did you mean 'max_workers'?"],
        ),
        ("[tool.accelmigrate.options.wrokers]\nmax_workers = 8\n", ["unknown key 'wrokers'", "did you mean 'workers'?"]),
        ('[tool.accelmigrate]\nto = ["wrokers"]\n', ["[tool.accelmigrate] 'to': unknown codemod 'wrokers'", "did you mean 'workers'?"]),
        ('[tool.accelmigrate]\nto = ["accumulate=1"]\n', ["[tool.accelmigrate] 'to': accumulate"]),
        ("[tool.accelmigrate]\nto = []\n", ["[tool.accelmigrate] 'to' names no codemod"]),
        ('[tool.accelmigrate]\nto = ["checklist=2"]\n', ["[tool.accelmigrate] 'to': the preset 'checklist' takes no value"]),
    ],
)
def test_config_mistakes_name_the_file_and_the_key(project: Path, config: str, words):
    (project / "pyproject.toml").write_text(config)
    result = invoke("check", "train.py", cwd=project)
    assert result.exit_code == 2
    assert f"{project / 'pyproject.toml'}: " in result.stderr
    assert "--to" not in result.stderr
    for word in words:
        assert word in result.stderr


def test_config_options_a_codemod_reads_are_accepted(project: Path):
    (project / "pyproject.toml").write_text("[tool.accelmigrate.options.workers]\nmax_workers = 4\npersistent = true\n")
    assert invoke("check", "clean.py", cwd=project).exit_code == 0


def test_a_preset_with_a_value_on_the_command_line_is_a_usage_error(project: Path):
    result = invoke("check", "--to", "checklist=2", "train.py", cwd=project)
    assert result.exit_code == 2 and "--to: the preset 'checklist' takes no value" in result.stderr


@pytest.mark.parametrize("words", ["", " , "])
def test_empty_to_is_a_usage_error(project: Path, words: str):
    result = invoke("apply", "--to", words, "train.py", cwd=project)
    assert result.exit_code == 2 and "--to: names no codemod" in result.stderr
    assert (project / "train.py").read_text() == LOOP_WITH_EMPTY_CACHE


def test_a_folder_without_python_files_is_an_error_and_the_others_still_run(project: Path):
    (project / "docs").mkdir()
    (project / "docs" / "notes.txt").write_text("nothing to migrate\n")
    result = invoke("apply", "docs", "train.py", cwd=project)
    assert result.exit_code == 2
    assert "no Python files found in docs" in result.stderr
    assert "changed train.py: empty-cache" in result.stderr
