"""Fill constants that float16 cannot hold (issue 29, item 9): attention
scores masked with -1e9 raise under float16 autocast ("value cannot be
converted to type c10::Half without overflow"). amp writes the constant by
the scores' dtype (`torch.finfo(scores.dtype).min`); forced to float16 on
the CPU the migrated fixture trains, and in float32 it prints exactly what
the original printed."""

from __future__ import annotations

import textwrap

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, run_python
from test_amp import ONE_THREAD, PRECISION_VARIABLE, final_loss

FIXTURE = FIXTURES / "amp" / "attention_mask_fill.py"
FILL = "scores = scores.masked_fill(mask == 0, -1e9)"


def amp(source: str):
    return migrate_source(source, [("amp", {})], "train.py")


@pytest.mark.slow
def test_under_float16_the_masked_attention_trains_where_the_original_does(tmp_path):
    source = FIXTURE.read_text(encoding="utf-8")
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "migrated.py").write_text(amp(source).code)
    (tmp_path / "kept.py").write_text(amp(source.replace(FILL, FILL + "  # accelmigrate: skip[AM419]")).code)
    original = run_python(tmp_path / "original.py", env=ONE_THREAD)
    float32 = run_python(tmp_path / "migrated.py", env={**ONE_THREAD, PRECISION_VARIABLE: ""})
    assert float32.returncode == 0 and float32.stdout == original.stdout, float32.stderr[-2000:]
    kept = run_python(tmp_path / "kept.py", env={**ONE_THREAD, PRECISION_VARIABLE: "fp16"})
    assert kept.returncode != 0 and "without overflow" in kept.stderr, kept.stderr[-2000:]
    float16 = final_loss(run_python(tmp_path / "migrated.py", env={**ONE_THREAD, PRECISION_VARIABLE: "fp16"}))
    assert float16 != final_loss(original), "ACCELMIGRATE_PRECISION=fp16 changed nothing: autocast did not run"
    assert float16 == pytest.approx(final_loss(original), rel=0.03)


MODEL_MODULE = textwrap.dedent('''
    import torch
    from torch import nn


    class Scorer(nn.Module):
        def forward(self, scores, keep):
            scores.masked_fill_(~keep, value=-1e30)
            positive = scores.masked_fill(keep, 1e5)
            small = scores.masked_fill(~keep, -1e4)
            minus_inf = scores.masked_fill(~keep, float("-inf"))
            return torch.softmax(scores, -1) + positive + small + minus_inf


    def not_a_model(scores, keep):
        return scores.masked_fill(~keep, -1e9)


    def attention(scores, keep):
        weights = scores.masked_fill(keep == 0, -1e9)
        return weights.softmax(-1)


    class Attending(nn.Module):
        def forward(self, scores, keep):
            return attention(scores, keep)
''')


def test_a_model_module_gets_fills_by_dtype_in_its_modules_only():
    """A model module a training script reaches (no step of its own): the
    fills beyond float16's range in its nn.Module's code (and a function of
    the file that a module calls) are written by dtype; a fill float16 holds
    (-1e4, -inf) and a function no model calls are left."""
    result = amp(MODEL_MODULE)
    assert "scores.masked_fill_(~keep, value=torch.finfo(scores.dtype).min)" in result.code
    assert "scores.masked_fill(keep, torch.finfo(scores.dtype).max)" in result.code
    assert "scores.masked_fill(~keep, -1e4)" in result.code and 'float("-inf")' in result.code
    assert "return scores.masked_fill(~keep, -1e9)" in result.code
    assert "weights = scores.masked_fill(keep == 0, torch.finfo(scores.dtype).min)" in result.code  # called by a model
    assert [f.code for f in result.findings if f.fixed] == ["AM419", "AM419", "AM419"]
    assert amp(result.code).code == result.code


def test_a_fill_of_an_unnamed_value_is_a_finding():
    source = MODEL_MODULE.replace("scores.masked_fill_(~keep, value=-1e30)", "(scores * 2).masked_fill(~keep, -1e9)")
    result = amp(source)
    assert "(scores * 2).masked_fill(~keep, -1e9)" in result.code
    assert any(f.code == "AM419" and not f.fixed for f in result.findings), result.findings
