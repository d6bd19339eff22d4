"""`--to accelerate` of training code in functions the entry point calls
(codemods/_accelerate/functions.py).

- fast: the accelerator is passed to `train()` / `test()` of the examples
  shape, the `--no-cuda` flag still keeps the run on the CPU, and a function
  called with different models, from elsewhere, or a method is refused whole;
- end to end (slow): the migrated examples-shape fixture
  (fixtures/accelerate/train_fn_mnist_examples.py: argparse in main(),
  train() and test() called once per epoch, seeded synthetic data) run as
  plain `python` and on 2 CPU processes under torchrun (ACCELERATE_USE_CPU)
  saves the one-process original's weights within 1e-5, and prints each
  epoch's test line once; so does the examples' `DataLoader(data,
  **train_kwargs)` (train_fn_loader_kwargs.py), watched from outside by
  fixtures/scripts/ddp_rank_weights.py. A chain of functions
  (fixtures/accelerate/train_fn_chain.py: main -> fit -> train_one_epoch ->
  train_step) gets the accelerator (or the Fabric) passed down, and its
  migrations end on 2 processes with the original's weights.
"""

from __future__ import annotations

import sys

import pytest
from conftest import FIXTURES, PARITY, exact_options
from launching import (
    ONE_PROCESS_TOLERANCE,
    RANK_WEIGHTS,
    assert_ranks_agree,
    cpu_env,
    largest_parameter_difference,
    launch_all,
    on_two,
    rank_weights,
)

from accelmigrate.engine.migrate import migrate_source

EXAMPLES = FIXTURES / "accelerate" / "train_fn_mnist_examples.py"
LOADER_KWARGS = FIXTURES / "accelerate" / "train_fn_loader_kwargs.py"
CHAIN = FIXTURES / "accelerate" / "train_fn_chain.py"  # main -> fit -> train_one_epoch -> train_step
EPOCHS = 3  # the fixture's default


def _migrate(source: str):
    return migrate_source(source, [("accelerate", PARITY)], "train.py")


def _refusals(result) -> list[str]:
    return [f.code for f in result.findings if not f.fixed]


def test_the_accelerator_is_passed_to_the_functions_that_train_and_print():
    result = _migrate(EXAMPLES.read_text())
    code = result.code
    assert _refusals(result) == [] and "accelerator.prepare(model, optimizer, train_loader, scheduler)" in code
    assert "def train(args, model, device, train_loader, optimizer, epoch, accelerator):" in code
    assert "def test(model, device, test_loader, accelerator):" in code
    assert code.count("accelerator=accelerator)") == 2
    assert "accelerator.backward(loss)" in code and "print(" not in code.replace("accelerator.print(", "")


def test_the_no_cuda_flag_still_keeps_the_run_on_the_cpu():
    code = _migrate(EXAMPLES.read_text()).code
    assert "Accelerator(cpu=args.no_cuda or not torch.cuda.is_available()," in code
    # made once the arguments are parsed
    assert code.index("args = parser.parse_args()") < code.index("accelerator = Accelerator(")


TWO_CALLERS = '''\
import torch
from torch.utils.data import DataLoader


def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def warm_up(model, loader, optimizer):
    train(model, loader, optimizer)


def main():
    loader = DataLoader(list(zip(torch.randn(8, 2), torch.randn(8, 1))), batch_size=4)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warm_up(model, loader, optimizer)
    train(model, loader, optimizer)


if __name__ == "__main__":
    main()
'''

