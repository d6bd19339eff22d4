"""ddp: one process (with or without `nn.DataParallel`) -> DistributedDataParallel.

What it does
    Turns a script that trains in one process, with `nn.DataParallel` or on
    one device, into one that trains in as many processes as it is launched
    with (`accelmigrate run`, torchrun, SLURM tasks), and that still behaves
    as before when started with plain `python train.py` (a world of one):

    - joins the process group at the start of the entry point
      (`init_distributed()`: torchrun's or SLURM's environment, nccl on CUDA
      and gloo on CPU, the rank's GPU made current; torn down at exit,
      after an exception too; a world of one joins nothing);
    - wraps the model in `DistributedDataParallel` once it is on its device:
      in place of `nn.DataParallel`, or else the model whose parameters the
      optimizer trains, at the binding that training calls (an optimizer
      built in a factory from its parameter gets the model wrapped where
      the factory is called) (only when there is a process group, so a
      world of one runs the bare model);
    - gives each training DataLoader a `SeededDistributedSampler` (the
      runtime's DistributedSampler) that carries its old `shuffle=` (and
      `generator=`): in a world of one it shuffles exactly as `shuffle=True`
      did, from the script's own `torch.manual_seed(...)`; across ranks its
      seed is rank 0's draw from that same seeding. Calls
      `<loader>.sampler.set_epoch(epoch)` at the top of the epoch loop, and
      divides the batch size by the world size, so that the global batch,
      the steps per epoch and the learning-rate schedule stay what they were
      (`--to ddp=per-process` keeps the batch per process instead, so the
      global batch grows with the world size, and scales the optimizers'
      learning rates linearly);
    - prints, logs and writes files (`torch.save`, `open(..., "w")`, ...) on
      rank 0 only and hides tqdm bars on the other ranks; where every rank
      then reads back (`torch.load`, `open`, `numpy.load`) or removes
      (`os.remove`) a file rank 0 writes earlier in the same function,
      a `barrier()` comes first, and the removal is rank 0's;
    - reads and writes `state_dict`s (and `.module`) through
      `unwrap_model(model)`, so checkpoint keys carry no `module.` prefix;
    - gives `--local_rank` / `--local-rank` a default read from LOCAL_RANK,
      where torchrun puts it.

Why
    DataParallel is one Python process driving every GPU: each step it
    copies the model to every GPU, scatters the batch, gathers the outputs
    on the first GPU and reduces the gradients there; the interpreter lock
    and GPU 0 become the bottleneck. DDP runs a process per GPU, each on its
    own share of the data, and overlaps the gradient all-reduce with the
    backward pass; it also spans machines. PyTorch recommends it over
    DataParallel even on one machine.

Example
    Before::

        model = nn.DataParallel(Net()).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(train_set, batch_size=256, shuffle=True)
        for epoch in range(10):
            for x, y in loader:
                ...
            print(f"epoch {epoch}")
        torch.save(model.state_dict(), "model.pt")

    After::

        init_distributed()
        model = Net().to(device)
        if is_distributed():
            model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(train_set, batch_size=per_process_batch_size(256), sampler=SeededDistributedSampler(train_set, shuffle=True))
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                ...
            if is_main_process():
                print(f"epoch {epoch}")
        if is_main_process():
            torch.save(unwrap_model(model).state_dict(), "model.pt")

Left alone (a finding says what to do by hand)
    Scripts that already set up torch.distributed; several models (GANs, an
    optimizer over two models); no `backward()` (no training loop) or no
    optimizer over a model's parameters; a model trained through its own
    methods (`model.encode(x)`: DDP synchronises gradients only through
    `model(...)`), rebound or moved after the wrap, returned from a
    function, or wrapped under a condition that does more than print;
    training DataLoaders with a custom `sampler=` or `batch_sampler=`,
    unseen arguments (`**kwargs`), no batch size, or no name of their own;
    epoch loops without a plain loop variable (`while`); output whose
    arguments may run collectives (`print(evaluate(model))`) or that shares
    its line; SummaryWriter; `download=True` on every rank; a `torch.load`
    that may read what rank 0 is still writing elsewhere (another function,
    or under a branch some ranks may not take); a file that only defines
    (where to call `init_distributed()`). Evaluation DataLoaders stay whole:
    every rank evaluates the full set, so rank 0 prints the numbers a single
    process would. Names the migrated code needs but the file already uses
    stop the migration.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional, Sequence

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import Assignment, PositionProvider, ScopeProvider

from ._base import Codemod, append_keyword_args, dotted_name, has_star_args, is_docstring, is_main_guard, keyword_arg, walk
from ._scopes import is_plain_reference, is_unbound, reads_import_of

RUNTIME = "accelmigrate.runtime.distributed"

DATA_PARALLEL = frozenset(
    {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}
)
DISTRIBUTED_DATA_PARALLEL = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
DISTRIBUTED_SAMPLER = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)
RUNTIME_SAMPLER = frozenset({f"{RUNTIME}.SeededDistributedSampler"})
# What a script that already runs distributed calls; such a script is left to its author.
ALREADY_DISTRIBUTED = DISTRIBUTED_DATA_PARALLEL | DISTRIBUTED_SAMPLER | {
    "torch.distributed.init_process_group",
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
}
DATA_LOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
OPTIMIZER_MODULE = "torch.optim."
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
LR_SCHEDULERS_WITH_LR = frozenset(
    {"torch.optim.lr_scheduler.OneCycleLR", "torch.optim.lr_scheduler.CyclicLR"}
)
TQDM = frozenset(
    {f"tqdm.{module}{name}" for module in ("", "auto.", "notebook.", "std.", "rich.") for name in ("tqdm", "trange")}
)
PRINT_LIKE = frozenset(
    {"builtins.print", "pprint.pprint", *(f"{name}.write" for name in TQDM if name.endswith(".tqdm"))}
)
LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")
LOGGING_CALLS = frozenset(f"logging.{level}" for level in LOG_LEVELS)
FILE_WRITES = frozenset(
    {
        "torch.save",
        "numpy.save",
        "numpy.savez",
        "numpy.savez_compressed",
        "numpy.savetxt",
        "json.dump",
        "pickle.dump",
        "yaml.dump",
        "yaml.safe_dump",
        "matplotlib.pyplot.savefig",
    }
)
OPEN = frozenset({"builtins.open", "io.open"})
SUMMARY_WRITERS = frozenset(
    {"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter", "tensorboardX.SummaryWriter"}
)
TORCH_LOAD = frozenset({"torch.load"})
# Where each call names its file: (keyword, position among the positional arguments).
WRITTEN_PATH = {
    "torch.save": ("f", 1),
    "numpy.save": ("file", 0),
    "numpy.savez": ("file", 0),
    "numpy.savez_compressed": ("file", 0),
    "numpy.savetxt": ("fname", 0),
    "matplotlib.pyplot.savefig": ("fname", 0),
}
READ_PATH = {"torch.load": ("f", 0), "numpy.load": ("file", 0), "builtins.open": ("file", 0), "io.open": ("file", 0)}
REMOVED_PATH = {"os.remove": ("path", 0), "os.unlink": ("path", 0)}
NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})

# Attributes of a model that mean the same on DistributedDataParallel.
MODULE_API = frozenset(
    {
        "train", "eval", "parameters", "buffers", "children", "modules", "zero_grad", "to", "cuda", "cpu",
        "float", "half", "double", "bfloat16", "type", "apply", "requires_grad_", "training", "forward",
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "register_backward_hook", "share_memory", "no_sync",
    }
)
# ...and those that must go to the unwrapped model (names and keys without `module.`).
UNWRAP_API = frozenset(
    {"state_dict", "load_state_dict", "named_parameters", "named_buffers", "named_modules", "named_children"}
)
MOVES = frozenset({"to", "cuda"})
# Methods of a model that return the model itself, so `DataParallel(m).to(d)` is `m.to(d)` wrapped.
SELF_RETURNING = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "type"})

# Names the migrated code uses; a file that binds one of them otherwise is left alone.
ADDED_NAMES = {
    "DistributedDataParallel": "torch.nn.parallel",
    "SeededDistributedSampler": RUNTIME,
    "init_distributed": RUNTIME,
    "is_distributed": RUNTIME,
    "is_main_process": RUNTIME,
    "ddp_device_ids": RUNTIME,
    "unwrap_model": RUNTIME,
    "world_size": RUNTIME,
    "per_process_batch_size": RUNTIME,
    "barrier": RUNTIME,
}
# Needed only where a file rank 0 writes is read back; a clash leaves those reads to the author.
ADDED_WHERE_NEEDED = frozenset({"barrier"})
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
FOLLOW_DEPTH = 3  # how deep into the script's own functions a model or loader is followed

COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
Edit = Callable[[cst.CSTNode], cst.CSTNode]



def _defines_without_calls(statement: cst.CSTNode) -> bool:
    """`BATCH_SIZE = 64`, `__all__ = [...]`: a module-level binding that calls nothing."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and all(isinstance(small, (cst.Assign, cst.AnnAssign)) for small in statement.body)
        and not any(isinstance(node, cst.Call) for node in walk(statement))
    )


def _batch_mode(options) -> str:
    """`ddp` (the global batch stays) or `ddp=per-process` (each process keeps it)."""
    value = options.get("value", "").strip().lower().replace("_", "-")
    if value not in ("", "global", "per-process"):
        raise ValueError(f"unknown option {value!r} (use ddp=per-process)")
    return value or "global"

