"""`--to accelerate` and `--to fabric` of a trainer class's methods.

- fixtures/accelerate/trainer_class_receives.py: `Trainer(model, optimizer,
  criterion, device)` made in main(), `trainer.fit(train_loader,
  val_loader, epochs)` calling `self.train_epoch(...)` and
  `self.evaluate(...)`: the methods on the way to the training step receive
  the accelerator (the Fabric) as the entry point's functions do; what the
  instance keeps (`self.model`, `self.optimizer`) is prepared in main()
  under the names the instance is made with;
- fixtures/accelerate/solver_class_builds.py: a `Solver(args, dataset)`
  whose `__init__` makes its network, optimizer and DataLoader and chooses
  the device: `__init__` receives the accelerator and prepares them there,
  the device becomes the accelerator's;
- in both, the checkpoint a method saves is the bare model's, written by
  the main process. Refused whole: an instance made before the last object
  to prepare is made, a class named other than to make an instance. The
  migrations end on 2 gloo processes with the one-process weights (fabric:
  over an unshuffled loader, as Fabric's sampler draws another order).
"""

from __future__ import annotations

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, exact_options
from test_ddp_param_groups import expected_pair_parity, parity_on_two

CASE = FIXTURES / "accelerate" / "trainer_class_receives.py"
BUILDS = FIXTURES / "accelerate" / "solver_class_builds.py"


def _migrate(source: str, word: str = "accelerate", default: bool = False):
    """With exact parity, but as the fixtures are written (Accelerate's defaults) with `default`."""
    return migrate_source(source, [(word, {} if default else exact_options(word))], "train.py")


def test_the_methods_on_the_way_to_the_step_receive_the_accelerator():
    result = _migrate(CASE.read_text())
    code = result.code
    assert [f.code for f in result.findings if not f.fixed and f.code not in ("AM811",)] == []
    assert "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)" in code
    assert "def train_epoch(self, loader, accelerator):" in code and "def fit(self, train_loader, val_loader, epochs, accelerator):" in code
    assert "train_loss = self.train_epoch(train_loader, accelerator=accelerator)" in code
    assert "trainer.fit(train_loader, val_loader, epochs=4, accelerator=accelerator)" in code
    assert "accelerator.unwrap_model(self.model).state_dict()" in code
    assert "def evaluate(self, loader):" in code  # it uses nothing of the accelerator


def test_a_trainer_calling_super_with_its_own_name_is_a_trainer_still():
    """`super(Trainer, self).__init__()` names the class in its own code, as `super()` would without naming it."""
    def edit(text):
        return text.replace("class Trainer:\n", "class Trainer(object):\n").replace(
            "        self.model = model.to(device)\n", "        super(Trainer, self).__init__()\n        self.model = model.to(device)\n", 1
        )

    source = edit(CASE.read_text())
    assert "super(Trainer, self)" in source
    assert _migrate(source, default=True).code == edit(CASE.with_name(f"{CASE.stem}.expected.py").read_text())


def test_a_method_under_no_grad_that_prints_receives_the_accelerator_too():
    source = CASE.read_text().replace("    def evaluate(self, loader):\n", "    @torch.no_grad()\n    def evaluate(self, loader):\n").replace(
        "                total += self.criterion(self.model(inputs), targets).item()\n        return",
        "                total += self.criterion(self.model(inputs), targets).item()\n        print(f\"validation total {total:.5f}\")\n        return",
    )
    assert "@torch.no_grad()" in source and "validation total" in source
    code = _migrate(source).code
    assert "    @torch.no_grad()\n    def evaluate(self, loader, accelerator):\n" in code
    assert 'accelerator.print(f"validation total {total:.5f}")' in code and "val_loss = self.evaluate(val_loader, accelerator=accelerator)" in code


def test_fabric_sets_up_what_the_instance_is_made_with():
    code = _migrate(CASE.read_text(), "fabric").code
    assert "model, optimizer = fabric.setup(model, optimizer)" in code and "self.model, " not in code.replace("self.model, self.optimizer", "")
    assert "trainer.fit(train_loader, val_loader, epochs=4, fabric=fabric)" in code


