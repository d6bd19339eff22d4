"""What a name means at a given place, for spelling generated code.

Generated code names modules (`torch.nn...`, `os.environ`); at the place it
is inserted, that name must read the module, not a local variable that
happens to share its name (`torch = T.optim.SGD(...)`), or the function
raises UnboundLocalError. The answers come from the model's scopes.
"""

from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst

from .model import ScriptModel


def reads_import_of(model: ScriptModel, at: cst.CSTNode, name: str, module: str) -> bool:
    """At `at`, `name` reads only imports of `module`."""
    bindings = model.bindings_of(name, at)
    return bool(bindings) and all(b.kind == "import" and b.qualified == module for b in bindings)


def is_unbound(model: ScriptModel, at: cst.CSTNode, name: str) -> bool:
    """Nothing visible at `at` binds `name`: a module-level import added for it
    is what the place will read."""
    return not model.bindings_of(name, at)


def spelling_at(model: ScriptModel, at: cst.CSTNode, paths: Iterable[tuple[str, str]]) -> Optional[str]:
    """How to write a dotted path at `at` with the names the module already
    imports: `paths` pairs each module or object that may be imported (from
    the outermost: `torch`, `torch.nn`, ...) with the rest of the path below
    it. None when no imported name reads one of them there."""
    names = model.derived(_module_import_names)
    for imported, rest in paths:
        preferred = imported.rsplit(".", 1)[-1]
        for name in sorted(names, key=lambda n: n != preferred):
            if reads_import_of(model, at, name, imported):
                return f"{name}.{rest}" if rest else name
    return None


def _module_import_names(model: ScriptModel) -> list[str]:
    """The names the module's own imports bind, sorted (found once per model)."""
    return sorted({b.name for bs in model.module_scope.bindings.values() for b in bs if b.kind == "import"})


__all__ = ["is_unbound", "reads_import_of", "spelling_at"]
