"""sync-bn speaks only where a model may have BatchNorm layers: a model
built from classes of this file that build none gets no conversion and no
finding to act on (AM544, a note, at a wrap); one built from anything that
cannot be seen (another module, torchvision, torch.hub, a layer passed in)
is converted, or reported when there is no wrap."""

import textwrap

import pytest

from accelmigrate.engine.migrate import migrate_source

MODELS = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), LAYER, nn.Tanh())

        def forward(self, z):
            return self.net(z)


    class Critic(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 1))

        def forward(self, x):
            return self.net(x)


    """
)
# ddp cannot wrap two models assigned in one tuple: sync-bn has no wrap.
TWO_MODELS_UNWRAPPED = MODELS + textwrap.dedent(
    """\
    netG, netD = nn.DataParallel(Generator()), nn.DataParallel(Critic())
    optG = torch.optim.Adam(netG.parameters())
    optD = torch.optim.Adam(netD.parameters())
    for step in range(10):
        optD.zero_grad()
        netD(netG(torch.randn(4, 8))).mean().backward()
        optD.step()
    """
)
ONE_MODEL = MODELS + textwrap.dedent(
    """\
    def main():
        model = nn.DataParallel(BUILT.cuda())
        optimizer = torch.optim.Adam(model.parameters())
        for step in range(10):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).mean().backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """
)


def sync_bn_codes(source: str) -> list[str]:
    found = migrate_source(source, [("sync-bn", {})], "train.py", check_only=True).findings
    return [f.code for f in found if f.word == "sync-bn"]


@pytest.mark.parametrize(
    "layer, codes",
    [
        ("nn.ReLU()", []),  # linear layers only: nothing to synchronise
        ("nn.BatchNorm1d(16)", ["AM541"]),
        ("nn.LazyBatchNorm1d()", ["AM541"]),
    ],
)
def test_without_a_wrap_a_missing_conversion_is_reported_only_where_batch_norm_may_be(layer, codes):
    assert sync_bn_codes(TWO_MODELS_UNWRAPPED.replace("LAYER", layer)) == codes


@pytest.mark.parametrize(
    "layer, built, codes",
    [
        ("nn.ReLU()", "Generator()", ["AM544"]),
        ("nn.BatchNorm1d(16)", "Generator()", ["AM540"]),
        ("Block(16)", "Generator()", ["AM540"]),  # a block of another module may hold BatchNorm
        ("nn.ReLU()", "torch.hub.load('owner/repo', 'net')", ["AM540"]),
        ("nn.ReLU()", "torchvision.models.resnet18()", ["AM540"]),
    ],
)
def test_a_wrap_is_converted_unless_the_model_surely_has_no_batch_norm(layer, built, codes):
    source = ONE_MODEL.replace("LAYER", layer).replace("BUILT", built)
    source = "import torchvision\nfrom blocks import Block\n" + source
    assert sync_bn_codes(source) == codes


def test_a_class_that_builds_a_layer_it_is_given_may_have_batch_norm():
    source = ONE_MODEL.replace("LAYER", "norm(16)").replace("def __init__(self):\n        super().__init__()\n        self.net = nn.Sequential(nn.Linear(8, 16)", "def __init__(self, norm=nn.Identity):\n        super().__init__()\n        self.net = nn.Sequential(nn.Linear(8, 16)", 1)
    assert "norm=nn.Identity" in source
    assert sync_bn_codes(source.replace("BUILT", "Generator()")) == ["AM540"]


def test_models_wrapped_with_rank_local_buffers_are_converted():
    """ddp gives a GAN's discriminator `**rank_local_buffers()`: runtime
    settings of its buffers, never a process group, so sync-bn still converts."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "gan_tutorial.py"
    result = migrate_source(script.read_text(), [("ddp", {}), ("sync-bn", {})], str(script))
    assert "**rank_local_buffers()" in result.code
    for model in ("netG", "netD"):
        assert f"{model} = torch.nn.SyncBatchNorm.convert_sync_batchnorm({model})" in result.code
    assert not [f for f in result.findings if f.code == "AM542"]
