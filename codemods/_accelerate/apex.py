"""NVIDIA apex's amp onto Accelerate's mixed precision (AM812), or refused
whole (AM821).

What is migrated, all of it or none:
- `model, optimizer = amp.initialize(model, optimizer, opt_level="O1")`,
  bound back to the same names, in the entry point's own body: the line goes; "O1" and "O2" (apex's default
  is "O1") ask the Accelerator for fp16 on CUDA, "O0" or `enabled=False`
  for no mixed precision. Accelerate's fp16 is autocast, fp32 weights
  (O1's), which is what NVIDIA advises when moving off apex: an O2 script
  is told so;
- `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`: the
  block gives way to its body, and the backward planner writes
  `accelerator.backward(loss)` (`unscaled`);
- `amp.master_params(optimizer)` -> the optimizer's own parameters (Accelerate
  keeps no separate fp32 copy): clipping then goes through
  `accelerator.clip_grad_norm_`;
- the apex import.

Refused: "O3" (pure fp16, which Accelerate does not offer), lists of
models or optimizers (not followed to the training step), an opt_level
or `enabled=` that is not a literal, apex under a condition or outside the
entry point, `amp.state_dict()` / `load_state_dict()` (Accelerate saves its
scaler with `save_state`), any other part of apex (apex.parallel,
apex.optimizers, ...), and an apex import inside `try:`.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, dotted_name, keyword_arg
from .common import ACCELERATOR, CannotMigrate

APEX = "apex"
INITIALIZE, SCALE_LOSS, MASTER_PARAMS = "apex.amp.initialize", "apex.amp.scale_loss", "apex.amp.master_params"
STATE = frozenset({"apex.amp.state_dict", "apex.amp.load_state_dict"})
# The opt_level's mixed precision for the Accelerator; None: fp32 throughout.
OPT_LEVELS = {"O0": None, "O1": "fp16", "O2": "fp16"}
# Settings of apex's own loss scaling and casts that Accelerate's autocast and
# dynamic GradScaler stand in for.
DROPPED = frozenset({"keep_batchnorm_fp32", "loss_scale", "verbosity", "num_losses", "min_loss_scale", "max_loss_scale"})
MANUAL_STEP = (
    "remove apex by hand (the `amp.initialize` line, `with amp.scale_loss(loss, optimizer) as scaled_loss: "
    "scaled_loss.backward()` -> `loss.backward()`, `amp.master_params(optimizer)` -> `model.parameters()`, the apex "
    "import), run accelerate again, then pass `mixed_precision=\"fp16\" if torch.cuda.is_available() else \"no\"` "
    "to `Accelerator(...)` (apex's O1 and O2)"
)


def refuse(node: cst.CSTNode, why: str, step: str = MANUAL_STEP) -> CannotMigrate:
    return CannotMigrate(node, "AM821", f"{why}: accelerate changed nothing; {step}")


class ApexAmp:
    """Plans apex's removal; `unscaled` gives the loss a `scale_loss` block scaled."""

    def __init__(self, precision) -> None:
        self.planner = precision.planner
        self.codemod = precision.codemod
        self.plan = precision.plan
        self.scaled: dict[str, cst.BaseExpression] = {}  # `scaled_loss` -> the loss its blocks scale
        self.blocks: dict[str, list] = {}  # `scaled_loss` -> the `scale_loss` blocks that bind it

    def _names(self, node: cst.CSTNode) -> frozenset:
        return self.codemod.qualified_names(node)

    def is_apex(self, call: cst.Call) -> bool:
        """A call of apex itself (not of what one returns: `convert_syncbn_model(m).cuda()`)."""
        return bool(dotted_name(call.func)) and any(n == APEX or n.startswith(APEX + ".") for n in self._names(call.func))

    def plan_apex(self, calls: list) -> Optional[str]:
        """The Accelerator's mixed precision for these apex calls ("fp16" or None)."""
        self._refuse_guarded_imports()
        handled: set = set()
        initializes = []
        for call in calls:
            names = self._names(call.func)
            if INITIALIZE in names:
                initializes.append(call)
            elif SCALE_LOSS in names:
                self._plan_scale_loss(call)
            elif MASTER_PARAMS in names:
                self._plan_master_params(call)
            elif names & STATE:
                raise refuse(call, f"`{code_of(call.func)}()`, apex's loss scale kept in a checkpoint (Accelerate saves its own with `{ACCELERATOR}.save_state(...)` and reads it back with `{ACCELERATOR}.load_state(...)`)",
                             f"take apex's entry out of the checkpoint, then {MANUAL_STEP}")
            else:
                raise refuse(call, f"`{code_of(call.func)}`, a part of apex beyond amp", f"{_torch_equivalent(names)}, then run accelerate again")
            handled.update(id(n) for n in _names_in(call.func))
        self._refuse_other_references(handled)
        self._refuse_scaled_losses_kept()
        if not initializes:
            raise refuse(calls[0], "apex's amp used without `amp.initialize`")
        if len(initializes) > 1:
            raise refuse(initializes[1], "`amp.initialize` called more than once")
        if not self.scaled:
            raise refuse(initializes[0], "`amp.initialize` with no `with amp.scale_loss(...)` block in the training step")
        dtype = self._plan_initialize(initializes[0])
        for statement in dict.fromkeys(b.statement for b in self._apex_imports()):
            self.codemod.remove_import_of(statement)  # `from apex import amp, optimizers`: the unused names too
        return dtype

    def unscaled(self, operand: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """The loss for `scaled_loss` of a `scale_loss` block this plan removes."""
        return self.scaled.get(operand.value) if isinstance(operand, cst.Name) else None

    # -- the parts ----------------------------------------------------------------------

    def _plan_initialize(self, call: cst.Call) -> Optional[str]:
        assign = self.codemod.parent(call)
        line = self.codemod.parent(assign)
        if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            raise refuse(call, "`amp.initialize` whose results are not bound back to the models and optimizers it was given")
        if line not in self.planner.body:
            block = self.codemod.parent(self.codemod.parent(line))
            condition = code_of(block.test) if isinstance(block, cst.If) else "<your condition>"
            raise refuse(call, "`amp.initialize` outside the entry point's own body (under a condition, such as `if args.fp16:`, or in another function; "
                               "the mixed precision is chosen once, where the Accelerator is made)",
                         f"remove apex by hand, run accelerate again, then pass `mixed_precision=\"fp16\" if {condition} and torch.cuda.is_available() else \"no\"` "
                         f"to `Accelerator(...)` (the condition must be known where the Accelerator is made)")
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if not positional or len(positional) > 2 or len(positional) != len(call.args) - sum(a.keyword is not None for a in call.args):
            raise refuse(call, f"`{code_of(call)}` whose models and optimizers cannot be read")
        if any(isinstance(p, (cst.List, cst.Tuple)) for p in positional):
            raise refuse(call, "`amp.initialize` with lists of models or optimizers, which the codemod does not follow to the training step")
        target = assign.targets[0].target
        targets = list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) and len(positional) > 1 else [target]
        if len(targets) != len(positional) or not all(_same(getattr(t, "value", t), p) for t, p in zip(targets, positional)):
            raise refuse(call, "`amp.initialize` whose results are bound to other names than the models and optimizers it was given")
        dtype, level = self._level(call)
        dropped = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value in DROPPED - {"verbosity"}]
        self.plan.removed.add(line)
        message = f"`amp.initialize` (opt_level \"{level}\") removed: " + (
            f"`Accelerator(mixed_precision=\"fp16\" if torch.cuda.is_available() else \"no\")` autocasts the prepared model's forward and `{ACCELERATOR}.backward` scales the loss"
            if dtype else "no mixed precision (fp32, as O0 and `enabled=False` compute)"
        )
        if level == "O2" and dtype:
            message += "; O2's fp16 weights with fp32 master copies become autocast over fp32 weights (O1's), NVIDIA's advice for moving off apex"
        if dropped:
            message += f"; {', '.join(dropped)} dropped: autocast keeps batch norm in fp32 and Accelerate's GradScaler scales the loss dynamically"
        self.plan.fixes.append((call, "AM812", message))
        return dtype

    def _level(self, call: cst.Call) -> tuple[Optional[str], str]:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value not in DROPPED | {"opt_level", "enabled"}:
                raise refuse(call, f"`amp.initialize(..., {arg.keyword.value}=...)`, a setting Accelerate's mixed precision does not take")
        enabled = keyword_arg(call, "enabled")
        if enabled is not None and not (isinstance(enabled.value, cst.Name) and enabled.value.value in ("True", "False")):
            raise refuse(call, f"`amp.initialize(..., enabled={code_of(enabled.value)})`, mixed precision switched on by a value the codemod cannot read",
                         f"remove apex by hand, run accelerate again, then pass `mixed_precision=\"fp16\" if {code_of(enabled.value)} and torch.cuda.is_available() else \"no\"` "
                         f"to `Accelerator(...)` (the value must be known where the Accelerator is made)")
        given = keyword_arg(call, "opt_level")
        if given is not None and not isinstance(given.value, cst.SimpleString):
            raise refuse(call, f"`opt_level={code_of(given.value)}`, an opt_level that is not written as a literal",
                         "write the opt_level you train with as a literal (`opt_level=\"O1\"`), then run accelerate again")
        level = "O1" if given is None else given.value.evaluated_value  # apex's default
        if level not in OPT_LEVELS:
            raise refuse(call, f"opt_level \"{level}\" (O3 is pure fp16, which Accelerate does not offer)",
                         "choose O1 or O2 (Accelerate's fp16 is autocast over fp32 weights), then run accelerate again")
        on = enabled is None or enabled.value.value == "True"
        return (OPT_LEVELS[level] if on else None), level

    def _plan_scale_loss(self, call: cst.Call) -> None:
        item = self.codemod.parent(call)
        block = self.codemod.parent(item) if isinstance(item, cst.WithItem) else None
        if not (isinstance(block, cst.With) and len(block.items) == 1 and block.asynchronous is None
                and item.asname is not None and isinstance(item.asname.name, cst.Name)
                and isinstance(self.codemod.parent(block), (cst.IndentedBlock, cst.Module))):
            raise refuse(call, "`amp.scale_loss` not used as `with amp.scale_loss(loss, optimizer) as scaled_loss:`, a block of its own")
        positional = [a for a in call.args if a.keyword is None and not a.star]
        extra = [a for a in call.args if a.keyword is not None and a.keyword.value != "delay_unscale"]
        if not 1 <= len(positional) <= 2 or extra or any(a.star for a in call.args):
            raise refuse(call, f"`{code_of(call)}` with arguments accelerate does not take (`loss_id=`, ...)")
        name, loss = item.asname.name.value, positional[0].value
        if name in self.scaled and code_of(self.scaled[name]) != code_of(loss):
            raise refuse(call, f"`{name}` naming the scaled losses of two different losses")
        self.scaled[name] = loss
        self.blocks.setdefault(name, []).append(block)
        self.plan.unwrapped.add(block)
        delayed = "; `delay_unscale=` dropped: the prepared optimizer unscales once, when it steps" if keyword_arg(call, "delay_unscale") else ""
        self.plan.fixes.append((call, "AM812", f"`amp.scale_loss` block removed: `{ACCELERATOR}.backward` scales the loss{delayed}"))

    def _plan_master_params(self, call: cst.Call) -> None:
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            raise refuse(call, f"`{code_of(call)}` whose optimizer cannot be read")
        optimizer = code_of(call.args[0].value)
        parameters = f'[p for group in {optimizer}.param_groups for p in group["params"]]'
        self.plan.edit(call, lambda updated: cst.parse_expression(parameters))
        self.plan.fixes.append((call, "AM812", f"`amp.master_params({optimizer})` -> `{optimizer}`'s own parameters: Accelerate keeps no separate fp32 copy"))

    # -- what else refers to apex ---------------------------------------------------------

    def _refuse_scaled_losses_kept(self) -> None:
        """`scaled_loss` read only as `scaled_loss.backward()` in a block that binds it: the blocks go."""
        for name, blocks in self.blocks.items():
            targets = {id(b.items[0].asname.name) for b in blocks}
            for node in self.planner.uses.names.get(name, ()):
                if id(node) in targets:
                    continue
                attribute = self.codemod.parent(node)
                backward = self.codemod.parent(attribute)
                if not (isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "backward"
                        and isinstance(backward, cst.Call) and any(a in blocks for a in self.codemod.ancestors(backward))):
                    raise refuse(node, f"`{name}` used other than as `{name}.backward()` in its `scale_loss` block")

    def _apex_imports(self) -> list:
        return [b for b in self.codemod.script.imports if (b.qualified or "") == APEX or (b.qualified or "").startswith(APEX + ".")]

    def _refuse_guarded_imports(self) -> None:
        for binding in self._apex_imports():
            if any(isinstance(a, (cst.Try, cst.If, cst.FunctionDef)) for a in self.codemod.ancestors(binding.statement)):
                raise refuse(binding.statement, "apex imported under `try:`, a condition or in a function",
                             "make `from apex import amp` a plain import at the top of the file (drop the `except ImportError:` branch "
                             "and what it sets), then run accelerate again: the migrated script no longer needs apex")

    def _refuse_other_references(self, handled: set) -> None:
        """`amp` passed, compared or kept: a use the codemod would leave without its import."""
        for binding in self._apex_imports():
            for node in self.planner.uses.names.get(binding.name.split(".")[0], ()):
                if id(node) in handled or any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.codemod.ancestors(node)):
                    continue
                parent = self.codemod.parent(node)
                if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
                    continue
                if node is binding.node or not (self._names(node) & {binding.qualified}):
                    continue
                raise refuse(node, f"`{code_of(parent if isinstance(parent, cst.Attribute) else node)}`, apex used other than through amp.initialize, scale_loss and master_params")


