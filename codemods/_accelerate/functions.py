"""Training code in the functions the entry point calls, and the flag that
keeps a script on the CPU.

pytorch/examples' shape: `def train(args, model, device, train_loader,
optimizer, epoch)` called once per epoch from `main()`, which makes the
model, the optimizer and the loaders. Migrating it by hand, one passes the
Accelerator in; so does the codemod, for a function the entry point alone
calls (`EntryFunctions`):

- a function of the module (not nested in another), or a plain method of
  a trainer class of the module whose instances the entry point makes
  (`Trainer(model, optimizer)`; the class named for nothing else, the
  method read only where it is called), every
  call of it in the entry point's own code or in functions that themselves
  receive the accelerator (`main` -> `fit` -> `train_one_epoch` ->
  `train_step`), by its name, with arguments that can be seen (no `*args` /
  `**kwargs`), its name used for nothing else (not passed on as a callback);
- one that trains gets the same plain name of the entry point at every call
  for each parameter that holds something to prepare (model, optimizer,
  loader, scheduler), followed through the parameters of the functions
  between: what `accelerator.prepare` rebinds is the entry point's.

Its code is then planned as the entry point's own (backward, clipping,
prints, saves, `.cuda()`, the model's attributes), and one whose planned code
calls the accelerator gets a parameter `accelerator` (last, before `**kwargs`;
keyword-only after `*` or after parameters with defaults) and
`accelerator=accelerator` at every call. In a flat script the accelerator is
a module global already: nothing is passed.

A loop exit in such a function decided on a parameter that every call passes
the same on every process (`if args.dry_run: break`, `args` parsed by the
entry point) stays as it is (`ExitsThroughParameters`).

`--no-cuda` / `--no-accel` / `--cpu` / `--cuda` (`action="store_true"`) let
the user keep the script on the CPU; the Accelerator then reads the flag (`cpu_flag`):
`Accelerator(cpu=args.no_cuda or not torch.cuda.is_available())`; so it reads
`--device cpu` (`cpu=args.device == "cpu" or ...`). `parsed_flag` also finds
every read of a flag's value (`args.device`, `args.gpu`, through parameters
too), which the planner allows only where it rewrites them: any other device
or GPU index named by the flag would put every process on that one device.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from .._base import code_of, keyword_arg
from .._ddp.decisions import RankDecisions
from ..script import vocabulary as v
from ..script.devices import CPU_CHOICE_FLAGS
from ..script.uses import FOLLOW_DEPTH
from .common import ACCELERATOR
from .exits import ExitReading

PREPARED_KINDS = frozenset({"model", "optimizer", "loader", "scheduler"})


def own_scope(scope):
    """The function or module whose code `scope` is (through lambdas and comprehensions)."""
    while scope.kind in ("lambda", "comprehension"):
        scope = scope.parent
    return scope


class EntryFunctions:
    """The module's functions that the entry point `entry` alone calls, and what passing the accelerator into them takes."""

    def __init__(self, planner, entry) -> None:
        self.planner = planner
        self.script = planner.script
        self.entry = entry
        self._reasons: dict = {}  # Function -> why it cannot receive the accelerator ("" when it can)
        self._kept: dict = {}  # Entity -> the statement of `__init__` that keeps it (kept_by_init), or None

    # -- which functions --------------------------------------------------------------------

    def why_not(self, function) -> str:
        """"" for a function that can receive the accelerator, else why not."""
        if function not in self._reasons:
            self._reasons[function] = f"`{function.name}` calls itself"  # what a recursive call meets meanwhile
            self._reasons[function] = self._why_not(function)
        return self._reasons[function]

    def _receiving_caller(self, site):
        """The function (not the entry point) whose code makes the call `site`, when it receives the accelerator."""
        caller = own_scope(site.caller)
        if caller is self.entry or caller.kind != "function":
            return None
        function = self.script.flow.function_of(caller)
        return function if function is not None and not self.why_not(function) else None

    def _why_not(self, function) -> str:
        name = function.name
        if function.owner is not None:
            why = self._why_not_method(function)
            if why:
                return why
        elif self.script.parent(function.node) is not self.script.module:
            return f"`{name}` is nested in another function"
        if not function.callers:
            return f"`{name}` is not called in this file"
        where = "the module's code" if self.entry.kind == "module" else f"`{self.entry.name}`"
        for site in function.callers:
            caller = own_scope(site.caller)
            if caller is not self.entry and self._receiving_caller(site) is None:
                elsewhere = "module level" if caller.kind == "module" else f"`{caller.name}`"
                return f"`{name}` is also called from {elsewhere} (line {site.line}), not only from {where}"
            if not isinstance(site.call.func, (cst.Name, cst.Attribute) if function.owner else cst.Name) or not site.complete:
                return f"`{name}` is called with arguments that cannot be seen (line {site.line})"
        calls = {site.call.func for site in function.callers}
        definition = next((b for b in self.script.module_scope.bindings.get(name, ()) if b.node is function.node), None)
        for node in self.planner.uses.names.get(name, ()):
            if node is function.node.name or node in calls or not self.planner.uses.is_read(node):
                continue
            if definition in self.script.bindings_of(name, node):
                return f"`{name}` is passed on as a value (line {self.script.line(node)})"
        if self.trains(function):
            return self._different_objects(function)
        return ""

    def _why_not_method(self, function) -> str:
        """A trainer class's method receives the accelerator as a function does (`trainer.fit(loader,
        accelerator=accelerator)`, `self.train_epoch(loader, accelerator=accelerator)`) when every call of it can
        be followed: a plain method of a class of the module's own (not a model, a data set or an optimizer), the
        class named only to make instances, and the method only to call it on one."""
        name, klass = function.name, self.script.parent(self.script.parent(function.node))
        if not isinstance(klass, cst.ClassDef) or self.script.parent(klass) is not self.script.module:
            return f"`{name}` is a method of a nested class"
        if not function.is_method or not all(map(self._keeps_the_signature, function.node.decorators)):
            return f"`{name}` is a decorated method"
        if self.script.class_kind(klass) is not None:
            return f"`{name}` is a method of a {self.script.class_kind(klass)} class"
        for node in self.planner.uses.names.get(klass.name.value, ()):
            parent = self.script.parent(node)
            if node is not klass.name and not (isinstance(parent, cst.Call) and parent.func is node) and not self._own_super(node, klass):
                return f"`{name}` is a method of `{klass.name.value}`, which is used other than to make an instance (line {self.script.line(node)})"
        calls = {site.call.func for site in function.callers}
        # `__init__` runs where the class is called (`super().__init__()` elsewhere is another class's).
        for node in self.planner.uses.names.get(function.node.name.value, ()) if function.node.name.value != "__init__" else ():
            parent = self.script.parent(node)
            if node is not function.node.name and isinstance(parent, cst.Attribute) and parent.attr is node and parent not in calls and not self._of_something_else(parent):
                return f"`{name}` is a method whose calls cannot all be followed (`.{node.value}`, line {self.script.line(node)})"
        return ""

    def _own_super(self, node: cst.Name, klass: cst.ClassDef) -> bool:
        """`super(Trainer, self).__init__()` in the class's own code: the older spelling of `super()`."""
        argument = self.script.parent(node)
        call = self.script.parent(argument) if isinstance(argument, cst.Arg) else None
        return (
            isinstance(call, cst.Call) and call.args[0] is argument and self.script.is_call_to(call, {"builtins.super"})
            and any(a is klass for a in self.script.ancestors(call))
        )

    def _keeps_the_signature(self, decorator: cst.Decorator) -> bool:
        """`@torch.no_grad()`, `@torch.inference_mode()`: the method is called as written."""
        called = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        return bool(self.planner.codemod.qualified_names(called) & v.NO_GRAD)

    def _of_something_else(self, attribute: cst.Attribute) -> bool:
        """`torch.save`, `self.model.train()`: a name of an imported module, or of what the script knows to be
        another thing (a model, an optimizer, a loader), not an instance of the file's trainer class."""
        root = attribute.value
        while isinstance(root, cst.Attribute):
            root = root.value
        bindings = self.script.module_scope.bindings.get(root.value, ()) if isinstance(root, cst.Name) else ()
        imported = bool(bindings) and all(b.kind == "import" for b in bindings)
        return imported or self.script.kind_of(attribute.value) is not None

    def kept_by_init(self, entity):
        """The statement of a trainer's `__init__` (receiving the accelerator) that binds `self.model` of `entity`:
        its own, or its call of the method that binds it (`self.build_model()`, called from there alone), when
        nothing else in the class binds that attribute; else None."""
        if entity not in self._kept:
            self._kept[entity] = self._kept_by_init(entity)
        return self._kept[entity]

    def _kept_by_init(self, entity):
        function = self.script.flow.function_of(entity.scope)
        if not entity.name.startswith("self.") or function is None or self.why_not(function):
            return None
        klass = entity.scope.enclosing_class
        attribute = "." + entity.name.removeprefix("self.")
        stores = [
            binding for scope in self.script.index.scopes if _within(scope, klass)
            for name, bindings in scope.bindings.items() if name.endswith(attribute) for binding in bindings
        ]
        statement = next((a for a in self.script.ancestors(entity.at) if isinstance(a, cst.SimpleStatementLine)), None)
        if function.node.name.value != "__init__" and len(function.callers) == 1:
            call = function.callers[0].call  # `self.build_model()`, a statement of `__init__`'s own
            function = self.script.flow.function_of(function.callers[0].caller)
            line = self.script.parent(self.script.parent(call))
            statement = line if isinstance(line, cst.SimpleStatementLine) and line.body[0].value is call else None
        if len(stores) != 1 or function is None or function.node.name.value != "__init__" or self.why_not(function):
            return None
        return statement if statement in function.node.body.body else None

    def constructed_with(self, entity) -> str:
        """For `self.model` kept by a trainer's `__init__` (`kept_by_init`) as its parameter `model` (or
        `model.to(device)`): the plain name of the entry point that every construction of the class passes for
        it (`Trainer(model, optimizer)`); "" otherwise."""
        statement = self.kept_by_init(entity)
        init = self.script.flow.function_of(entity.scope) if statement is not None else None
        value = entity.value  # a parameter is no entity of its own: follow `.to(device)` to its name by hand
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda"):
            value = value.func.value
        if init is None or init.node.name.value != "__init__" or not isinstance(value, cst.Name) or value.value not in init.parameters:
            return ""
        passed = self.passed_by_the_entry(init, value.value)
        names = {a.value if isinstance(a, cst.Name) else None for a in passed}
        return names.pop() if len(names) == 1 and None not in names else ""

    def trains(self, function) -> bool:
        return any(own_scope(step.function) is function.scope for step in self.script.training_steps)

    def _different_objects(self, function) -> str:
        """Why a training function's prepared objects are not the entry point's, one name each."""
        for parameter in function.parameters:
            passed = self.passed_by_the_entry(function, parameter)
            if not any(a is not None and self.script.kind_of(a) in PREPARED_KINDS for a in passed):
                continue
            names = {a.value if isinstance(a, cst.Name) else None for a in passed}
            if len(names) != 1 or None in names:
                shown = " and ".join(dict.fromkeys(f"`{code_of(a)}`" if a is not None else "its default" for a in passed))
                return (
                    f"`{function.name}` gets {shown} for its parameter `{parameter}`: the objects to prepare must be "
                    f"the same names of {self._where()} at every call"
                )
        return ""

    def passed_by_the_entry(self, function, parameter: str, depth: int = 0) -> list:
        """What the entry point's own code passes for `parameter`, at each call: through a function between that
        hands on its own parameter of the same plain name, what is passed for that one."""
        passed = []
        for site in function.callers:
            argument = site.arguments.get(parameter)
            between = self._receiving_caller(site)
            handed_on = isinstance(argument, cst.Name) and argument.value in between.parameters if between else False
            if handed_on and depth < FOLLOW_DEPTH and all(b.kind == "param" for b in self.script.bindings_of(argument.value, argument)):
                passed += self.passed_by_the_entry(between, argument.value, depth + 1)
            else:
                passed.append(argument)
        return passed

    def _where(self) -> str:
        return "the module" if self.entry.kind == "module" else f"`{self.entry.name}`"

    def function_of(self, node: cst.CSTNode):
        """The function that receives the accelerator and whose own code holds `node`; None elsewhere."""
        function = self.script.flow.function_of(self.script.scope_of(node))
        if function is None or function.scope is self.entry or self.why_not(function):
            return None
        return function

    def first_call_statement(self, node: cst.CSTNode, top_statement) -> cst.CSTNode | None:
        """The entry point's own statement that first calls the function holding `node`."""
        function = self.function_of(node)
        if function is None:
            return None
        tops = [top_statement(site.call) or self.first_call_statement(site.call, top_statement) for site in function.callers]
        body = self.planner.body
        return min((t for t in tops if t is not None), key=body.index, default=None)

    # -- passing the accelerator -------------------------------------------------------------

    def pass_accelerator(self, plan) -> None:
        """A parameter `accelerator` for each function whose planned code uses it, and the argument at its calls."""
        if self.entry.kind == "module":
            return  # the accelerator is a global of the module
        touched = [*plan.edits, *plan.guarded, *plan.before, *plan.after, *plan.removed, *plan.unwrapped]
        receiving = {}
        pending = [f for f in map(self.function_of, touched) if f is not None]
        while pending:  # each function that uses it, and every function between that hands it on
            function = pending.pop()
            if function not in receiving:
                receiving[function] = None
                pending += [f for f in map(self._receiving_caller, function.callers) if f is not None]
        order = self.script.index.order
        for function in sorted(receiving, key=lambda f: order[f.node]):
            plan.edit(function.node.params, with_accelerator_parameter)
            for site in function.callers:
                plan.edit(site.call, with_accelerator_argument)
            plan.fixes.append((
                function.node, "AM801",
                (f"`{ACCELERATOR}` passed to `{function.name}` (a parameter, and `{ACCELERATOR}={ACCELERATOR}` at its calls): "
                 f"what it trains, prints or saves goes through the entry point's Accelerator"),
            ))


