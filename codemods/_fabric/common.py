"""What the fabric codemod writes and how it words what it inherits.

The fabric codemod plans with the accelerate codemod's reading of the
script (codemods/_accelerate/plan.py): the same training steps, entry
point, devices, outputs and refusals. What that reading writes or says in
Accelerate's terms is put in Fabric's here: its codes (AM8xx -> AM9xx), the
names its messages mention, and the calls its edits build.
"""

from __future__ import annotations

import re

import libcst as cst

from .._accelerate.common import ACCELERATOR, NO_CUDA, expression

FABRIC = "fabric"
# The names the migrated code binds or imports; a file that uses one of them
# for something else is left alone (AM925).
ADDED_NAMES = {"Fabric": "lightning_fabric", FABRIC: None}

# Under torchrun, Fabric's TorchElasticEnvironment requires devices * num_nodes
# == WORLD_SIZE; plain `python` sets neither variable: a world of one device.
# Fabric picks its DDP strategy itself when devices * num_nodes > 1.
DEVICES = 'int(os.environ.get("LOCAL_WORLD_SIZE", 1))'
NODES = f'int(os.environ.get("WORLD_SIZE", 1)) // {DEVICES}'
# The original chose CUDA when it was there and the CPU otherwise (not MPS or a TPU).
ACCELERATOR_CHOICE = '"cuda" if torch.cuda.is_available() else "cpu"'
# Accelerate's mixed precision names -> Fabric's; without CUDA the original's
# CUDA autocast was off, so "32-true" keeps its fp32 numbers there.
PRECISIONS = {'"fp16"': '"16-mixed"', '"bf16"': '"bf16-mixed"'}


def fabric_statements(accelerate_mode: str | None, cpu: str = NO_CUDA, parity: bool = True) -> tuple[str, str]:
    """The lines that make and launch the Fabric object. `cpu`: the planner's
    expression that is true where the run stays on the CPU (a `--no-cuda`
    flag, or no CUDA). Without `parity`, the guide's `Fabric()`: what the
    script chose itself (its mixed precision, its `--no-cuda` flag) and
    nothing else; the devices and nodes come from `fabric run` (LT_DEVICES, ...)."""
    own_flag = cpu != NO_CUDA
    on_cuda = "torch.cuda.is_available()" if not own_flag else f"not ({cpu})"
    settings = []
    if accelerate_mode:
        mode = next(fabric for accelerate, fabric in PRECISIONS.items() if accelerate_mode.startswith(accelerate))  # checked by the planner
        settings.append(f"precision={mode} if {on_cuda} else \"32-true\"")
    if parity:
        choice = ACCELERATOR_CHOICE if not own_flag else f'"cpu" if {cpu} else "cuda"'
        settings += [f"accelerator={choice}", f"devices={DEVICES}", f"num_nodes={NODES}"]
    elif own_flag:
        settings.append(f'accelerator="cpu" if {cpu.removesuffix(f" or {NO_CUDA}")} else "auto"')
    return f"{FABRIC} = Fabric({', '.join(settings)})", f"{FABRIC}.launch()"


def strided_rows(size: str) -> tuple[str, str]:
    """A draw for the global batch and this rank's rows of it: Fabric's DistributedSampler gives rank r the
    samples r::world of every global batch (codemods/_accelerate/draws.py)."""
    return f"{size} * {FABRIC}.world_size", f"[{FABRIC}.global_rank::{FABRIC}.world_size]"


def fabric_call(method: str, args) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=cst.Name(FABRIC), attr=cst.Name(method)), args=args)


def world_share(value: cst.BaseExpression) -> cst.BinaryOperation:
    """`value // fabric.world_size`, parenthesised where the operator would bind otherwise."""
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=value, operator=cst.FloorDivide(), right=expression(f"{FABRIC}.world_size"))


# -- codes and words ----------------------------------------------------------------------


def fabric_code(code: str) -> str:
    """AM8xx, the accelerate codemod's code, -> the fabric codemod's AM9xx of the same meaning."""
    return "AM9" + code[3:] if code.startswith("AM8") else code


