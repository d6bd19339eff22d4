"""The result cache (`.accelmigrate_cache/`): a second run over unchanged
files answers from it without running the codemods; anything that could
change a result (the content, the words and options, the mode, the tool's
own source) misses it; `--no-cache` neither reads nor writes it; a damaged
entry is a miss; git ignores the folder."""

import json
import multiprocessing
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelmigrate.cli import main
from accelmigrate.codemods import Finding
from accelmigrate.engine import cache as cache_module
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.cache import CACHE_DIR_VARIABLE, CACHE_FOLDER_NAME, ResultCache, source_digest, tool_source_files
from accelmigrate.engine.migrate import Migration, process_files

LOOP = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        x = torch.ones(2)
        torch.cuda.empty_cache()
    """
)
MIGRATED = LOOP.replace("    torch.cuda.empty_cache()\n", "")
CLEAN = "import torch\n\nx = torch.ones(2)\n"
EMPTY_CACHE = [("empty-cache", {})]


@pytest.fixture(autouse=True)
def cache_at_the_project_root(monkeypatch, tmp_path_factory):
    monkeypatch.delenv(CACHE_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))  # the user's secret


def payload(entry: Path) -> dict:
    """An entry's JSON, after its signature line."""
    return json.loads(entry.read_bytes().partition(b"\n")[2])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LOOP)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


@pytest.fixture
def migrations(monkeypatch) -> list[str]:
    """The paths that went through the codemods (engine.migrate_source)."""
    seen: list[str] = []
    real = engine.migrate_source

    def migrate(source, plan, path="<string>", **kwargs):
        seen.append(Path(path).name)
        return real(source, plan, path, **kwargs)

    monkeypatch.setattr(engine, "migrate_source", migrate)
    return seen


