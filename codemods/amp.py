"""amp: train and evaluate in 16-bit mixed precision with `torch.autocast`.

What it does
    For every training step it can prove (a `loss.backward()` and the
    `step()` of an optimizer built from `torch.optim` in the same loop or
    function, the loss computed before the backward in that loop or function):

    - wraps the forward pass and the loss computation in
      `torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=...)`;
      the backward pass and the optimizer step stay outside;
    - scales the loss with a `torch.amp.GradScaler`: `scaler.scale(loss).backward()`,
      `scaler.step(optimizer)` for every optimizer, one `scaler.update()` per
      iteration, and `scaler.unscale_(optimizer)` before the gradients are
      clipped or read;
    - binds `amp_dtype = autocast_dtype(device)` after the device binding and
      `scaler = grad_scaler(device, amp_dtype)` after the optimizer (in a
      class: `self.amp_dtype`, `self.scaler`). The runtime picks bfloat16 on
      GPUs that compute it, else float16, and float32 (autocast off) on a
      CPU; `ACCELMIGRATE_PRECISION=bf16|fp16|fp32` overrides it (fp32 turns
      autocast off through `enabled=`). The scaler is enabled only for
      float16, so the same code runs in every precision;
    - runs evaluation (`with torch.no_grad():`, `torch.inference_mode()`, and
      functions decorated with them) under the same autocast, without a scaler;
    - saves the scaler's state next to the optimizer's in checkpoints
      (`{"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}`)
      and loads it back after `optimizer.load_state_dict(ckpt["optimizer"])`;
    - migrates NVIDIA apex (`amp.initialize`, `amp.scale_loss`,
      `amp.master_params`, `amp.state_dict`) to the native API and drops the
      apex import;
    - replaces the deprecated `torch.cuda.amp.autocast`, `GradScaler`,
      `custom_fwd`, `custom_bwd` (and `torch.cpu.amp`), however imported. With
      a device binding in reach of every old autocast and GradScaler, they
      move onto the same policy as the rest: `torch.autocast(device_type=
      device.type, dtype=amp_dtype, enabled=...)` (the user's own `enabled=`
      kept in the condition) and `grad_scaler(device, amp_dtype, ...)` (its
      options kept), so the scaler is on only for float16 and
      ACCELMIGRATE_PRECISION applies. All of them or none: when one is out of
      reach, suppressed, or names a dtype other than float16 (the user's
      choice), every one becomes its `torch.amp` form on the device it named,
      in the precision as written, and the finding says so.

    The autocast device comes from the device binding the `device` codemod
    leaves (`device = get_device()`), or any `device = torch.device(...)`.

Why float32 on a CPU by default
    CPU autocast keeps far fewer operations in float32 than CUDA's does:
    softmax, log_softmax, sum, cumsum, layer_norm, group_norm, exp, log and
    pow run in bfloat16 there (CUDA runs them in float32). bfloat16 is slower
    than float32 on CPUs without bfloat16 units, and 1.2-1.7x faster on small
    conv nets where the CPU has them. A migrated script run on a CPU is mostly
    a check that it still trains as before, so it computes what the original
    computed; `ACCELMIGRATE_PRECISION=bf16` opts in to bfloat16 there. (A
    BatchNorm conv net with a one-cycle schedule peaking at 0.2 ended 93% ->
    42% once in bfloat16; measured over 96 paired runs of such nets, bfloat16
    stayed within float32's own spread across seeds, so the drop is that of a
    schedule whose outcome any rounding can tip, not of one operation.)

Why
    Tensor cores compute matrix products in 16 bits several times faster than
    in 32, and activations in 16 bits halve the memory traffic. Autocast runs
    each operation in the precision that is safe for it (matmuls and
    convolutions in 16 bits, reductions and losses in 32), so the model's
    parameters and the optimizer stay in float32. float16's narrow exponent
    range lets small gradients underflow to zero: the scaler multiplies the
    loss before the backward and divides the gradients before the step,
    skipping steps whose gradients overflowed. Gradients must be unscaled
    before they are clipped, or the threshold applies to scaled values.

Example
    Before::

        device = get_device()
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            output = model(x)
            loss = criterion(output, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

    After::

        device = get_device()
        amp_dtype = autocast_dtype(device)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = grad_scaler(device, amp_dtype)
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                output = model(x)
                loss = criterion(output, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()

Left alone (with a finding that says what to do by hand)
    - a backward whose loss is not computed before it in the same loop or
      function (forward and backward in different functions, a loss passed in
      as a parameter: AM410), or computed in the backward statement itself
      (`criterion(model(x), y).backward()`: bind it first);
    - `backward()` with arguments (`retain_graph=True`, a gradient) and
      `torch.autograd.grad` in the step: gradient penalties and shared graphs
      need the scaler placed by hand (AM412);
    - `optimizer.step(closure)` (LBFGS): the loss is computed inside step() (AM411);
    - an optimizer the codemod cannot trace to its constructor (a function
      parameter, a factory), or any `.step()` in the step whose receiver might
      be one: a step that bypassed the scaler would apply scaled gradients (AM414);
    - no device binding in reach (AM413), the device bound inside the loop,
      several optimizers stepped only in separate branches (AM415);
    - apex as a whole when one of its uses has no native equivalent
      (`amp.register_float_function`, ...: AM416).

    Steps that already run under autocast or scale their loss (a previous
    run, or the user's own native AMP) are left as they are, and so are
    no_grad blocks that only update parameters in place (an EMA).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional, Sequence, Union

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import (
    Assignment,
    ExpressionContext,
    ExpressionContextProvider,
    PositionProvider,
    ScopeProvider,
)

from ._base import CLIP_GRAD_FUNCTIONS, Codemod, code_of, walk

PRECISION = "accelmigrate.runtime.precision"
AUTOCAST_DTYPE = f"{PRECISION}.autocast_dtype"
GRAD_SCALER_FACTORY = f"{PRECISION}.grad_scaler"
DEVICE_FACTORIES = {"accelmigrate.runtime.device.get_device", "torch.device"}
NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}
AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cuda.amp.autocast_mode.autocast",
    "torch.cpu.amp.autocast",
    "torch.cpu.amp.autocast_mode.autocast",
}
RAW_AUTOGRAD = {"torch.autograd.grad", "torch.autograd.backward"}
OPTIMIZER_PACKAGES = ("torch.optim.", "torch.distributed.optim.", "apex.optimizers.", "bitsandbytes.optim.")
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")

# Deprecated spelling -> (its torch.amp replacement, the device it hard-coded).
DEPRECATED = {
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
    "torch.cuda.amp.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cpu.amp.GradScaler": ("amp.GradScaler", "cpu"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cpu"),
    "torch.cuda.amp.custom_fwd": ("amp.custom_fwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("amp.custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("amp.custom_bwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("amp.custom_bwd", "cuda"),
}
# The old autocast took (enabled, dtype, cache_enabled) positionally, the old
# GradScaler (init_scale, growth_factor, backoff_factor, growth_interval,
# enabled); their replacements take the device first: positional arguments
# become keywords.
OLD_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
OLD_SCALER_POSITIONAL = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
# The dtype the old autocast defaulted to; naming it asks for nothing the
# runtime's choice does not give (float16 where bfloat16 is not computed).
HALF = {"torch.float16", "torch.half"}

APEX = "apex.amp"
APEX_INITIALIZE = "apex.amp.initialize"
APEX_SCALE_LOSS = "apex.amp.scale_loss"
APEX_MASTER_PARAMS = "apex.amp.master_params"
APEX_STATE_DICT = "apex.amp.state_dict"
APEX_LOAD_STATE_DICT = "apex.amp.load_state_dict"

# Calls that only move or cast data: such statements at the start of a forward
# pass stay outside the autocast region (they compute nothing it would change).
VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable"}  # a no-op wrapper since 0.4
MOVES = {"to", "cuda", "cpu", "float", "half", "double", "long", "int", "bool", "contiguous", "pin_memory", "type"}
# Methods that read or move tensors and modules without computing with them.
ACCESSORS = {
    "parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children",
    "state_dict", "detach", "item", "tolist", "numel", "size", "dim", "cpu", "to", "clone",
    "keys", "values", "items", "append", "extend", "eval", "train", "zero_grad",
}
SCALER_NAMES = ("scaler", "amp_scaler")
DTYPE_NAMES = ("amp_dtype", "autocast_dtype_")

Block = Union[cst.IndentedBlock, cst.Module]


def is_optimizer_class(qualified: str) -> bool:
    last = qualified.rsplit(".", 1)[-1]
    return qualified.startswith(OPTIMIZER_PACKAGES) and not qualified.startswith(NOT_OPTIMIZERS) and last[:1].isupper()


def is_scheduler(qualified: str) -> bool:
    """A learning-rate scheduler's class or factory (torch, transformers, timm ...)."""
    if qualified.startswith("torch.optim.lr_scheduler.") or qualified == "torch.optim.swa_utils.SWALR":
        return True
    module, _, last = qualified.rpartition(".")
    return "schedul" in last.lower() or module.split(".")[-1] in ("lr_scheduler", "scheduler")


