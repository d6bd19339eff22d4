"""The `.to(device)` that `prepare` makes redundant, dropped as Accelerate's
guide drops it: `accelerator.prepare` (Fabric's `setup`) places the model on
the process's device, and a prepared DataLoader yields batches already there.

    net = Net().to(device)             ->  net = Net()
    net.to(device)                     ->  (removed)
    for x, y in train_loader:              for x, y in train_loader:
        x, y = x.to(device), y.to(device)      (removed)

Only where nothing else can depend on it: the device is the one the
Accelerator gives (`device = accelerator.device`, or a function's parameter
the entry point passes that name for), the model's line is a statement of the
entry point before the `prepare` and nothing between them runs or hands on the
model (reading its `.parameters()` for the optimizer is fine: the tensors move
in place), and a batch's line assigns each name the loop binds its own
`.to(device)`, before anything else in the loop body reads them.
"""

from __future__ import annotations

import libcst as cst

from .._syntax import code_of, walk

# What may be asked of a model before `prepare` places it: parameters move in place, so the optimizer made over
# them holds the same tensors afterwards.
PARAMETER_READS = frozenset({"parameters", "named_parameters"})
PLACE_CODE = "AM803"


def plan_placements(planner) -> None:
    """Plan the removals on `planner.plan` (the accelerate or fabric planner, once it has prepared)."""
    devices = _accelerator_devices(planner)
    if not devices:
        return
    _drop_model_placements(planner, devices)
    for step in planner.steps:
        for loop in step.loops:
            if isinstance(loop.node, cst.For) and planner.loader_of(loop) in planner.training_loaders:
                _drop_batch_placement(planner, loop.node, devices)


def _accelerator_devices(planner) -> set[str]:
    """The names, in the entry point and the functions it calls, that hold the Accelerator's device."""
    entry = set(getattr(planner, "accelerator_device_names", ()))
    names = set(entry)
    for binding in planner.script.devices:
        if binding.kind != "parameter" or binding.scope is planner.entry:
            continue
        function = planner.script.flow.function_of(binding.scope)
        passed = planner.functions.passed_by_the_entry(function, binding.name) if function is not None else []
        if passed and all(isinstance(a, cst.Name) and a.value in entry for a in passed):
            names.add(binding.name)
    return names


def _placed(value: cst.BaseExpression, devices: set[str]) -> cst.BaseExpression | None:
    """`X` for `X.to(device)` (with `non_blocking=` at most) on a device of `devices`; else None."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to"):
        return None
    positional = [a for a in value.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in value.args if a.keyword is not None}
    if len(positional) != 1 or keywords - {"non_blocking"} or len(value.args) != 1 + len(keywords):
        return None
    device = positional[0].value
    return value.func.value if isinstance(device, cst.Name) and device.value in devices else None


def _drop_model_placements(planner, devices: set[str]) -> None:
    prepared_at = planner.prepared_at
    for position, line in enumerate(planner.body[:prepared_at]):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            continue
        small = line.body[0]
        if isinstance(small, cst.Expr):
            model = _placed(small.value, devices)
            if isinstance(model, cst.Name) and model.value in planner.model_names and _untouched(planner, model.value, planner.body[position + 1:prepared_at + 1]):
                planner.plan.removed.add(line)
                planner.plan.fixes.append((line, PLACE_CODE, f"`{code_of(small.value)}` removed: `prepare` places `{model.value}` on the process's device"))
        elif isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            name = small.targets[0].target.value
            made = _placed(small.value, devices)
            if made is not None and name in planner.model_names and _untouched(planner, name, planner.body[position + 1:prepared_at + 1]):
                planner.plan.edit(small.value, lambda updated: updated.func.value)
                planner.plan.fixes.append((small.value, PLACE_CODE, f"`.to(...)` removed: `prepare` places `{name}` on the process's device"))


def _untouched(planner, model: str, between: list) -> bool:
    """Nothing in `between` (up to the `prepare`) uses `model` but to read its parameters."""
    for line in between:
        for node in walk(line):
            if isinstance(node, cst.Name) and node.value == model:
                parent = planner.codemod.parent(node)
                if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in PARAMETER_READS):
                    return False
    return True


def _drop_batch_placement(planner, loop: cst.For, devices: set[str]) -> None:
    """The loop body's first line that reads a name the loop binds, when it only places them."""
    bound = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
    for line in loop.body.body:
        if not any(isinstance(n, cst.Name) and n.value in bound for n in walk(line)):
            continue
        placed = _self_placements(line, devices)
        if placed and set(placed) <= bound:
            planner.plan.removed.add(line)
            planner.plan.fixes.append((line, PLACE_CODE, "batch placement removed: a prepared DataLoader yields its batches on the process's device"))
        return


def _self_placements(line: cst.CSTNode, devices: set[str]) -> list[str]:
    """The names of `x, y = x.to(device), y.to(device)` (or `x = x.to(device)`); [] for anything else."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return []
    assign = line.body[0]
    if len(assign.targets) != 1:
        return []
    target, value = assign.targets[0].target, assign.value
    targets = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]
    values = [e.value for e in value.elements] if isinstance(value, cst.Tuple) and isinstance(target, cst.Tuple) else [value]
    if len(targets) != len(values):
        return []
    names = []
    for name, placed in zip(targets, values):
        moved = _placed(placed, devices)
        if not (isinstance(name, cst.Name) and isinstance(moved, cst.Name) and moved.value == name.value):
            return []
        names.append(name.value)
    return names


__all__ = ["plan_placements"]