class CannotMigrate(Exception):
    """A step that cannot be done safely; the message is the finding."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node, self.code, self.message = node, code, message


@dataclasses.dataclass(frozen=True)
class Var:
    """A variable: a name in a scope, or `self.<name>` within a class."""

    name: str
    owner: object  # the LibCST Scope of a name, the ClassDef of a self attribute
    is_attribute: bool = False

    @property
    def code(self) -> str:
        return f"self.{self.name}" if self.is_attribute else self.name


@dataclasses.dataclass
class Step:
    """One planned rewrite: recorded as a fix, then applied, unless suppressed."""

    node: cst.CSTNode
    code: str
    message: str
    apply: Callable[[], None]
    core: bool = False  # suppressing it turns ddp off for the file


@dataclasses.dataclass
class Insertion:
    statement: cst.BaseStatement
    # "none": the anchor keeps its leading lines; "all": the inserted statement
    # takes them (comments above the anchor describe it); "blank": it takes the
    # blank lines above the anchor's comments.
    take_leading: str = "none"


class DistributedDataParallelCodemod(Codemod):
    word = "ddp"
    summary = "DataParallel or one process -> DistributedDataParallel, DistributedSampler, rank-0 output"
    requires = ("device",)
    codes = {
        "AM501": "process group joined at the start of the entry point",
        "AM502": "DataParallel replaced by DistributedDataParallel",
        "AM503": "model wrapped in DistributedDataParallel",
        "AM504": "training DataLoader given a DistributedSampler",
        "AM505": "sampler.set_epoch(epoch) at the top of the epoch loop",
        "AM506": "printing, logging or a file write on rank 0 only",
        "AM507": "tqdm bar hidden on ranks other than 0",
        "AM508": "state_dict of the unwrapped model (no `module.` prefix)",
        "AM509": "--local_rank defaults to LOCAL_RANK",
        "AM510": "learning rate scaled by the world size (per-process batch)",
        "AM520": "several models, or a model that cannot be wrapped safely",
        "AM521": "training loop or epoch loop not found",
        "AM522": "DataLoader with a custom sampler",
        "AM523": "DataLoader whose batch size or arguments cannot be seen",
        "AM524": "evaluation DataLoader: every rank evaluates the full set",
        "AM525": "output that cannot be moved to rank 0 safely",
        "AM526": "script already distributed",
        "AM527": "model used through its own methods while training",
        "AM528": "file read that may race rank 0's write, or a writer to create on rank 0",
        "AM529": "learning rate that cannot be scaled",
        "AM530": "name needed by the migrated code already used",
        "AM531": "no entry point in this file to join the process group from",
    }
    triggers = ("DataParallel", "DataLoader", "optim", "local_rank", "local-rank")

    METADATA_DEPENDENCIES = (*Codemod.METADATA_DEPENDENCIES, ScopeProvider)

    @classmethod
    def check_options(cls, options) -> None:
        _batch_mode(options)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.per_process = _batch_mode(self.options) == "per-process"
        self._edits: dict[cst.CSTNode, Edit] = {}
        self._before: dict[cst.CSTNode, list[Insertion]] = {}
        self._after: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self._remove: set[cst.CSTNode] = set()
        self._comments_moved: set[cst.CSTNode] = set()  # removed statements whose comments went elsewhere
        self._guarded: set[cst.CSTNode] = set()
        self._steps: list[Step] = []
        self._needed: set[str] = set()
        self._set_epoch_planned: set[tuple[cst.CSTNode, str]] = set()
        self._guard_planned: set[cst.CSTNode] = set()
        self._barrier_planned: set[cst.CSTNode] = set()
        self._training_loaders: list[cst.Call] = []

    # =====================================================================
    # Planning: everything is decided on the original tree, then applied.
    # =====================================================================

    def visit_Module(self, node: cst.Module) -> bool:
        self._module = node
        self._config = node.config_for_parsing
        self._nodes = list(walk(node))
        self._functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        self._classes = {s.name.value: s for s in node.body if isinstance(s, cst.ClassDef)}
        self._plan_local_rank()
        try:
            self._plan()
        except CannotMigrate as failure:
            self.report(failure.node, failure.code, failure.message)
            return True
        # Joining the group and wrapping the model go together with the rest:
        # sharding the data without them would train a model per rank.
        if any(self.is_suppressed(step.node, step.code) for step in self._steps if step.core):
            return True
        for step in self._steps:
            if self.fix(step.node, step.code, step.message):
                step.apply()
        return True

    def _plan(self) -> None:
        if not self._imports_runtime():
            self._refuse_if_already_distributed()
        self._refuse_on_name_clash()
        if not self._nodes_calling_backward():
            first = next((n for n in self._nodes if isinstance(n, cst.Call) and self._is_model_or_loader_call(n)), None)
            if first is not None:
                raise CannotMigrate(
                    first, "AM521",
                    "no `backward()` call found, so no training loop: ddp changed nothing; wrap the model in "
                    "DistributedDataParallel and give the training DataLoader a DistributedSampler by hand",
                )
            return
        model = None
        wrapped_before = self._calls_to(DISTRIBUTED_DATA_PARALLEL)  # migrated before
        if not wrapped_before:
            model = self._plan_model()
        self._plan_loaders()
        if model is not None:
            self._plan_model_references(model, had_data_parallel=bool(self._calls_to(DATA_PARALLEL)))
        self._plan_learning_rates()
        self._plan_rank_zero_output(model or self._var_wrapped_by(wrapped_before))
        self._plan_init()

    def _var_wrapped_by(self, calls: list[cst.Call]) -> Optional[Var]:
        """`model` of an existing `model = DistributedDataParallel(model, ...)`."""
        for call in calls:
            assign = self.parent(call)
            if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
                return self._target_var(assign.targets[0].target)
        return None

    def _step(self, node: cst.CSTNode, code: str, message: str, apply: Callable[[], None], core: bool = False) -> None:
        self._steps.append(Step(node, code, message, apply, core))

    def _use(self, *names: str) -> None:
        for name in names:
            if name not in self._needed:
                self._needed.add(name)
                self.add_import(ADDED_NAMES[name], name)

    # -- refusals --------------------------------------------------------------

    def _imports_runtime(self) -> bool:
        return any(
            isinstance(n, cst.ImportFrom) and n.module is not None and dotted_name(n.module) == RUNTIME
            for n in self._nodes
        )

    def _refuse_if_already_distributed(self) -> None:
        for node in self._nodes:
            if isinstance(node, cst.Call) and self.is_call_to(node, ALREADY_DISTRIBUTED):
                raise CannotMigrate(
                    node, "AM526",
                    "this script already sets up torch.distributed: ddp changed nothing; "
                    "launch it with `accelmigrate run --nproc-per-node N`",
                )

    def _refuse_on_name_clash(self) -> None:
        for node in self._nodes:
            if isinstance(node, cst.Name) and node.value not in ADDED_WHERE_NEEDED and self._clashes(node):
                raise CannotMigrate(
                node, "AM530",
                f"`{node.value}` already names something in this file, and the migrated code needs that name: "
                f"rename yours, then run ddp again",
            )

    def _clashes(self, node: cst.Name) -> bool:
        """`node` is a name the migrated code needs, bound to something else here."""
        if node.value not in ADDED_NAMES or self._is_member_name(node):
            return False
        expected = f"{ADDED_NAMES[node.value]}.{node.value}"
        return expected not in self.qualified_names(node) and not self._imported_from(node, ADDED_NAMES[node.value])

    def _is_member_name(self, name: cst.Name) -> bool:
        """An attribute or keyword name: `x.world_size`, `f(world_size=2)`."""
        parent = self.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return True
        return isinstance(parent, cst.Arg) and parent.keyword is name

    def _imported_from(self, name: cst.Name, module: str) -> bool:
        for ancestor in self.ancestors(name):
            if isinstance(ancestor, cst.ImportFrom):
                return ancestor.module is not None and dotted_name(ancestor.module) == module
        return False

    # -- the model -------------------------------------------------------------

    def _plan_model(self) -> Var:
        """Plan wrapping the model in DistributedDataParallel; the variable that holds it."""
        wrappers = self._calls_to(DATA_PARALLEL)
        if len(wrappers) > 1:
            raise CannotMigrate(
                wrappers[1], "AM520",
                "several models are wrapped in DataParallel: ddp changed nothing; wrap each in "
                "DistributedDataParallel by hand once it is on its device, give the training DataLoaders a "
                "DistributedSampler, and print and save on rank 0 only",
            )
        if wrappers:
            model, anchor, apply = self._plan_data_parallel(wrappers[0])
            node, code = wrappers[0], "AM502"
            message = f"`DataParallel` -> `DistributedDataParallel` for `{model.code}` once it is on its device (only when launched on several processes)"
            dropped = [_keyword(a) or "a positional argument" for a in wrappers[0].args[1:]]
            if dropped:
                message += f"; its {', '.join(dropped)} dropped: each process computes on its own device"
        else:
            model, anchor, node, apply = self._plan_bare_model()
            code = "AM503"
            message = f"`{model.code}` wrapped in `DistributedDataParallel` once it is on its device (only when launched on several processes)"
        self._check_model_uses(model, anchor)

        def wrap() -> None:
            self._use("is_distributed", "DistributedDataParallel", "ddp_device_ids")
            apply()

        self._step(node, code, message, wrap, core=True)
        return model

    def _ddp_wrap(self, model: Var, trailing: Optional[cst.TrailingWhitespace] = None) -> cst.If:
        target = model.code
        nl, indent = self._module.default_newline, self._module.default_indent
        statement = cst.parse_statement(
            f"if is_distributed():{nl}{indent}{target} = DistributedDataParallel({target}, device_ids=ddp_device_ids({target})){nl}",
            config=self._config,
        )
        if trailing is not None and trailing.comment is not None:
            inner = statement.body.body[0].with_changes(trailing_whitespace=trailing)
            statement = statement.with_changes(body=statement.body.with_changes(body=[inner]))
        return statement

    def _plan_data_parallel(self, call: cst.Call) -> tuple[Var, cst.CSTNode, Callable[[], None]]:
        line, assign, model = self._wrapper_assignment(call)
        inner = _first_positional(call)
        if inner is None:
            raise CannotMigrate(call, "AM520", "DataParallel without a module argument: replace it by DistributedDataParallel by hand")
        chained = self._self_returning_chain(call, assign.value)
        rebinds_itself = not chained and self._var_of(inner.value) == model  # model = nn.DataParallel(model)
        anchor, conditions = self._unconditional_anchor(line)
        if conditions and not rebinds_itself:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel under a condition, in another form than `model = nn.DataParallel(model)`: replace it by "
                "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` "
                "after the model is on its device",
            )
        anchor = self._after_moves(anchor, model)
        wrap = self._ddp_wrap(model, line.trailing_whitespace if rebinds_itself else None)
        if rebinds_itself:  # the comments about the DataParallel line now describe the wrap
            wrap = wrap.with_changes(leading_lines=[l for l in line.leading_lines if l.comment is not None])
        imported = self._from_import(call.func)

        def apply() -> None:
            if rebinds_itself:
                self._remove.add(line)
                self._comments_moved.add(line)
                for condition in conditions:  # innermost first
                    if all(s in self._remove for s in condition.body.body):
                        self._remove.add(condition)
            else:  # model = nn.DataParallel(Net()).to(device) -> model = Net().to(device)
                self._edits[call] = lambda updated: _as_atom(updated.args[0].value) if chained else updated.args[0].value
            self._after.setdefault(anchor, []).append(wrap)
            if imported is not None:  # `from torch.nn import DataParallel` may be unused now
                RemoveImportsVisitor.remove_unused_import(self.context, *imported)

        return model, anchor, apply

    def _wrapper_assignment(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, cst.Assign, Var]:
        """`model = nn.DataParallel(...)[.to(...)...]`: its line, Assign and target."""
        expression: cst.CSTNode = call
        parent = self.parent(expression)
        while isinstance(parent, cst.Attribute) and isinstance(self.parent(parent), cst.Call):
            expression = self.parent(parent)
            parent = self.parent(expression)
        if isinstance(parent, cst.Return):
            raise CannotMigrate(
                call, "AM520",
                "DataParallel returned from a function: wrap the returned model where it is used, after it is "
                "on its device: `if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))`",
            )
        statement = self.assignment_line(expression)
        if statement is None:
            raise CannotMigrate(
                call, "AM520",
                "DataParallel outside a plain `model = nn.DataParallel(...)` statement: replace it by "
                "DistributedDataParallel by hand, once the model is on its device",
            )
        line, assign = statement
        model = self._target_var(assign.targets[0].target)
        if model is None:
            raise CannotMigrate(call, "AM520", "DataParallel assigned to something other than a name or `self.<name>`: wrap the model by hand")
        return line, assign, model

    def _self_returning_chain(self, call: cst.Call, value: cst.BaseExpression) -> bool:
        """True when `value` is `call` followed by methods that return the model
        itself (`.to(device)`, `.cuda()`, ...); raises for any other chain."""
        node: cst.CSTNode = call
        chained = False
        while node is not value:
            attribute = self.parent(node)
            if not (isinstance(attribute, cst.Attribute) and attribute.attr.value in SELF_RETURNING):
                raise CannotMigrate(call, "AM520", "DataParallel(...) followed by a method other than .to()/.cuda(): wrap the model by hand")
            node = self.parent(attribute)
            chained = True
        return chained

    def _unconditional_anchor(self, line: cst.SimpleStatementLine) -> tuple[cst.CSTNode, list[cst.If]]:
        """The statement that runs whenever `line` could: `line` itself, or the
        outermost `if` around it whose bodies hold nothing else but output
        (`if torch.cuda.device_count() > 1: print(...); model = nn.DataParallel(model)`)."""
        anchor: cst.CSTNode = line
        conditions: list[cst.If] = []
        while True:
            block = self.parent(anchor)
            owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if isinstance(owner, cst.If) and is_main_guard(owner.test):
                return anchor, conditions  # the script's entry point runs unconditionally
            if not isinstance(owner, cst.If) or owner.orelse is not None or block is not owner.body:
                if isinstance(owner, (cst.For, cst.While, cst.With, cst.Try, cst.If)):
                    raise CannotMigrate(line, "AM520", "DataParallel inside a loop, `with`, `try` or `if`/`else`: wrap the model by hand")
                return anchor, conditions
            others = [s for s in owner.body.body if s is not anchor]
            if not all(self._is_output_statement(s) for s in others):
                raise CannotMigrate(
                    line, "AM520",
                    "DataParallel under a condition that also does other work: replace it by "
                    "`if is_distributed(): model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))` by hand",
                )
            conditions.append(owner)
            anchor = owner

    def _after_moves(self, anchor: cst.CSTNode, model: Var) -> cst.CSTNode:
        """The last statement of `anchor`'s block, from `anchor` on, that moves the
        model to its device (`model.to(device)`): DDP wraps a model in place."""
        block = self.parent(anchor)
        body = list(block.body)
        last = anchor
        for statement in body[body.index(anchor) + 1:]:
            if self._moves_model(statement, model):
                last = statement
        return last

    def _moves_model(self, statement: cst.CSTNode, model: Var) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        if isinstance(small, cst.Assign) and not (
            len(small.targets) == 1 and self._target_var(small.targets[0].target) == model
        ):
            return False
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in MOVES
            and self._var_of(value.func.value) == model
        )

    def _plan_bare_model(self) -> tuple[Var, cst.CSTNode, cst.CSTNode, Callable[[], None]]:
        """No DataParallel: the one model whose parameters the optimizers train."""
        optimizers = self._optimizer_calls()
        models: dict[Var, cst.Call] = {}
        for optimizer in optimizers:
            for var in self._models_trained_by(optimizer):
                models.setdefault(var, optimizer)
        if not models:
            node = optimizers[0] if optimizers else self._nodes_calling_backward()[0]
            raise CannotMigrate(
                node, "AM520",
                "no optimizer over `model.parameters()` found, so ddp cannot tell which model to wrap: once the "
                "model is on its device, add `if is_distributed(): model = DistributedDataParallel(model, "
                "device_ids=ddp_device_ids(model))`, then run ddp again",
            )
        if len(models) > 1:
            names = ", ".join(f"`{v.code}`" for v in models)
            raise CannotMigrate(
                list(models.values())[1], "AM520",
                f"several models are trained ({names}): ddp changed nothing; wrap each in DistributedDataParallel "
                f"by hand once it is on its device, give the training DataLoaders a DistributedSampler, and print "
                f"and save on rank 0 only",
            )
        model, first_optimizer = next(iter(models.items()))
        model, built_at = self._binding_called_in_training(model, first_optimizer)
        anchor, insert_before = self._bare_model_anchor(model, built_at)
        wrap = self._ddp_wrap(model)

        def apply() -> None:
            if insert_before:
                self._before.setdefault(anchor, []).append(Insertion(wrap))
            else:
                self._after.setdefault(anchor, []).append(wrap)

        return model, anchor, built_at, apply

    def _binding_called_in_training(self, model: Var, optimizer: cst.Call) -> tuple[Var, cst.Call]:
        """The binding of the optimizer's model that training calls, and the
        call that builds the optimizer from it there. When the optimizer is
        built in a factory (`def make_optimizer(model): return SGD(model.parameters())`),
        wrapping the factory's parameter would wrap a local nobody calls: the
        wrap goes where the factory is called, on the variable passed to it."""
        site: cst.Call = optimizer
        for _ in range(FOLLOW_DEPTH + 1):
            if self._called_outside_no_grad(model) or self._parameter_of(model) is None:
                return model, site  # a model built here is wrapped here (and returned wrapped, if it is)
            caller = self._caller_binding(model)
            if caller is None:
                break
            model, site = caller
        raise CannotMigrate(
            optimizer, "AM520",
            f"the optimizer trains `{model.code}`, but that binding is never called to compute a loss (a parameter of "
            f"a factory, called from several places or under another name?): wrap the model that the training loop "
            f"calls, once it is on its device and before the optimizer is built from it: `if is_distributed(): "
            f"model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))`",
        )

    def _called_outside_no_grad(self, model: Var) -> bool:
        """`model(...)` or `model.forward(...)` somewhere gradients are recorded."""
        for reference, _ in self._followed_references(model):
            callee, parent = reference, self.parent(reference)
            if isinstance(parent, cst.Attribute) and parent.value is reference and parent.attr.value == "forward":
                callee, parent = parent, self.parent(parent)
            if isinstance(parent, cst.Call) and parent.func is callee and not self._under_no_grad(parent):
                return True
        return False

    def _parameter_of(self, var: Var) -> Optional[cst.Param]:
        """The parameter `var` is, when its function never rebinds it."""
        if var.is_attribute or not isinstance(getattr(var.owner, "node", None), cst.FunctionDef):
            return None
        bindings = list(var.owner.assignments[var.name])
        return bindings[0].node if len(bindings) == 1 and isinstance(bindings[0].node, cst.Param) else None

    def _caller_binding(self, parameter: Var) -> Optional[tuple[Var, cst.Call]]:
        """For a parameter of the script's own function, called from one place:
        the variable passed for it there, and that call."""
        param = self._parameter_of(parameter)
        if param is None:
            return None
        function = parameter.owner.node
        sites = [c for c in self._nodes if isinstance(c, cst.Call) and (self._callee(c) or (None,))[0] is function]
        if len(sites) != 1:
            return None
        site = sites[0]
        skipped = self._callee(site)[1]
        passed = [a for a in site.args if not a.star and _parameter_for(function, skipped, site, a) is param]
        outer = self._var_of(passed[0].value) if len(passed) == 1 else None
        return (outer, site) if outer is not None else None

    def _optimizer_calls(self) -> list[cst.Call]:
        found = []
        for node in self._nodes:
            if isinstance(node, cst.Call):
                names = self.qualified_names(node.func)
                if any(n.startswith(OPTIMIZER_MODULE) and not n.startswith(NOT_OPTIMIZERS) and n.rsplit(".", 1)[1][:1].isupper() for n in names):
                    found.append(node)
        return found

    def _models_trained_by(self, optimizer: cst.Call) -> set[Var]:
        params = _first_positional(optimizer) or keyword_arg(optimizer, "params")
        if params is None:
            return set()
        expressions = [params.value]
        if isinstance(params.value, cst.Name):  # params = [p for p in model.parameters() if ...]
            expressions.extend(self._assigned_values(params.value))
        models = set()
        for expression in expressions:
            for node in walk(expression):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("parameters", "named_parameters")
                ):
                    root = self._root_var(node.func.value)
                    if root is not None:
                        models.add(root)
        return models

    def _assigned_values(self, name: cst.Name) -> list[cst.BaseExpression]:
        values = []
        for assignment in self._referents(name):
            target = assignment.node
            assign = self.parent(self.parent(target)) if isinstance(target, cst.Name) else None
            if isinstance(assign, cst.Assign):
                values.append(assign.value)
        return values

    def _bare_model_anchor(self, model: Var, optimizer: cst.Call) -> tuple[cst.CSTNode, bool]:
        """Where the wrap goes: after the last statement that binds or moves the
        model before the optimizer is built, in a block that also builds the
        optimizer; else just before the statement that builds it."""
        optimizer_line = self._position(optimizer)[0]
        best = None
        for statement in self._statements_binding(model):
            if self._position(statement)[0] >= optimizer_line:
                continue
            block = self.parent(statement)
            if not any(a is block for a in self.ancestors(optimizer)):
                continue
            if best is None or self._position(statement) > self._position(best):
                best = statement
        if best is not None:
            return self._after_moves(best, model), False
        statement, block = self._block_statement(optimizer)
        if statement is None or self.innermost_loop(statement) is not None:
            raise CannotMigrate(
                optimizer, "AM520",
                f"cannot find where `{model.code}` is built and moved to its device: after that, add "
                f"`if is_distributed(): {model.code} = DistributedDataParallel({model.code}, device_ids=ddp_device_ids({model.code}))`",
            )
        return statement, True

    def _statements_binding(self, model: Var) -> list[cst.CSTNode]:
        """Plain statements (alone on their line, in a block) that assign or move `model`."""
        found = []
        for node in self._nodes:
            if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
                small = node.body[0]
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and self._target_var(small.targets[0].target) == model:
                    found.append(node)
                elif self._moves_model(node, model):
                    found.append(node)
        return found

    def _check_model_uses(self, model: Var, anchor: cst.CSTNode) -> None:
        """Refuse when the model is rebound or moved after it is wrapped, or when
        training calls its own methods (which bypass DDP's gradient hooks)."""
        wrap_line = self._position(anchor, end=True)[0]
        for statement in self._statements_binding(model):
            if self._position(statement)[0] > wrap_line and not self._compiles_model(statement, model):
                raise CannotMigrate(
                    statement, "AM520",
                    f"`{model.code}` is moved or rebound after the point where ddp would wrap it: make the model final "
                    f"and on its device first, then wrap it in DistributedDataParallel by hand",
                )
        for reference, _ in self._followed_references(model):
            method = self._own_method_called(reference)
            if method is not None and not self._under_no_grad(reference):
                raise CannotMigrate(
                    reference, "AM527",
                    f"the model's own method `{method}` is called: under DistributedDataParallel gradients are "
                    f"synchronised only through `model(...)`; route the computation through `forward`, then run ddp again",
                )

    def _compiles_model(self, statement: cst.SimpleStatementLine, model: Var) -> bool:
        """`model = torch.compile(model, ...)`: compiling the DDP model is the recommended order."""
        value = statement.body[0].value
        first = _first_positional(value) if isinstance(value, cst.Call) else None
        return (
            first is not None
            and self.is_call_to(value, {"torch.compile"})
            and self._var_of(first.value) == model
        )

    def _own_method_called(self, reference: cst.CSTNode) -> Optional[str]:
        """`model.encode(...)` or `model.module.encode(...)`: the method's name."""
        node = reference
        attribute = self.parent(node)
        if isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "module":
            node, attribute = attribute, self.parent(attribute)
        if not (isinstance(attribute, cst.Attribute) and attribute.value is node):
            return None
        call = self.parent(attribute)
        name = attribute.attr.value
        if isinstance(call, cst.Call) and call.func is attribute and name not in MODULE_API | UNWRAP_API:
            return name
        return None

    def _under_no_grad(self, node: cst.CSTNode) -> bool:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.is_call_to(item.item, NO_GRAD) for item in ancestor.items
            ):
                return True
            if isinstance(ancestor, cst.FunctionDef):
                return any(
                    self.is_qualified(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator, NO_GRAD)
                    for d in ancestor.decorators
                )
        return False

    def _plan_model_references(self, model: Var, had_data_parallel: bool) -> None:
        """`model.state_dict()` / `.load_state_dict()` / `.named_*()` / `.module` /
        `torch.save(model)` go to the unwrapped model, in every world size alike."""
        for reference, _ in self._followed_references(model):
            parent = self.parent(reference)
            name = self._code(reference)
            if isinstance(parent, cst.Arg) and self._is_unwrap_argument(parent):
                continue
            if isinstance(parent, cst.Attribute) and parent.value is reference:
                attribute = parent.attr.value
                if attribute == "module":
                    self._plan_unwrap(parent, reference, f"`{name}.module` -> `unwrap_model({name})`")
                elif attribute == "load_state_dict" and had_data_parallel:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.load_state_dict` -> `unwrap_model({name}).load_state_dict`: checkpoints are saved "
                        f"without `module.` now; strip it from older ones with "
                        f"`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, \"module.\")`",
                    )
                elif attribute in UNWRAP_API:
                    self._plan_unwrap(
                        reference, reference,
                        f"`{name}.{attribute}` -> `unwrap_model({name}).{attribute}`: names without `module.`, whatever the world size",
                    )
            elif isinstance(parent, cst.Arg) and parent.keyword is None:
                call = self.parent(parent)
                if isinstance(call, cst.Call) and self.is_call_to(call, {"torch.save"}) and call.args[0] is parent:
                    self._plan_unwrap(reference, reference, f"`torch.save(unwrap_model({name}), ...)`: the model itself, not its DDP wrapper")

    def _is_unwrap_argument(self, arg: cst.Arg) -> bool:
        call = self.parent(arg)
        return isinstance(call, cst.Call) and self.is_qualified(call.func, {f"{RUNTIME}.unwrap_model"})

    def _plan_unwrap(self, node: cst.CSTNode, reference: cst.CSTNode, message: str) -> None:
        def apply() -> None:
            self._use("unwrap_model")
            if node is reference:
                self._edits[node] = lambda updated: _call("unwrap_model", updated)
            else:
                self._edits[node] = lambda updated: _call("unwrap_model", updated.value)

        self._step(node, "AM508", message, apply)

    # -- data loaders -----------------------------------------------------------

    def _plan_loaders(self) -> None:
        for call in self._calls_to(DATA_LOADER):
            self._plan_loader(call)
        if not self._training_loaders and not self._calls_to(DISTRIBUTED_SAMPLER | RUNTIME_SAMPLER):
            self.report(
                self._nodes_calling_backward()[0], "AM521",
                "no training DataLoader found to give a DistributedSampler: every rank trains on the same batches "
                "(correct, but no faster than one process); give each rank its share of the data by hand "
                "(`global_rank()` of `world_size()`)",
            )

    def _plan_loader(self, call: cst.Call) -> None:
        sampler = keyword_arg(call, "sampler")
        if sampler is not None and isinstance(sampler.value, cst.Call) and self.is_call_to(sampler.value, DISTRIBUTED_SAMPLER | RUNTIME_SAMPLER):
            self._plan_set_epoch_for(call)  # migrated before
            return
        loops = self._batch_loops(call)
        training = [loop for loop in loops if self._trains(_loop_body(loop[0]))]
        if loops and not training:
            self.report(
                call, "AM524",
                "evaluation DataLoader left whole: every rank evaluates the full set, so rank 0 prints what one "
                "process would; to split that work instead, give it `DistributedSampler(dataset, shuffle=False)` and "
                "combine sums and counts with `mean_across_ranks(total, count)`, minding the samples the sampler "
                "repeats to even out the ranks",
            )
            return
        if not loops:
            self.report(
                call, "AM521",
                "cannot see where this DataLoader is iterated: if it feeds training, give it "
                "`sampler=SeededDistributedSampler(dataset, shuffle=...)` instead of `shuffle=`, pass its batch size "
                "through `per_process_batch_size()` and call `loader.sampler.set_epoch(epoch)` at the top of each epoch",
            )
            return
        self._training_loaders.append(call)
        try:
            self._plan_training_loader(call)
        except CannotMigrate as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        for loop, expression, path in training:
            try:
                self._plan_set_epoch(loop, expression, path)
            except CannotMigrate as problem:
                self.report(problem.node, problem.code, problem.message)

    def _plan_training_loader(self, call: cst.Call) -> None:
        if has_star_args(call):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader with `*args`/`**kwargs`: pass `sampler=SeededDistributedSampler(dataset, shuffle=...)` "
                "instead of `shuffle=`, and the batch size through `per_process_batch_size()`, by hand",
            )
        for name in ("sampler", "batch_sampler"):
            if keyword_arg(call, name) is not None:
                raise CannotMigrate(
                    call, "AM522",
                    f"training DataLoader with its own `{name}=`: it must give each rank a different share of "
                    f"the data (see DistributedSampler), or every rank trains on the same samples",
                )
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) > 2:
            raise CannotMigrate(call, "AM523", "DataLoader with more than two positional arguments: name them, then run ddp again")
        dataset = positional[0] if positional else keyword_arg(call, "dataset")
        batch = positional[1] if len(positional) > 1 else keyword_arg(call, "batch_size")
        if dataset is None or batch is None or _is_none(batch.value):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader without a visible batch size: give it `batch_size=`, then run ddp again",
            )
        line, assign, _ = self._loader_assignment(call)
        shuffle = keyword_arg(call, "shuffle")
        shuffle_code = self._code(shuffle.value) if shuffle is not None else "False"
        hoisted = None
        dataset_code = self._code(dataset.value)
        if not is_plain_reference(dataset.value):
            hoisted = self._fresh_name(_dataset_name_for(assign.targets[0].target))
            dataset_code = hoisted
        sampler_code = f"SeededDistributedSampler({dataset_code}, shuffle={shuffle_code}{self._sampler_generator(call)})"
        batch_code = self._code(batch.value)
        if self.per_process:
            message = (
                f"`SeededDistributedSampler(shuffle={shuffle_code})` instead of `shuffle=`; batch size `{batch_code}` kept per "
                f"process (ddp=per-process): the global batch is now `{batch_code}` x world size, with fewer steps per epoch"
            )
        else:
            message = (
                f"`SeededDistributedSampler(shuffle={shuffle_code})` instead of `shuffle=`, the same order in a world of "
                f"one; batch size `{batch_code}` split "
                f"across the processes: the global batch and the steps per epoch stay as they were"
            )

        def apply() -> None:
            self._use("SeededDistributedSampler")
            if not self.per_process:
                self._use("per_process_batch_size")
            if hoisted is not None:
                statement = cst.parse_statement(f"{hoisted} = {self._code(dataset.value)}{self._module.default_newline}", config=self._config)
                self._before.setdefault(line, []).append(Insertion(statement, take_leading="all"))
            self._edits[call] = lambda updated: self._rewrite_loader(updated, sampler_code, hoisted)

        self._step(call, "AM504", message, apply)

    def _sampler_generator(self, call: cst.Call) -> str:
        """`, generator=g` when the DataLoader shuffles with its own generator:
        the sampler must draw from that same generator object."""
        generator = keyword_arg(call, "generator")
        if generator is None or _is_none(generator.value):
            return ""
        if not is_plain_reference(generator.value):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader whose `generator=` is not a plain name: bind the generator to a name and pass "
                "that, then run ddp again (the sampler must shuffle with the same generator)",
            )
        return f", generator={self._code(generator.value)}"

    def _rewrite_loader(self, call: cst.Call, sampler_code: str, hoisted: Optional[str]) -> cst.Call:
        sampler = cst.parse_expression(sampler_code, config=self._config)
        args = list(call.args)
        positional = [i for i, a in enumerate(args) if a.keyword is None]
        dataset_index = positional[0] if positional else next(i for i, a in enumerate(args) if _keyword(a) == "dataset")
        batch_index = positional[1] if len(positional) > 1 else next(i for i, a in enumerate(args) if _keyword(a) == "batch_size")
        if hoisted is not None:
            args[dataset_index] = args[dataset_index].with_changes(value=cst.Name(hoisted))
        if not self.per_process:
            args[batch_index] = args[batch_index].with_changes(value=_call("per_process_batch_size", args[batch_index].value))
        shuffle_index = next((i for i, a in enumerate(args) if _keyword(a) == "shuffle"), None)
        if shuffle_index is not None:
            args[shuffle_index] = args[shuffle_index].with_changes(keyword=cst.Name("sampler"), value=sampler)
            return call.with_changes(args=args)
        return append_keyword_args(call.with_changes(args=args), [("sampler", sampler)])

    def _loader_assignment(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, cst.Assign, Var]:
        assign = self.parent(call)
        line = self.parent(assign)
        var = self._target_var(assign.targets[0].target) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
        if (
            var is None
            or assign.value is not call
            or not isinstance(line, cst.SimpleStatementLine)
            or not isinstance(self.parent(line), (cst.IndentedBlock, cst.Module))
        ):
            raise CannotMigrate(
                call, "AM523",
                "training DataLoader not assigned to a name on its own line: bind it (`train_loader = DataLoader(...)`), "
                "then run ddp again",
            )
        return line, assign, var

    def _fresh_name(self, wanted: str) -> str:
        taken = {n.value for n in self._nodes if isinstance(n, cst.Name)}
        name, number = wanted, 1
        while name in taken:
            number += 1
            name = f"{wanted}{number}"
        return name

    def _batch_loops(self, call: cst.Call) -> list[tuple[cst.For, cst.CSTNode, list[tuple[cst.Call, cst.CSTNode]]]]:
        """The `for` loops that iterate this DataLoader, directly or in the
        script's own functions it is passed to: (loop, the loader's expression
        there, the calls that led there with the argument passed)."""
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            var = self._target_var(parent.targets[0].target)
            if var is None:
                return []
            return [
                (loop, reference, path)
                for reference, path in self._followed_references(var)
                for loop in [self._loop_iterating(reference)]
                if loop is not None
            ]
        loop = self._loop_iterating(call)
        return [(loop, call, [])] if loop is not None else []

    def _loop_iterating(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The `for` statement or comprehension whose iterable holds `node`."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.BaseSuite)):
                return None
            if isinstance(ancestor, cst.For):
                return ancestor if child is ancestor.iter else None
            if isinstance(ancestor, cst.CompFor):
                if child is not ancestor.iter:
                    return None
                return next(a for a in self.ancestors(ancestor) if isinstance(a, COMPREHENSIONS))
            child = ancestor
        return None

    def _trains(self, body: cst.CSTNode, depth: int = 0) -> bool:
        """Does running `body` call `backward()` (in it or in the script's own functions it calls)?"""
        for node in walk(body):
            if isinstance(node, cst.Call):
                if _is_backward(node) or self.is_call_to(node, {"torch.autograd.backward"}):
                    return True
                if depth < FOLLOW_DEPTH:
                    callee = self._callee(node)
                    if callee is not None and self._trains(callee[0].body, depth + 1):
                        return True
        return False

    def _nodes_calling_backward(self) -> list[cst.Call]:
        return [n for n in self._nodes if isinstance(n, cst.Call) and (_is_backward(n) or self.is_call_to(n, {"torch.autograd.backward"}))]

    def _is_model_or_loader_call(self, call: cst.Call) -> bool:
        return self.is_call_to(call, DATA_PARALLEL | DATA_LOADER)

    # -- set_epoch ---------------------------------------------------------------

    def _plan_set_epoch_for(self, call: cst.Call) -> None:
        for loop, expression, path in self._batch_loops(call):
            if self._trains(_loop_body(loop)):
                try:
                    self._plan_set_epoch(loop, expression, path)
                except CannotMigrate as problem:
                    self.report(problem.node, problem.code, problem.message)

    def _plan_set_epoch(self, batch_loop: cst.For, expression: cst.CSTNode, path: list) -> None:
        found = self._epoch_loop(batch_loop, expression, list(path), 0)
        if found is None:
            return  # one pass over the data: nothing to reshuffle
        epoch_loop, loader = found
        if not isinstance(epoch_loop, cst.For) or not isinstance(epoch_loop.target, cst.Name) or epoch_loop.target.value == "_":
            raise CannotMigrate(
                _header(epoch_loop), "AM521",
                f"epoch loop without a plain epoch variable: call `{self._code(loader)}.sampler.set_epoch(epoch)` "
                f"at the top of each epoch by hand, or every epoch sees the same order",
            )
        if not isinstance(epoch_loop.body, cst.IndentedBlock):
            raise CannotMigrate(_header(epoch_loop), "AM521", "one-line epoch loop: call `loader.sampler.set_epoch(epoch)` at the top of each epoch by hand")
        if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "set_epoch" for n in walk(epoch_loop.body)):
            return
        if not is_plain_reference(loader):
            raise CannotMigrate(_header(epoch_loop), "AM521", "the training DataLoader has no plain name in the epoch loop: call `loader.sampler.set_epoch(epoch)` by hand")
        key = (epoch_loop, self._code(loader))
        if key in self._set_epoch_planned:
            return
        self._set_epoch_planned.add(key)
        first = epoch_loop.body.body[0]
        code = f"{self._code(loader)}.sampler.set_epoch({epoch_loop.target.value}){self._module.default_newline}"
        statement = cst.parse_statement(code, config=self._config)

        def apply() -> None:
            self._before.setdefault(first, []).append(Insertion(statement))

        self._step(epoch_loop.target, "AM505", f"`{code.strip()}` at the top of the epoch loop: a new order every epoch, the same on every rank", apply)

    def _epoch_loop(self, node: cst.CSTNode, loader: cst.CSTNode, path: list, depth: int) -> Optional[tuple[cst.CSTNode, cst.CSTNode]]:
        """The loop around `node` (the loop over the data, or a call that leads
        to it) and the loader's expression there."""
        outer = self.innermost_loop(node)
        if outer is not None:
            return outer, loader
        if path:
            call, argument = path.pop()
            return self._epoch_loop(call, argument, path, depth)
        function = next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
        if function is None or depth >= FOLLOW_DEPTH or not is_plain_reference(loader):
            return None
        sites = [c for c in self._nodes if isinstance(c, cst.Call) and (self._callee(c) or (None,))[0] is function]
        if len(sites) != 1:
            return None
        return self._epoch_loop(sites[0], loader, [], depth + 1)

    # -- learning rates (per-process batch) ---------------------------------------

    def _plan_learning_rates(self) -> None:
        if not self.per_process:
            return
        for optimizer in self._optimizer_calls():
            lr = keyword_arg(optimizer, "lr")
            positional = [a for a in optimizer.args if a.keyword is None]
            if lr is None and len(positional) > 1:
                lr = positional[1]
            if lr is None:
                self.report(
                    optimizer, "AM529",
                    "optimizer on its default learning rate: the global batch grows with the world size, so pass "
                    "`lr=<default> * world_size()` by hand",
                )
                continue
            if any(isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.world_size"}) for n in walk(lr.value)):
                continue
            self._plan_scaled_lr(optimizer, lr)
        for scheduler in self._calls_to(LR_SCHEDULERS_WITH_LR):
            self.report(
                scheduler, "AM529",
                "this scheduler sets its own learning rates: multiply them by world_size() by hand, as the optimizers' were",
            )

    def _plan_scaled_lr(self, optimizer: cst.Call, lr: cst.Arg) -> None:
        def scale(updated: cst.Arg) -> cst.Arg:
            value = updated.value
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated.with_changes(value=cst.BinaryOperation(value, cst.Multiply(), _call("world_size")))

        def apply() -> None:
            self._use("world_size")
            self._edits[lr] = scale

        self._step(
            lr, "AM510",
            f"learning rate `{self._code(lr.value)}` x `world_size()`: per-process batches make the global batch "
            f"world-size times larger (linear scaling rule; consider a warm-up)",
            apply,
        )

    # -- rank-0 output -------------------------------------------------------------

    def _plan_rank_zero_output(self, model: Optional[Var]) -> None:
        loggers = self._logger_references()
        # Where the model is called under any name: its forward may broadcast buffers.
        self._model_references = {r for r, _ in self._followed_references(model)} if model is not None else set()
        rank_zero_writes: list[cst.CSTNode] = []
        for node in self._nodes:
            if isinstance(node, cst.Call) and self.is_call_to(node, TQDM):
                self._plan_tqdm(node)
            elif isinstance(node, cst.Call) and _downloads(node):
                self.report(
                    node, "AM528",
                    "`download=True` runs on every rank at once, into the same folder: download the data once "
                    "before launching (or on rank 0, then `barrier()` on every rank before the others read it)",
                )
            elif isinstance(node, cst.Call) and self.is_call_to(node, SUMMARY_WRITERS):
                self.report(
                    node, "AM528",
                    "every rank would write the same TensorBoard events: create the writer with "
                    "`SummaryWriter(...) if is_main_process() else None` and log through it on rank 0 only",
                )
            elif isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite, cst.With)):
                kind = self._output_kind(node, loggers)
                if kind is not None and self._plan_guard(node, kind) and kind == "a file write":
                    rank_zero_writes.append(node)
        if rank_zero_writes:
            self._plan_reads_after_writes(rank_zero_writes)

    # -- files rank 0 writes, then every rank reads ------------------------------------

    def _plan_reads_after_writes(self, writes: list[cst.CSTNode]) -> None:
        """Every rank that reads (or removes) a file rank 0 writes earlier in the
        same function waits for it at a `barrier()` first; removal is rank 0's
        alone, once every rank has read it."""
        written = [(w, self._code(path)) for w in writes for path in [self._written_path(w)] if path is not None]
        for node in self._nodes:
            if not isinstance(node, cst.Call):
                continue
            removal = self.is_call_to(node, REMOVED_PATH)
            path = self._path_argument(node, REMOVED_PATH if removal else READ_PATH)
            if path is None or (not removal and self.is_call_to(node, OPEN) and _opens_for_writing(node)):
                continue
            if not any(code == self._code(path) and self._comes_before_in_same_function(w, node) for w, code in written):
                if self.is_call_to(node, TORCH_LOAD):
                    self.report(
                        node, "AM528",
                        "rank 0 alone writes checkpoints now: if this reads one written during this run, call "
                        "`barrier()` (accelmigrate.runtime.distributed) on every rank between the save and the load",
                    )
                continue
            self._plan_barrier_before(node, removal)

    def _written_path(self, write: cst.CSTNode) -> Optional[cst.BaseExpression]:
        if isinstance(write, cst.With):
            opened = next(
                i.item for i in write.items
                if isinstance(i.item, cst.Call) and self.is_call_to(i.item, OPEN) and _opens_for_writing(i.item)
            )
            return self._path_argument(opened, READ_PATH)
        call = write.body[0].value if isinstance(write.body[0], cst.Expr) else None
        return self._path_argument(call, WRITTEN_PATH) if isinstance(call, cst.Call) else None

    def _path_argument(self, call: cst.Call, where: dict) -> Optional[cst.BaseExpression]:
        """The file `call` names, when it is one of `where`'s functions."""
        name = next((n for n in self.qualified_names(call.func) if n in where), None)
        if name is None or has_star_args(call):
            return None
        keyword, position = where[name]
        positional = [a for a in call.args if a.keyword is None]
        given = keyword_arg(call, keyword) or (positional[position] if len(positional) > position else None)
        return given.value if given is not None else None

    def _comes_before_in_same_function(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        def function(node: cst.CSTNode) -> Optional[cst.CSTNode]:
            return next((a for a in self.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)

        return function(first) is function(second) and self._position(first, end=True) <= self._position(second)

    def _plan_barrier_before(self, call: cst.Call, removal: bool) -> None:
        what = "removes" if removal else "reads"
        statement, _ = self._block_statement(call)
        if statement is None or not self._runs_alike_on_every_rank(statement) or any(
            isinstance(n, cst.Name) and n.value == "barrier" and self._clashes(n) for n in self._nodes
        ):
            self.report(
                call, "AM528",
                f"every rank {what} a file that rank 0 alone writes earlier: call `barrier()` "
                f"(accelmigrate.runtime.distributed) on every rank between the write and this line"
                + (", and remove the file on rank 0 only (after a `barrier()` that follows every read)" if removal else ""),
            )
            return
        if removal and not self._plan_guard(statement, "removing a file rank 0 wrote"):
            return
        if statement in self._barrier_planned:
            return
        self._barrier_planned.add(statement)

        def apply() -> None:
            self._use("barrier")
            barrier = cst.parse_statement(f"barrier(){self._module.default_newline}", config=self._config)
            self._before.setdefault(statement, []).append(Insertion(barrier, take_leading="all"))

        if removal:
            message = "`barrier()` before rank 0 removes the file it wrote above: every rank has read it by then"
        else:
            message = "`barrier()` before every rank reads the file rank 0 writes above: it is written by then"
        self._step(call, "AM528", message, apply)

    def _runs_alike_on_every_rank(self, statement: cst.CSTNode) -> bool:
        """Does every rank reach `statement` as often as the others? Provably when
        nothing between it and its function branches: only `for` and `with`
        bodies (a DistributedSampler gives every rank as many batches), or the
        `__main__` block."""
        child = statement
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return True
            if isinstance(ancestor, cst.If) and is_main_guard(ancestor.test) and child is ancestor.body:
                pass
            elif isinstance(ancestor, cst.For) and child is not ancestor.body:
                return False
            elif not isinstance(ancestor, (cst.IndentedBlock, cst.For, cst.With)):
                return False
            child = ancestor
        return True

    def _output_kind(self, statement: cst.CSTNode, loggers: set[cst.CSTNode]) -> Optional[str]:
        if isinstance(statement, cst.With):
            for item in statement.items:
                if isinstance(item.item, cst.Call) and self.is_call_to(item.item, OPEN) and _opens_for_writing(item.item):
                    return "a file write"
            return None
        calls = [s.value for s in statement.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)]
        for call in calls:
            if self.is_call_to(call, PRINT_LIKE):
                return "printing"
            if self.is_call_to(call, LOGGING_CALLS) or (
                isinstance(call.func, cst.Attribute) and call.func.attr.value in LOG_LEVELS and call.func.value in loggers
            ):
                return "logging"
            if self.is_call_to(call, FILE_WRITES):
                return "a file write"
        return None

    def _logger_references(self) -> set[cst.CSTNode]:
        """Names bound to `logging.getLogger(...)` at module level, where used."""
        found: set[cst.CSTNode] = set()
        for statement in self._module.body:
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                small = statement.body[0]
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                    and isinstance(small.value, cst.Call)
                    and self.is_call_to(small.value, {"logging.getLogger"})
                ):
                    var = self._target_var(small.targets[0].target)
                    found.update(reference for reference in self._references(var))
        return found

    def _plan_guard(self, statement: cst.CSTNode, kind: str) -> bool:
        if self._guarded_already(statement):
            return False
        problem = None
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) != 1:
            problem = f"{kind} shares its line with other statements: put it on its own line, then run ddp again"
        elif isinstance(statement, cst.SimpleStatementSuite) or not isinstance(self.parent(statement), (cst.IndentedBlock, cst.Module)):
            problem = f"{kind} in a one-line block: put it on its own line, then run ddp again"
        else:
            communicating = self._may_communicate(statement)
            if communicating is not None:
                problem = (
                    f"{kind} that calls `{communicating}`, which may take part in collectives on every rank: compute "
                    f"that value on every rank first, then do the output under `if is_main_process():`"
                )
        if problem is not None:
            self.report(statement, "AM525", problem)
            return False

        self._guard_planned.add(statement)

        def apply() -> None:
            self._use("is_main_process")
            self._guarded.add(statement)

        self._step(statement, "AM506", f"{kind} under `if is_main_process():`, on rank 0 only", apply)
        return True

    def _guarded_already(self, node: cst.CSTNode) -> bool:
        for ancestor in self.ancestors(node):
            if ancestor in self._guard_planned:
                return True
            if isinstance(ancestor, cst.If) and any(
                isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.is_main_process", "accelmigrate.runtime.env.is_main_process"})
                for n in walk(ancestor.test)
            ):
                return True
        return False

    def _may_communicate(self, statement: cst.CSTNode) -> Optional[str]:
        """The first call in `statement` that might run a collective: the script's
        own functions, torch.distributed, or the model's forward."""
        for node in walk(statement):
            if not isinstance(node, cst.Call):
                continue
            names = self.qualified_names(node.func)
            if any(n.startswith(("torch.distributed.", f"{RUNTIME}.sum", f"{RUNTIME}.mean", f"{RUNTIME}.barrier")) for n in names):
                return self._code(node.func)
            if self._callee(node) is not None:
                return self._code(node.func)
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "forward":
                func = func.value
            if func in self._model_references:
                return self._code(node.func)
        return None

    def _plan_tqdm(self, call: cst.Call) -> None:
        if has_star_args(call):
            self.report(call, "AM507", "tqdm with `**kwargs`: pass `disable=not is_main_process()` by hand")
            return
        disable = keyword_arg(call, "disable")
        if disable is not None and any(
            isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.is_main_process"}) for n in walk(disable.value)
        ):
            return

        def rewrite(updated: cst.Call) -> cst.Call:
            hidden = cst.parse_expression("not is_main_process()")
            old = keyword_arg(updated, "disable")
            if old is None:
                return append_keyword_args(updated, [("disable", hidden)])
            value = old.value if not isinstance(old.value, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) else old.value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            combined = cst.BooleanOperation(value, cst.Or(), hidden)
            return updated.with_changes(args=[a.with_changes(value=combined) if a is old else a for a in updated.args])

        def apply() -> None:
            self._use("is_main_process")
            self._edits[call] = rewrite

        self._step(call, "AM507", "tqdm bar on rank 0 only: `disable=not is_main_process()`", apply)

    # -- the entry point --------------------------------------------------------------

    def _plan_init(self) -> None:
        if any(isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.init_distributed"}) for n in self._nodes):
            return
        main_block = self._main_block()
        if main_block is not None and not self._runs_at_import():
            first = main_block.body.body[0]
            anchor, insertion = first, Insertion(self._init_statement())
        else:
            anchor = self._first_statement_after_imports()
            if anchor is None:
                self.report(
                    self._module.body[-1] if self._module.body else self._nodes[0], "AM531",
                    "this file only defines things: call `init_distributed()` (accelmigrate.runtime.distributed) at "
                    "the start of the program that uses them, before any model is wrapped or DataLoader built",
                )
                return
            insertion = Insertion(self._init_statement(), take_leading="blank")

        def apply() -> None:
            self._use("init_distributed")
            self._before.setdefault(anchor, []).insert(0, insertion)

        # First, so that a suppressed set-up turns off the rest.
        self._steps.insert(0, Step(_header(anchor), "AM501", "`init_distributed()`: joins the launch's process group here (left at exit, after an exception too); plain `python` runs a world of one", apply))

    def _init_statement(self) -> cst.BaseStatement:
        return cst.parse_statement(f"init_distributed(){self._module.default_newline}", config=self._config)

    def _main_block(self) -> Optional[cst.If]:
        for statement in self._module.body:
            if isinstance(statement, cst.If) and is_main_guard(statement.test) and isinstance(statement.body, cst.IndentedBlock):
                return statement
        return None

    def _runs_at_import(self) -> bool:
        """Does module-level code (outside the `__main__` block) build models or
        loaders, or call the script's own functions and classes?"""
        for statement in self._module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.If) and is_main_guard(statement.test):
                continue
            for node in walk(statement):
                if isinstance(node, cst.Call) and (
                    self._callee(node) is not None
                    or self._is_model_or_loader_call(node)
                    or _is_backward(node)
                    or (isinstance(node.func, cst.Name) and node.func.value in self._classes)
                ):
                    return True
        return False

    def _first_statement_after_imports(self) -> Optional[cst.CSTNode]:
        """The first module-level statement that runs code (None in a file that only defines)."""
        body = self._module.body
        for index, statement in enumerate(body):
            if index == 0 and is_docstring(statement):
                continue
            if isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
                continue
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or _defines_without_calls(statement):
                continue  # defining runs nothing; join the group just before the first code that runs
            return statement
        return None

    # -- --local_rank ------------------------------------------------------------------

    def _plan_local_rank(self) -> None:
        for node in self._nodes:
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument"):
                continue
            flags = [a for a in node.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
            if not any(f.value.evaluated_value in LOCAL_RANK_FLAGS for f in flags):
                continue
            default = keyword_arg(node, "default")
            if default is not None and any(isinstance(n, cst.SimpleString) and "LOCAL_RANK" in n.value for n in walk(default.value)):
                continue
            if default is not None and not (_is_int_literal(default.value) or _is_none(default.value)):
                self.report(node, "AM509", "`--local_rank` with a computed default: make it `int(os.environ.get(\"LOCAL_RANK\", ...))` by hand: torchrun passes the local rank in the environment, not as a flag")
                continue
            scope = self.get_metadata(ScopeProvider, node, None)
            if not (reads_import_of(scope, "os", "os") or is_unbound(scope, "os")):
                self.report(node, "AM509", "`--local_rank`: `os` means something else here; give the flag the default `int(os.environ.get(\"LOCAL_RANK\", ...))` by hand: torchrun passes the local rank in the environment, not as a flag")
                continue
            if default is None or _is_none(default.value):
                value = 'int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None'
            else:
                value = f'int(os.environ.get("LOCAL_RANK", {self._code(default.value)}))'
            if self.fix(node, "AM509", "`--local_rank` defaults to the LOCAL_RANK environment variable: torchrun passes the local rank there, not as a flag"):
                self.add_import("os")
                expression = cst.parse_expression(value)
                self._edits[node] = lambda updated, e=expression: _set_keyword(updated, "default", e)

    # =====================================================================
    # Following variables through the script
    # =====================================================================

    def _target_var(self, target: cst.BaseExpression) -> Optional[Var]:
        if isinstance(target, cst.Name):
            return Var(target.value, self.get_metadata(ScopeProvider, target))
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
            owner = next((a for a in self.ancestors(target) if isinstance(a, cst.ClassDef)), None)
            return Var(target.attr.value, owner, is_attribute=True) if owner is not None else None
        return None

    def _var_of(self, expression: cst.CSTNode) -> Optional[Var]:
        """The variable an expression reads, when it is a name or `self.<name>`."""
        if isinstance(expression, cst.Name):
            referents = self._referents(expression)
            scopes = {a.scope for a in referents}
            return Var(expression.value, scopes.pop()) if len(scopes) == 1 else None
        if isinstance(expression, cst.Attribute):
            return self._target_var(expression)
        return None

    def _root_var(self, expression: cst.CSTNode) -> Optional[Var]:
        """`model.fc` -> model; `self.net.encoder` -> self.net."""
        while isinstance(expression, cst.Attribute):
            var = self._var_of(expression)
            if var is not None:
                return var
            expression = expression.value
        return self._var_of(expression) if isinstance(expression, cst.Name) else None

    def _referents(self, name: cst.Name) -> set:
        try:
            scope = self.get_metadata(ScopeProvider, name)
        except KeyError:
            return set()
        if scope is None:
            return set()
        found = set()
        for access in scope.accesses[name]:
            found.update(a for a in access.referents if isinstance(a, Assignment))
        if not found and name.value in scope.assignments:
            found.update(a for a in scope.assignments[name.value] if isinstance(a, Assignment))
        return found

    def _references(self, var: Var) -> list[cst.CSTNode]:
        """Where the variable is read."""
        if var.is_attribute:
            return [
                n for n in walk(var.owner)
                if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == "self"
                and n.attr.value == var.name and not self._is_assign_target(n)
            ]
        found = []
        for assignment in var.owner.assignments[var.name]:
            for access in assignment.references:
                if access.node not in found:
                    found.append(access.node)
        return found

    def _is_assign_target(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign)) and getattr(parent, "target", None) is node

    def _followed_references(self, var: Var, depth: int = 0, path: tuple = ()) -> Iterator[tuple[cst.CSTNode, list]]:
        """References to `var`, and to the parameters of the script's own
        functions it is passed to: (reference, [(call, argument), ...])."""
        for reference in self._references(var):
            yield reference, list(path)
            if depth >= FOLLOW_DEPTH:
                continue
            argument = self.parent(reference)
            call = self.parent(argument) if isinstance(argument, cst.Arg) else None
            if not isinstance(call, cst.Call) or argument.value is not reference or argument.star:
                continue
            callee = self._callee(call)
            if callee is None:
                continue
            parameter = _parameter_for(callee[0], callee[1], call, argument)
            if parameter is None:
                continue
            inner = Var(parameter.name.value, self.get_metadata(ScopeProvider, parameter.name))
            yield from self._followed_references(inner, depth + 1, path + ((call, reference),))

    def _callee(self, call: cst.Call) -> Optional[tuple[cst.FunctionDef, int]]:
        """The script's own function (or method, via `self.`) a call runs, and
        how many leading parameters (`self`) the call does not pass."""
        func = call.func
        if isinstance(func, cst.Name):
            referents = self._referents(func)
            for assignment in referents:
                if isinstance(assignment.node, cst.FunctionDef) and assignment.node in self._functions.values():
                    return assignment.node, 0
                if isinstance(assignment.node, cst.ClassDef) and assignment.node in self._classes.values():
                    init = _method(assignment.node, "__init__")
                    return (init, 1) if init is not None else None
            return None
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            owner = next((a for a in self.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            method = _method(owner, func.attr.value) if owner is not None else None
            return (method, 1) if method is not None else None
        return None

    # =====================================================================
    # Small queries
    # =====================================================================

    def _calls_to(self, names) -> list[cst.Call]:
        return [n for n in self._nodes if isinstance(n, cst.Call) and self.is_call_to(n, names)]

    def _code(self, node: cst.CSTNode) -> str:
        return self._module.code_for_node(node).strip()

    def _position(self, node: cst.CSTNode, end: bool = False) -> tuple[int, int]:
        where = self.get_metadata(PositionProvider, node)
        point = where.end if end else where.start
        return point.line, point.column

    def _block_statement(self, node: cst.CSTNode) -> tuple[Optional[cst.CSTNode], Optional[cst.CSTNode]]:
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                return child, ancestor
            if isinstance(ancestor, cst.SimpleStatementSuite):
                return None, None
            child = ancestor
        return None, None

    def _is_output_statement(self, statement: cst.CSTNode) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        return all(
            isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and self.is_call_to(s.value, PRINT_LIKE | LOGGING_CALLS)
            for s in statement.body
        )

    def _from_import(self, func: cst.BaseExpression) -> Optional[tuple[str, str, Optional[str]]]:
        """`DataParallel` bound by `from torch.nn import DataParallel [as DP]`:
        ("torch.nn", "DataParallel", "DP" or None)."""
        if not isinstance(func, cst.Name):
            return None
        for assignment in self._referents(func):
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.ImportFrom) and node.module is not None and not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    bound = alias.asname.name.value if alias.asname is not None else _last_name(alias.name)
                    if bound == func.value:
                        asname = bound if alias.asname is not None else None
                        return dotted_name(node.module), _last_name(alias.name), asname
        return None

    # =====================================================================
    # Applying the plan
    # =====================================================================

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self._edits.get(original_node)
        if edit is not None and not isinstance(updated_node, cst.RemovalSentinel):
            updated_node = edit(updated_node)
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def _rewrite_body(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        if not any(s in self._before or s in self._after or s in self._guarded or s in self._remove for s in originals):
            return list(updated)
        result: list[cst.CSTNode] = []
        run: list[cst.CSTNode] = []  # consecutive statements to guard together
        carried: list[cst.EmptyLine] = []  # the leading lines of a removed statement

        def emit(statement: cst.CSTNode) -> None:
            nonlocal carried
            if run:
                result.append(self._guard(run))
                run.clear()
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                carried = []
            result.append(statement)

        for original, statement in zip(originals, updated):
            for insertion in self._before.get(original, ()):
                statement, inserted = _take_leading(statement, insertion)
                emit(inserted)
            if original in self._remove:
                carried.extend(
                    line for line in getattr(statement, "leading_lines", ())
                    if original not in self._comments_moved or line.comment is None
                )
            elif original in self._guarded:
                if carried:
                    statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                    carried = []
                run.append(statement)
            else:
                emit(statement)
            for statement_after in self._after.get(original, ()):
                emit(statement_after)
        if run:
            result.append(self._guard(run))
        if not result:
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        elif any(line.comment is not None for line in carried):
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        return result

    def _guard(self, statements: list[cst.CSTNode]) -> cst.If:
        first = statements[0]
        inner = [first.with_changes(leading_lines=[]), *statements[1:]]
        return cst.If(
            test=cst.parse_expression("is_main_process()"),
            body=cst.IndentedBlock(body=inner),
            leading_lines=first.leading_lines,
        )


# -- helpers on syntax alone ----------------------------------------------------------


def _header(statement: cst.CSTNode) -> cst.CSTNode:
    """A node on the first line of a statement, for a finding about the
    statement as a whole (a skip comment inside its body is not about it)."""
    if isinstance(statement, (cst.For,)):
        return statement.target
    if isinstance(statement, (cst.If, cst.While)):
        return statement.test
    if isinstance(statement, cst.With):
        return statement.items[0]
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return statement.name
    return statement


def _loop_body(loop: cst.CSTNode) -> cst.CSTNode:
    """What runs once per item: a `for` statement's body, a whole comprehension."""
    return loop.body if isinstance(loop, cst.For) else loop


def _last_name(node: cst.BaseExpression) -> str:
    return node.attr.value if isinstance(node, cst.Attribute) else node.value


def _call(name: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name(name), args=[cst.Arg(a) for a in args])


def _keyword(arg: cst.Arg) -> Optional[str]:
    return arg.keyword.value if arg.keyword is not None else None


def _first_positional(call: cst.Call) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is None and not arg.star:
            return arg
        if arg.star:
            return None
    return None


def _set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    if keyword_arg(call, name) is None:
        return append_keyword_args(call, [(name, value)])
    return call.with_changes(args=[a.with_changes(value=value) if _keyword(a) == name else a for a in call.args])


def _as_atom(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node`, parenthesised when a following `.attr` would bind to a part of it."""
    if node.lpar or isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.List, cst.Tuple, cst.Dict)):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _is_none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _is_int_literal(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _downloads(call: cst.Call) -> bool:
    """`datasets.MNIST(..., download=True)`."""
    download = keyword_arg(call, "download")
    return download is not None and isinstance(download.value, cst.Name) and download.value.value == "True"


def _opens_for_writing(call: cst.Call) -> bool:
    positional = [a for a in call.args if a.keyword is None]
    mode = keyword_arg(call, "mode") or (positional[1] if len(positional) > 1 else None)
    if mode is None or not isinstance(mode.value, cst.SimpleString):
        return False
    return any(flag in mode.value.evaluated_value for flag in "wax+")


def _dataset_name_for(target: cst.BaseExpression) -> str:
    name = target.attr.value if isinstance(target, cst.Attribute) else target.value
    for suffix in ("_loader", "loader", "_dataloader", "dataloader"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)].rstrip("_") + "_dataset"
    return "dataset"


def _method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


def _parameter_for(function: cst.FunctionDef, skipped: int, call: cst.Call, argument: cst.Arg) -> Optional[cst.Param]:
    positional = [*function.params.posonly_params, *function.params.params]
    if argument.keyword is not None:
        for param in [*function.params.params, *function.params.kwonly_params]:
            if param.name.value == argument.keyword.value:
                return param
        return None
    index = [a for a in call.args if a.keyword is None].index(argument) + skipped
    return positional[index] if index < len(positional) else None


def _take_leading(anchor: cst.CSTNode, insertion: Insertion) -> tuple[cst.CSTNode, cst.BaseStatement]:
    """Split the anchor's leading lines between it and the statement inserted before it."""
    leading = list(getattr(anchor, "leading_lines", ()))
    if insertion.take_leading == "all":
        return anchor.with_changes(leading_lines=[]), insertion.statement.with_changes(leading_lines=leading)
    if insertion.take_leading == "blank":
        blank = []
        for line in leading:
            if line.comment is not None:
                break
            blank.append(line)
        return anchor, insertion.statement.with_changes(leading_lines=blank)
    return anchor, insertion.statement