def invoke(*args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{CACHE_FOLDER_NAME}/*/*.json"))


def outcome(results) -> list[tuple]:
    return [(r.path, r.migrated, r.error, r.findings) for r in results]


# -- hits and misses -------------------------------------------------------------------------


def test_a_second_check_of_an_unchanged_folder_runs_no_codemod(project: Path, migrations):
    first = invoke("check", ".", "--jobs", "1", cwd=project)
    assert first.exit_code == 1 and sorted(migrations) == ["clean.py", "train.py"]
    assert len(entries(project)) == 2
    migrations.clear()
    second = invoke("check", ".", "--jobs", "1", cwd=project)
    assert (second.exit_code, second.stdout, second.stderr) == (first.exit_code, first.stdout, first.stderr)
    assert "AM210" in second.stdout and migrations == []


def test_an_edited_file_is_checked_again(project: Path, migrations):
    invoke("check", ".", "--jobs", "1", "--to", "empty-cache", cwd=project)
    (project / "train.py").write_text(LOOP.replace("    x = torch.ones(2)\n", "    x = torch.ones(2)\n    y = x * 2\n"))
    migrations.clear()
    result = invoke("check", ".", "--jobs", "1", "--to", "empty-cache", cwd=project)
    assert migrations == ["train.py"]
    assert "train.py:6:5: AM210" in result.stdout  # the finding moved down with the edit


@pytest.mark.parametrize(
    "first, second",
    [
        (["check", "--to", "empty-cache"], ["check", "--to", "empty-cache,item"]),
        (["check", "--to", "accumulate=4"], ["check", "--to", "accumulate=8"]),  # another option value
        (["check", "--to", "empty-cache"], ["apply", "--diff", "--to", "empty-cache"]),  # another mode
    ],
    ids=["words", "options", "mode"],
)
def test_other_words_options_or_mode_miss_the_cache(project: Path, migrations, first, second):
    invoke(*first, ".", "--jobs", "1", cwd=project)
    migrations.clear()
    invoke(*second, ".", "--jobs", "1", cwd=project)
    assert sorted(migrations) == ["clean.py", "train.py"]


def test_an_edit_of_the_tool_misses_the_cache(project: Path, migrations, monkeypatch):
    invoke("check", ".", "--jobs", "1", cwd=project)
    monkeypatch.setattr(cache_module, "tool_version", lambda: "an edited codemod")
    migrations.clear()
    invoke("check", ".", "--jobs", "1", cwd=project)
    assert sorted(migrations) == ["clean.py", "train.py"]


def test_the_tool_version_hashes_the_engine_and_every_codemod(tmp_path: Path):
    names = {path.name for path in tool_source_files()}
    assert {"migrate.py", "line_map.py", "cache.py", "workers.py", "precheck.py", "rules.py"} <= names
    (tmp_path / "a.py").write_text("x = 1\n")
    before = source_digest([tmp_path / "a.py"])
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_digest([tmp_path / "a.py"]) != before


def test_the_same_content_at_another_path_is_another_entry(project: Path, migrations):
    (project / "copy.py").write_text(LOOP)
    invoke("check", ".", "--jobs", "1", cwd=project)
    assert sorted(migrations) == ["clean.py", "copy.py", "train.py"]  # messages carry the path


def test_apply_writes_a_cached_change(project: Path, migrations):
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 1
    migrations.clear()
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    assert migrations == [] and (project / "train.py").read_text() == MIGRATED
    assert invoke("apply", "--diff", "train.py", cwd=project).exit_code == 0  # new content: migrated, nothing pending
    assert migrations == ["train.py"]


def test_a_file_that_cannot_be_migrated_keeps_its_error(project: Path, migrations):
    (project / "broken.py").write_text("for x in y:\npass\n")
    first = invoke("check", "broken.py", cwd=project)
    migrations.clear()
    second = invoke("check", "broken.py", cwd=project)
    assert first.exit_code == second.exit_code == 2 and migrations == []
    assert second.stderr == first.stderr
    assert "error: broken.py:2:1: syntax error: expected an indented block" in second.stderr


def test_a_failed_codemod_is_not_kept(project: Path, monkeypatch):
    """AM000 may not recur (out of memory, a bug fixed): try again next time."""
    calls: list[str] = []

    def failing(source, plan, path="<string>", **kwargs):
        calls.append(path)
        return Migration(source, [Finding(1, 1, engine.CODEMOD_FAILED, "codemod 'item' failed", False, "item")])

    monkeypatch.setattr(engine, "migrate_source", failing)
    invoke("check", "train.py", cwd=project)
    invoke("check", "train.py", cwd=project)
    assert calls == ["train.py", "train.py"] and entries(project) == []


# -- bypassing, damage, several processes ---------------------------------------------------


@pytest.mark.parametrize("command", [["check"], ["apply", "--diff"], ["apply"]])
def test_no_cache_writes_nothing(project: Path, command):
    invoke(*command, "--no-cache", ".", cwd=project)
    assert not (project / CACHE_FOLDER_NAME).exists()


def test_no_cache_reads_nothing(project: Path, migrations):
    invoke("check", ".", "--jobs", "1", cwd=project)
    migrations.clear()
    invoke("check", "--no-cache", ".", "--jobs", "1", cwd=project)
    assert sorted(migrations) == ["clean.py", "train.py"]


@pytest.mark.parametrize(
    "damage",
    ["", "{not json", json.dumps({"migrated": None}), json.dumps({"migrated": 3, "findings": [], "error": None}),
     json.dumps({"migrated": None, "findings": [[1, "one", "AM210", "m", False, "empty-cache"]], "error": None})],
    ids=["empty", "not json", "a key missing", "wrong type", "a wrong finding"],
)
def test_a_damaged_entry_is_a_miss_and_is_replaced(project: Path, migrations, damage: str):
    first = invoke("check", "train.py", cwd=project)
    (entry,) = entries(project)
    entry.write_text(damage)
    migrations.clear()
    second = invoke("check", "train.py", cwd=project)
    assert migrations == ["train.py"] and second.stdout == first.stdout
    assert payload(entry)["findings"]  # written again, whole


def test_an_unreadable_cache_folder_costs_nothing_but_speed(project: Path):
    (project / CACHE_FOLDER_NAME).write_text("a file where the folder would be")
    result = invoke("apply", "train.py", cwd=project)
    assert result.exit_code == 0 and (project / "train.py").read_text() == MIGRATED


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the tripwire is inherited by forked workers")
def test_worker_processes_share_the_cache(project: Path, monkeypatch):
    for i in range(8):
        (project / f"copy{i}.py").write_text(LOOP.replace("range(3)", f"range({i + 1})"))
    paths = sorted(str(p) for p in project.glob("*.py"))
    first = process_files(paths, EMPTY_CACHE, check_only=True, jobs=2, cache_folder=project / CACHE_FOLDER_NAME)
    assert len(entries(project)) == len(paths)
    assert not [p for p in (project / CACHE_FOLDER_NAME).rglob("*") if p.name.endswith(".tmp")]

    def tripwire(*args, **kwargs):
        raise AssertionError("the codemods ran on a cached file")

    monkeypatch.setattr(engine, "migrate_source", tripwire)  # forked workers inherit it
    second = process_files(paths, EMPTY_CACHE, check_only=True, jobs=2, cache_folder=project / CACHE_FOLDER_NAME)
    assert outcome(second) == outcome(first) and not any(r.error for r in second)


# -- where it lives ---------------------------------------------------------------------------


def test_the_cache_lives_at_the_folder_of_the_nearest_pyproject(tmp_path: Path):
    (tmp_path / "repo" / "src").mkdir(parents=True)
    (tmp_path / "repo" / "pyproject.toml").write_text("[tool.accelmigrate]\n")
    (tmp_path / "repo" / "src" / "train.py").write_text(LOOP)
    (tmp_path / "elsewhere").mkdir()
    invoke("check", tmp_path / "repo" / "src", cwd=tmp_path / "elsewhere")
    assert len(entries(tmp_path / "repo")) == 1
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_without_a_pyproject_the_cache_lives_in_the_current_folder(project: Path):
    invoke("check", "train.py", cwd=project)
    assert len(entries(project)) == 1


def test_the_cache_folder_can_be_put_elsewhere(project: Path, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("caches") / "accelmigrate"
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(elsewhere))
    invoke("check", "train.py", cwd=project)
    assert not (project / CACHE_FOLDER_NAME).exists() and len(list(elsewhere.glob("*/*.json"))) == 1


def test_git_ignores_the_cache_folder(project: Path):
    git = lambda *args: subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True)  # noqa: E731
    git("init", "-q")
    invoke("check", ".", cwd=project)
    assert (project / CACHE_FOLDER_NAME / ".gitignore").read_text().splitlines()[-1] == "*"
    untracked = git("status", "--porcelain", "--untracked-files=all").stdout.split()
    assert sorted(untracked) == ["??", "??", "clean.py", "train.py"]


def test_the_project_s_own_gitignore_names_the_cache_folder():
    gitignore = Path(__file__).resolve().parent.parent / ".gitignore"
    assert f"{CACHE_FOLDER_NAME}/" in gitignore.read_text().splitlines()


def test_a_cache_entry_round_trips(tmp_path: Path):
    from accelmigrate.engine.cache import Outcome
    from accelmigrate.files.sources import SourceText

    cache = ResultCache.open(tmp_path / "cache", {"plan": EMPTY_CACHE})
    finding = Finding(5, 5, "AM210", "removed", True, "empty-cache")
    key = cache.key("train.py", SourceText(LOOP, "utf-8"))
    source = SourceText(LOOP, "utf-8")
    assert cache.get(key, source) is None
    cache.put(key, Outcome(MIGRATED, [finding]), source)
    assert cache.get(key, source) == Outcome(MIGRATED, [finding])
    assert key != cache.key("train.py", SourceText(LOOP, "latin-1"))  # written back in another encoding