def _within(scope, outer) -> bool:
    """`scope` is `outer` or nested in it."""
    while scope is not None and scope is not outer:
        scope = scope.parent
    return scope is not None


def _appended(elements: list, new):
    """`elements` + `new`, keeping a trailing comma (and the line breaks of a signature written one item a line)."""
    if not elements or not isinstance(elements[-1].comma, cst.Comma):
        return [*elements, new]
    last = elements[-1]
    between = elements[-2].comma if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [*elements[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]


def with_accelerator_parameter(updated: cst.Parameters) -> cst.Parameters:
    parameter = cst.Param(name=cst.Name(ACCELERATOR))
    if isinstance(updated.star_arg, (cst.Param, cst.ParamStar)):
        return updated.with_changes(kwonly_params=_appended(list(updated.kwonly_params), parameter))
    if any(p.default is not None for p in (*updated.posonly_params, *updated.params)):
        # After parameters with defaults a parameter without one must be keyword-only: `*, accelerator`.
        params = list(updated.params)
        star = cst.ParamStar()
        if params and isinstance(params[-1].comma, cst.Comma):
            *params, star_at = _appended(params, star)
            star, parameter = star_at.with_changes(comma=params[-1].comma), parameter.with_changes(comma=star_at.comma)
        return updated.with_changes(params=params, star_arg=star, kwonly_params=[parameter])
    return updated.with_changes(params=_appended(list(updated.params), parameter))


def with_accelerator_argument(updated: cst.Call) -> cst.Call:
    no_space = cst.SimpleWhitespace("")
    argument = cst.Arg(value=cst.Name(ACCELERATOR), keyword=cst.Name(ACCELERATOR), equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space))
    return updated.with_changes(args=_appended(list(updated.args), argument))


