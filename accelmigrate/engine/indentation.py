"""Clean indentation for the blocks that codemods generate.

LibCST renders a block without an indentation of its own with the module's
`default_indent`, which it takes from the first indented line of the file.
That line may hold a form feed (which the tokenizer ignores, and which LibCST
refuses in a generated block), or tabs in a file whose other blocks are
indented with spaces, so that a generated block inside them would mix the
two. For such files (the only ones this module touches):

- `before_codemods` gives every existing block its indentation explicitly,
  so that its text no longer depends on the default, and sets a clean default;
- `after_codemods` then knows that a block without an indentation is a new
  one, and gives it the style of the block around it (tabs inside tabs,
  the same number of spaces inside spaces).
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

# An indentation that holds a tab or a form feed, at the start of some line.
_UNUSUAL_INDENT = re.compile(r"^[ \t\f]*[\t\f]", re.MULTILINE)


def needs_care(source: str) -> bool:
    """Could a generated block get a form feed, or mix tabs and spaces?"""
    return ("\t" in source or "\f" in source) and _UNUSUAL_INDENT.search(source) is not None


def is_clean(indent: str) -> bool:
    return indent != "" and (set(indent) == {" "} or set(indent) == {"\t"})


def clean_default(indent: str) -> str:
    """The indentation a generated block gets where nothing else decides."""
    without_form_feeds = indent.replace("\f", "")
    if is_clean(without_form_feeds):
        return without_form_feeds
    return "\t" if "\t" in indent else "    "


class _MakeIndentsExplicit(cst.CSTTransformer):
    def __init__(self, default: str) -> None:
        super().__init__()
        self.default = default

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(indent=self.default) if updated.indent is None else updated


class _IndentNewBlocksLikeTheirSurroundings(cst.CSTTransformer):
    def __init__(self, default: str) -> None:
        super().__init__()
        self.default = default
        self.enclosing: list[tuple[str, bool]] = []  # (indent unit, is it a new block)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> Optional[bool]:
        if node.indent is not None:
            self.enclosing.append((node.indent, False))
        else:
            around = self.enclosing[-1][0] if self.enclosing else self.default
            self.enclosing.append((around if is_clean(around) else self.default, True))
        return True

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        unit, is_new = self.enclosing.pop()
        return updated.with_changes(indent=unit) if is_new else updated


def before_codemods(module: cst.Module) -> cst.Module:
    explicit = module.visit(_MakeIndentsExplicit(module.default_indent))
    return explicit.with_changes(default_indent=clean_default(module.default_indent))


def after_codemods(module: cst.Module) -> cst.Module:
    return module.visit(_IndentNewBlocksLikeTheirSurroundings(module.default_indent))