def dotted(node: cst.CSTNode) -> Optional[str]:
    """`a`, `a.b.c` for names and attribute chains of names, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def is_block(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, (cst.IndentedBlock, cst.Module))


def statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


def without_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def method_call(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == name


# -- what the planning finds ----------------------------------------------------


@dataclasses.dataclass
class Ref:
    """A device or an optimizer: a variable (`kind` "name", bound in scope
    `home`) or an attribute of `self` (`kind` "attr", `home` the ClassDef)."""

    kind: str
    name: str
    home: object
    bindings: list  # the statement lines that bind it

    @property
    def key(self) -> tuple:
        return (self.kind, id(self.home), self.name)


@dataclasses.dataclass
class Backward:
    statement: cst.BaseStatement  # the line `loss.backward()`, or apex's `with amp.scale_loss(...)`
    call: Optional[cst.Call]  # `loss.backward()`; None for apex
    loss: cst.BaseExpression
    apex: Optional[cst.With] = None


@dataclasses.dataclass
class Region:
    """Statements `first`..`last` of one block, to run under autocast."""

    block: Block
    first: cst.BaseStatement
    last: cst.BaseStatement
    header: str = ""  # the `torch.autocast(...)` expression


@dataclasses.dataclass
class StepPlan:
    """One training step (a loop body or a function body) that can be migrated."""

    backwards: list
    device: Ref
    optimizers: list  # distinct Refs, in order of first step
    steps: list  # (step call, Ref)
    regions: list
    unscales: list  # (statement to insert before, [Ref...], clipping node for the finding)
    update_after: cst.BaseStatement
    site: cst.CSTNode  # where the scaler is used (for visibility checks)


@dataclasses.dataclass
class Binding:
    """A binding the codemod adds (`amp_dtype`, `scaler`): where, and its text."""

    kind: str  # "name" or "attr"
    name: str
    after: cst.BaseStatement
    owner: Optional[str]  # the `self` parameter, for attributes
    value: str
    exists: bool = False  # already there (a previous run)
    used: bool = False  # something committed refers to it

    def text(self, owner: Optional[str]) -> str:
        return f"{owner}.{self.name}" if self.kind == "attr" else self.name


@dataclasses.dataclass
class ApexEdit:
    """One apex call migrated: the call replaced, or its line removed or swapped."""

    call: cst.Call
    message: str
    replace: Optional[Callable] = None  # updated call -> new expression
    line: Optional[cst.SimpleStatementLine] = None  # removed, unless `swap` gives its replacement
    swap: Optional[Callable] = None


class Edits:
    """Changes planned on original nodes, applied when the transformer leaves them."""

    def __init__(self) -> None:
        self.replace: dict = {}  # node -> function(updated node) -> new node
        self.before: dict = {}  # statement -> [new statements]
        self.after: dict = {}  # statement -> [new statements]
        self.swap: dict = {}  # statement -> function(updated statement) -> new statement
        self.remove: set = set()
        self.wrap: dict = {}  # first statement -> (last statement, header expression text)

    def insert_after(self, anchor: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.after.setdefault(anchor, []).append(new)

    def insert_before(self, anchor: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.before.setdefault(anchor, []).append(new)

    def touches(self, body: Sequence[cst.CSTNode]) -> bool:
        return any(s in self.before or s in self.after or s in self.swap or s in self.remove or s in self.wrap for s in body)


class Problem(Exception):
    """A reason not to migrate: where, the code and the manual step."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node, self.code, self.message = node, code, message


class Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.withs: list[cst.With] = []
        self.functions: list[cst.FunctionDef] = []
        self.assigns: list[cst.Assign] = []
        self.imports: list[Union[cst.Import, cst.ImportFrom]] = []
        self.names: list[cst.Name] = []
        self.grads: list[cst.Attribute] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_With(self, node: cst.With) -> None:
        self.withs.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assigns.append(node)

    def visit_Import(self, node: cst.Import) -> None:
        self.imports.append(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.imports.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "grad":
            self.grads.append(node)


class Amp(Codemod):
    word = "amp"
    summary = "mixed precision: torch.autocast around forward and loss, a GradScaler for fp16; apex and torch.cuda.amp migrated"
    requires = ("device",)
    codes = {
        "AM401": "training step runs under torch.autocast with a GradScaler",
        "AM402": "evaluation runs under torch.autocast",
        "AM403": "NVIDIA apex amp replaced by torch.amp",
        "AM404": "deprecated torch.cuda.amp / torch.cpu.amp API replaced by torch.amp",
        "AM405": "GradScaler state saved and loaded with the optimizer's",
        "AM406": "gradients unscaled before they are clipped or read",
        "AM410": "backward without its forward, loss or step in view: mixed precision by hand",
        "AM411": "optimizer.step(closure): mixed precision by hand",
        "AM412": "backward with arguments or raw autograd calls: scale by hand",
        "AM413": "no device binding in reach: autocast needs the device type",
        "AM414": "optimizer not traceable to its constructor: bind the GradScaler by hand",
        "AM415": "layout the codemod cannot rewrite safely",
        "AM416": "apex usage without a native equivalent: apex left in place",
        "AM417": "checkpoint of the optimizer without the scaler's state",
    }
    # Every spelling of what this codemod matches contains one of these: a
    # training step ("backward"), an evaluation block, or the old AMP APIs,
    # which are reached through `.amp`, apex, or one of their names.
    triggers = (
        "backward", "no_grad", "inference_mode",
        ".amp", "apex", "autocast", "GradScaler", "custom_fwd", "custom_bwd",
    )

    METADATA_DEPENDENCIES = Codemod.METADATA_DEPENDENCIES + (ScopeProvider, ExpressionContextProvider)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.edits = Edits()
        self.facts = Collector()
        self.torch = "torch"
        self.devices: dict = {}  # device Ref key -> Ref
        self.dtype_bindings: dict = {}  # device Ref key -> Binding
        self.scaler_bindings: dict = {}  # (kind, id(home)) of the optimizers -> Binding
        self.apex_edits: list = []  # ApexEdits, committed together or not at all

    # =========================================================================
    # planning: everything is decided on the original tree, before any change
    # =========================================================================

    def visit_Module(self, node: cst.Module) -> bool:
        self.tree = node
        node.visit(self.facts)
        self.torch = self.torch_alias()
        self.index_bindings()
        plans = self.plan_scalers(self.plan_steps())
        plans = self.plan_apex(plans)
        for plan in plans:
            self.commit_step(plan)
        self.commit_apex()
        self.plan_evaluation()
        self.plan_checkpoints(plans)
        self.plan_deprecated()
        self.commit_bindings()
        return True

    # -- what the file binds -----------------------------------------------------

    def index_bindings(self) -> None:
        """Which statement lines build devices, optimizers and other things,
        and which lines bind each `self.<attribute>` of each class."""
        self.device_statements: set = set()
        self.device_names: set = set()
        self.optimizer_statements: set = set()
        self.not_optimizer_statements: set = set()  # schedulers, None, constants
        self.apex_rebinds: set = set()  # `model, optimizer = amp.initialize(model, optimizer)`
        self.class_attributes: dict = {}  # (ClassDef, attribute) -> [statement lines]
        for assign in self.facts.assigns:
            line = self.parent(assign)
            kind = self.value_kind(assign.value)
            sets = {
                "device": self.device_statements,
                "optimizer": self.optimizer_statements,
                "apex": self.apex_rebinds,
                "scheduler": self.not_optimizer_statements,
                "plain": self.not_optimizer_statements,
            }
            if kind in sets:
                sets[kind].add(line)
            owner = self.method_owner(assign)
            for target in assign.targets:
                if kind == "device" and isinstance(target.target, cst.Name):
                    self.device_names.add(target.target.value)
                if owner and isinstance(target.target, cst.Attribute) and dotted(target.target.value) == owner[1]:
                    self.class_attributes.setdefault((owner[0], target.target.attr.value), []).append(line)

    def value_kind(self, value: cst.BaseExpression) -> str:
        """device, optimizer, apex (amp.initialize), scheduler, plain (no call:
        None, a constant), or unknown (a call that may return anything)."""
        if isinstance(value, cst.IfExp):
            kinds = {self.value_kind(value.body), self.value_kind(value.orelse)}
            return kinds.pop() if len(kinds) == 1 else "unknown"
        if isinstance(value, (cst.BaseNumber, cst.BaseString)) or (isinstance(value, cst.Name) and value.value in ("None", "True", "False")):
            return "plain"
        if not isinstance(value, cst.Call):
            return "unknown"  # another name may hold an optimizer
        names = self.qualified_names(value.func)
        if names & DEVICE_FACTORIES:
            return "device"
        if any(is_optimizer_class(name) for name in names):
            return "optimizer"
        if APEX_INITIALIZE in names:
            return "apex"
        if any(is_scheduler(name) for name in names):
            return "scheduler"
        return "unknown"

    def method_owner(self, node: cst.CSTNode) -> Optional[tuple]:
        """(ClassDef, name of the `self` parameter) of the method `node` is in."""
        function = self.enclosing_function(node)
        if function is None or not function.params.params:
            return None
        body = self.parent(function)
        klass = self.parent(body) if isinstance(body, cst.IndentedBlock) else None
        if not isinstance(klass, cst.ClassDef):
            return None
        if any(self.is_qualified(d.decorator, {"builtins.staticmethod", "builtins.classmethod"}) for d in function.decorators):
            return None
        return klass, function.params.params[0].name.value

    def enclosing_function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return None

    def owner_at(self, site: cst.CSTNode) -> Optional[str]:
        owner = self.method_owner(site)
        return owner[1] if owner else None

    def torch_alias(self) -> str:
        """The name a module-level `import torch [as th]` binds (else `torch`,
        imported when needed)."""
        for node in self.module_imports():
            for alias in node.names:
                name = dotted(alias.name) or ""
                if name == "torch" and alias.asname is not None:
                    return alias.evaluated_alias
        return "torch"

    def module_imports(self) -> list:
        return [n for n in self.facts.imports if isinstance(n, cst.Import) and self.at_module_level(n)]

    def need_torch(self) -> None:
        binds_torch = any(
            (dotted(a.name) or "").split(".")[0] == "torch" and (a.asname is None or a.evaluated_alias == self.torch)
            for node in self.module_imports()
            for a in node.names
        )
        if not binds_torch:
            self.add_import("torch")

    def at_module_level(self, node: cst.CSTNode) -> bool:
        return not any(isinstance(a, (cst.FunctionDef, cst.ClassDef)) for a in self.ancestors(node))

    # -- resolving names to their bindings ------------------------------------------

    def scope_of(self, node: cst.CSTNode):
        return self.get_metadata(ScopeProvider, node, None)

    def start(self, node: cst.CSTNode) -> tuple:
        where = self.get_metadata(PositionProvider, node).start
        return (where.line, where.column)

    def end(self, node: cst.CSTNode) -> tuple:
        where = self.get_metadata(PositionProvider, node).end
        return (where.line, where.column)

    def ends_before(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        return self.end(first) <= self.start(second)

    def resolve_ref(self, expression: cst.BaseExpression, site: cst.CSTNode, statements: set, transparent: set = frozenset()) -> Optional[Ref]:
        """The Ref for `expression` (a name, or `self.attr` in a method) at
        `site`, when every binding of it in reach is one of `statements`
        (ignoring the rebindings in `transparent`)."""
        if isinstance(expression, cst.Name):
            return self.resolve_name(expression.value, site, statements, transparent)
        if isinstance(expression, cst.Attribute) and isinstance(expression.value, cst.Name):
            owner = self.method_owner(site)
            if owner is None or expression.value.value != owner[1]:
                return None
            lines = [line for line in self.class_attributes.get((owner[0], expression.attr.value), []) if line not in transparent]
            if lines and all(line in statements for line in lines):
                return Ref("attr", expression.attr.value, owner[0], lines)
        return None

    def resolve_name(self, name: str, site: cst.CSTNode, statements: set, transparent: set = frozenset()) -> Optional[Ref]:
        scope = self.scope_of(site)
        if scope is None:
            return None
        lines, homes = [], set()
        for assignment in scope[name]:
            line = self.assignment_line(assignment.node) if isinstance(assignment, Assignment) else None
            if line is not None and line in transparent:
                continue
            if line is None or line not in statements:
                return None
            lines.append(line)
            homes.add(assignment.scope)
        if not lines or len(homes) != 1:
            return None
        home = homes.pop()
        if home is scope and not any(self.ends_before(line, site) for line in lines):
            return None  # bound only further down in the same scope
        return Ref("name", name, home, sorted(lines, key=self.start))

    def assignment_line(self, target: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
        """The line of a plain `target = value` (unpacking allowed) that binds `target`."""
        for ancestor in self.ancestors(target):
            if isinstance(ancestor, cst.Assign):
                line = self.parent(ancestor)
                return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
            if isinstance(ancestor, (cst.BaseStatement, cst.BaseSmallStatement)):
                return None
        return None

    def device_at(self, site: cst.CSTNode) -> Optional[Ref]:
        """The device binding in reach of `site`: a variable, else `self.<attr>`."""
        for name in sorted(self.device_names, key=lambda n: (n != "device", n)):
            ref = self.resolve_name(name, site, self.device_statements)
            if ref is not None:
                return self.devices.setdefault(ref.key, ref)
        owner = self.method_owner(site)
        if owner is not None:
            attributes = [attr for (klass, attr) in self.class_attributes if klass is owner[0]]
            for attr in sorted(attributes, key=lambda a: (a != "device", a)):
                ref = self.resolve_ref(cst.Attribute(value=cst.Name(owner[1]), attr=cst.Name(attr)), site, self.device_statements)
                if ref is not None:
                    return self.devices.setdefault(ref.key, ref)
        return None

    def optimizer_of(self, receiver: cst.BaseExpression, site: cst.CSTNode) -> Optional[Ref]:
        return self.resolve_ref(receiver, site, self.optimizer_statements, self.apex_rebinds)

    def is_known_other(self, receiver: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`receiver` is bound only to things that are not optimizers: a
        learning-rate scheduler, None. (Anything else built by a call may be an
        optimizer from a factory, whose step must go through the scaler.)"""
        return self.resolve_ref(receiver, site, self.not_optimizer_statements) is not None

    # -- statements, blocks and reads ----------------------------------------------

    def line_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement, directly in a block, that holds `node`."""
        for candidate in (node, *self.ancestors(node)):
            if isinstance(candidate, cst.BaseStatement) and is_block(self.parent(candidate)):
                return candidate
        return None

    def own_line(self, node: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
        """The line that holds `node` as its only statement (`node` or `x = node`)."""
        small = self.parent(node)
        line = self.parent(small)
        if isinstance(small, (cst.Expr, cst.Assign)) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line if is_block(self.parent(line)) else None
        return None

    def unit_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The loop (else the function, else the module) whose body runs `node`
        once per iteration."""
        return self.innermost_loop(node) or self.enclosing_function(node) or self.tree

    def within(self, node: cst.CSTNode, unit: cst.CSTNode) -> bool:
        """`node` runs inside `unit`, in the same function."""
        for ancestor in self.ancestors(node):
            if ancestor is unit:
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
        return unit is self.tree

    def statement_in_unit(self, node: cst.CSTNode, unit: cst.CSTNode) -> cst.BaseStatement:
        """The innermost statement holding `node` that runs once per iteration
        of `unit` (outside the loops nested in it)."""
        for candidate in (node, *self.ancestors(node)):
            if isinstance(candidate, cst.BaseStatement) and is_block(self.parent(candidate)) and self.unit_of(candidate) is unit:
                return candidate
        raise Problem(node, "AM415", "cannot place this statement in the training step")

    def common_block(self, nodes: Sequence[cst.CSTNode]) -> tuple:
        """The innermost block holding all `nodes`, and for each node the
        statement of that block that holds it."""
        chains = [[n, *self.ancestors(n)] for n in nodes]
        for candidate in chains[0]:
            if is_block(candidate) and all(candidate in chain for chain in chains[1:]):
                return candidate, [chain[chain.index(candidate) - 1] for chain in chains]
        raise Problem(nodes[0], "AM415", "cannot find one block around these statements")

    def is_attribute_name(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.Attribute) and parent.attr is node

    def names_in(self, node: cst.CSTNode, context: ExpressionContext) -> set:
        """Names and dotted names (`self.loss`) read (LOAD) or bound (STORE) in `node`."""
        found = set()
        for child in walk(node, into_definitions=False):
            if isinstance(child, (cst.Name, cst.Attribute)) and not self.is_attribute_name(child):
                if self.get_metadata(ExpressionContextProvider, child, None) == context:
                    name = dotted(child)
                    if name:
                        found.add(name)
        return found

    def reads(self, node: cst.CSTNode) -> set:
        found = self.names_in(node, ExpressionContext.LOAD)
        for child in walk(node, into_definitions=False):
            if isinstance(child, cst.AugAssign):
                found |= self.names_in(child.target, ExpressionContext.STORE)
        return found

    def binds(self, node: cst.CSTNode) -> set:
        return self.names_in(node, ExpressionContext.STORE)

    # =========================================================================
    # training steps
    # =========================================================================

    def plan_steps(self) -> list:
        """A StepPlan for each training step that can be migrated; a finding
        for each that cannot."""
        units: dict = {}
        for backward in self.backwards():
            units.setdefault(self.training_unit(backward.statement), []).append(backward)
        plans = []
        for unit, backwards in units.items():
            if any(self.is_scaled(b) for b in backwards) or self.runs_under_autocast(backwards[0].statement):
                continue  # mixed precision already (a previous run, or the user's own)
            try:
                plan = self.plan_step(unit, backwards)
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)
                continue
            if plan is not None and not self.is_step_suppressed(plan):
                plans.append(plan)
        return plans

    def is_step_suppressed(self, plan: StepPlan) -> bool:
        nodes = [(b.call or b.statement, "AM401") for b in plan.backwards] + [(user, "AM406") for _, _, user in plan.unscales]
        return any(self.is_suppressed(node, code) for node, code in nodes)

    def backwards(self) -> list:
        found, inside_apex = [], set()
        for with_node in self.facts.withs:
            scale_loss = self.apex_scale_loss(with_node)
            if scale_loss is not None:
                loss = scale_loss.args[0].value if scale_loss.args and not scale_loss.args[0].keyword else None
                found.append(Backward(with_node, None, loss, with_node))
                inside_apex.update(walk(with_node.body, into_definitions=False))
        for call in self.facts.calls:
            if method_call(call, "backward") and call not in inside_apex:
                found.append(Backward(self.line_of(call), call, call.func.value))
        return sorted((b for b in found if b.statement is not None), key=lambda b: self.start(b.statement))

    def training_unit(self, line: cst.BaseStatement) -> cst.CSTNode:
        """The backward's loop, or the loop around it when only that one steps
        (micro-batches accumulated in an inner loop)."""
        unit = self.unit_of(line)
        if isinstance(unit, (cst.For, cst.While)) and not self.steps_directly_in(unit):
            outer = self.unit_of(unit)
            if self.steps_directly_in(outer):
                return outer
        return unit

    def steps_directly_in(self, unit: cst.CSTNode) -> bool:
        return any(method_call(c, "step") and self.unit_of(c) is unit for c in self.facts.calls)

    def apex_scale_loss(self, with_node: cst.With) -> Optional[cst.Call]:
        for item in with_node.items:
            if isinstance(item.item, cst.Call) and self.is_call_to(item.item, {APEX_SCALE_LOSS}):
                return item.item
        return None

    def is_scaled(self, backward: Backward) -> bool:
        """`scaler.scale(loss).backward()`: a previous run, or native AMP."""
        return backward.call is not None and method_call(backward.loss, "scale")

    def has_autocast(self, with_node: cst.With) -> bool:
        return any(isinstance(i.item, cst.Call) and self.is_call_to(i.item, AUTOCAST) for i in with_node.items)

    def runs_under_autocast(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.With) and self.has_autocast(a) for a in self.ancestors(node))

    def contains_autocast(self, node: cst.CSTNode) -> bool:
        return any(isinstance(n, cst.With) and self.has_autocast(n) for n in walk(node, into_definitions=False))

    def plan_step(self, unit: cst.CSTNode, backwards: list) -> Optional[StepPlan]:
        first = backwards[0].call or backwards[0].statement
        self.check_backwards(unit, backwards)
        device = self.device_at(backwards[0].statement)
        if device is None:
            raise Problem(first, "AM413", "no device binding in reach of this training step (autocast needs device.type): bind `device = get_device()` (accelmigrate.runtime.device), move the model and the batches there with `.to(device)`, and run again (`--to device` does it for a script written for CUDA)")
        regions = []
        for backward in backwards:
            region = self.region_for(backward)
            if region is None:
                return None  # the user's own autocast computes this loss
            regions.append(region)
        regions = self.merged(regions)
        self.check_regions(regions, device)
        steps = self.optimizer_steps(unit, backwards)
        optimizers: list = []
        for _, ref in steps:
            if all(ref.key != other.key for other in optimizers):
                optimizers.append(ref)
        return StepPlan(
            backwards=backwards,
            device=device,
            optimizers=optimizers,
            steps=steps,
            regions=regions,
            unscales=self.unscales(unit, backwards, steps),
            update_after=self.update_anchor(steps),
            site=backwards[0].statement,
        )

    def check_regions(self, regions: list, device: Ref) -> None:
        """The autocast header reads the device and the dtype: both must be
        bound before the region starts."""
        for region in regions:
            if self.device_at(region.first) is not device:
                raise Problem(region.first, "AM415", "the device is bound inside the forward pass: bind it before the loop, then run again")
            region.header = self.autocast_text(device, region.first)

    def check_backwards(self, unit: cst.CSTNode, backwards: list) -> None:
        for backward in backwards:
            node = backward.call or backward.statement
            if backward.call is not None and self.own_line(backward.call) is None:
                raise Problem(node, "AM415", "put `loss.backward()` on a line of its own (not in a one-line block, not after `;`) so that it can be scaled")
            if backward.apex is not None:
                self.check_apex_with(backward)
            if backward.call is not None and backward.call.args:
                raise Problem(node, "AM412", "backward() with arguments (retain_graph=, a gradient): scale each loss by hand, `scaler.scale(loss).backward(...)`, as in PyTorch's AMP examples")
            if any(isinstance(c, cst.Call) and not isinstance(c.func, cst.Attribute) for c in walk(backward.loss, into_definitions=False)):
                raise Problem(node, "AM410", "the loss is computed in the backward statement itself: bind it first (`loss = criterion(model(x), y)`, then `loss.backward()`) and run again")
        for call in self.facts.calls:
            if self.is_call_to(call, RAW_AUTOGRAD) and self.within(call, unit):
                raise Problem(call, "AM412", "torch.autograd.grad/backward in the training step: a gradient penalty needs the scaled loss and unscaled gradients by hand (PyTorch's AMP examples, 'Gradient penalty')")

    def check_apex_with(self, backward: Backward) -> None:
        with_node = backward.apex
        body = with_node.body.body if isinstance(with_node.body, cst.IndentedBlock) else []
        target = with_node.items[0].asname.name if with_node.items[0].asname is not None else None
        sole = body[0].body[0] if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 else None
        call = sole.value if isinstance(sole, cst.Expr) else None
        if backward.loss is None or len(with_node.items) != 1 or not isinstance(target, cst.Name) or not method_call(call, "backward") or dotted(call.func.value) != target.value:
            raise Problem(with_node, "AM416", "amp.scale_loss() block other than `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`: replace it by `scaler.scale(loss).backward()` by hand")
        if call.args:
            raise Problem(with_node, "AM412", "scaled_loss.backward() with arguments: replace it by `scaler.scale(loss).backward(...)` by hand")

    def optimizer_steps(self, unit: cst.CSTNode, backwards: list) -> list:
        """(call, optimizer) for each `.step()` of the unit; a Problem when a
        `.step()` may belong to an optimizer the codemod cannot see."""
        first = backwards[0].call or backwards[0].statement
        steps = []
        for call in self.facts.calls:
            if not method_call(call, "step") or not self.within(call, unit):
                continue
            receiver = call.func.value
            ref = self.optimizer_of(receiver, call)
            if ref is None and self.is_known_other(receiver, call):
                continue
            if ref is None:
                raise Problem(first, "AM414", f"cannot trace `{code_of(receiver)}` (stepped in this training step) to a torch.optim constructor in reach (a parameter? a factory?): bind `scaler = grad_scaler(device, amp_dtype)` next to the optimizer and scale by hand")
            if call.args:
                raise Problem(call, "AM411", "optimizer.step(closure) (LBFGS and the like) evaluates the loss inside step(): run the closure's forward under autocast and scale by hand, or keep this step in float32")
            if self.unit_of(call) is not unit or self.own_line(call) is None:
                raise Problem(call, "AM415", "put `optimizer.step()` on a line of its own, once per iteration of the training loop, so that scaler.update() can follow it")
            steps.append((call, ref))
        if not steps:
            self.check_closure(unit)
            raise Problem(first, "AM410", "no optimizer.step() in the same loop or function as this backward (forward, backward and step apart): add autocast and a GradScaler by hand")
        if not any(self.ends_before(backwards[0].statement, call) for call, _ in steps):
            raise Problem(first, "AM410", "the optimizer steps before this backward in the loop: add autocast and a GradScaler by hand")
        return steps

    def check_closure(self, unit: cst.CSTNode) -> None:
        """A backward in a closure handed to `optimizer.step(closure)`."""
        if not isinstance(unit, cst.FunctionDef):
            return
        for call in self.facts.calls:
            if method_call(call, "step") and any(isinstance(a.value, cst.Name) and a.value.value == unit.name.value for a in call.args):
                raise Problem(call, "AM411", "optimizer.step(closure) (LBFGS and the like) evaluates the loss inside step(): run the closure's forward under autocast and scale by hand, or keep this step in float32")

    # -- the autocast region ---------------------------------------------------------

    def region_for(self, backward: Backward) -> Optional[Region]:
        """The statements that compute the backward's loss: the last statement
        before it that binds the loss (looking outward through `if`/`try`/`with`
        blocks, never out of the loop or function), and before that the
        statements of the same block it depends on. None when the user's own
        autocast computes the loss."""
        wanted = self.reads(backward.loss)
        node = backward.call or backward.statement
        current = backward.statement
        while True:
            block = self.parent(current)
            body = list(block.body)
            for position in range(body.index(current) - 1, -1, -1):
                if self.binds(body[position]) & wanted:
                    return self.extend_region(block, body, position, node)
            current = self.statement_around(block, node)

    def statement_around(self, block: cst.CSTNode, node: cst.CSTNode) -> cst.BaseStatement:
        owner = self.parent(block)
        while owner is not None and not is_block(self.parent(owner)):
            owner = self.parent(owner)
        if owner is None or isinstance(owner, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            raise Problem(node, "AM410", "the loss of this backward is not computed before it in the same loop or function (forward and backward apart?): wrap the forward and the loss in `torch.autocast(device_type=device.type, dtype=amp_dtype)` and scale by hand")
        return owner

    def extend_region(self, block: Block, body: list, last: int, node: cst.CSTNode) -> Optional[Region]:
        binding = body[last]
        if self.contains_autocast(binding):
            return None
        if self.is_barrier(binding):
            raise Problem(node, "AM410", "the loss is bound by a loop, a `with` block or a statement that steps or returns: wrap the forward and the loss in autocast by hand")
        needed = self.reads(binding)
        contributors = {last}
        first = last
        for position in range(last - 1, -1, -1):
            candidate = body[position]
            if self.is_barrier(candidate):
                break
            if self.binds(candidate) & needed:
                contributors.add(position)
                needed |= self.reads(candidate)
                first = position
        while first < last and (first not in contributors or self.is_data_statement(body[first])):
            first += 1
        return Region(block, body[first], body[last])

    def is_barrier(self, line: cst.CSTNode) -> bool:
        """A statement an autocast region must not take in."""
        if isinstance(line, (cst.For, cst.While, cst.With, cst.FunctionDef, cst.ClassDef)):
            return True
        for child in walk(line, into_definitions=False):
            if isinstance(child, (cst.Return, cst.Break, cst.Continue, cst.Yield, cst.Global, cst.Nonlocal, cst.Await)):
                return True
            if method_call(child, "backward") or method_call(child, "step"):
                return True
        return False

    def is_data_statement(self, line: cst.CSTNode) -> bool:
        """`x, y = batch` or `x = x.to(device)`: unpacks, moves or casts data only."""
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
            return False
        return all(
            (isinstance(child.func, cst.Attribute) and child.func.attr.value in MOVES) or self.is_qualified(child.func, VARIABLE)
            for child in walk(line.body[0].value, into_definitions=False)
            if isinstance(child, cst.Call)
        )

    def merged(self, regions: list) -> list:
        """Overlapping regions of one block merge; a region inside another's
        statements is dropped."""
        result: list = []
        for region in sorted(regions, key=lambda r: self.start(r.first)):
            previous = result[-1] if result else None
            if previous is not None and previous.block is region.block:
                body = list(region.block.body)
                if body.index(region.first) <= body.index(previous.last):
                    if body.index(region.last) > body.index(previous.last):
                        previous.last = region.last
                    continue
            if not any(self.inside_region(region.first, other) for other in result):
                result.append(region)
        return result

    def inside_region(self, node: cst.CSTNode, region: Region) -> bool:
        body = list(region.block.body)
        span = body[body.index(region.first): body.index(region.last) + 1]
        return any(ancestor in span for ancestor in self.ancestors(node))

    # -- unscale_ and update --------------------------------------------------------

    def unscales(self, unit: cst.CSTNode, backwards: list, steps: list) -> list:
        """(statement, optimizers, first gradient user): `scaler.unscale_()` of
        each optimizer goes before the first statement that clips or reads
        gradients after a backward and before the optimizer's step."""
        events = [(self.start(b.statement), "backward", b) for b in backwards]
        events += [(self.start(call), "step", ref) for call, ref in steps]
        events += [(self.start(user), "gradients", user) for user in self.gradient_users(unit)]
        events.sort(key=lambda event: event[0])
        pending: Optional[list] = None  # gradient users since the last backward
        users_of: dict = {}  # optimizer key -> (Ref, [users])
        for _, kind, payload in events:
            if kind == "backward":
                pending = []
            elif kind == "gradients" and pending is not None:
                pending.append(payload)
            elif kind == "step" and pending:
                users_of.setdefault(payload.key, (payload, []))[1].extend(pending)
        placements: dict = {}  # statement -> ([Ref], first user)
        for ref, users in users_of.values():
            statements = [self.statement_in_unit(user, unit) for user in users]
            _, anchors = self.common_block(statements)
            anchor = min(anchors, key=self.start)
            if not any(self.ends_before(b.statement, anchor) for b in backwards):
                raise Problem(users[0], "AM415", "gradients are clipped or read where scaler.unscale_(optimizer) cannot go between the backward and the step: unscale by hand")
            placements.setdefault(anchor, ([], users[0]))[0].append(ref)
        return [(anchor, refs, user) for anchor, (refs, user) in placements.items()]

    def gradient_users(self, unit: cst.CSTNode) -> list:
        """Clipping calls and reads of `.grad` in the unit."""
        users = [c for c in self.facts.calls if self.is_call_to(c, CLIP_GRAD_FUNCTIONS | {APEX_MASTER_PARAMS}) and self.within(c, unit)]
        for attribute in self.facts.grads:
            if (
                self.get_metadata(ExpressionContextProvider, attribute, None) == ExpressionContext.LOAD
                and self.within(attribute, unit)
                and not self.only_clears(attribute)
                and not any(self.within(attribute, c) or attribute is c for c in users)
            ):
                users.append(attribute)
        return users

    def only_clears(self, attribute: cst.Attribute) -> bool:
        """`p.grad.zero_()`, `p.grad.detach_()`, `if p.grad is not None`."""
        parent = self.parent(attribute)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("zero_", "detach_", "requires_grad_"):
            return True
        return isinstance(parent, cst.Comparison) and all(isinstance(c.operator, (cst.Is, cst.IsNot)) for c in parent.comparisons)

    def update_anchor(self, steps: list) -> cst.BaseStatement:
        """The statement after which `scaler.update()` runs once per iteration
        in which the optimizers stepped: after the last step, or after the
        branch that holds it when an unconditional step comes first."""
        lines = [self.own_line(call) for call, _ in steps]
        _, anchors = self.common_block(lines)
        distinct = {id(line) for line in lines}
        if len(distinct) > 1 and not any(anchor is line for anchor, line in zip(anchors, lines)):
            raise Problem(steps[0][0], "AM415", "the optimizers step only in separate branches: call scaler.update() once per iteration, after the last scaler.step(), by hand")
        return max(anchors, key=self.start)

    # -- where the bindings go --------------------------------------------------------

    def plan_scalers(self, plans: list) -> list:
        """One scaler per place its optimizers are bound (a scope, or a class),
        right after the last of them (and after the dtype binding it needs)."""
        by_home: dict = {}
        for plan in plans:
            homes = {(ref.kind, id(ref.home)) for ref in plan.optimizers}
            if len(homes) != 1:
                self.report(plan.backwards[0].call or plan.site, "AM414", "the optimizers of this step are bound in different scopes: bind one `scaler = grad_scaler(device, amp_dtype)` in reach of all of them by hand")
                continue
            by_home.setdefault(homes.pop(), []).append(plan)
        kept = []
        for home, group in by_home.items():
            try:
                self.scaler_bindings[home] = self.scaler_binding(group)
                kept.extend(group)
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)
        return sorted(kept, key=lambda p: self.start(p.site))

    def scaler_binding(self, group: list) -> Binding:
        ref = group[0].optimizers[0]
        lines = sorted({id(line): line for plan in group for r in plan.optimizers for line in r.bindings}.values(), key=self.start)
        existing = self.existing_binding(ref, GRAD_SCALER_FACTORY)
        if existing is not None:
            return existing
        block, anchors = self.common_block(lines)
        after = max(anchors, key=self.start)
        site = group[0].site
        if ref.kind == "attr" and self.method_owner(after) is None:
            raise Problem(site, "AM414", "the optimizer attributes are bound in different methods: bind `self.scaler = grad_scaler(self.device, self.amp_dtype)` after them by hand")
        device = group[0].device
        dtype = self.dtype_binding(device)
        if self.scope_of(dtype.after) is self.scope_of(after) and self.start(after) < self.start(dtype.after):
            after = dtype.after  # the device is bound after the optimizer: the scaler follows the dtype
        elif self.device_at(after) is not device:
            raise Problem(site, "AM413", "the device binding is out of reach where the optimizer is built: bind `scaler = grad_scaler(device, amp_dtype)` next to the optimizer by hand")
        for plan in group:
            if self.scope_of(plan.site) is self.scope_of(after) and not self.ends_before(after, plan.site):
                raise Problem(plan.site, "AM414", "the optimizer is bound after a training loop that uses it: bind `scaler = grad_scaler(device, amp_dtype)` before that loop by hand")
        owner = self.owner_at(after) if ref.kind == "attr" else None
        name = self.free_name(ref, SCALER_NAMES, [p.site for p in group] + [after])
        return Binding(ref.kind, name, after, owner, f"grad_scaler({self.device_text(device, after)}, {dtype.text(self.owner_at(after))})")

    def existing_binding(self, ref: Ref, factory: str) -> Optional[Binding]:
        """The binding of `factory(...)` that a previous run left where `ref` lives."""
        for assign in self.facts.assigns:
            if not (isinstance(assign.value, cst.Call) and self.is_call_to(assign.value, {factory}) and len(assign.targets) == 1):
                continue
            target, line = assign.targets[0].target, self.parent(assign)
            if ref.kind == "name" and isinstance(target, cst.Name) and self.scope_of(line) is ref.home:
                return Binding("name", target.value, line, None, "", exists=True)
            owner = self.method_owner(assign)
            if ref.kind == "attr" and isinstance(target, cst.Attribute) and owner is not None and owner[0] is ref.home:
                return Binding("attr", target.attr.value, line, owner[1], "", exists=True)
        return None

    def free_name(self, ref: Ref, candidates: Sequence[str], sites: list) -> str:
        for name in candidates:
            if ref.kind == "attr":
                if not any(klass is ref.home and attr == name for klass, attr in self.class_attributes):
                    return name
            elif not any(self.scope_of(site)[name] for site in sites):
                return name
        raise Problem(sites[0], "AM414", f"the names {', '.join(candidates)} are taken: bind the autocast dtype and the GradScaler by hand")

    def dtype_binding(self, device: Ref) -> Binding:
        """`amp_dtype = autocast_dtype(device)`, right after the device binding."""
        if device.key not in self.dtype_bindings:
            binding = self.existing_binding(device, AUTOCAST_DTYPE)
            if binding is None:
                _, anchors = self.common_block(device.bindings)
                after = max(anchors, key=self.start)
                owner = self.owner_at(after) if device.kind == "attr" else None
                name = self.free_name(device, DTYPE_NAMES, [after])
                binding = Binding(device.kind, name, after, owner, f"autocast_dtype({self.device_text(device, after)})")
            self.dtype_bindings[device.key] = binding
        return self.dtype_bindings[device.key]

    def device_text(self, device: Ref, site: cst.CSTNode) -> str:
        return f"{self.owner_at(site)}.{device.name}" if device.kind == "attr" else device.name

    def dtype_text(self, device: Ref, site: cst.CSTNode) -> str:
        """`amp_dtype` (or `self.amp_dtype`) as read at `site`; a Problem when
        its binding (after the device's) does not come first."""
        binding = self.dtype_binding(device)
        if self.scope_of(binding.after) is self.scope_of(site) and not self.ends_before(binding.after, site):
            raise Problem(site, "AM415", "the device is bound after this point (or in a loop around it): bind it once before the training and evaluation code, then run again")
        return binding.text(self.owner_at(site))

    def autocast_text(self, device: Ref, site: cst.CSTNode, enabled: Optional[str] = None) -> str:
        """The autocast header; `enabled` is the user's own condition, if any."""
        dtype = self.dtype_text(device, site)
        condition = f"{dtype} != {self.torch}.float32"
        if enabled is not None:
            condition = f"{enabled} and {condition}"
        return f"{self.torch}.autocast(device_type={self.device_text(device, site)}.type, dtype={dtype}, enabled={condition})"

    def scaler_of(self, plan: StepPlan) -> Binding:
        return self.scaler_bindings[(plan.optimizers[0].kind, id(plan.optimizers[0].home))]

    # -- committing a step -------------------------------------------------------------

    def commit_step(self, plan: StepPlan) -> None:
        site = plan.site
        scaler_binding = self.scaler_of(plan)
        scaler = scaler_binding.text(self.owner_at(site))
        for region in plan.regions:
            self.edits.wrap[region.first] = (region.last, region.header)
        for backward in plan.backwards:
            self.scale_backward(backward, scaler)
        for call, _ in plan.steps:
            self.edits.replace[call] = lambda updated, scaler=scaler: cst.Call(func=cst.parse_expression(f"{scaler}.step"), args=[cst.Arg(updated.func.value)])
        for anchor, refs, user in plan.unscales:
            for ref in refs:
                self.edits.insert_before(anchor, statement(f"{scaler}.unscale_({self.optimizer_text(ref, anchor)})"))
            self.fix(user, "AM406", "scaler.unscale_(optimizer) first: clipping or reading the gradients must see their true values, not values multiplied by the loss scale")
        self.edits.insert_after(plan.update_after, statement(f"{scaler}.update()"))
        scaler_binding.used = True
        self.dtype_binding(plan.device).used = True
        self.add_import(PRECISION, "autocast_dtype")
        self.add_import(PRECISION, "grad_scaler")
        self.need_torch()
        stepped = ", ".join(self.optimizer_text(ref, site) for ref in plan.optimizers)
        for backward in plan.backwards:
            self.fix(backward.call or backward.statement, "AM401", f"forward and loss under torch.autocast (bf16 on GPUs that support it, else fp16 with the GradScaler; fp32 on a CPU; ACCELMIGRATE_PRECISION overrides), backward scaled, {stepped} stepped through the scaler")

    def optimizer_text(self, ref: Ref, site: cst.CSTNode) -> str:
        return f"{self.owner_at(site)}.{ref.name}" if ref.kind == "attr" else ref.name

    def scale_backward(self, backward: Backward, scaler: str) -> None:
        if backward.apex is not None:
            text = f"{scaler}.scale({code_of(without_parens(backward.loss))}).backward()"
            self.edits.swap[backward.statement] = lambda old, text=text: statement(text).with_changes(leading_lines=old.leading_lines)
            return

        def scale(updated: cst.Call) -> cst.Call:
            scaled = cst.Call(func=cst.parse_expression(f"{scaler}.scale"), args=[cst.Arg(without_parens(updated.func.value))])
            return updated.with_changes(func=updated.func.with_changes(value=scaled))

        self.edits.replace[backward.call] = scale

    # =========================================================================
    # apex
    # =========================================================================

    def plan_apex(self, plans: list) -> list:
        """apex goes as a whole or not at all: when one of its uses cannot be
        migrated, the steps that scale through it stay as they are."""
        uses = [n for n in self.facts.names if self.is_apex_reference(n) and not self.in_import(n)]
        calls = [c for c in self.facts.calls if any(q.startswith(APEX + ".") for q in self.qualified_names(c.func))]
        if not uses and not calls:
            return plans
        problems, handled = [], set()
        for call in calls:
            handled.update(n for n in walk(call.func, into_definitions=False) if isinstance(n, cst.Name))
            try:
                self.plan_apex_call(call, plans)
            except Problem as problem:
                problems.append(problem)
        for name in uses:
            if name not in handled:
                problems.append(Problem(name, "AM416", "apex amp used other than through initialize/scale_loss/master_params/state_dict: migrate it to torch.amp by hand"))
        if problems or any(self.is_suppressed(edit.call, "AM403") for edit in self.apex_edits):
            for problem in problems:
                self.report(problem.node, problem.code, problem.message)
            self.apex_edits = []
            kept = []
            for plan in plans:
                apex_steps = [b.apex for b in plan.backwards if b.apex is not None]
                if apex_steps:
                    self.report(apex_steps[0], "AM416", "apex stays in this file (one of its uses has no torch.amp equivalent), so this step keeps amp.scale_loss: migrate it together with the rest of apex by hand")
                else:
                    kept.append(plan)
            return kept
        return plans

    def is_apex_reference(self, name: cst.Name) -> bool:
        return not self.is_attribute_name(name) and any(q == APEX or q.startswith(APEX + ".") for q in self.qualified_names(name))

    def in_import(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node))

    def plan_apex_call(self, call: cst.Call, plans: list) -> None:
        names = self.qualified_names(call.func)
        if APEX_INITIALIZE in names:
            self.plan_apex_initialize(call)
        elif APEX_SCALE_LOSS in names:
            if not any(b.apex is not None and self.apex_scale_loss(b.apex) is call for p in plans for b in p.backwards):
                raise Problem(call, "AM416", "amp.scale_loss() in a training step this codemod cannot migrate: replace it by `scaler.scale(loss).backward()` by hand")
            self.apex_edits.append(ApexEdit(call, "apex amp.scale_loss() replaced by scaler.scale(loss).backward()"))
        elif APEX_MASTER_PARAMS in names:
            if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
                raise Problem(call, "AM416", "amp.master_params() with unusual arguments: pass the optimizer's parameters by hand")
            parameters = cst.parse_expression(f'[p for group in {code_of(call.args[0].value)}.param_groups for p in group["params"]]')
            message = "apex amp.master_params(optimizer) replaced by the optimizer's parameters (torch.amp keeps no separate master copy)"
            self.apex_edits.append(ApexEdit(call, message, replace=lambda updated: parameters))
        elif APEX_STATE_DICT in names or APEX_LOAD_STATE_DICT in names:
            self.plan_apex_state(call, "state_dict" if APEX_STATE_DICT in names else "load_state_dict")
        else:
            raise Problem(call, "AM416", f"apex `{code_of(call.func)}` has no torch.amp equivalent: migrate it by hand")

    def plan_apex_initialize(self, call: cst.Call) -> None:
        line = self.own_line(call)
        assign = line.body[0] if line is not None else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            raise Problem(call, "AM416", "amp.initialize() whose result is not assigned: remove it by hand (native autocast needs no initialisation)")
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        target = assign.targets[0].target
        targets = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        if not positional or len(targets) != len(positional) or any(isinstance(v, (cst.List, cst.Tuple)) for v in positional):
            raise Problem(call, "AM416", "amp.initialize() with lists of models or optimizers: remove it by hand (native autocast needs no initialisation)")
        level = next((code_of(a.value) for a in call.args if a.keyword is not None and a.keyword.value == "opt_level"), None)
        extra = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in ("opt_level", "verbosity")]
        message = "apex amp.initialize()" + (f" (opt_level {level})" if level else "") + " removed: torch.autocast and GradScaler wrap neither model nor optimizer"
        if extra:
            message += f"; {', '.join(extra)} dropped: torch.amp keeps float32 weights and scales the loss dynamically"
        if all(dotted(t) is not None and dotted(t) == dotted(v) for t, v in zip(targets, positional)):
            self.apex_edits.append(ApexEdit(call, message, line=line))  # `model, optimizer = amp.initialize(model, optimizer)`: gone
        else:
            rebinding = statement(f"{code_of(target)} = {', '.join(code_of(v) for v in positional)}")
            self.apex_edits.append(ApexEdit(call, message, line=line, swap=lambda old: rebinding.with_changes(leading_lines=old.leading_lines)))

    def plan_apex_state(self, call: cst.Call, method: str) -> None:
        scalers = list(self.scaler_bindings.values())
        if len(scalers) != 1 or scalers[0].kind != "name" or not self.name_visible(scalers[0], call):
            raise Problem(call, "AM416", f"apex amp.{method}(): use the GradScaler's {method}() in its place by hand")
        func = cst.parse_expression(f"{scalers[0].name}.{method}")
        self.apex_edits.append(ApexEdit(call, f"apex amp.{method}() replaced by scaler.{method}()", replace=lambda updated: updated.with_changes(func=func)))

    def name_visible(self, binding: Binding, site: cst.CSTNode) -> bool:
        """A variable bound right after `binding.after` is in reach of `site`."""
        home, scope = self.scope_of(binding.after), self.scope_of(site)
        if scope is home:
            return self.ends_before(binding.after, site)
        while scope is not None and scope.parent is not scope:
            scope = scope.parent
            if scope is home:
                return True
        return False

    def commit_apex(self) -> None:
        if not self.apex_edits:
            return
        for edit in self.apex_edits:
            if not self.fix(edit.call, "AM403", edit.message):
                continue
            if edit.replace is not None:
                self.edits.replace[edit.call] = edit.replace
            elif edit.swap is not None:
                self.edits.swap[edit.line] = edit.swap
            elif edit.line is not None:
                self.edits.remove.add(edit.line)
        for node in self.facts.imports:
            if self.imports_apex_amp(node):
                RemoveImportsVisitor.remove_unused_import_by_node(self.context, node)

    def imports_apex_amp(self, node: Union[cst.Import, cst.ImportFrom]) -> bool:
        if isinstance(node, cst.ImportFrom):
            module = dotted(node.module) if node.module is not None else None
            if isinstance(node.names, cst.ImportStar) or node.relative:
                return False
            return module == APEX or (module == "apex" and all(a.evaluated_name == "amp" for a in node.names))
        return all((dotted(a.name) or "") in ("apex", APEX) for a in node.names)

    # =========================================================================
    # evaluation
    # =========================================================================

    def plan_evaluation(self) -> None:
        for with_node in self.facts.withs:
            if self.is_evaluation_block(with_node):
                self.plan_evaluation_block(with_node)
        for function in self.facts.functions:
            if self.is_evaluation_function(function):
                self.plan_evaluation_function(function)

    def is_no_grad(self, expression: cst.BaseExpression) -> bool:
        return self.is_qualified(expression.func if isinstance(expression, cst.Call) else expression, NO_GRAD)

    def is_evaluation_block(self, with_node: cst.With) -> bool:
        return (
            any(isinstance(i.item, cst.Call) and self.is_no_grad(i.item) for i in with_node.items)
            and not self.has_autocast(with_node)
            and not self.runs_under_autocast(with_node)
            and not self.contains_autocast(with_node.body)
            and not self.in_evaluation(with_node)
            and self.forward_like(with_node.body)
        )

    def is_evaluation_function(self, function: cst.FunctionDef) -> bool:
        return (
            any(self.is_no_grad(d.decorator) for d in function.decorators)
            and isinstance(function.body, cst.IndentedBlock)
            and not self.contains_autocast(function.body)
            and not self.in_evaluation(function)
            and self.forward_like(function.body)
        )

    def in_evaluation(self, node: cst.CSTNode) -> bool:
        """Inside another no_grad block or function (which gets the autocast)."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With) and any(isinstance(i.item, cst.Call) and self.is_no_grad(i.item) for i in ancestor.items):
                return True
            if isinstance(ancestor, cst.FunctionDef) and any(self.is_no_grad(d.decorator) for d in ancestor.decorators):
                return True
        return False

    def forward_like(self, body: cst.CSTNode) -> bool:
        """Calls something (a model) besides builtins, in-place tensor methods
        and accessors: parameter updates such as EMAs gain nothing from autocast."""
        return any(isinstance(child, cst.Call) and self.may_compute(child) for child in walk(body, into_definitions=False))

    def may_compute(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Attribute):
            method = call.func.attr.value
            if method.endswith("_") or method in ACCESSORS:
                return False
        return not any(name.startswith("builtins.") for name in self.qualified_names(call.func))

    def plan_evaluation_block(self, with_node: cst.With) -> None:
        device = self.device_at(with_node)
        if device is None:
            self.report(with_node, "AM413", "evaluation under no_grad with no device binding in reach (a `device` parameter may be a string): add `torch.autocast(device_type=device.type, dtype=amp_dtype)` to this block by hand")
            return
        try:
            header = self.autocast_text(device, with_node)
        except Problem as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        if not self.fix(with_node, "AM402", "evaluation runs under torch.autocast too (no GradScaler: nothing is backpropagated)"):
            return

        def add_item(updated: cst.With) -> cst.With:
            items = list(updated.items)
            items[-1] = items[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(items=[*items, cst.WithItem(item=cst.parse_expression(header))])

        self.edits.replace[with_node] = add_item
        self.use_dtype(device)

    def plan_evaluation_function(self, function: cst.FunctionDef) -> None:
        statements = list(function.body.body)
        first = 1 if self.is_docstring(statements[0]) and len(statements) > 1 else 0
        device = self.device_at(statements[first])
        name = function.name.value
        if device is None:
            self.report(function, "AM413", f"{name}() runs under no_grad with no device binding in reach: wrap its forward in `torch.autocast(device_type=device.type, dtype=amp_dtype)` by hand")
            return
        try:
            header = self.autocast_text(device, statements[first])
        except Problem as problem:
            self.report(problem.node, problem.code, problem.message)
            return
        if self.fix(function, "AM402", f"{name}() (under no_grad) runs its body under torch.autocast too"):
            self.edits.wrap[statements[first]] = (statements[-1], header)
            self.use_dtype(device)

    @staticmethod
    def is_docstring(line: cst.CSTNode) -> bool:
        return (
            isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(line.body[0], cst.Expr)
            and isinstance(line.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        )

    def use_dtype(self, device: Ref) -> None:
        self.dtype_binding(device).used = True
        self.add_import(PRECISION, "autocast_dtype")
        self.need_torch()

    # =========================================================================
    # checkpoints
    # =========================================================================

    def plan_checkpoints(self, plans: list) -> None:
        """`optimizer.state_dict()` in a dict literal (or stored under a key)
        gains the scaler's next to it; `optimizer.load_state_dict(ckpt[key])`
        is followed by the scaler's, when the checkpoint has it."""
        scalers = {ref.key: self.scaler_of(plan) for plan in plans for ref in plan.optimizers}
        for call in self.facts.calls:
            if not (method_call(call, "state_dict") or method_call(call, "load_state_dict")):
                continue
            ref = self.optimizer_of(call.func.value, call)
            if ref is None or ref.key not in scalers:
                continue
            binding = scalers[ref.key]
            try:
                if binding.kind == "name" and not self.name_visible(binding, call):
                    raise Problem(call, "AM417", "the optimizer's state is saved or loaded where the scaler is out of reach: save and load `scaler.state_dict()` with it by hand")
                if method_call(call, "state_dict"):
                    self.plan_save(call, binding.text(self.owner_at(call)))
                else:
                    self.plan_load(call, binding.text(self.owner_at(call)))
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)

    def plan_save(self, call: cst.Call, scaler: str) -> None:
        parent = self.parent(call)
        if isinstance(parent, cst.DictElement) and parent.value is call:
            self.plan_save_in_dict(call, parent, scaler)
            return
        line = self.own_line(call)
        assign = line.body[0] if line is not None else None
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Subscript):
            self.plan_save_in_subscript(call, line, assign.targets[0].target, scaler)
            return
        if not self.scaler_state_near(call, "state_dict"):
            raise Problem(call, "AM417", f"the optimizer's state is saved without the scaler's: save `{scaler}.state_dict()` with it")

    def plan_save_in_dict(self, call: cst.Call, element: cst.DictElement, scaler: str) -> None:
        dictionary = self.parent(element)
        entries = [e for e in dictionary.elements if isinstance(e, cst.DictElement)]
        if any(self.is_scaler_state(e.value, "state_dict") for e in entries):
            return
        key = self.sibling_key(element.key)
        if key is None or any(isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == "scaler" for e in entries):
            raise Problem(call, "AM417", f"cannot add a 'scaler' entry next to the optimizer's here: add `{scaler}.state_dict()` to the checkpoint by hand")
        if not self.fix(call, "AM405", "the GradScaler's state is saved next to the optimizer's (a resumed fp16 run keeps its loss scale)"):
            return
        index = list(dictionary.elements).index(element)
        new = cst.DictElement(key=cst.SimpleString(key), value=cst.parse_expression(f"{scaler}.state_dict()"))
        self.edits.replace[dictionary] = lambda updated: updated.with_changes(elements=self.with_entry(list(updated.elements), index, new))

    @staticmethod
    def with_entry(elements: list, index: int, new: cst.DictElement) -> list:
        """`elements` with `new` after `elements[index]`, following the layout."""
        current = elements[index]
        if index + 1 < len(elements):
            between, trailing = current.comma, current.comma
        else:
            previous = elements[index - 1].comma if index > 0 else None
            between = previous if isinstance(previous, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            trailing = current.comma
        elements[index] = current.with_changes(comma=between)
        elements.insert(index + 1, new.with_changes(comma=trailing))
        return elements

    @staticmethod
    def sibling_key(key: Optional[cst.BaseExpression]) -> Optional[str]:
        """'scaler', in the quotes of the optimizer's key."""
        if not isinstance(key, cst.SimpleString) or key.prefix:
            return None
        return f"{key.quote}scaler{key.quote}"

    def is_scaler_state(self, node: cst.CSTNode, method: str) -> bool:
        """`scaler.state_dict()` (or apex's amp.state_dict(), being replaced by it)."""
        if not method_call(node, method):
            return False
        if self.is_qualified(node.func, {APEX_STATE_DICT, APEX_LOAD_STATE_DICT}):
            return True
        receiver = dotted(node.func.value) or ""
        return receiver.split(".")[-1] in SCALER_NAMES

    def scaler_state_near(self, call: cst.Call, method: str) -> bool:
        block = self.parent(self.line_of(call))
        return any(self.is_scaler_state(c, method) for c in walk(block, into_definitions=False))

    def plan_save_in_subscript(self, call: cst.Call, line: cst.SimpleStatementLine, target: cst.Subscript, scaler: str) -> None:
        index = target.slice[0].slice if len(target.slice) == 1 else None
        key = self.sibling_key(index.value) if isinstance(index, cst.Index) else None
        if key is None or dotted(target.value) is None:
            raise Problem(call, "AM417", f"save `{scaler}.state_dict()` next to the optimizer's state by hand")
        if self.scaler_state_near(call, "state_dict"):
            return
        if self.fix(call, "AM405", "the GradScaler's state is saved next to the optimizer's (a resumed fp16 run keeps its loss scale)"):
            self.edits.insert_after(line, statement(f"{code_of(target.value)}[{key}] = {scaler}.state_dict()"))

    def plan_load(self, call: cst.Call, scaler: str) -> None:
        line = self.own_line(call)
        argument = call.args[0].value if len(call.args) == 1 and not call.args[0].keyword else None
        index = argument.slice[0].slice if isinstance(argument, cst.Subscript) and len(argument.slice) == 1 else None
        key = self.sibling_key(index.value) if isinstance(index, cst.Index) else None
        container = dotted(argument.value) if isinstance(argument, cst.Subscript) else None
        if line is None or key is None or container is None:
            raise Problem(call, "AM417", f"the optimizer's state is loaded without the scaler's: load `{scaler}.load_state_dict(...)` from the checkpoint by hand")
        if self.scaler_state_near(call, "load_state_dict"):
            return
        if self.fix(call, "AM405", "the GradScaler's state is loaded after the optimizer's, when the checkpoint has it"):
            self.edits.insert_after(line, statement(f"if {key} in {container}:\n    {scaler}.load_state_dict({container}[{key}])"))

    # =========================================================================
    # the deprecated torch.cuda.amp API
    # =========================================================================

    def plan_deprecated(self) -> None:
        calls = []
        for call in self.facts.calls:
            names = self.qualified_names(call.func) & DEPRECATED.keys()
            if names:
                calls.append((call, min(names)))
        devices, reason = self.policy_devices(calls)
        for call, name in calls:
            if call in devices:
                self.plan_on_policy(call, name, devices[call])
            else:
                self.plan_deprecated_call(call, name, reason)
        for function in self.facts.functions:
            for decorator in function.decorators:
                bare = decorator.decorator
                names = self.qualified_names(bare) & DEPRECATED.keys() if isinstance(bare, (cst.Name, cst.Attribute)) else set()
                if names:
                    self.plan_bare_decorator(bare, min(names))

    def policy_devices(self, calls: list) -> tuple:
        """The device binding of each old autocast and GradScaler, when all of
        them can move onto the runtime's policy (`amp_dtype`, `grad_scaler`);
        else none, and why. All or none: an autocast on the policy (bfloat16
        where supported) with a scaler left as written costs only speed, but
        a float16 autocast left as written with a scaler on the policy (off
        unless float16) would train float16 without loss scaling."""
        devices: dict = {}
        for call, name in calls:
            replacement, _ = DEPRECATED[name]
            if replacement not in ("autocast", "amp.GradScaler"):
                continue
            device = self.device_at(call)
            if device is None:
                return {}, "no device binding in reach of every old autocast and GradScaler"
            if any(a.star for a in call.args) or self.is_suppressed(call, "AM404"):
                return {}, f"`{code_of(call)}` stays as it is"
            dtype = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "dtype") if replacement == "autocast" else None
            if dtype is not None and not self.is_qualified(dtype, HALF):
                return {}, f"an old autocast names dtype={code_of(dtype)}"
            try:
                self.dtype_text(device, call)
            except Problem as problem:
                return {}, problem.message
            devices[call] = device
        return devices, ""

    @staticmethod
    def old_argument(call: cst.Call, positional: Sequence[str], name: str) -> Optional[cst.BaseExpression]:
        """The argument `name` of an old API call, passed by position or keyword."""
        for index, arg in enumerate(call.args):
            keyword = arg.keyword.value if arg.keyword is not None else (positional[index] if index < len(positional) else None)
            if keyword == name:
                return arg.value
        return None

    def plan_on_policy(self, call: cst.Call, name: str, device: Ref) -> None:
        """`autocast(...)` -> `torch.autocast(device_type=device.type, dtype=amp_dtype, ...)`,
        `GradScaler(...)` -> `grad_scaler(device, amp_dtype, ...)`."""
        replacement, _ = DEPRECATED[name]
        dtype = self.dtype_text(device, call)
        if replacement == "autocast":
            enabled = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "enabled")
            text = self.autocast_text(device, call, self.user_condition(enabled))
            cache = self.old_argument(call, OLD_AUTOCAST_POSITIONAL, "cache_enabled")
            text = text[:-1] + (f", cache_enabled={code_of(cache)})" if cache is not None else ")")
            message = f"deprecated {name}(...) replaced by torch.autocast on {self.device_text(device, call)}.type in the runtime's precision ({dtype}: bfloat16 on GPUs that compute it, else float16; float32 on a CPU; ACCELMIGRATE_PRECISION overrides)"
        else:
            options = [
                f"{keyword}={code_of(value)}"
                for keyword, value in self.old_keywords(call, OLD_SCALER_POSITIONAL)
                if not (keyword == "enabled" and isinstance(value, cst.Name) and value.value == "True")
            ]
            text = f"grad_scaler({', '.join([self.device_text(device, call), dtype, *options])})"
            message = f"deprecated {name}(...) replaced by grad_scaler(device, {dtype}): it scales the loss only when {dtype} is float16, as the runtime's precision asks"
        if not self.fix(call, "AM404", message):
            return
        expression = cst.parse_expression(text)
        self.edits.replace[call] = lambda updated: expression
        self.use_dtype(device)
        if replacement != "autocast":
            self.add_import(PRECISION, "grad_scaler")
        self.forget_import_of(call.func)

    @staticmethod
    def old_keywords(call: cst.Call, positional: Sequence[str]) -> list:
        return [
            (arg.keyword.value if arg.keyword is not None else positional[index], arg.value)
            for index, arg in enumerate(call.args)
            if arg.keyword is not None or index < len(positional)
        ]

    @staticmethod
    def user_condition(enabled: Optional[cst.BaseExpression]) -> Optional[str]:
        """The user's `enabled=` as the left side of `... and amp_dtype != torch.float32`
        (None for a literal True, which adds nothing)."""
        if enabled is None or (isinstance(enabled, cst.Name) and enabled.value == "True"):
            return None
        text = code_of(without_parens(enabled))
        atom = isinstance(enabled, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.BaseNumber, cst.BaseString))
        return text if atom else f"({text})"

    def plan_deprecated_call(self, call: cst.Call, name: str, reason: str = "") -> None:
        """Off the policy: torch.amp on the device the old API named, so the
        precision stays exactly what it was."""
        replacement, device_type = DEPRECATED[name]
        if any(a.star for a in call.args):
            self.report(call, "AM404", f"replace the deprecated {name} by torch.{replacement} by hand (arguments passed with * or **)")
            return
        where = f'"{device_type}"'
        note = f" ({reason}: precision as written, on {device_type}; ACCELMIGRATE_PRECISION does not apply)" if reason and replacement in ("autocast", "amp.GradScaler") else ""
        if not self.fix(call, "AM404", f"deprecated {name}(...) replaced by torch.{replacement}({where}, ...){note}"):
            return
        func = f"{self.torch}.{replacement}"

        def rewrite(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            if replacement == "autocast":
                args = [self.keyword_for_position(arg, i) for i, arg in enumerate(args)]
            if replacement.startswith("amp.custom_"):
                args = self.appended(args, cst.Arg(cst.SimpleString(f'"{device_type}"'), keyword=cst.Name("device_type"), equal=NO_SPACE_EQUAL))
            else:
                first = cst.Arg(cst.parse_expression(where), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if args else cst.MaybeSentinel.DEFAULT)
                args = [first, *args]
            return updated.with_changes(func=cst.parse_expression(func), args=args)

        self.edits.replace[call] = rewrite
        self.forget_import_of(call.func)

    def plan_bare_decorator(self, node: cst.BaseExpression, name: str) -> None:
        replacement, device_type = DEPRECATED[name]
        if not replacement.startswith("amp.custom_"):
            return
        text = f'{self.torch}.{replacement}(device_type="{device_type}")'
        if self.fix(node, "AM404", f'deprecated {name} replaced by torch.{replacement}(device_type="{device_type}")'):
            self.edits.replace[node] = lambda updated: cst.parse_expression(text)
            self.forget_import_of(node)

    def forget_import_of(self, node: cst.CSTNode) -> None:
        """Drop the import of the deprecated name once nothing uses it."""
        RemoveImportsVisitor.remove_unused_import_by_node(self.context, node)
        self.need_torch()
        self.imports_changed = True  # the engine then runs the import bookkeeping

    @staticmethod
    def keyword_for_position(arg: cst.Arg, index: int) -> cst.Arg:
        if arg.keyword is not None or index >= len(OLD_AUTOCAST_POSITIONAL):
            return arg
        return arg.with_changes(keyword=cst.Name(OLD_AUTOCAST_POSITIONAL[index]), equal=NO_SPACE_EQUAL)

    @staticmethod
    def appended(args: list, new: cst.Arg) -> list:
        if args and not isinstance(args[-1].comma, cst.Comma):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return [*args, new]

    # =========================================================================
    # the bindings, and applying the edits
    # =========================================================================

    def commit_bindings(self) -> None:
        """Insert the dtype bindings first: a scaler placed at the same spot needs its dtype."""
        for binding in [*self.dtype_bindings.values(), *self.scaler_bindings.values()]:
            if binding.used and not binding.exists:
                self.edits.insert_after(binding.after, statement(f"{binding.text(binding.owner)} = {binding.value}"))

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        updated_node = super().on_leave(original_node, updated_node)
        change = self.edits.replace.get(original_node)
        if change is not None and isinstance(updated_node, cst.CSTNode):
            return change(updated_node)
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self.edits.touches(original_node.body):
            return updated_node
        return updated_node.with_changes(body=self.edited_body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.edits.touches(original_node.body):
            return updated_node
        return updated_node.with_changes(body=self.edited_body(original_node.body, updated_node.body))

    def edited_body(self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list:
        pairs = list(zip(originals, updated))
        result: list = []
        self.carried = []  # comment lines of a removed statement
        index = 0
        while index < len(pairs):
            original = pairs[index][0]
            if original in self.edits.wrap:
                last, header = self.edits.wrap[original]
                end = next(i for i in range(index, len(pairs)) if pairs[i][0] is last)
                inner = [s for o, n in pairs[index:end + 1] for s in self.edited_statement(o, n)]
                result.append(self.wrapped(inner, header))
                index = end + 1
            else:
                result.extend(self.edited_statement(*pairs[index]))
                index += 1
        if any(line.comment for line in self.carried):
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=self.carried))
        if not result:
            result.append(cst.SimpleStatementLine(body=[cst.Pass()]))
        return result

    def edited_statement(self, original: cst.BaseStatement, new: cst.BaseStatement) -> list:
        """The statement as edited, with what goes before and after it; comment
        lines above it stay above whatever is inserted before it."""
        before = list(self.edits.before.get(original, []))
        after = list(self.edits.after.get(original, []))
        if original in self.edits.swap:
            new = self.edits.swap[original](new)
        leading = list(getattr(new, "leading_lines", []))
        if before and leading:
            before[0] = before[0].with_changes(leading_lines=[*leading, *before[0].leading_lines])
            new = new.with_changes(leading_lines=[])
        if original in self.edits.remove:
            if after and leading and not before:
                after[0] = after[0].with_changes(leading_lines=[*leading, *after[0].leading_lines])
            elif leading and not before:
                self.carried.extend(leading)  # for the next statement
            return [*before, *after]
        if self.carried and hasattr(new, "leading_lines"):
            target = before[0] if before else new
            moved = target.with_changes(leading_lines=[*self.carried, *target.leading_lines])
            before, new = ([moved, *before[1:]], new) if before else (before, moved)
            self.carried = []
        return [*before, new, *after]

    @staticmethod
    def wrapped(statements: list, header: str) -> cst.With:
        first = statements[0]
        leading = list(getattr(first, "leading_lines", []))
        statements = [first.with_changes(leading_lines=[]), *statements[1:]] if leading else statements
        return cst.With(items=[cst.WithItem(item=cst.parse_expression(header))], body=cst.IndentedBlock(body=statements), leading_lines=leading)


NO_SPACE_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
