"""Source positions of nodes, computed one statement at a time.

LibCST's PositionProvider generates the code of the whole module while it
records a range for every node: in a large file that costs more than the
parse (9 s for a 1.3 MB module), though a codemod reports on a few nodes.
Here one plain code generation of the module records the line on which each
statement of a body (the module's, a class's, a function's, a block's)
starts, with the indentation around it (a statement always ends with its
newline, so the next one starts at column 0). A node's range comes from
LibCST's own position-recording code generation of only the innermost such
statement that holds it, started at that line and indentation: a report in
one method of a 5,000-line class lays out that method's statement, not the
class. The ranges are LibCST's, by construction (tests/test_positions.py
compares them node by node).
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
        self._starts: Optional[dict[cst.CSTNode, tuple[int, list[str]]]] = None  # statement -> first line, indentation
        self._ranges: dict[cst.CSTNode, CodeRange] = {}
        self._done: set[cst.CSTNode] = set()  # statements whose nodes' ranges are in `_ranges`
        self._whole_module_done = False

    def __call__(self, node: cst.CSTNode) -> int:
        return self.range(node).start.line

    def range(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges.get(node)
        if found is not None:
            return found
        statement = self._statement_holding(node)
        if statement is None:  # the module, its header or footer, or a node the index leaves out
            if not self._whole_module_done:
                self._resolve_whole_module()
        elif statement not in self._done:
            self._resolve(statement)
        return self._ranges[node]  # KeyError: LibCST gives this node no position either

    def _statement_holding(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost statement of a body that holds (or is) `node`."""
        starts = self._statement_starts()
        current = node
        while current is not None:
            if current in starts:
                return current
            current = self._parent(current)
        return None

    def _statement_starts(self) -> dict[cst.CSTNode, tuple[int, list[str]]]:
        if self._starts is None:
            state = _RecordingStatementStarts(self._module)
            self._module._codegen(state)
            self._starts = state.starts
        return self._starts

    def _resolve(self, statement: cst.CSTNode) -> None:
        module = self._module
        line, indentation = self._statement_starts()[statement]
        provider = PositionProvider()
        state = PositionProvidingCodegenState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            provider=provider,
            indent_tokens=list(indentation),
            line=line,
        )
        statement._codegen(state)
        self._ranges.update(provider._computed)
        self._done.add(statement)

    def _resolve_whole_module(self) -> None:
        self._ranges.update(MetadataWrapper(self._module, unsafe_skip_copy=True).resolve(PositionProvider))
        self._done.update(self._statement_starts())
        self._whole_module_done = True


class _RecordingStatementStarts(CodegenState):
    """A plain code generation that records, for each statement of a body,
    the line it starts on and the indentation in force there. Statements
    laid out as part of another (an `elif`, which prints differently on its
    own) are not recorded."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.starts: dict[cst.CSTNode, tuple[int, list[str]]] = {}
        # ids of the statements of the bodies being laid out, innermost last (an
        # int's hash is far cheaper than a node's, and this runs for every node)
        self._bodies = [{id(statement) for statement in module.body}]
        self._line = 1
        self._counted = 0  # tokens whose newlines are in `_line`

    def before_codegen(self, node: cst.CSTNode) -> None:
        if type(node) is cst.IndentedBlock:
            self._bodies.append({id(statement) for statement in node.body})
        elif id(node) in self._bodies[-1]:
            tokens = self.tokens
            self._line += sum(len(NEWLINE_RE.findall(t)) for t in tokens[self._counted :] if "\n" in t or "\r" in t)
            self._counted = len(tokens)
            self.starts[node] = (self._line, tuple(self.indent_tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        if type(node) is cst.IndentedBlock:
            self._bodies.pop()
