"""No file under the project tree decides what `apply` writes or what `check`
reports: cache entries are signed with a secret of the user's own, outside
the tree; an entry anyone else wrote, edited or damaged is a miss; a cache
folder that is a link is not followed out of the project; a cached
migration holds only for the first-party layout it was made with."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelmigrate.engine import migrate as engine
from accelmigrate.engine.cache import CACHE_DIR_VARIABLE, CACHE_FOLDER_NAME, ResultCache, secret_path, user_secret
from test_cache import LOOP, MIGRATED, invoke

PLANTED = "import os\nos.system('echo planted')\n"


def cli(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, as the user whose home is HOME, with the
    cache at the project root."""
    env = {k: v for k, v in os.environ.items() if k not in (CACHE_DIR_VARIABLE, "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    command = [sys.executable, "-m", "accelmigrate", *args]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120)


def entries(project: Path) -> list[Path]:
    return sorted(p for p in (project / CACHE_FOLDER_NAME).glob("*/*") if p.name.endswith(".json"))


def split_entry(data: bytes) -> tuple[bytes, dict]:
    """An entry's signature line (empty if it has none) and its JSON."""
    head, newline, rest = data.partition(b"\n")
    return (head, json.loads(rest)) if newline else (b"", json.loads(head))


def edited(entry: Path, change) -> None:
    """The entry's JSON changed by CHANGE, its signature line kept."""
    signature, payload = split_entry(entry.read_bytes())
    change(payload)
    text = json.dumps(payload).encode()
    entry.write_bytes(signature + b"\n" + text if signature else text)


def plant(payload: dict) -> None:
    """What an attacker would put: planted code to write, no findings to report."""
    if payload["migrated"] is not None:
        payload["migrated"] = PLANTED
    payload["findings"] = []


@pytest.fixture
def users(tmp_path: Path) -> tuple[Path, Path]:
    homes = tmp_path / "alice", tmp_path / "bob"
    for home in homes:
        home.mkdir()
    return homes


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "train.py").write_text(LOOP)
    return folder


def test_entries_edited_in_the_tree_change_nothing_for_another_user(project: Path, users):
    """One tree (a shared checkout, or one that a pull request or a tarball
    brought with its cache folder), two users with their own home."""
    alice, bob = users
    assert cli(project, alice, "apply", "--diff", "train.py").returncode == 1  # an entry of apply's
    assert cli(project, alice, "check", "train.py").returncode == 1  # and one of check's
    assert len(entries(project)) == 2
    for entry in entries(project):
        edited(entry, plant)
    check = cli(project, bob, "check", "train.py")
    assert check.returncode == 1 and "AM210" in check.stdout  # the planted "pass" is not believed
    applied = cli(project, bob, "apply", "train.py")
    assert applied.returncode == 0, applied.stderr
    assert (project / "train.py").read_text() == MIGRATED


def test_entries_edited_in_the_tree_change_nothing_for_their_own_user(project: Path, users):
    alice, _ = users
    cli(project, alice, "apply", "--diff", "train.py")
    for entry in entries(project):
        edited(entry, plant)
    assert cli(project, alice, "apply", "train.py").returncode == 0
    assert (project / "train.py").read_text() == MIGRATED


def test_the_secret_lives_outside_the_tree_and_only_its_user_reads_it(project: Path, users):
    alice, _ = users
    cli(project, alice, "check", "train.py")
    secret = alice / ".cache" / "accelmigrate" / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    assert not [p for p in project.rglob("*") if "secret" in p.name]


def test_a_secret_that_others_can_read_turns_the_cache_off(project: Path, users):
    alice, _ = users
    secret = alice / ".cache" / "accelmigrate" / "secret"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"k" * 32)
    secret.chmod(0o644)  # as a checkout or a careless copy leaves it
    result = cli(project, alice, "apply", "train.py")
    assert result.returncode == 0 and (project / "train.py").read_text() == MIGRATED
    assert entries(project) == []


def _lose_one_character(payload: dict) -> None:
    payload["migrated"] = payload["migrated"][:-3] + payload["migrated"][-2:]


def _nest(entry: Path) -> None:
    signature, _ = split_entry(entry.read_bytes())
    entry.write_bytes(signature + b"\n" + b"[" * 100_000 + b"]" * 100_000)


def _fifo(entry: Path) -> None:
    entry.unlink()
    os.mkfifo(entry)


def _dev_zero(entry: Path) -> None:
    entry.unlink()
    entry.symlink_to("/dev/zero")


