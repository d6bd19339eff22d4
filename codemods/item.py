"""item: stop keeping losses, with their autograd graphs, across iterations.

What it does
    Finds a loss: a tensor that `.backward()` is called on (also through
    `scaler.scale(loss)`, `(loss / n)`, `torch.autograd.backward(...)`,
    `self.manual_backward(loss)`), the tensors it is computed from by arithmetic
    (`loss_sum = loss1 + loss2`), the values computed from it
    (`total_loss = loss * w`), and the call of a function of this file that
    always returns one (`train_step(model, batch)` or `self.train_step(batch)`
    ending in `return loss`). Where a loop stores one in something that
    outlives the iteration (`losses.append(loss)`, `total += loss`,
    `running = running + loss`, `history[k] = loss`, `self.losses.append(loss)`,
    a global), it stores `loss.item()` when every later use of that
    accumulator reads it as a number (printing, formatting, arithmetic,
    comparisons, `float()`, `sum()`, `np.mean()`, logging), and
    `loss.detach()` when later code treats it as a tensor (`torch.stack`,
    `.mean()`, `.cpu()`, `.numpy()`, `.item()`) or the loss may hold more than
    one number. Later uses are followed through assignments, loops,
    comprehensions, containers, the callers of a function that returns the
    accumulator, and the methods of the class for `self.` attributes.

    A loss stored inside a record made for logging (`record = {"loss": loss}`,
    then `history.append(record)`) is detached in that literal, where every
    use of the record reads it as a number or tensor; `losses.append(
    train_step(...))` gets `.item()` (or `.detach()`) on the call.

Why
    A loss references the whole graph of the forward pass that produced it.
    Adding it to a list or a running total keeps every graph alive for as
    long as the accumulator lives (with `retain_graph=True`, or before
    `backward()`, with all their saved activations), and a running total
    grows one long graph: memory climbs every step until the epoch ends or the
    device runs out. `.item()` keeps a Python float and lets the graph go;
    `.detach()` keeps the same tensor without its history.

Example
    Before::

        losses = []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss)
        print(sum(losses) / len(losses))

    After::

        losses = []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        print(sum(losses) / len(losses))

Left alone
    Values already detached (`loss.item()`, `loss.detach()`, `loss.data`,
    `loss.data[0]`, `float(loss)`); accumulators assigned afresh in every
    iteration of the loop that computes the loss; values kept in order to be
    backpropagated later (per-step policy-gradient losses stacked and summed
    before `.backward()`, `total += loss` followed by `total.backward()`);
    tensors that are not losses (an RNN's hidden state, predictions) and plain
    numbers that losses are multiplied by. When the later use cannot be
    followed (the accumulator is an argument, an attribute of another object,
    passed to an unknown function, returned to no caller in the file, a
    `self.` attribute never read in the file, or a meter's `update(loss, n)`)
    it reports AM203 and changes nothing; so does a loss inside a value that
    cannot be detached as a whole (a tuple a function returns, a function
    that returns None on some path, a record assigned in two branches).
"""

from __future__ import annotations

import libcst as cst

from ._base import Codemod, code_of
from ._item.analysis import Analysis
from ._item.syntax import Expression, Need, Store, Verdict, first_line
from .script.item_facts import item_facts


