"""Edits planned on the original tree, applied as the transformer leaves it:
nodes replaced, statements inserted, swapped or removed, and runs of
statements wrapped in a `with` block."""

from __future__ import annotations

from typing import Sequence

import libcst as cst


class Edits:
    """Changes planned on original nodes, applied when the transformer leaves them."""

    def __init__(self) -> None:
        self.replace: dict = {}  # node -> function(updated node) -> new node
        self.before: dict = {}  # statement -> [new statements]
        self.after: dict = {}  # statement -> [new statements]
        self.swap: dict = {}  # statement -> function(updated statement) -> new statement
        self.remove: set = set()
        self.wrap: dict = {}  # first statement -> (last statement, header expression text)

    def insert_after(self, anchor: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.after.setdefault(anchor, []).append(new)

    def insert_before(self, anchor: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.before.setdefault(anchor, []).append(new)

    def touches(self, body: Sequence[cst.CSTNode]) -> bool:
        return any(s in self.before or s in self.after or s in self.swap or s in self.remove or s in self.wrap for s in body)


class AppliesEdits:
    """The transformer's side: `self.edits` applied to the nodes it leaves."""

    edits: Edits

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        updated_node = super().on_leave(original_node, updated_node)
        change = self.edits.replace.get(original_node)
        if change is not None and isinstance(updated_node, cst.CSTNode):
            return change(updated_node)
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self.edits.touches(original_node.body):
            return updated_node
        return updated_node.with_changes(body=self.edited_body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.edits.touches(original_node.body):
            return updated_node
        return updated_node.with_changes(body=self.edited_body(original_node.body, updated_node.body))

    def edited_body(self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list:
        pairs = list(zip(originals, updated))
        result: list = []
        self.carried = []  # comment lines of a removed statement
        index = 0
        while index < len(pairs):
            original = pairs[index][0]
            if original in self.edits.wrap:
                last, header = self.edits.wrap[original]
                end = next(i for i in range(index, len(pairs)) if pairs[i][0] is last)
                hoisted = self.edits.before.pop(original, [])  # what the header reads (`amp_dtype = ...`)
                if hoisted:
                    first = pairs[index][1]
                    hoisted[0] = hoisted[0].with_changes(leading_lines=[*first.leading_lines, *hoisted[0].leading_lines])
                    pairs[index] = (original, first.with_changes(leading_lines=[]))
                    result.extend(hoisted)
                inner = [s for o, n in pairs[index:end + 1] for s in self.edited_statement(o, n)]
                result.append(self.wrapped(inner, header))
                index = end + 1
            else:
                result.extend(self.edited_statement(*pairs[index]))
                index += 1
        if any(line.comment for line in self.carried):
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=self.carried))
        if not result:
            result.append(cst.SimpleStatementLine(body=[cst.Pass()]))
        return result

    def edited_statement(self, original: cst.BaseStatement, new: cst.BaseStatement) -> list:
        """The statement as edited, with what goes before and after it; comment
        lines above it stay above whatever is inserted before it."""
        before = list(self.edits.before.get(original, []))
        after = list(self.edits.after.get(original, []))
        if original in self.edits.swap:
            new = self.edits.swap[original](new)
        leading = list(getattr(new, "leading_lines", []))
        if before and leading:
            before[0] = before[0].with_changes(leading_lines=[*leading, *before[0].leading_lines])
            new = new.with_changes(leading_lines=[])
        if original in self.edits.remove:
            if after and leading and not before:
                after[0] = after[0].with_changes(leading_lines=[*leading, *after[0].leading_lines])
            elif leading and not before:
                self.carried.extend(leading)  # for the next statement
            return [*before, *after]
        if self.carried and hasattr(new, "leading_lines"):
            target = before[0] if before else new
            moved = target.with_changes(leading_lines=[*self.carried, *target.leading_lines])
            before, new = ([moved, *before[1:]], new) if before else (before, moved)
            self.carried = []
        return [*before, new, *after]

    @staticmethod
    def wrapped(statements: list, header: str) -> cst.With:
        first = statements[0]
        leading = list(getattr(first, "leading_lines", []))
        statements = [first.with_changes(leading_lines=[]), *statements[1:]] if leading else statements
        return cst.With(items=[cst.WithItem(item=cst.parse_expression(header))], body=cst.IndentedBlock(body=statements), leading_lines=leading)