class ExitsThroughParameters(ExitReading):
    """Exit conditions read as ddp reads them, and a parameter the same on every process when every call passes
    such a value: `if args.dry_run: break` in `train(args, ...)`, whose `args` the entry point parsed."""

    def _uniform_binding(self, binding, depth: int = 0) -> bool:
        if binding.kind != "param":
            return RankDecisions._uniform_binding(self, binding)
        function = self.script.flow.functions.get(binding.scope.node)
        if function is None or not function.callers or depth > FOLLOW_DEPTH:
            return False
        for site in function.callers:
            passed = site.arguments.get(binding.name)
            if not isinstance(passed, cst.Name) or not site.complete:
                return False
            if not all(self._uniform_binding(b, depth + 1) for b in self.script.bindings_of(passed.value, passed)):
                return False
        return True


# -- the flags that choose the device -------------------------------------------------------

DEVICE_NAME_FLAGS = {"--device": '{} == "cpu"'}  # a flag whose value names the device: the CPU is asked for by name
GPU_INDEX_FLAGS = frozenset({"--gpu"})  # a flag whose value is the GPU's index, which accelerate chooses per process


@dataclasses.dataclass
class CpuFlag:
    """`--no-cuda` (or `--device`) read from `args = parser.parse_args()`."""

    asks_for_cpu: str  # "args.no_cuda", "not args.cuda", 'args.device == "cpu"'
    parsed_at: cst.CSTNode | None  # the entry point's own statement that parses the arguments; None: parsed before it runs
    reads: list = dataclasses.field(default_factory=list)  # the script's `args.device`: each must become `accelerator.device`