# In order: the specific phrases before the words they contain.
WORDING = (
    (f", through `{ACCELERATOR}.save`", ""),  # the save itself stays torch.save
    ("accelerate changed nothing", "fabric changed nothing"),
    ("run accelerate again", "run fabric again"),
    ("printed once, by the main process", "printed once on each machine, by its first process (`local_rank` 0)"),
    (f"`{ACCELERATOR}={ACCELERATOR}`", f"`{FABRIC}={FABRIC}`"),
    (f"`{ACCELERATOR}.prepare`", f"`{FABRIC}.setup`"),
    (f"if {ACCELERATOR}.is_main_process:", f"if {FABRIC}.is_global_zero:"),
    (f"{ACCELERATOR}.wait_for_everyone()", f"{FABRIC}.barrier()"),
    (f"{ACCELERATOR}.gather(", f"{FABRIC}.all_gather("),
    (f"{ACCELERATOR}.num_processes", f"{FABRIC}.world_size"),
    (f"{ACCELERATOR}.clip_grad_norm_", f"{FABRIC}.clip_gradients"),
    (f"{ACCELERATOR}.save_state(...)", f"{FABRIC}.save(path, state)"),
    (f"{ACCELERATOR}.load_state(...)", f"{FABRIC}.load(path, state)"),
    ("Accelerate's mixed precision", "Fabric's precision"),
    ("Accelerate keeps its own", "Fabric keeps its own"),
    ("(pass them through `GradScalerKwargs` by hand)", "(pass `plugins=MixedPrecision(\"16-mixed\", \"cuda\", scaler=...)` to `Fabric(...)` by hand)"),
    ('`mixed_precision="fp16"` (or "bf16") to `Accelerator(...)`', '`precision="16-mixed"` (or "bf16-mixed") to `Fabric(...)`'),
    ("`mixed_precision=`", "`precision=`"),
    ("accelerate gives", "Fabric gives"),
    ("after the Accelerator is made", "after the Fabric object is made"),
    ("the `Accelerator`", "the `Fabric` object"),
    (f"{ACCELERATOR}.", f"{FABRIC}."),
    ("`accelerator`", f"`{FABRIC}`"),
    ("accelerator.", f"{FABRIC}."),
    ("Accelerate", "Fabric"),
    ("accelerate", "fabric"),
)


# Accelerate's mixed precision, as the accelerate planner's messages spell it.
PRECISION_WORDING = (
    (re.compile(r"`Accelerator\(mixed_precision=[^`]*\)`"), "`Fabric(precision=...)`"),
    (re.compile(r'"fp16"'), '"16-mixed"'),
    (re.compile(r'"bf16"'), '"bf16-mixed"'),
    (re.compile(r'else "no"'), 'else "32-true"'),
    (re.compile(r"\bmixed_precision="), "precision="),
    (re.compile(r"\bprepared (model|optimizer)"), r"set-up \1"),
    (re.compile(r"\bAccelerator\b"), "Fabric"),
)


def fabric_words(message: str) -> str:
    for pattern, fabric in PRECISION_WORDING:
        message = pattern.sub(fabric, message)
    for accelerate, fabric in WORDING:
        message = message.replace(accelerate, fabric)
    return message


# What an edit of the accelerate planner builds on `accelerator`, in Fabric's terms.
ATTRIBUTES = {"device": "device", "print": "print", "backward": "backward", "num_processes": "world_size", "is_main_process": "is_global_zero"}


class FabricNames(cst.CSTTransformer):
    """`accelerator` -> `fabric` (a parameter and argument passing it on too), and `accelerator.<x>` ->
    `fabric.<y>`, in what the accelerate planner builds; never inside the `Fabric(...)` call, whose
    `accelerator=` is Fabric's own."""

    def visit_Call(self, node: cst.Call) -> bool:
        return not (isinstance(node.func, cst.Name) and node.func.value == "Fabric")

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if isinstance(original_node.value, cst.Name) and original_node.value.value == ACCELERATOR:
            return updated_node.with_changes(attr=cst.Name(ATTRIBUTES[original_node.attr.value]))
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=FABRIC) if updated_node.value == ACCELERATOR else updated_node


def in_fabric_names(node: cst.CSTNode) -> cst.CSTNode:
    return node.visit(FabricNames())


def untranslated(node: cst.CSTNode) -> str | None:
    """An `accelerator.<x>` in `node` that Fabric has no spelling for (e.g. `gather_for_metrics`); `save`
    stays the script's own `torch.save`."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if isinstance(attribute.value, cst.Name) and attribute.value.value == ACCELERATOR and attribute.attr.value not in ATTRIBUTES and attribute.attr.value != "save":
                found.append(f"{ACCELERATOR}.{attribute.attr.value}")

    node.visit(Finder())
    return found[0] if found else None


def is_accelerator_call(node: cst.CSTNode, method: str) -> bool:
    return (
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method
        and isinstance(node.func.value, cst.Name) and node.func.value.value == ACCELERATOR
    )
