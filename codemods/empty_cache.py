"""empty-cache: remove `torch.cuda.empty_cache()` from loop bodies.

What it does
    Removes a `torch.cuda.empty_cache()` statement (however torch is imported
    or aliased) that runs inside the body of a `for` or `while` loop. Outside
    loops it only reports the call.

Why
    `empty_cache()` hands the caching allocator's free blocks back to the
    driver. It frees no tensor that is still referenced, so it does not lower
    the peak memory of the next iteration; it synchronises the device and
    forces the allocator to ask the driver for the same memory again (slow
    `cudaMalloc` calls) on the next iteration. In a training loop it costs
    time every step and buys nothing. Memory that keeps growing comes from
    references kept alive (see the `item` codemod), not from the cache.

Example
    Before::

        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.empty_cache()

    After::

        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

Left alone
    A call outside any loop (AM211, a note: it costs one sync and may be there
    on purpose, e.g. before handing the GPU to another process), a call inside
    a function that is merely defined in a loop, and a call in a loop body that
    is not a statement of its own line (`x = torch.cuda.empty_cache()`,
    `print(i); torch.cuda.empty_cache()`): AM212 says to remove it by hand.
"""

from __future__ import annotations

from typing import Union

import libcst as cst

from ._base import Codemod, remove_statements
from .script.vocabulary import EMPTY_CACHE


class EmptyCache(Codemod):
    word = "empty-cache"
    needs_torch = (0, 0)  # it only removes calls
    summary = "remove torch.cuda.empty_cache() from loop bodies (a device sync every iteration)"
    codes = {
        "AM210": "torch.cuda.empty_cache() in a loop body synchronises the device every iteration",
        "AM211": "torch.cuda.empty_cache() outside a loop: one device sync, kept",
        "AM212": "torch.cuda.empty_cache() in a loop body, inside a larger statement: remove it by hand",
    }
    # Outside a loop the call costs one sync and may be there on purpose.
    notes = frozenset({"AM211"})
    triggers = ("empty_cache",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._doomed: set[cst.CSTNode] = set()  # statement lines to remove

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, EMPTY_CACHE):
            return
        statement = self._own_statement_line(node)
        in_loop = bool(self.script.loops_around(node))
        if not in_loop:
            self.report(node, "AM211", "torch.cuda.empty_cache() outside a loop: one device sync, kept (it frees memory for another process, not for this one)")
        elif statement is None:
            self.report(node, "AM212", "torch.cuda.empty_cache() in a loop body, inside a larger statement: remove it by hand (it synchronises the device every iteration)")
        elif self.fix(node, "AM210", "removed torch.cuda.empty_cache() from a loop body: it synchronises the device every iteration and frees no live tensor"):
            self._doomed.add(statement)

    def _own_statement_line(self, call: cst.Call) -> Union[cst.SimpleStatementLine, None]:
        """The statement line that is nothing but this call, if it is one."""
        expression = self.parent(call)
        line = self.parent(expression) if isinstance(expression, cst.Expr) else None
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if self._doomed.isdisjoint(original_node.body):
            return updated_node
        # Map the updated children back to the originals, which _doomed holds.
        doomed_updated = {new for old, new in zip(original_node.body, updated_node.body) if old in self._doomed}
        return updated_node.with_changes(body=remove_statements(updated_node.body, doomed_updated))