@pytest.mark.parametrize(
    "damage",
    [lambda entry: edited(entry, _lose_one_character), _nest, _fifo, _dev_zero],
    ids=["one character lost", "nested 100,000 deep", "a FIFO", "a link to /dev/zero"],
)
def test_a_damaged_entry_is_a_miss_and_the_file_is_migrated(project: Path, users, damage):
    alice, _ = users
    cli(project, alice, "apply", "--diff", "train.py")
    (entry,) = entries(project)
    damage(entry)
    result = cli(project, alice, "apply", "train.py")  # a FIFO or /dev/zero read would never return
    assert result.returncode == 0, result.stderr
    assert (project / "train.py").read_text() == MIGRATED


# -- in this process: the signed entry that no longer parses, links, layout ----------------------


@pytest.fixture(autouse=True)
def own_secret(monkeypatch, tmp_path_factory):
    monkeypatch.delenv(CACHE_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))


def test_a_signed_migration_that_does_not_parse_is_migrated_again(project: Path):
    invoke("apply", "--diff", "train.py", cwd=project)
    (entry,) = entries(project)
    _, payload = split_entry(entry.read_bytes())
    payload["migrated"] = MIGRATED[:-3]  # as a disk might damage it before it was signed
    data = json.dumps(payload).encode()
    cache = ResultCache(entry.parent, user_secret(secret_path()))
    entry.write_bytes(cache._sign(entry.stem, data) + b"\n" + data)
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    assert (project / "train.py").read_text() == MIGRATED


@pytest.mark.parametrize("command", [["check"], ["apply"]])
def test_a_cache_folder_linked_out_of_the_project_is_not_followed(tmp_path: Path, command):
    outer = tmp_path / "outer"
    project = outer / "checkout"
    project.mkdir(parents=True)
    (project / "train.py").write_text(LOOP)
    (project / CACHE_FOLDER_NAME).symlink_to("..")
    before = sorted(p.name for p in outer.iterdir())
    result = invoke(*command, "train.py", cwd=project)
    assert result.exit_code == (1 if command == ["check"] else 0)
    assert sorted(p.name for p in outer.iterdir()) == before  # no .gitignore, no CACHEDIR.TAG, no entries
    assert sorted(p.name for p in project.iterdir()) == [CACHE_FOLDER_NAME, "train.py"]
    if command == ["apply"]:
        assert (project / "train.py").read_text() == MIGRATED


def test_a_namespace_folder_that_is_a_link_is_not_used(project: Path, tmp_path: Path):
    invoke("check", "train.py", cwd=project)
    (namespace,) = (project / CACHE_FOLDER_NAME).glob("*-*")
    shutil.rmtree(namespace)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    namespace.symlink_to(elsewhere)
    assert invoke("check", "train.py", cwd=project).exit_code == 1
    assert list(elsewhere.iterdir()) == []


DEVICE_SCRIPT = textwrap.dedent(
    """\
    import torch
    import zoo

    model = torch.nn.Linear(2, 2).cuda()
    x = torch.ones(2).cuda()
    print(model(x))
    """
)


def test_a_cached_migration_follows_the_first_party_layout(tmp_path: Path):
    """A local package that appears makes `zoo` first party: the new import
    goes above it, in a cached run as in a fresh one."""
    project, fresh = tmp_path / "cached", tmp_path / "fresh"
    for folder in (project, fresh):
        folder.mkdir()
        (folder / "pyproject.toml").write_text("")
        (folder / "train.py").write_text(DEVICE_SCRIPT)
    invoke("apply", "--diff", "--to", "device", "--runtime", "train.py", cwd=project)  # cached with zoo third party
    for folder in (project, fresh):
        (folder / "zoo").mkdir()
    invoke("apply", "--to", "device", "--runtime", "train.py", cwd=project)
    invoke("apply", "--no-cache", "--to", "device", "--runtime", "train.py", cwd=fresh)
    written = (project / "train.py").read_text()
    assert written == (fresh / "train.py").read_text()
    assert written.index("from accelmigrate.runtime.device import get_device") < written.index("import zoo")


def test_check_shares_entries_across_layouts(project: Path, monkeypatch):
    """check never places imports: its key leaves the layout out."""
    invoke("check", "train.py", cwd=project)
    (project / "zoo").mkdir()
    seen = []
    monkeypatch.setattr(engine, "migrate_source", lambda *args, **kwargs: seen.append(args) or None)
    assert invoke("check", "train.py", cwd=project).exit_code == 1 and seen == []


def test_a_secret_inside_the_project_turns_the_cache_off(project: Path, monkeypatch):
    """It could have come with the repository (a tarball keeps mode 0600)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(project / ".cache"))
    assert invoke("apply", "train.py", cwd=project).exit_code == 0
    assert (project / "train.py").read_text() == MIGRATED and entries(project) == []
    assert not (project / ".cache" / "accelmigrate" / "secret").exists()  # never written into the work tree
