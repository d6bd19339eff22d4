"""The names the codemod introduces, chosen so that each means what the
codemod means in every scope that reads it: the runtime's functions it
imports (`autocast_dtype`, `grad_scaler`, `full_precision`) and the
variables it binds (`amp_dtype`, `scaler`).

A module-level import is read from every scope of the file, so the
runtime's function is imported under its own name only when no scope binds
that name to anything else (`grad_scaler = torch.cuda.amp.GradScaler()` in a
function would make the migrated `grad_scaler = grad_scaler(...)` read its
own unbound local); else under `accelmigrate_<name>`. A variable bound in a
scope is read there and in the scopes nested in it, so none of those may
bind the name the codemod picks.
"""

from __future__ import annotations

from typing import Iterator

from .plan import PRECISION

ALIAS_PREFIX = "accelmigrate_"


class Introduced:
    """Mixed into the codemod."""

    def runtime_name(self, function: str) -> str:
        """The name the migrated code calls the runtime's `function` by."""
        if function not in self.runtime_names:
            self.runtime_names[function] = self.choose_runtime_name(function)
        return self.runtime_names[function]

    def import_runtime(self, function: str) -> None:
        """Schedule the import of the runtime's `function`, aliased where its name is taken."""
        name = self.runtime_name(function)
        self.add_import(PRECISION, function, name if name != function else None)

    def choose_runtime_name(self, function: str) -> str:
        qualified = f"{PRECISION}.{function}"
        imported = [b.name for b in self.module_imports_from(PRECISION) if b.qualified == qualified]
        candidates = [*imported, function, ALIAS_PREFIX + function]
        number = 2
        while True:
            for name in candidates:
                if all(b.kind == "import" and b.qualified == qualified for b in self.bindings_anywhere(name)):
                    return name
            candidates, number = [f"{ALIAS_PREFIX}{function}_{number}"], number + 1

    def module_imports_from(self, module: str) -> list:
        return [b for b in self.script.imports if b.scope.kind == "module" and (b.qualified or "").startswith(module + ".")]

    def bindings_anywhere(self, name: str) -> list:
        """The bindings of `name` in every scope of the file."""
        return [b for scope in self.script.scopes for b in scope.bindings.get(name, ())]

    def bound_within(self, name: str, home) -> bool:
        """`name` is bound in scope `home` or in a scope nested in it: there
        a variable that the codemod binds in `home` would not be what is read."""
        return any(home in _chain(b.scope) for b in self.bindings_anywhere(name))


def _chain(scope) -> Iterator:
    while scope is not None:
        yield scope
        scope = scope.parent
