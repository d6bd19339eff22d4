"""Positions computed one statement at a time (codemods/script/positions.py)
are LibCST's PositionProvider's, node by node."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from accelmigrate.codemods.script import ScriptModel

from conftest import FIXTURES

SHAPES = {
    "header comments and decorators": "#!/usr/bin/env python\n# a comment\n\n\nimport torch\n\n\n@torch.no_grad()\n# between\n@staticmethod\ndef f(x):\n    return x.cuda()\n    # the block's footer\n\n# before the class\nclass A:\n    pass\n",
    "semicolons and continuations": "a = 1; b = (2,\n  3); c = \\\n    4\nif a: b = 2\nx = f'''\n{a}\n'''\n",
    "carriage returns": "import torch\r\n\r\nx = torch.ones(2)\r\ny = x.cuda()\r\n",
    "no trailing newline": "import torch\nx = torch.ones(2).cuda()",
    "comments only": "# nothing but\n# comments\n",
    "form feed": "x = 1\n\x0c\ndef f():\n    return 2\n",
    "nested bodies, elif and odd indentation": "class A:\n  def f(self, x):\n\n      # c\n      if x:\n        y = 1\n      elif x > 1:\n        y = 2\n      else:\n       y = 3\n      while y: y -= 1\n      try:\n          pass\n      finally:\n          z = x.cuda()\n      return y\n  @property\n  def g(self): return 1\n",
}


def _assert_same_positions(source: str) -> None:
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = ScriptModel.of(module).line
    for node, where in reversed(list(expected.items())):  # inner nodes first: each statement resolved by a late node
        assert lines.range(node) == where, (type(node).__name__, cst.Module([]).code_for_node(node) if isinstance(node, cst.CSTNode) else node)
        assert lines(node) == where.start.line


@pytest.mark.parametrize("shape", list(SHAPES))
def test_positions_of_awkward_shapes_are_libcsts(shape):
    _assert_same_positions(SHAPES[shape])


def test_positions_of_every_fixture_are_libcsts():
    files = sorted(FIXTURES.rglob("*.py"))
    assert len(files) > 100
    for file in files:
        _assert_same_positions(file.read_text())


def test_positions_of_torch_sources_are_libcsts():
    root = Path(importlib.util.find_spec("torch").origin).parent
    files = sorted(root.glob("nn/modules/*.py"))[:20] + sorted(root.glob("optim/*.py"))[:10]
    assert len(files) == 30
    for file in files:
        _assert_same_positions(file.read_text())


def test_a_statement_is_laid_out_only_when_a_node_in_it_is_asked_for():
    module = cst.parse_module("x = 1\ny = 2\nz = [\n    3,\n]\n")
    lines = ScriptModel.of(module).line
    three = module.body[2].body[0].value.elements[0].value
    assert lines(three) == 4
    assert lines._done == {module.body[2]}


def test_a_report_in_one_method_lays_out_that_statement_not_the_class():
    source = "class Trainer:\n" + "".join(f"    def step{i}(self, x):\n        y = x + {i}\n        return y.cuda()\n\n" for i in range(50))
    module = cst.parse_module(source)
    lines = ScriptModel.of(module).line
    method = module.body[0].body.body[30]
    call = method.body.body[1].body[0].value
    assert lines(call) == 2 + 4 * 30 + 2
    assert lines.range(call) == MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[call]
    assert lines._done == {method.body.body[1]}