METHOD = '''\
import torch
from torch.utils.data import DataLoader


class Trainer:
    def fit(self, model, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


def main():
    loader = DataLoader(list(zip(torch.randn(8, 2), torch.randn(8, 1))), batch_size=4)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer().fit(model, loader, optimizer)


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("source, said", [
    ((FIXTURES / "accelerate" / "train_fn_refused_two_models.py").read_text(), "gets `small` and `large` for its parameter `model`"),
    (TWO_CALLERS.replace("\n\ndef main():", "\n\nWARM_UPS = [warm_up]\n\n\ndef main():"), "`train` is also called from `warm_up`"),
    (TWO_CALLERS.replace("    warm_up(model, loader, optimizer)\n    train(", "    warm_up(model, loader, optimizer)\n    warm_up(model, loader, torch.optim.SGD(model.parameters(), lr=0.2))\n    train("),
     "gets `optimizer` and `torch.optim.SGD(model.parameters(), lr=0.2)` for its parameter `optimizer`"),
    (METHOD, "`Trainer.fit` is a method whose calls cannot all be followed (`.fit`, line 17)"),
])
def test_a_function_the_entry_point_does_not_alone_call_with_its_own_objects_is_refused_whole(source, said):
    result = _migrate(source)
    assert result.code == source
    (refusal,) = [f for f in result.findings if not f.fixed]
    assert refusal.code == "AM820" and said in refusal.message


def test_a_function_called_from_another_that_receives_the_accelerator_receives_it_too():
    code = _migrate(TWO_CALLERS).code
    assert "def warm_up(model, loader, optimizer, accelerator):\n    train(model, loader, optimizer, accelerator=accelerator)" in code
    assert code.count("accelerator=accelerator)") == 3  # warm_up's call of train, and main's two calls


def test_a_cuda_flag_given_as_a_number_keeps_the_cpu_too():
    source = EXAMPLES.read_text().replace(
        'parser.add_argument("--no-cuda", action="store_true", default=False, help="train on the CPU")',
        'parser.add_argument("--cuda", type=int, default=1, help="0 trains on the CPU")',
    ).replace("use_cuda = not args.no_cuda and", "use_cuda = args.cuda and")
    assert "--cuda" in source and "args.cuda and" in source
    result = _migrate(source)
    assert _refusals(result) == [] and "Accelerator(cpu=not args.cuda or not torch.cuda.is_available()," in result.code


@pytest.mark.parametrize("flag, dest", [("--no-accel", "no_accel"), ("--cpu", "cpu")])
@pytest.mark.parametrize("word, reads", [("accelerate", "Accelerator(cpu=args.{} or"), ("fabric", 'Fabric(accelerator="cpu" if args.{} or')])
def test_the_other_spellings_of_the_cpu_choice_keep_the_cpu_too(flag, dest, word, reads):
    """Today's examples ask for the CPU with `--no-accel` (torch.accelerator); once the choice went unread."""
    source = EXAMPLES.read_text().replace(
        'parser.add_argument("--no-cuda", action="store_true", default=False, help="train on the CPU")',
        f'parser.add_argument("{flag}", action="store_true", default=False, help="train on the CPU")',
    ).replace("use_cuda = not args.no_cuda and", f"use_cuda = not args.{dest} and")
    assert flag in source
    result = migrate_source(source, [(word, exact_options(word))], "train.py")
    assert reads.format(dest) in result.code


def test_a_print_before_the_arguments_are_parsed_keeps_the_flag_refused():
    source = EXAMPLES.read_text().replace("    parser = argparse.ArgumentParser(", "    print('starting')\n    parser = argparse.ArgumentParser(")
    result = _migrate(source)
    assert result.code == source and _refusals(result) == ["AM827"]


# -- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("accelerate_functions")
    migrated = work / "migrated.py"
    migrated.write_text(_migrate(EXAMPLES.read_text()).code)
    kwargs = work / "kwargs_migrated.py"
    kwargs.write_text(_migrate(LOADER_KWARGS.read_text()).code)
    chained = {}
    for word in ("accelerate", "fabric"):
        chained[word] = work / f"chain_{word}.py"  # not accelerate.py: it would shadow the package
        chained[word].write_text(migrate_source(CHAIN.read_text(), [(word, exact_options(word))], "train.py").code)
    weights = ["--save-model", "{folder}/weights.pt"]
    plans = {
        "original": [sys.executable, str(EXAMPLES), *weights],
        "plain": [sys.executable, str(migrated), *weights],
        "two": on_two(migrated, *weights),
        "kwargs_original": [sys.executable, str(RANK_WEIGHTS), "{folder}", str(LOADER_KWARGS)],
        "kwargs_two": on_two(RANK_WEIGHTS, "{folder}", str(kwargs)),
        "chain_original": [sys.executable, str(CHAIN), *weights],
        "chain_plain": [sys.executable, str(chained["accelerate"]), *weights],
        "chain_accelerate_two": on_two(chained["accelerate"], *weights),
        "chain_fabric_two": on_two(chained["fabric"], *weights),
    }
    launches, folders = launch_all(work, plans, cpu_env(ACCELERATE_USE_CPU="true"))
    for launch in launches.values():
        launch.succeeded()
    return launches, folders


def _weights(folder) -> list:
    import torch

    return list(torch.load(folder / "weights.pt").values())


def _test_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Test set")]


@pytest.mark.slow
@pytest.mark.parametrize("migrated", ["plain", "two"])
def test_migrated_examples_shape_ends_with_the_originals_weights(runs, migrated):
    _, folders = runs
    assert largest_parameter_difference(_weights(folders["original"]), _weights(folders[migrated])) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("migrated", ["plain", "two"])
def test_each_epochs_test_line_is_printed_once(runs, migrated):
    launches, _ = runs
    expected = _test_lines(launches["original"].stdout)
    assert len(expected) == EPOCHS
    # Every process evaluates the whole test set with the same weights: the original's numbers, once.
    assert _test_lines(launches[migrated].stdout) == expected


@pytest.mark.slow
def test_a_loader_given_its_settings_as_kwargs_trains_as_the_original_on_two_processes(runs):
    launches, folders = runs
    (original,) = rank_weights(folders["kwargs_original"])
    two = assert_ranks_agree(launches["kwargs_two"], folders["kwargs_two"])
    assert largest_parameter_difference(original, two) <= ONE_PROCESS_TOLERANCE
    assert launches["kwargs_two"].stdout.count("epoch 2 done") == 1


@pytest.mark.slow
@pytest.mark.parametrize("migrated", ["chain_plain", "chain_accelerate_two", "chain_fabric_two"])
def test_a_chain_of_functions_passes_the_accelerator_down_and_trains_as_the_original(runs, migrated):
    launches, folders = runs
    assert largest_parameter_difference(_weights(folders["chain_original"]), _weights(folders[migrated])) <= ONE_PROCESS_TOLERANCE
    assert launches[migrated].stdout.count("mean loss") == EPOCHS  # each epoch's line, once


def test_a_flag_parsed_at_module_level_and_a_function_called_twice():
    source = LOADER_KWARGS.read_text()
    parsing = '''    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
'''
    source = source.replace(parsing, "").replace("def main():\n", parsing.replace("    ", "") + "\n\ndef main():\n")
    source = source.replace("    for epoch in range(1, 3):\n", "    train(args, model, device, train_loader, optimizer, 0)\n    for epoch in range(1, 3):\n")
    result = _migrate(source)
    assert _refusals(result) == ["AM811"]
    code = result.code
    assert "def main():\n    accelerator = Accelerator(cpu=args.no_cuda or not torch.cuda.is_available()," in code
    assert code.count("optimizer, 0, accelerator=accelerator)") == 1 and code.count("epoch, accelerator=accelerator)") == 1
    assert code.index("accelerator.prepare(") < code.index("optimizer, 0, accelerator=accelerator)")