@pytest.mark.parametrize("edit, said", [
    (lambda s: s.replace("    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)\n    trainer = Trainer(model, optimizer, nn.MSELoss(), device)\n",
                         "    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)\n    trainer = Trainer(model, optimizer, nn.MSELoss(), device)\n    train_loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)\n"),
     "keeps objects to prepare before the last of them is made"),
    (lambda s: s.replace("\n\ndef main():", "\n\nTRAINERS = {'plain': Trainer}\n\n\ndef main():"),
     "which is used other than to make an instance"),
])
def test_a_trainer_whose_instances_cannot_be_followed_is_refused_whole(edit, said):
    source = edit(CASE.read_text())
    assert source != CASE.read_text()
    result = _migrate(source)
    assert result.code == source
    assert any(f.code == "AM820" and said in f.message for f in result.findings if not f.fixed), result.findings


def test_a_solver_that_makes_what_it_trains_prepares_it_in_its_init():
    result = _migrate(BUILDS.read_text())
    code = result.code
    assert [f.code for f in result.findings if not f.fixed and f.code not in ("AM811",)] == []
    init = code[code.index("    def __init__(self, args, dataset, accelerator):"):code.index("    def train(self, accelerator):")]
    assert init.index("self.device = accelerator.device") < init.index("accelerator.prepare(")
    assert init.rstrip().endswith("self.net, self.optim, self.loader = accelerator.prepare(self.net, self.optim, self.loader)")
    assert 'self.save("solver.pt", accelerator=accelerator)' in code and "solver.train(accelerator=accelerator)" in code
    fabric = _migrate(BUILDS.read_text(), "fabric").code
    assert "self.net, self.optim = fabric.setup(self.net, self.optim)" in fabric and "self.loader = fabric.setup_dataloaders(self.loader)" in fabric


BUILT_BY_A_METHOD = (
    """        self.net = Net().to(self.device)
        self.optim = torch.optim.SGD(self.net.parameters(), lr=args.lr, momentum=0.9)
        self.loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
""",
    """        self.loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
        self.build_model()

    def build_model(self):
        self.net = Net().to(self.device)
        self.optim = torch.optim.SGD(self.net.parameters(), lr=self.args.lr, momentum=0.9)
""",
)


def test_what_a_method_called_by_init_makes_is_prepared_after_that_call():
    source = BUILDS.read_text().replace(*BUILT_BY_A_METHOD)
    assert "def build_model(self):" in source
    code = _migrate(source).code
    assert "        self.build_model()\n        self.net, self.optim, self.loader = accelerator.prepare(self.net, self.optim, self.loader)\n" in code


def test_the_model_an_instance_keeps_read_outside_its_class_is_refused_under_accelerate():
    source = BUILDS.read_text().replace("    solver.train()\n", "    solver.train()\n    torch.save(solver.net.state_dict(), 'net.pt')\n")
    result = _migrate(source)
    assert result.code == source and [f.code for f in result.findings if not f.fixed and f.code != "AM811"] == ["AM824"]
    # Fabric's module answers state_dict as the bare module: read there, it is right as it is.
    fabric = _migrate(source, "fabric").code
    assert "self.net, self.optim = fabric.setup(self.net, self.optim)" in fabric and "solver.net.state_dict()" in fabric


@pytest.mark.slow
@pytest.mark.parametrize("case", [CASE, BUILDS], ids=["receives", "builds"])
def test_two_processes_end_with_the_one_process_weights(tmp_path, case):
    parity = expected_pair_parity(case, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why


@pytest.mark.slow
@pytest.mark.parametrize("case", [CASE, BUILDS], ids=["receives", "builds"])
def test_fabric_on_two_processes_ends_with_the_one_process_weights(tmp_path, case):
    source = case.read_text().replace("batch_size=16, shuffle=True)", "batch_size=16)").replace(", shuffle=True)", ")")
    assert "shuffle" not in source
    parity = parity_on_two(source, _migrate(source, "fabric").code, case.name, tmp_path, "fabric")
    assert parity.verdict == "same", parity.why
