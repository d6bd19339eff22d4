"""What one later use of stored loss values needs of them: a number, a
tensor, the graph, or something that cannot be followed.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import code_of
from .syntax import (
    DETACHING_METHODS,
    STORING_METHODS,
    MUTATING_METHODS,
    ELEMENT_METHODS,
    SHAPE_METHODS,
    AUTOGRAD_ATTRIBUTES,
    TENSOR_FACTS,
    LOGGING_METHODS,
    BUILTIN_NUMBER_SINKS,
    BUILTIN_SHAPE_ONLY,
    BUILTIN_CARRIERS,
    NUMBER_MODULES,
    AUTOGRAD_CALLS,
    Verdict,
    NOTHING,
    NUMBER,
    TENSOR,
    GRAPH,
    unknown,
    first_line,
)


class Uses:
    """Part of the analysis (see `analysis.Analysis`): one use at a time."""

    # -- 4a. one use -------------------------------------------------------------------

    def classify(self, node: cst.CSTNode) -> Verdict:
        """What the use at `node` (an expression holding the stored values)
        needs of them."""
        holder = self.parent(node)
        if holder is None:
            return unknown("used where it cannot be followed")
        for kind, rule in _RULES:
            if isinstance(holder, kind):
                return rule(self, node, holder)
        return unknown(f"used in `{first_line(self.statement_of(node))}`")

    def _in_attribute(self, node, attribute: cst.Attribute) -> Verdict:
        if attribute.value is not node:
            return NOTHING
        name = attribute.attr.value
        call = self.parent(attribute)
        called = isinstance(call, cst.Call) and call.func is attribute
        if name in AUTOGRAD_ATTRIBUTES:
            return GRAPH
        if not called:
            return TENSOR if name in TENSOR_FACTS else TENSOR | self.classify(attribute)
        if name in MUTATING_METHODS or name in SHAPE_METHODS:
            return NOTHING
        if name in ELEMENT_METHODS:
            return self.classify(call)
        if name in DETACHING_METHODS:
            return TENSOR
        return TENSOR | self.classify(call)  # a tensor method: its result carries the values

    def _in_subscript(self, node, subscript: cst.Subscript) -> Verdict:
        if subscript.value is not node:
            return unknown("used as an index")
        holder = self.parent(subscript)
        if isinstance(holder, (cst.AssignTarget, cst.Del)) or (
            isinstance(holder, cst.AugAssign) and holder.target is subscript
        ):
            return NOTHING
        return self.classify(subscript)

    def _in_arithmetic(self, node, operation) -> Verdict:
        if (
            isinstance(operation, cst.BinaryOperation)
            and isinstance(operation.operator, cst.Modulo)
            and isinstance(operation.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))
        ):
            return NUMBER  # "%.3f" % total
        return NUMBER | self.classify(operation)

    def _in_comparison(self, node, comparison) -> Verdict:
        operators = (
            [target.operator for target in comparison.comparisons]
            if isinstance(comparison, cst.Comparison)
            else [comparison.operator]
        )
        if all(isinstance(op, (cst.Is, cst.IsNot)) for op in operators):
            return NOTHING
        return NUMBER

    def _in_argument(self, node, argument: cst.Arg) -> Verdict:
        call = self.parent(argument)
        if argument.value is not node or not isinstance(call, cst.Call) or call.func is node:
            return unknown("used where it cannot be followed")
        names = self.codemod.qualified_names(call.func)
        callee = code_of(call.func)
        if names & AUTOGRAD_CALLS:
            return GRAPH
        if names & BUILTIN_NUMBER_SINKS:
            return NUMBER
        if names & BUILTIN_SHAPE_ONLY:
            return NOTHING
        if names & BUILTIN_CARRIERS:
            return NUMBER | self.classify(call)
        if any(q.startswith("torch.") for q in names):
            return TENSOR | self.classify(call)
        if any(q.startswith(NUMBER_MODULES) for q in names):
            return NUMBER
        method = self.method(call)
        if method in STORING_METHODS:
            target = self.accumulator_of(call.func.value)
            return self._accumulator_verdict(target) if target else unknown(f"stored into {code_of(call.func.value)}")
        if method in LOGGING_METHODS:
            return NUMBER
        parameter = self._parameter_for(call, argument)
        if parameter is not None:
            return self._follow_binding(parameter)
        return unknown(f"passed to {callee}()")

    def _parameter_for(self, call: cst.Call, argument: cst.Arg) -> Optional[cst.Name]:
        """The parameter of a function defined in this file that receives `argument`."""
        if not isinstance(call.func, cst.Name) or argument.star:
            return None
        definitions = [b.node for b in self.codemod.script.bindings_of(call.func.value, call.func)]
        if len(definitions) != 1 or not isinstance(definitions[0], cst.FunctionDef):
            return None
        parameters = definitions[0].params
        if argument.keyword is not None:
            found = [
                p for p in (*parameters.params, *parameters.kwonly_params) if p.name.value == argument.keyword.value
            ]
            return found[0].name if found else None
        index = [a for a in call.args if a.keyword is None].index(argument)
        ordered = [*parameters.posonly_params, *parameters.params]
        return ordered[index].name if index < len(ordered) else None

    def follow_binding(self, target: cst.CSTNode) -> Verdict:
        """What the later uses of the value a binding target receives need of it."""
        return self._follow_binding(target)

    def _follow_binding(self, target: cst.CSTNode) -> Verdict:
        """Uses of what a binding target (`x = ...`, `for x in ...`) receives."""
        if isinstance(target, (cst.Tuple, cst.List)):
            verdict = NOTHING
            for element in target.elements:
                verdict |= self._follow_binding(element.value)
            return verdict
        if isinstance(target, cst.Name):
            key = self.key(target)
            if key is None:
                return unknown(f"assigned to {target.value}")
            if ("name", *key) in self._following:
                return NOTHING
            self._following.add(("name", *key))
            try:
                verdict = NOTHING
                for read in self._reads_of(target, key):
                    verdict |= self.classify(read)
                return verdict
            finally:
                self._following.discard(("name", *key))
        accumulator = self.accumulator_of(target)
        if accumulator is not None:
            return self._accumulator_verdict(accumulator)
        return unknown(f"assigned to {code_of(target)}")

    def _reads_of(self, target: cst.Name, key: tuple) -> Iterator[cst.CSTNode]:
        """The reads of a variable that can see the value `target` binds: in a
        `for` loop's body for its variable, else those after the binding, and
        those in a loop around it (they see it on the next iteration)."""
        reads = {id(read): read for read in self.reads(key)}
        binder = target
        while isinstance(self.parent(binder), (cst.Element, cst.Tuple, cst.List)):
            binder = self.parent(binder)
        holder = self.parent(binder)
        if isinstance(holder, (cst.Param, cst.CompFor)):
            yield from reads.values()
            return
        if isinstance(holder, cst.For) and holder.target is binder:
            yield from (read for read in reads.values() if self.is_inside(read, [holder]))
            return
        statement = self.statement_of(target)
        loop = self.codemod.innermost_loop(statement)
        for read in reads.values():
            if self.is_after(read, statement) or (loop is not None and self.is_inside(read, [loop.body])):
                yield read

    def _in_assignment(self, node, statement) -> Verdict:
        if isinstance(statement, cst.AugAssign):
            return NOTHING if statement.target is node else self._follow_binding(statement.target)
        if getattr(statement, "value", None) is not node:
            return NOTHING  # the node is (part of) a target
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        verdict = NOTHING
        for target in targets:
            verdict |= self._follow_binding(target)
        return verdict

    def _in_loop_header(self, node, loop) -> Verdict:
        if loop.iter is not node:
            return NOTHING
        return self._follow_binding(loop.target)

    def _in_return(self, node, statement: cst.Return) -> Verdict:
        function = next(
            (a for a in self.codemod.ancestors(statement) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None
        )
        if not isinstance(function, cst.FunctionDef):
            return unknown("returned")
        if ("return", id(function)) in self._following:
            return NOTHING
        callers = self._calls_of(function)
        if not callers:
            return unknown(f"returned from {function.name.value}(), which this file does not call")
        self._following.add(("return", id(function)))
        try:
            verdict = NOTHING
            for call in callers:
                verdict |= (
                    self.classify(call)
                    if isinstance(call, cst.Call)
                    else unknown(f"{function.name.value} is passed around")
                )
            return verdict
        finally:
            self._following.discard(("return", id(function)))

    def _calls_of(self, function: cst.FunctionDef) -> list[cst.CSTNode]:
        name = function.name.value
        is_method = isinstance(self.parent(self.parent(function)), cst.ClassDef)
        if is_method:
            return [
                self.parent(a)
                for a in self.nodes.attributes
                if a.attr.value == name and isinstance(self.parent(a), cst.Call)
            ]
        uses = self.reads(self.key(function.name))
        return [
            self.parent(n) if isinstance(self.parent(n), cst.Call) and self.parent(n).func is n else n for n in uses
        ]

    def _in_element(self, node, element) -> Verdict:
        holder = self.parent(element)
        if isinstance(element, cst.DictElement) and element.value is not node:
            return NOTHING  # a key
        return self.classify(holder)

    def _in_comprehension(self, node, comprehension) -> Verdict:
        if getattr(comprehension, "elt", None) is node or getattr(comprehension, "value", None) is node:
            return self.classify(comprehension)
        return NOTHING

    def _carried(self, node, holder) -> Verdict:
        return self.classify(holder)


def _number(_analysis, _node, _holder) -> Verdict:
    return NUMBER


def _nothing(_analysis, _node, _holder) -> Verdict:
    return NOTHING


def _escapes(what: str):
    return lambda _analysis, _node, _holder: unknown(what)


_RULES = (
    (cst.Attribute, Uses._in_attribute),
    (cst.Subscript, Uses._in_subscript),
    (cst.Arg, Uses._in_argument),
    ((cst.BinaryOperation, cst.UnaryOperation), Uses._in_arithmetic),
    ((cst.Comparison, cst.ComparisonTarget), Uses._in_comparison),
    ((cst.Assign, cst.AnnAssign, cst.AugAssign, cst.AssignTarget), Uses._in_assignment),
    ((cst.For, cst.CompFor), Uses._in_loop_header),
    (cst.Return, Uses._in_return),
    ((cst.Element, cst.DictElement, cst.StarredElement), Uses._in_element),
    ((cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp), Uses._in_comprehension),
    ((cst.BooleanOperation, cst.IfExp), Uses._carried),
    ((cst.FormattedStringExpression, cst.If, cst.While, cst.Assert, cst.CompIf), _number),
    ((cst.Expr, cst.Del, cst.Global, cst.Nonlocal), _nothing),
    ((cst.Yield, cst.Await, cst.Lambda), _escapes("yielded or used in a lambda")),
)
