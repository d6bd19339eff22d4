"""What the `device` codemod reads from a script beyond the shared model:
single-target assignments by target, the `if` and `try` statements and
defaulted parameters, names that may be legacy CUDA tensor types, the alias of
`import torch`, whether the module declares `__all__`, and which functions
the entry point runs.

`device_facts(model)` computes them once per model from the nodes the model
already ordered (no walk of the whole tree); the entry point's reach is
computed only when asked.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._syntax import walk
from .model import ScriptModel
from .uses import uses_of


def device_facts(model: ScriptModel) -> "DeviceFacts":
    return model.derived(DeviceFacts)


class DeviceFacts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.uses = uses_of(model)
        self.calls: list[cst.Call] = self.uses.calls  # source order, outer calls first
        self.all_names: set[str] = set(self.uses.names)
        # `target = value` with one Name or attribute target: target -> the Assign / AnnAssign
        self.assignment_of: dict[cst.CSTNode, cst.BaseSmallStatement] = {}
        for scope in model.scopes:
            for bindings in scope.bindings.values():
                for binding in bindings:
                    if binding.kind == "assign" and _single_target(binding.statement, binding.node):
                        self.assignment_of[binding.node] = binding.statement
        order = model.index.order
        self.assignments = sorted(self.assignment_of.items(), key=lambda item: order[item[0]])
        self.ifs: list[cst.If] = []
        self.parameters: list[cst.Param] = []  # with a default
        self.legacy_references: list[cst.CSTNode] = []  # `*Tensor` names and attributes not called
        self.tries: list[cst.Try] = []
        for node in order:
            if isinstance(node, cst.If):
                self.ifs.append(node)
            elif isinstance(node, cst.Try):
                self.tries.append(node)
            elif isinstance(node, cst.Param) and node.default is not None:
                self.parameters.append(node)
            elif isinstance(node, (cst.Name, cst.Attribute)) and self._is_tensor_type_reference(node):
                self.legacy_references.append(node)
        self.torch_alias = next((b.name for b in model.imports if b.qualified == "torch" and isinstance(b.statement, cst.Import)), None)
        self.declares_all = "__all__" in model.module_scope.bindings
        self._entry: Optional[set] = None

    def _is_tensor_type_reference(self, node: cst.CSTNode) -> bool:
        """`torch.cuda.FloatTensor` used as a value: not called, not imported,
        not the attribute name inside `x.FloatTensor` (the Attribute is)."""
        name = node.value if isinstance(node, cst.Name) else node.attr.value
        if not name.endswith("Tensor"):
            return False
        parent = self.model.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            return False
        if isinstance(node, cst.Name) and isinstance(parent, cst.Attribute) and parent.attr is node:
            return False
        return not any(isinstance(a, cst.ImportFrom) for a in self.model.ancestors(node))

    # -- what the entry point runs ----------------------------------------------------------

    def runs_from_entry(self, node: cst.CSTNode) -> bool:
        """Does `node` run when the file runs: module-level code (the main guard,
        flat code), or a function that such code calls or passes on by name
        (`mp.spawn(main)`), directly or through another such function, or a
        method of a class that it names."""
        if self._entry is None:
            self._entry = self._entry_functions()
        return not any(isinstance(a, cst.FunctionDef) and a not in self._entry for a in self.model.ancestors(node))

    def _entry_functions(self) -> set:
        reached: set = set()
        pending = [s for s in self.model.module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
        while pending:
            for name in walk(pending.pop(), into_definitions=False):
                if isinstance(name, cst.Name) and self.uses.is_read(name):
                    for definition in self._definitions_named(name):
                        if definition not in reached:
                            reached.add(definition)
                            pending.append(definition.body)
        return reached

    def _definitions_named(self, name: cst.Name) -> list[cst.FunctionDef]:
        found = []
        for binding in self.model.bindings_of(name.value, name):
            if binding.kind == "def":
                found.append(binding.node)
            elif binding.kind == "class":
                scope = self.model.index.scope_by_node[binding.node]
                found.extend(b.node for bs in scope.bindings.values() for b in bs if b.kind == "def")
        return found


def _single_target(statement: Optional[cst.CSTNode], target: cst.CSTNode) -> bool:
    if isinstance(statement, cst.Assign):
        return len(statement.targets) == 1 and statement.targets[0].target is target
    return isinstance(statement, cst.AnnAssign) and statement.value is not None and statement.target is target


__all__ = ["DeviceFacts", "device_facts"]