@dataclasses.dataclass
class ParsedFlag:
    """Where a flag's value is read: `args.<attribute>`, `args` bound once by `parser.parse_args()`."""

    name: str  # the parsed arguments: "args"
    attribute: str
    parsed_at: cst.CSTNode | None
    reads: list  # the `args.<attribute>` Attribute nodes


def cpu_flag(planner, flag: cst.Call) -> CpuFlag | None:
    """How the Accelerator reads a `--no-cuda` / `--cuda` store_true flag (or the CPU named by `--device cpu`), when
    it can: the arguments parsed into a plain name in the entry point's own body or at module level before it runs."""
    spelled = _spelled(flag)
    action = keyword_arg(flag, "action")
    if spelled in DEVICE_NAME_FLAGS:
        if action is not None or not _typed(flag, (None, "str")):
            return None  # a string is what `== "cpu"` can read
        asks = DEVICE_NAME_FLAGS[spelled]
    elif spelled in CPU_CHOICE_FLAGS and action is not None and isinstance(action.value, cst.SimpleString) and action.value.evaluated_value == "store_true":
        asks = CPU_CHOICE_FLAGS[spelled]
    elif spelled in CPU_CHOICE_FLAGS and action is None and _typed(flag, ("int",)):
        asks = CPU_CHOICE_FLAGS[spelled]  # `--cuda 1` / `--cuda 0`: read as a truth value, as a store_true flag's
    else:
        return None
    parsed = parsed_flag(planner, flag)
    if parsed is None:
        return None
    return CpuFlag(asks.format(f"{parsed.name}.{parsed.attribute}"), parsed.parsed_at, parsed.reads)


