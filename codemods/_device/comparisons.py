"""A string device compared with a device type (`device == "cuda"`,
`"cuda" in device`): when its definition becomes a torch.device, the
comparison reads `device.type`, which holds the same name."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .literals import Definition, string_value

# The names a string device of the definition and the compared literal may
# hold: `torch.device("cuda:0").type == "cuda"` but `"cuda:0" == "cuda"` is False.
TYPE_NAMES = ("cuda", "cpu", "mps")


def _is_type_name(node: cst.BaseExpression) -> bool:
    return string_value(node) in TYPE_NAMES


def holds_type_names(value: cst.BaseExpression) -> bool:
    """Is every string the definition may bind a bare type name (`"cuda"`,
    `"cuda" if ... else "cpu"`), never one with a GPU index?"""
    if isinstance(value, cst.IfExp):
        return holds_type_names(value.body) and holds_type_names(value.orelse)
    if isinstance(value, cst.BooleanOperation):
        return holds_type_names(value.left) and holds_type_names(value.right)
    return _is_type_name(value)


class StringComparisons:
    """Mixed into the codemod: reads `self.script`, `self.facts` and `self._edits`."""

    def _compares_type(self, read: cst.Name) -> bool:
        """`read == "cuda"`, `read != "cpu"`, `"cuda" in read` (not a chain)."""
        parent = self.parent(read)
        if isinstance(parent, cst.ComparisonTarget):
            comparison = self.parent(parent)
            other = comparison.left
        elif isinstance(parent, cst.Comparison) and parent.left is read:
            comparison, other = parent, parent.comparisons[0].comparator
        else:
            return False
        if len(comparison.comparisons) != 1 or not _is_type_name(other):
            return False
        operator = comparison.comparisons[0].operator
        if isinstance(operator, (cst.In, cst.NotIn)):
            return comparison.comparisons[0].comparator is read
        return isinstance(operator, (cst.Equal, cst.NotEqual))

    def _compare_use(self, read: cst.CSTNode, definition: Definition) -> Optional[str]:
        """"compare" when `read` compares the string of `definition` alone (no
        other binding reaches it) with a device type, and the definition holds
        bare type names only: then `read.type` keeps the comparison's result."""
        if not isinstance(read, (cst.Name, cst.Attribute)) or not self._compares_type(read):
            return None
        if not holds_type_names(definition.statement.value):
            return None
        if isinstance(read, cst.Attribute):
            return "compare"  # `self.device`, bound once in its class (see _instance_attribute_reads)
        values = self._assigned_values(read)
        return "compare" if values is not None and len(values) == 1 and values[0] is definition.statement.value else None

    def _compare_types(self, definition: Definition) -> None:
        """The definition became a torch.device: its comparisons read `.type`."""
        if isinstance(definition.target, cst.Name):
            reads = self.facts.uses.reads(definition.target.value, self.script.scope_of(definition.statement))
        else:
            reads = self._instance_attribute_reads(definition) or []
        for read in reads:
            if self._compare_use(read, definition) == "compare":
                self._edits[read] = lambda updated: cst.Attribute(value=updated, attr=cst.Name("type"))
