"""Does a script join a process group? Read from its source, never imported.

`accelmigrate run --nproc-per-node 4 train.py` on a script that never calls
`init_process_group` starts four independent copies that each train the
whole model on the whole data set: nothing fails, four times the work is
wasted. `run` warns about such a script, and refuses to launch more than one
process of it unless told to.

A script counts as joining a process group when it, or a module beside it
that it imports (the script's folder is the first entry of `sys.path`, as for
`python SCRIPT`, then PYTHONPATH), refers to one of: torch.distributed's
`init_process_group` or `init_device_mesh`, the runtime's `init_distributed`
or `distributed_session` (what `apply --to ddp` inserts), or a framework that
initialises the group itself when torchrun starts it (Lightning, Accelerate,
DeepSpeed, Ignite's `idist`, Composer, the Hugging Face and TRL trainers).
Anything this cannot see (a name built at run time, an installed package of
the user's own) reads as "not found": `run --force` launches anyway.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Iterable, Iterator, Optional

# Fully qualified names that initialise the default process group.
INITIALISERS = frozenset(
    {
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
        "torch.distributed.init_device_mesh",
        "torch.distributed.device_mesh.init_device_mesh",
        "accelmigrate.runtime.init_distributed",
        "accelmigrate.runtime.distributed.init_distributed",
        "accelmigrate.runtime.distributed_session",
        "accelmigrate.runtime.distributed.distributed_session",
    }
)
# The last part of a name that is an initialiser whatever it is reached
# through (`self.dist.init_process_group`, a module passed as an argument).
INITIALISER_ATTRIBUTES = frozenset({"init_process_group", "init_device_mesh"})
# Packages (or modules) that set the process group up themselves under torchrun.
FRAMEWORKS = frozenset(
    {"lightning", "lightning_fabric", "pytorch_lightning", "accelerate", "deepspeed", "ignite.distributed", "composer", "trl"}
)
# Names in a package that does more than training, which set the group up.
FRAMEWORK_NAMES = frozenset(
    {
        "transformers.Trainer",
        "transformers.Seq2SeqTrainer",
        "transformers.TrainingArguments",
        "transformers.Seq2SeqTrainingArguments",
    }
)
MAX_MODULES_READ = 200  # a script's own modules; a bound on a pathological tree


def initialises_process_group(script: Path, search_path: Optional[Iterable[Path]] = None) -> Optional[bool]:
    """True when SCRIPT, or a module of the user's it imports, initialises a
    process group; False when none does; None when SCRIPT cannot be read or
    parsed (then Python will say why, and no guess is made)."""
    script = Path(script)
    tree = _parse(script)
    if tree is None:
        return None
    folders = [script.resolve().parent, *(search_path if search_path is not None else pythonpath_folders())]
    seen = {script.resolve()}
    pending = [tree]
    while pending:
        tree = pending.pop()
        if _refers_to_an_initialiser(tree):
            return True
        for module in _local_modules(tree, folders):
            if module not in seen and len(seen) < MAX_MODULES_READ:
                seen.add(module)
                parsed = _parse(module)
                if parsed is not None:
                    pending.append(parsed)
    return False


def pythonpath_folders() -> list[Path]:
    return [Path(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _parse(path: Path) -> Optional[ast.Module]:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _refers_to_an_initialiser(tree: ast.Module) -> bool:
    aliases, star_modules = _import_aliases(tree)
    if any(_is_framework(name) for name in [*aliases.values(), *star_modules]):
        return True
    known = INITIALISERS | FRAMEWORK_NAMES
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INITIALISER_ATTRIBUTES:
            return True
        if isinstance(node, ast.Name) and node.id not in aliases:
            if any(f"{module}.{node.id}" in known for module in star_modules):
                return True
        if isinstance(node, (ast.Name, ast.Attribute)) and _qualified_name(node, aliases) in known:
            return True
    return False


def _import_aliases(tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """Local name -> the qualified name it was imported as, from every import
    in the file (a presence check: which scope imported it does not matter),
    and the modules imported with `*`."""
    aliases: dict[str, str] = {}
    star_modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # `import a.b` binds `a`, and `a.b.f` is then written out in full
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
                    aliases[alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name == "*":
                    star_modules.append(node.module)
                else:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases, star_modules


def _is_framework(qualified: str) -> bool:
    return any(qualified == package or qualified.startswith(package + ".") for package in FRAMEWORKS)


def _qualified_name(node: ast.expr, aliases: dict[str, str]) -> Optional[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    base = aliases.get(node.id, node.id)
    return ".".join([base, *reversed(parts)])


def _local_modules(tree: ast.Module, folders: list[Path]) -> Iterator[Path]:
    """The files of the modules TREE imports that lie in FOLDERS (the user's
    own code, beside the script), never the installed packages."""
    for name in _imported_module_names(tree):
        for folder in folders:
            found = _module_file(folder, name)
            if found is not None:
                yield found
                break


def _imported_module_names(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _with_parents(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from _with_parents(node.module)
            for alias in node.names:  # `from package import module`
                if alias.name != "*":
                    yield f"{node.module}.{alias.name}"


def _with_parents(dotted: str) -> Iterator[str]:
    """`a.b.c` imports `a`, `a.b` and `a.b.c`, running each one's code."""
    parts = dotted.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


def module_entry_file(dotted: str) -> Optional[Path]:
    """The file `python -m DOTTED` runs from here (a module's own file, or a
    package's `__main__.py`), found on the current folder and PYTHONPATH as
    Python would, without importing anything; None where there is none."""
    for folder in [Path.cwd(), *pythonpath_folders()]:
        base = folder.joinpath(*dotted.split("."))
        for candidate in (base.with_name(base.name + ".py"), base / "__main__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def _module_file(folder: Path, dotted: str) -> Optional[Path]:
    base = folder.joinpath(*dotted.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None
