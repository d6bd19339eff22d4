"""The analysis behind the `item` codemod, on one file version: which names
hold losses (`losses`), where they are stored across iterations
(`stores`), and what later code does with what was stored (`uses`). It reads
names, scopes, parents, order and training steps from the script model."""

from __future__ import annotations

import libcst as cst

from .._base import Codemod
from ..script.item_facts import ItemFacts
from .losses import Losses
from .stores import Stores
from .uses import Uses


class Analysis(Losses, Stores, Uses):
    """Which names hold losses, where they are stored across iterations, and
    what the code does later with what was stored. Works on one file
    version, reading names, scopes, parents and order from the script model."""

    def __init__(self, codemod: Codemod, nodes: ItemFacts) -> None:
        self.codemod = codemod
        self.nodes = nodes
        self.losses: dict[tuple, bool] = {}  # (scope, name) -> known to be 0-d
        self.containers: set[tuple] = set()  # lists whose elements are stacked and backpropagated
        self.carriers: set[tuple] = set()  # (scope, name) assigned a literal that holds a loss
        self._definitions: dict[int, list[cst.CSTNode]] = {}  # id(Name) -> what reaches it
        self._loss_definitions: set[int] = set()  # ids of binding targets that give a loss
        self._pending: list[tuple[cst.Name, bool]] = []  # loss reads whose sources are still to find
        self._traced: set[int] = set()
        self._doubtful: list[tuple[cst.Name, bool]] = []  # operands not (yet) known to be tensors
        self._following: set = set()  # what is being followed now, against cycles
        self._returning: set = set()  # the returns being read now, against recursion
        self._find_losses()


__all__ = ["Analysis"]
