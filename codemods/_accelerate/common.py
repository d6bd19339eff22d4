"""What the accelerate codemod's planning and rewriting share: the refusal,
the planned edits, and the statements it writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Union

import libcst as cst

# The names the migrated code binds or imports; a file that uses one of them
# for something else is left alone (AM825).
ACCELERATOR = "accelerator"
ADDED_NAMES = {"Accelerator": "accelerate", "DataLoaderConfiguration": "accelerate", ACCELERATOR: None}
# Where the run stays on the CPU, without a flag of the script's: no CUDA.
NO_CUDA = "not torch.cuda.is_available()"

# The exact-parity form (`accelerate=parity`). `split_batches=True`: the
# loader's batch size stays the global batch (each process takes its slice of
# every batch). Accelerate 1.x reads it from the DataLoaderConfiguration only:
# `Accelerator(split_batches=True)` is accepted and ignored. `cpu=`: torchrun's
# processes on a machine without CUDA form one gloo group only when accelerate
# is told to use the CPU; the original chose CUDA when it was there and the
# CPU otherwise. `dispatch_batches=True` for a shuffled training loader: on N
# processes `prepare` gives a RandomSampler without a generator one seeded
# from the global RNG (whatever `rng_types` and `use_seedable_sampler` say),
# which draws another order than the original's sampler; dispatching leaves
# the loader untouched on rank 0, which sends each process its slice of the
# original's batch.
# `cpu`: the script's own flag may keep it on the CPU (`args.no_cuda or ...`); else NO_CUDA.
def parity_accelerator_statement(dispatch: bool, mixed_precision: str | None = None, cpu: str = NO_CUDA) -> str:
    config = "split_batches=True, dispatch_batches=True" if dispatch else "split_batches=True"
    precision = f"mixed_precision={mixed_precision}, " if mixed_precision else ""
    return f"{ACCELERATOR} = Accelerator({precision}cpu={cpu}, dataloader_config=DataLoaderConfiguration({config}))"


# The default form, as Accelerate's own guide writes it: what the script chose
# itself (its mixed precision, its `--no-cuda` flag) and nothing else; the
# processes, the device and the rest come from `accelerate launch` or
# `accelerate config` (ACCELERATE_USE_CPU, ACCELERATE_MIXED_PRECISION, ...).
PER_PROCESS_BATCHES = (
    "Accelerate's defaults: on N processes each process loads the DataLoader's batch size, so the global batch is N "
    "times the original's and an epoch has N times fewer steps: the run trains as the original would with N times "
    "larger batches, at the learning rate as written; `--to accelerate=parity` keeps the original's global batch and order"
)


SAMPLER_ORDER = (
    "training DataLoader that shuffles (or may: made elsewhere, or with its own sampler): in a world of one it keeps "
    "the original's order; on N processes Accelerate's sampler draws another: a seeded run trains as well, not to the "
    "same numbers (`--to accelerate=parity` keeps the original's order)"
)


def accelerator_statement(mixed_precision: str | None = None, own_cpu_flag: str | None = None) -> str:
    settings = [f"mixed_precision={mixed_precision}"] if mixed_precision else []
    settings += [f"cpu={own_cpu_flag}"] if own_cpu_flag else []
    return f"{ACCELERATOR} = Accelerator({', '.join(settings)})"


Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]
Edit = Callable[[cst.CSTNode], cst.CSTNode]


class CannotMigrate(Exception):
    """Something the codemod cannot make right: reported, and nothing changes."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node, self.code, self.message = node, code, message


@dataclasses.dataclass
class Plan:
    """Every change, decided on the original tree and keyed by its nodes."""

    edits: dict = dataclasses.field(default_factory=dict)  # node -> Edit of its updated copy
    before: dict = dataclasses.field(default_factory=dict)  # statement -> [statements] inserted before it
    after: dict = dataclasses.field(default_factory=dict)  # statement -> [statements] inserted after it
    guarded: set = dataclasses.field(default_factory=set)  # statements run on the main process only
    removed: set = dataclasses.field(default_factory=set)  # statements dropped (the GradScaler's)
    unwrapped: set = dataclasses.field(default_factory=set)  # `with` blocks replaced by their body (autocast)
    fixes: list = dataclasses.field(default_factory=list)  # (node, code, message), reported when applied
    notes: list = dataclasses.field(default_factory=list)  # (node, code, message)
    imports: list = dataclasses.field(default_factory=list)  # (module, name or None)

    def edit(self, node: cst.CSTNode, edit: Edit) -> None:
        earlier = self.edits.get(node)
        self.edits[node] = edit if earlier is None else (lambda updated: edit(earlier(updated)))


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def statement(code: str, config: cst.PartialParserConfig) -> cst.BaseStatement:
    return cst.parse_statement(code + config.default_newline, config=config)


def accelerator_call(method: str, args) -> cst.Call:
    """`accelerator.<method>(args...)`, the arguments kept as written."""
    return cst.Call(func=cst.Attribute(value=cst.Name(ACCELERATOR), attr=cst.Name(method)), args=args)


def unwrapped(value: cst.BaseExpression) -> cst.Call:
    """`accelerator.unwrap_model(value)`: the bare module under DDP's wrapper."""
    return accelerator_call("unwrap_model", [cst.Arg(value=value)])


def on_main_process(statements: list, like: cst.CSTNode) -> cst.If:
    first = statements[0]
    inner = [first.with_changes(leading_lines=[]), *statements[1:]]
    return cst.If(
        test=expression(f"{ACCELERATOR}.is_main_process"),
        body=cst.IndentedBlock(body=inner),
        leading_lines=getattr(like, "leading_lines", ()),
    )
