"""amp on the shapes of the reach corpus (benchmarks/reach/): what steps in a
training loop is an optimizer only when it may be one."""
import textwrap

from accelmigrate.engine.migrate import migrate_source

HEAD = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    device = torch.device("cpu")
    model = nn.Linear(3, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """
)
LOOP = textwrap.dedent(
    """
    helper = {built}
    for step in range(3):
        x = torch.randn(4, 3, device=device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        helper.step()
    """
)


def amp_codes(classes: str, built: str) -> list:
    source = HEAD + textwrap.dedent(classes) + LOOP.format(built=built)
    return [f.code for f in migrate_source(source, [("amp", {})]).findings if f.code.startswith("AM4")]


def test_a_plain_class_built_from_constants_is_no_optimizer():
    classes = """
    class Counter(object):
        def __init__(self, start):
            self.value = start

        def step(self):
            self.value += 1
    """
    assert amp_codes(classes, "Counter(0)") == ["AM401"]


def test_a_plain_class_that_reads_gradients_may_be_an_optimizer():
    classes = """
    class ManualSGD:
        def __init__(self, lr):
            self.lr = lr

        def step(self):
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-self.lr)
    """
    assert amp_codes(classes, "ManualSGD(0.1)") == ["AM414"]


def test_a_plain_class_given_the_parameters_may_be_an_optimizer():
    classes = """
    class Stepper:
        def __init__(self, params):
            self.params = list(params)

        def step(self):
            pass
    """
    assert amp_codes(classes, "Stepper(model.parameters())") == ["AM414"]


def test_a_class_with_an_unknown_base_may_be_an_optimizer():
    classes = """
    from somewhere import Base

    class Stepper(Base):
        def step(self):
            pass
    """
    assert amp_codes(classes, "Stepper()") == ["AM414"]
