"""The code the `device` codemod writes, and small questions about syntax."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._base import code_of, is_docstring, walk


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def cuda_arguments(call: cst.Call) -> tuple[list[cst.Arg], Optional[cst.BaseExpression]]:
    """The arguments of `.cuda(...)` that `.to(device, ...)` keeps, as keywords
    (`non_blocking`, `memory_format`), and the device argument if given."""
    kept: list[cst.Arg] = []
    device = None
    for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else ("device", "non_blocking")[min(position, 1)]
        if name == "device":
            device = arg.value
        elif arg.keyword is None:
            kept.append(arg.with_changes(keyword=cst.Name(name), equal=_equal()))
        else:
            kept.append(arg)
    return kept, device


def to_call(updated: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """`x.cuda(<args>)` -> `x.to(device, <kept args>)`."""
    kept, _ = cuda_arguments(updated)
    first = cst.Arg(value=device, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if kept else cst.MaybeSentinel.DEFAULT)
    if kept:
        last = kept[-1]
        kept = [arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for arg in kept[:-1]] + [
            last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        ]
    func = updated.func.with_changes(attr=cst.Name("to"))
    return updated.with_changes(func=func, args=[first, *kept])


def legacy_to_cpu(updated: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """`torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...).to(device)`."""
    cpu_type = updated.func.with_changes(value=updated.func.value.value)
    constructor = updated.with_changes(func=cpu_type, lpar=[], rpar=[])
    return cst.Call(
        func=cst.Attribute(value=constructor, attr=cst.Name("to")),
        args=[cst.Arg(device)],
        lpar=updated.lpar,
        rpar=updated.rpar,
    )


def unwrap(statement: cst.If) -> list[cst.BaseStatement]:
    """The statements of an `if` body, standing in for the `if`."""
    body = statement.body
    if isinstance(body, cst.IndentedBlock):
        lines = list(body.body)
    else:
        lines = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
    lines[0] = lines[0].with_changes(leading_lines=[*statement.leading_lines, *lines[0].leading_lines])
    return lines


def binding_line(name: str, get_device: str, blank_line_before: bool = True) -> cst.SimpleStatementLine:
    """`device = get_device()`."""
    return cst.SimpleStatementLine(
        body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=cst.Call(func=cst.Name(get_device)))],
        leading_lines=[cst.EmptyLine(indent=False)] if blank_line_before else [],
    )


def runtime_import_line(module: str, get_device: str) -> cst.SimpleStatementLine:
    """`from <module> import get_device` (`as <get_device>` when renamed)."""
    alias = cst.ImportAlias(
        name=cst.Name("get_device"),
        asname=cst.AsName(name=cst.Name(get_device)) if get_device != "get_device" else None,
    )
    return cst.SimpleStatementLine(body=[cst.ImportFrom(module=cst.parse_expression(module), names=[alias])])


def is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def after_docstring_and_future(body: Sequence[cst.CSTNode]) -> int:
    index = 1 if body and is_docstring(body[0]) else 0
    while index < len(body) and isinstance(body[index], cst.SimpleStatementLine) and any(
        isinstance(small, cst.ImportFrom) and small.module is not None and code_of(small.module) == "__future__"
        for small in body[index].body
    ):
        index += 1
    return index


def mentions_cuda(test: cst.CSTNode) -> bool:
    """Does an `if` test look at CUDA (a name, attribute or string with "cuda",
    `.is_cuda`, `.type`), or at a device's being the CPU (`config.device != "cpu"`)?"""
    for node in walk(test):
        if isinstance(node, cst.Name) and ("cuda" in node.value.lower() or node.value in ("type", "device_count")):
            return True
        if isinstance(node, cst.SimpleString) and ("cuda" in node.value or node.evaluated_value == "cpu"):
            return True
    return False


def guarded_by(line: cst.SimpleStatementLine, test: cst.BaseExpression) -> cst.If:
    """`if test:` around `line`, which keeps its comments above the `if`."""
    body = cst.IndentedBlock(body=[line.with_changes(leading_lines=[])])
    return cst.If(test=test, body=body, leading_lines=line.leading_lines)


def first_param(function: cst.FunctionDef) -> Optional[str]:
    params = [*function.params.posonly_params, *function.params.params]
    return params[0].name.value if params else None


def is_static_or_class_method(function: cst.FunctionDef) -> bool:
    return any(
        isinstance(decorator.decorator, cst.Name) and decorator.decorator.value in ("staticmethod", "classmethod")
        for decorator in function.decorators
    )
