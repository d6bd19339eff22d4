"""What a name means at a given place, for spelling generated code.

Generated code names modules (`torch.nn...`, `os.environ`); at the place it
is inserted, that name must read the module, not a local variable that
happens to share its name (`torch = T.optim.SGD(...)`), or the function
raises UnboundLocalError.
"""

from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst
from libcst.metadata import ImportAssignment
from libcst.metadata.scope_provider import Scope


def reads_import_of(scope: Optional[Scope], name: str, module: str) -> bool:
    """At a place in `scope`, `name` reads only imports of `module`."""
    if scope is None:
        return False
    assignments = scope[name]
    return bool(assignments) and all(
        isinstance(a, ImportAssignment) and {q.name for q in a.get_qualified_names_for(name)} == {module}
        for a in assignments
    )


def is_unbound(scope: Optional[Scope], name: str) -> bool:
    """Nothing visible at a place in `scope` binds `name`: a module-level
    import added for it is what the place will read."""
    return scope is not None and not scope[name]


def import_names(scope: Optional[Scope]) -> list[str]:
    """The names that imports bind in the module around `scope`, sorted."""
    if scope is None:
        return []
    return sorted({a.name for a in scope.globals.assignments if isinstance(a, ImportAssignment)})


def spelling_at(scope: Optional[Scope], paths: Iterable[tuple[str, str]]) -> Optional[str]:
    """How to write a dotted path at a place in `scope` with the names already
    imported: `paths` pairs each module or object that may be imported (from
    the outermost: `torch`, `torch.nn`, ...) with the rest of the path below
    it. None when no imported name reads one of them there."""
    names = import_names(scope)
    for imported, rest in paths:
        preferred = imported.rsplit(".", 1)[-1]
        for name in sorted(names, key=lambda n: n != preferred):
            if "." not in name and reads_import_of(scope, name, imported):
                return f"{name}.{rest}" if rest else name
    return None


def is_plain_reference(node: cst.CSTNode) -> bool:
    """A name or a chain of attributes (`loader`, `self.groups.data`): cheap
    and free of side effects to evaluate again."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)
