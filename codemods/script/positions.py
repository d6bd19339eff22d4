"""Source positions of nodes, computed one top-level statement at a time.

LibCST's PositionProvider generates the code of the whole module while it
records a range for every node: in a large file that costs more than the
parse (9 s for a 1.3 MB module), though a codemod reports on a few nodes.
Here one plain code generation of the module finds the line on which each
top-level statement starts (a statement always ends with its newline, so the
next one starts at column 0), and a node's range comes from LibCST's own
position-recording code generation of only the top-level statement that
holds it, started at that line. The ranges are LibCST's, by construction
(tests/test_positions.py compares them node by node).
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodeRange
from libcst.metadata import MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState


class Lines:
    """`lines(node)` is the node's first line, `lines.range(node)` its
    LibCST CodeRange; both looked up when first asked, so a file with
    nothing to report never pays for positions."""

    def __init__(self, module: cst.Module, parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]]) -> None:
        self._module = module
        self._parent = parent
        self._starts: Optional[dict[cst.CSTNode, int]] = None  # top-level statement -> its first line
        self._ranges: dict[cst.CSTNode, CodeRange] = {}
        self._done: set[cst.CSTNode] = set()  # top-level statements whose ranges are in `_ranges`

    def __call__(self, node: cst.CSTNode) -> int:
        return self.range(node).start.line

    def range(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges.get(node)
        if found is not None:
            return found
        statement = self._top_level_statement(node)
        if statement is None or statement in self._done:  # the module, its header or footer
            self._resolve_whole_module()
        else:
            self._resolve(statement)
        return self._ranges[node]

    def _top_level_statement(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        current, parent = node, self._parent(node)
        while parent is not None and parent is not self._module:
            current, parent = parent, self._parent(parent)
        return current if parent is self._module and current in self._statement_starts() else None

    def _statement_starts(self) -> dict[cst.CSTNode, int]:
        if self._starts is None:
            module = self._module
            state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
            for line in module.header:
                line._codegen(state)
            starts, line = {}, 1 + _newlines(state)
            for statement in module.body:
                starts[statement] = line
                state.tokens.clear()
                statement._codegen(state)
                line += _newlines(state)
            self._starts = starts
        return self._starts

    def _resolve(self, statement: cst.CSTNode) -> None:
        module = self._module
        provider = PositionProvider()
        state = PositionProvidingCodegenState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            provider=provider,
            line=self._statement_starts()[statement],
        )
        statement._codegen(state)
        self._ranges.update(provider._computed)
        self._done.add(statement)

    def _resolve_whole_module(self) -> None:
        self._ranges.update(MetadataWrapper(self._module, unsafe_skip_copy=True).resolve(PositionProvider))
        self._done.update(self._module.body)


def _newlines(state: CodegenState) -> int:
    return sum(len(NEWLINE_RE.findall(token)) for token in state.tokens if "\n" in token or "\r" in token)