def _torch_equivalent(names: frozenset) -> str:
    if any(n.startswith("apex.parallel.") for n in names):
        return ("replace apex.parallel by hand: `torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` for convert_syncbn_model and "
                "SyncBatchNorm; no DistributedDataParallel of apex's (`accelerator.prepare` wraps the model)")
    if any(n.startswith("apex.optimizers.") for n in names):
        return ("replace apex's fused optimizer by hand: FusedAdam -> `torch.optim.AdamW(..., fused=True)` (`torch.optim.Adam` "
                "for `adam_w_mode=False`), FusedSGD -> `torch.optim.SGD`; FusedLAMB has no torch equivalent")
    return "replace it by its torch equivalent by hand"


def _names_in(node: cst.CSTNode):
    while isinstance(node, cst.Attribute):
        yield node.attr
        node = node.value
    if isinstance(node, cst.Name):
        yield node


def _same(target: cst.BaseExpression, value: cst.BaseExpression) -> bool:
    """`model` and `model`, `[m1, m2]` and `[m1, m2]`: the same names, element by element."""
    if isinstance(target, (cst.List, cst.Tuple)) and isinstance(value, (cst.List, cst.Tuple)):
        return len(target.elements) == len(value.elements) and all(_same(t.value, v.value) for t, v in zip(target.elements, value.elements))
    name = dotted_name(target)
    return bool(name) and name == dotted_name(value)