class Item(Codemod):
    word = "item"
    needs_torch = (0, 4)  # Tensor.item()
    summary = "store loss.item() / loss.detach(), not the loss and its graph, across iterations"
    codes = {
        "AM201": "loss kept across iterations with its autograd graph, later read only as a number: store .item()",
        "AM202": "loss kept across iterations with its autograd graph, later used as a tensor: store .detach()",
        "AM203": (
            "loss kept across iterations with its autograd graph, whose later use cannot be followed: "
            "detach it by hand"
        ),
    }
    triggers = ("backward",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._rewrites: dict[cst.CSTNode, str] = {}  # loss expression -> "item" / "detach"

    # -- the rewrite ---------------------------------------------------------------

    # The analysis reads the nodes the script model already ordered, so this
    # codemod's own pass does not descend; a second pass rewrites, only when
    # there is something to rewrite.

    def visit_Module(self, node: cst.Module) -> bool:
        return False  # everything is planned and rewritten in leave_Module: no walk

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        analysis = Analysis(self, item_facts(self.script))
        for accumulator, stores in analysis.accumulators().items():
            self._settle(analysis, accumulator, stores)
        if not self._rewrites:
            return updated_node
        # Nothing else changed in this pass: rewrite the original, whose nodes the rewrites name.
        return original_node.visit(_Rewriter(self._rewrites))

    def _settle(self, analysis: Analysis, accumulator: tuple, stores: list[Store]) -> None:
        verdict = analysis.later_uses(accumulator, stores)
        for target in {id(t): t for store in stores for t in store.carried}.values():
            verdict |= analysis.follow_binding(target)  # the container's other uses see the rewrite too
        if verdict.need is Need.GRAPH:
            return  # collected to be backpropagated: the graph is the point
        all_scalar = all(scalar for store in stores for _, scalar in store.atoms)
        method = "item" if verdict.need <= Need.NUMBER and all_scalar else "detach"
        for store in stores:
            if store.is_update:
                self._report_update(store)
            elif store.opaque:
                self._report_inside(store)
            elif verdict.need is Need.UNKNOWN:
                self._report_unknown(store, verdict.why)
            else:
                self._rewrite(store, method, verdict)

    def _rewrite(self, store: Store, method: str, verdict: Verdict) -> None:
        loss, where = _describe(store)
        kept = f"{loss} is kept in {where} across iterations with its whole autograd graph"
        if method == "item":
            code, message = "AM201", f"{kept}, and {where} is only read as a number: store {loss}.item()"
        elif verdict.need is Need.TENSOR:
            code, message = "AM202", f"{kept}, and {where} is later used as a tensor: store {loss}.detach()"
        else:
            code, message = "AM202", f"{kept}, and {loss} may hold more than one number: store {loss}.detach()"
        if self.fix(store.node, code, message):
            for atom, _ in store.atoms:
                self._rewrites[atom] = method

    def _report_update(self, store: Store) -> None:
        loss, _ = _describe(store)
        meter = code_of(store.node.func.value)
        self.report(
            store.node,
            "AM203",
            f"{meter}.update() gets {loss} with its autograd graph, and what {meter} keeps cannot be seen: "
            f"pass {loss}.item() (or {loss}.detach()) if it keeps the value across iterations",
        )

    def _report_inside(self, store: Store) -> None:
        """A loss inside what is stored (a tuple a function returns, a value
        on one of its paths), where appending `.item()` is no fix."""
        value = first_line(store.values[0]) if store.values else "the stored value"
        where = code_of(_holder_of(store.target))
        self.report(
            store.node,
            "AM203",
            f"{where} keeps a loss with its autograd graph inside `{value}`, which cannot be detached here as a "
            "whole: detach the loss where that value is made (`loss.item()`, or `loss.detach()` where it is used "
            "as a tensor), unless it is backpropagated later",
        )

    def _report_unknown(self, store: Store, why: str) -> None:
        loss, where = _describe(store)
        self.report(
            store.node,
            "AM203",
            f"{loss} is kept in {where} across iterations with its autograd graph, and what later code does with it "
            f"cannot be followed ({why}): store {loss}.item() if it is only read as a number, else {loss}.detach(), "
            "unless it is backpropagated later",
        )


class _Rewriter(cst.CSTTransformer):
    """Appends `.item()` or `.detach()` to the chosen loss expressions."""

    def __init__(self, rewrites: dict[cst.CSTNode, str]) -> None:
        super().__init__()
        self.rewrites = rewrites

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Expression:
        return self._rewritten(original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Expression:
        return self._rewritten(original_node, updated_node)

    def _rewritten(self, original: Expression, updated: Expression) -> Expression:
        method = self.rewrites.get(original)
        if method is None:
            return updated
        return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name(method)))


def _describe(store: Store) -> tuple[str, str]:
    """How messages name the stored loss and the accumulator."""
    stored = store.atoms[0][0] if store.atoms else store.values[0]
    loss = code_of(stored)
    if not isinstance(stored, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        loss = f"({loss})"
    return loss, code_of(_holder_of(store.target))


def _holder_of(target: Expression) -> Expression:
    """`history` for `history[k]` and `history[k][j]`."""
    while isinstance(target, cst.Subscript):
        target = target.value
    return target