def gpu_index_flag(planner, flag: cst.Call) -> ParsedFlag | None:
    """`--gpu` (an index), with where the script reads it."""
    return parsed_flag(planner, flag) if _spelled(flag) in GPU_INDEX_FLAGS else None


def _typed(flag: cst.Call, types: tuple) -> bool:
    """The flag's `type=` is one of `types` (builtin names; None: no `type=`)."""
    given = keyword_arg(flag, "type")
    if given is None:
        return None in types
    return isinstance(given.value, cst.Name) and given.value.value in types


def _spelled(flag: cst.Call) -> str | None:
    return next((a.value.evaluated_value for a in flag.args if a.keyword is None and isinstance(a.value, cst.SimpleString)), None)


def parsed_flag(planner, flag: cst.Call) -> ParsedFlag | None:
    """The flag's attribute and its reads, for arguments parsed into a plain name bound once, in the entry point's
    own body or at module level before the entry function runs."""
    dest = keyword_arg(flag, "dest")
    if dest is not None:
        if not isinstance(dest.value, cst.SimpleString):
            return None
        attribute = dest.value.evaluated_value
    else:
        attribute = _spelled(flag).lstrip("-").replace("-", "_")
    script = planner.script
    for call in planner.uses.calls:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "parse_args"):
            continue
        assign = script.parent(call)
        line = script.parent(assign) if isinstance(assign, cst.Assign) else None
        if not (isinstance(line, cst.SimpleStatementLine) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)):
            continue
        name = assign.targets[0].target.value
        scope = own_scope(script.scope_of(call))
        if len(scope.bindings.get(name, ())) != 1:
            continue
        reads = _reads_of(planner, name, attribute, assign.targets[0].target)
        if scope is planner.entry and line in planner.body:
            return ParsedFlag(name, attribute, line, reads)
        if scope.kind == "module" and planner.entry.kind == "function" and _parsed_before_the_entry_runs(planner, line):
            return ParsedFlag(name, attribute, None, reads)
    return None


