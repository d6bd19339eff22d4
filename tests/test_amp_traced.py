"""amp: optimizers and devices traced where real scripts keep them (the
corpus's AM413/AM414 stops): an optimizer handed to a trainer's __init__
and stepped in another method, and a script that names only the CPU."""
import textwrap

from accelmigrate.engine.migrate import migrate_source

TRAINER = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Trainer:
        def __init__(self, model, optimizer, device):
            self.model = model.to(device)
            self.optimizer = optimizer
            self.device = device

        def epoch(self, batches):
            for x, y in batches:
                x, y = x.to(self.device), y.to(self.device)
                self.optimizer.zero_grad()
                loss = nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()


    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(4, 1)
    {optimizer}
    trainer = Trainer(model, {argument}, device)
    trainer.epoch([(torch.randn(8, 4), torch.randn(8, 1))])
    """
)


def amp_codes(source: str) -> list:
    return [f.code for f in migrate_source(source, [("amp", {})]).findings if f.code.startswith("AM4")]


def test_an_optimizer_handed_to_the_constructor_gets_its_scaler_there():
    source = TRAINER.format(optimizer="optimizer = torch.optim.SGD(model.parameters(), lr=0.1)", argument="optimizer")
    migration = migrate_source(source, [("amp", {})])
    assert [f.code for f in migration.findings if f.code.startswith("AM4")] == ["AM401"]
    assert "        self.optimizer = optimizer\n        self.scaler = grad_scaler(device, amp_dtype)\n" in migration.code
    assert "self.scaler.step(self.optimizer)" in migration.code


def test_an_optimizer_the_caller_builds_out_of_view_gets_its_own_scaler_where_it_steps():
    source = TRAINER.format(optimizer="from helpers import make_optimizer\noptimizer = make_optimizer(model)", argument="optimizer")
    migration = migrate_source(source, [("amp", {})])
    assert [f.code for f in migration.findings if f.code.startswith("AM4")] == ["AM401"]
    assert "    def epoch(self, batches):\n        scaler = scaler_for(self.optimizer, device, amp_dtype)\n" in migration.code
    assert "scaler.step(self.optimizer)" in migration.code


def test_an_optimizer_reassigned_in_the_stepping_method_stays_a_manual_step():
    source = TRAINER.format(optimizer="from helpers import make_optimizer\noptimizer = make_optimizer(model)", argument="optimizer")
    source = source.replace("        for x, y in batches:\n", "        self.optimizer = make_optimizer(self.model)\n        for x, y in batches:\n", 1)
    assert amp_codes(source) == ["AM414"]


CPU_SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn

    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 4, device={where})
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), "w.pt")
    model.load_state_dict(torch.load("w.pt", map_location={where}))
    """
)


def test_naming_only_the_cpu_computes_on_the_cpu():
    migration = migrate_source(CPU_SCRIPT.format(where='"cpu"'), [("amp", {})])
    assert [f.code for f in migration.findings if f.code.startswith("AM4")] == ["AM401"]
    assert 'torch.autocast(device_type="cpu"' in migration.code


def test_naming_an_accelerator_is_not_the_cpu():
    migration = migrate_source(CPU_SCRIPT.format(where='"cuda"'), [("amp", {})])
    assert 'device_type="cpu"' not in migration.code