def _parsed_before_the_entry_runs(planner, line: cst.SimpleStatementLine) -> bool:
    """`line` is a module-level statement before the `__main__` block, or one of that block's own statements
    before every call of the entry function in it (`args = parser.parse_args()`, then `main(args)`)."""
    script = planner.script
    guard = script.entry.main_guard
    if guard is None:
        return False
    body = list(script.module.body)
    if script.parent(line) is script.module:
        return body.index(line) < body.index(guard)
    block = list(guard.body.body) if isinstance(guard.body, cst.IndentedBlock) else []
    if line not in block:
        return False
    function = script.flow.function_of(planner.entry)
    calls = [planner.codemod.ancestors(site.call) for site in function.callers] if function is not None else []
    tops = [next((a for a in ancestors if a in block), None) for ancestors in calls]
    return bool(tops) and all(top is not None and block.index(top) > block.index(line) for top in tops)


def _reads_of(planner, name: str, attribute: str, target: cst.Name) -> list:
    """`name.attribute` wherever `name` is the parsed arguments bound at `target`, through functions' parameters
    too (`train(args, ...)`): every read of the flag's value."""
    script = planner.script
    found = []
    for node in planner.uses.names.get(attribute, ()):
        attribute_node = script.parent(node)
        if not (isinstance(attribute_node, cst.Attribute) and attribute_node.attr is node and isinstance(attribute_node.value, cst.Name)):
            continue
        owner = attribute_node.value
        bindings = script.bindings_of(owner.value, owner)
        if owner.value == name or any(b.kind == "param" and not _of_a_model(script, b.scope) for b in bindings):
            found.append(attribute_node)  # a parameter may hold the parsed arguments: counted as a read
    return found


def _of_a_model(script, scope) -> bool:
    """A method of a model class: its parameters are tensors (`idx.device` in `forward`), not the parsed arguments."""
    klass = scope.enclosing_class
    return klass is not None and isinstance(klass.node, cst.ClassDef) and script.class_kind(klass.node) == "model"


__all__ = [
    "CpuFlag", "EntryFunctions", "ExitsThroughParameters", "ParsedFlag", "cpu_flag", "gpu_index_flag", "own_scope", "parsed_flag",
    "with_accelerator_argument", "with_accelerator_parameter",
]
