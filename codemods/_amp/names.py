"""Where things are, read from the script model: the device and optimizer
bindings in reach of a place, the statement and loop that hold a node, and
the names a statement reads and binds."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._base import dotted_name, is_docstring, walk
from ..script import ScriptModel
from ..script import vocabulary as v
from ..script.amp_facts import AmpFacts
from .plan import ACCESSORS, APEX_INITIALIZE, MOVES, Problem, Ref, is_block

# What an assignment binds, for the codemod: "device", "optimizer", "apex"
# (`model, optimizer = amp.initialize(...)`), "scheduler", "plain" (a
# constant, None), "other" (an instance of a plain class of this file, an
# environment, a replay buffer: never an optimizer), or "unknown" (a call
# that may return anything).
_KNOWN_KINDS = ("device", "optimizer", "scheduler")
# `device = torch.accelerator.current_accelerator()` (after `is_available()`): a torch.device.
ACCELERATOR_DEVICE = frozenset({"torch.accelerator.current_accelerator"})
# What a script does with an optimizer and not with an environment or a scheduler.
OPTIMIZER_USES = frozenset({"zero_grad", "param_groups", "add_param_group"})
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
# What the codemod names the device of a model it binds (`device = next(model.parameters()).device`).
MODEL_DEVICE_NAMES = ("device", "model_device")
# Methods that change a dict in place.
DICT_CHANGES = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


class Resolution:
    """Mixed into the codemod: answers from `self.script` and `self.facts`."""

    script: ScriptModel
    facts: AmpFacts
    tree: cst.Module

    # -- order ---------------------------------------------------------------------

    def order(self, node: cst.CSTNode) -> int:
        return self.facts.order(node)

    def ends_before(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        return self.facts.ends_before(first, second)

    # -- statements, blocks and units ------------------------------------------------

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

    def enclosing_function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        function = self.facts.function_at(node)
        return function.node if function is not None else None

    def unit_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The loop (else the function, else the module) whose body runs `node`
        once per iteration."""
        loops = self.script.loops_around(node)
        return loops[0].node if loops else (self.enclosing_function(node) or self.tree)

    def within(self, node: cst.CSTNode, unit: cst.CSTNode) -> bool:
        """`node` runs inside `unit`, in the same function."""
        for ancestor in self.ancestors(node):
            if ancestor is unit:
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
        return unit is self.tree

    def calls_within(self, unit: cst.CSTNode) -> list:
        """The calls that run inside `unit` (a loop, function or the module), in the same function."""
        return self.facts.calls_running_in(unit)

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

    def reads(self, node: cst.CSTNode) -> set:
        return self.facts.names_read(node)

    def binds(self, node: cst.CSTNode) -> set:
        return self.facts.names_bound(node)

    # -- autocast already there ---------------------------------------------------------

    def has_autocast(self, with_node: cst.With) -> bool:
        return any(self.script.is_call_to(i.item, v.AUTOCAST) for i in with_node.items)

    def runs_under_autocast(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.With) and self.has_autocast(a) for a in self.ancestors(node))

    def contains_autocast(self, node: cst.CSTNode) -> bool:
        return any(isinstance(n, cst.With) and self.has_autocast(n) for n in walk(node, into_definitions=False))

    # -- methods and their instance -------------------------------------------------------

    def method_owner(self, node: cst.CSTNode) -> Optional[tuple]:
        """(ClassDef, name of the `self` parameter) of the method `node` is in."""
        return self.facts.method_owner(node)

    def owner_at(self, site: cst.CSTNode) -> Optional[str]:
        owner = self.method_owner(site)
        return owner[1] if owner else None

    # -- devices and optimizers in reach --------------------------------------------------

    def value_kind(self, value: Optional[cst.BaseExpression]) -> str:
        if value is None:
            return "unknown"
        if isinstance(value, (cst.BaseNumber, cst.BaseString)) or (isinstance(value, cst.Name) and value.value in ("None", "True", "False")):
            return "plain"
        if isinstance(value, cst.IfExp):
            kinds = {self.value_kind(value.body), self.value_kind(value.orelse)}
            return kinds.pop() if len(kinds) == 1 else "unknown"
        if self.script.is_call_to(value, {APEX_INITIALIZE}):
            return "apex"
        if self.facts.is_parameter_device(value) or self.script.is_call_to(value, ACCELERATOR_DEVICE):
            return "device"
        kind = self.script.kind_of(value) if isinstance(value, cst.Call) else None
        if kind in _KNOWN_KINDS:
            return kind
        return "other" if self.makes_plain_instance(value) else "unknown"

    def makes_plain_instance(self, value: cst.BaseExpression) -> bool:
        """`Corridor()`, `ReplayMemory(500)`: a class of this file, built from
        constants alone, that derives from nothing but `object` (and the file's
        other such classes) and neither builds a model or an optimizer nor
        touches gradients. Its `step` is no optimizer's (a hand-written SGD
        class receives the parameters, or reads `.grad`)."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return False
        if not all(self.value_kind(argument.value) == "plain" and not argument.star for argument in value.args):
            return False
        return self.is_plain_class_name(value.func.value, self.script.index.scope_of(value), set())

    def is_plain_class_name(self, name: str, scope, seen: set) -> bool:
        definitions = self.script.index.bindings_of(name, scope)  # a class, never rebound
        if len(definitions) != 1 or definitions[0].kind != "class" or definitions[0].node in seen:
            return False
        klass = definitions[0].node
        seen.add(klass)
        if klass.keywords or klass.decorators or self.may_train(klass):
            return False  # a metaclass or a decorator may make it anything
        outer = self.script.index.scope_by_node[klass].parent
        return all(
            isinstance(base.value, cst.Name)
            and not base.keyword
            and (base.value.value == "object" or self.is_plain_class_name(base.value.value, outer, seen))
            for base in klass.bases
        )

    def may_train(self, klass: cst.ClassDef) -> bool:
        """The class builds a model or an optimizer, or reads gradients."""
        for node in walk(klass):
            if isinstance(node, cst.Attribute) and node.attr.value == "grad":
                return True
            if isinstance(node, cst.Call) and self.script.kind_of(node) in ("model", "optimizer"):
                return True
        return False

    def assignment_line(self, binding) -> Optional[cst.SimpleStatementLine]:
        """The line of a plain `target = value` (unpacking allowed) that makes the binding."""
        if binding.kind != "assign" or not isinstance(binding.statement, cst.Assign):
            return None
        line = self.parent(binding.statement)
        return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None

    def lines_of_kind(self, bindings: list, kinds: tuple, transparent: tuple = ()) -> Optional[list]:
        """The assignment lines of `bindings` when each binds a value of one of
        `kinds` (those that bind one of `transparent` are skipped); else None.
        A device may be bound from another device (`self.device = device`)."""
        lines = []
        for binding in bindings:
            line = self.assignment_line(binding)
            kind = self.value_kind(binding.statement.value) if line is not None else None
            if kind == "unknown" and "device" in kinds and self.device_value(binding.statement.value, line):
                kind = "device"
            if kind == "unknown" and "optimizer" in kinds and self.optimizer_handed_in(binding.statement.value, line):
                kind = "optimizer"  # `self.optimizer = optimizer` of a parameter that every caller passes an optimizer
            if line is not None and "device" in kinds and binding.node in self.string_device_nodes():
                kind = "device"  # a string that names it: autocast reads `torch.device(device).type`
            if kind in transparent:
                continue
            if kind not in kinds:
                return None
            lines.append(line)
        return lines or None

    def resolve_ref(self, expression: cst.BaseExpression, site: cst.CSTNode, kinds: tuple, transparent: tuple = ()) -> Optional[Ref]:
        """The Ref for `expression` (a name, or `self.attr` in a method) at
        `site`, when every binding of it in reach binds one of `kinds`."""
        if isinstance(expression, cst.Name):
            return self.resolve_name(expression.value, site, kinds, transparent)
        if isinstance(expression, cst.Attribute) and isinstance(expression.value, cst.Name):
            owner = self.method_owner(site)
            if owner is None or expression.value.value != owner[1]:
                return None
            lines = self.lines_of_kind(self.facts.self_attribute(owner[0], expression.attr.value), kinds, transparent)
            if lines:
                return Ref("attr", expression.attr.value, owner[0], lines)
        return None

    def resolve_name(self, name: str, site: cst.CSTNode, kinds: tuple, transparent: tuple = ()) -> Optional[Ref]:
        bindings = self.facts.bindings_of(name, site)
        lines = self.lines_of_kind(bindings, kinds, transparent)
        if not lines and len(bindings) > 1:  # `import torch.optim as optim`, then `optim = torch.optim.Adam(...)`
            bindings = self.reaching(bindings, site)
            lines = self.lines_of_kind(bindings, kinds, transparent)
        if not lines:
            return None
        home = bindings[0].scope
        if home is self.facts.scope_of(site) and not any(self.ends_before(line, site) for line in lines):
            return None  # bound only further down in the same scope
        if "device" in kinds and home is self.facts.scope_of(site) and not self.bound_on_every_path(lines, site):
            return None  # a device bound in one branch only (`loc = ...` under `if args.resume:`)
        if self.called_before(lines, site, home):
            return None
        return Ref("name", name, home, sorted(lines, key=self.order))

    def reaching(self, bindings: list, site: cst.CSTNode) -> list:
        """The bindings, in the scope of `site`, whose value may reach it: not
        one that a later binding, run on every path to `site`, overwrites
        first (`import torch.optim as optim`, then `optim = torch.optim.Adam(...)`)."""
        if len(bindings) < 2 or bindings[0].scope is not self.facts.scope_of(site):
            return bindings
        lines = [self.line_of(b.node) for b in bindings]
        overwriting = [line for line in lines if line is not None and self.ends_before(line, site) and self.bound_on_every_path([line], site)]
        kept = [
            binding for binding, line in zip(bindings, lines)
            if line is None or not any(line is not later and self.ends_before(line, later) for later in overwriting)
        ]
        return kept or bindings

    def bound_on_every_path(self, lines: list, site: cst.CSTNode) -> bool:
        """Some of `lines` runs, before `site`, whichever way the code goes:
        a line of a block around `site`, or an `if` there whose every branch
        binds (`if args.cuda: device = ... else: device = ...`). The body
        of a `with` or `try` counts as run; a loop's body may not run."""
        around = {id(a) for a in self.ancestors(site)}
        statements = {id(line) for line in lines}
        for line in lines:
            if not self.ends_before(line, site):
                continue
            top = line
            for ancestor in self.ancestors(line):
                if id(ancestor) in around:
                    break
                top = ancestor
            if self.always_binds(top, statements):
                return True
        return False

    def always_binds(self, node: cst.CSTNode, statements: set) -> bool:
        """Running the statement `node` runs one of `statements`."""
        if id(node) in statements:
            return True
        if isinstance(node, cst.If):
            return self.block_binds(node.body, statements) and node.orelse is not None and (
                self.always_binds(node.orelse, statements) if isinstance(node.orelse, cst.If) else self.block_binds(node.orelse.body, statements)
            )
        if isinstance(node, (cst.With, cst.Try)):
            return self.block_binds(node.body, statements)
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            return self.block_binds(node, statements)
        return False

    def block_binds(self, block: cst.BaseSuite, statements: set) -> bool:
        return isinstance(block, cst.IndentedBlock) and any(self.always_binds(statement, statements) for statement in block.body)

    def called_before(self, lines: list, site: cst.CSTNode, home) -> bool:
        """The function around `site` (defined in `home`) is called there
        before any of `lines` binds the name it reads: a notebook's
        `eval_model(model_0)` runs before the cell that binds `device`."""
        function = self.facts.function_at(site)
        if function is None or function.scope.parent is not home:
            return False
        return any(
            caller.caller is home and not any(self.ends_before(line, caller.call) for line in lines)
            for caller in function.callers
        )

    def device_at(self, site: cst.CSTNode) -> Optional[Ref]:
        """The device binding in reach of `site`: a variable (`device`,
        `args.device`), else `self.<attr>`, else a parameter that every caller
        passes a device to, else the CPU of a script that names no device."""
        for name in self.device_names():
            ref = self.device_named(name, site) if not self.is_instance_attribute(name, site) else None
            if ref is not None:
                return self.where_computed(self.devices.setdefault(ref.key, ref))
        owner = self.method_owner(site)
        if owner is not None:
            prefix = owner[1] + "."
            attributes = {n[len(prefix):] for n in self.device_names() if n.startswith(prefix) and "." not in n[len(prefix):]}
            for attr in sorted(attributes | {"device"}, key=lambda a: (a != "device", a)):
                ref = self.resolve_ref(cst.Attribute(value=cst.Name(owner[1]), attr=cst.Name(attr)), site, ("device",))
                if ref is not None:
                    return self.where_computed(self.devices.setdefault(ref.key, ref))
        return (
            self.device_parameter_at(site) or self.config_device_at(site) or self.cpu_only() or self.model_device_at(site)
            or self.evaluated_model_device_before(site)
        )

    def evaluated_model_device_before(self, site: cst.CSTNode) -> Optional[Ref]:
        """The device of a model that an evaluation block in the same scope
        computes with (a teacher's soft targets), bound where that model is
        bound, before `site`: the step's loss reads what that model computed,
        so it computes on the same device; the evaluation binds it anyway, and
        a second run would find it bound."""
        scope = self.facts.scope_of(site)
        for region in self.script.evaluation:
            node = region.node
            if not isinstance(node, cst.With) or self.facts.scope_of(node) is not scope or not self.is_evaluation_block(node):
                continue
            ref = self.model_device_at(node)
            if ref is not None and ref.home is scope and all(self.ends_before(anchor, site) for anchor in ref.bindings):
                return ref
        return None

    def model_device_at(self, site: cst.CSTNode) -> Optional[Ref]:
        """Where no device is bound (`.cuda(args.gpu)` on the model, or
        `.to(device_at(args.gpu))` once the device codemod ran), the code at
        `site` computes where the one model it calls is: `device =
        next(model.parameters()).device`, bound right after the model (which
        is bound once and never moved afterwards)."""
        unit = site if isinstance(site, cst.With) else self.unit_of(site)
        calls = self.calls_within(unit)
        names = {c.func.value for c in calls if isinstance(c.func, cst.Name) and self.script.is_model(c.func)}
        if not names and isinstance(site, cst.With):  # an evaluation's `model.module.generate(...)`: a method of the one model it reaches
            names = {
                root.value for c in calls
                if isinstance(c.func, cst.Attribute) and c.func.attr.value not in ACCESSORS
                and isinstance(root := _root_name(c.func), cst.Name) and self.script.is_model(root)
            }
        if len(names) != 1:
            return None
        model = names.pop()
        bindings = self.facts.bindings_of(model, site)
        if len(bindings) != 1:
            return None
        home = bindings[0].scope
        if bindings[0].kind == "param":  # `def evaluate(model, loader)`: bound first thing in the function
            function = self.facts.function_at(site)
            if function is None or function.scope is not home or not isinstance(function.node.body, cst.IndentedBlock):
                return None
            if self.moved_by(model, function):
                return None  # where the callers moved it beforehand is where it is on entry
            if any(d.scope is home for d in self.script.devices) or any(n in home.bindings for n in self.facts.parameter_device_names()):
                return None  # the function binds its device itself, further down
            body = list(function.node.body.body)
            anchor, before = (body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]), True
        else:
            anchor, before = self.assignment_line(bindings[0]), False
            if anchor is None or len(anchor.body[0].targets) != 1 or self.is_moved(model):
                return None
            if home is self.facts.scope_of(site) and not self.ends_before(anchor, site):
                return None
        name = next((n for n in MODEL_DEVICE_NAMES if not self.bindings_anywhere(n) and not self.is_read_anywhere(n)), None)
        if name is None:
            return None
        ref = Ref("name", name, home, [anchor])
        ref = self.devices.setdefault(ref.key, ref)
        self.model_devices.setdefault(ref.key, (anchor, f"{name} = next({model}.parameters()).device", before))
        return ref

    def is_moved(self, model: str) -> bool:
        """`model.cuda()`, `model.to(...)`, `model.half()` somewhere in the
        file, or in a function of the file that is handed the model."""
        if _moves_name(model, self.script.index.nodes):
            return True
        for function in self.script.flow.functions.values():
            for call_site in function.callers:
                for parameter, argument in call_site.arguments.items():
                    if isinstance(argument, cst.Name) and argument.value == model and _moves_name(parameter, walk(function.node.body)):
                        return True
        return False

    def moved_by(self, model: str, function) -> bool:
        """`function` (or a function of the file it hands `model`) moves its parameter `model`."""
        if _moves_name(model, walk(function.node.body)):
            return True
        return any(
            call_site.caller is function.scope and isinstance(argument, cst.Name) and argument.value == model
            and _moves_name(parameter, walk(callee.node.body))
            for callee in self.script.flow.functions.values() for call_site in callee.callers
            for parameter, argument in call_site.arguments.items()
        )

    def is_read_anywhere(self, name: str) -> bool:
        return any(
            isinstance(n, cst.Name) and n.value == name and not self.is_attribute_name(n) and not isinstance(self.parent(n), cst.Arg)
            for n in self.script.index.nodes
        )

    def config_device_at(self, site: cst.CSTNode) -> Optional[Ref]:
        """`config["device"]` of a module-level config dict, bound once and
        never changed (no item stored, no `config.update(...)`)."""
        for device in self.script.devices:
            if device.kind != "string" or "[" not in device.name:
                continue
            root = device.name.split("[", 1)[0]
            if not self.only_read(root) or self.script.module_scope not in self.scope_chain(site):
                continue
            line = self.assignment_line(next(b for b in self.script.module_scope.bindings[root] if b.node is device.node))
            if line is None or not self.ends_before(line, site) and self.facts.scope_of(site) is self.script.module_scope:
                continue
            ref = Ref("name", device.name, self.script.module_scope, [line])
            return self.where_computed(self.devices.setdefault(ref.key, ref))
        return None

    def only_read(self, root: str) -> bool:
        """The module-level dict `root` is never changed in place, and no scope rebinds the name."""
        for node in self.script.index.nodes:
            if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == root and self.facts.stored(node):
                return False
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == root and node.attr.value in DICT_CHANGES:
                return False
            if isinstance(node, cst.Subscript) and isinstance(self.parent(node), cst.Del):
                return False
        return all(scope.kind == "module" or root not in scope.bindings for scope in self.script.index.scopes)

    def scope_chain(self, site: cst.CSTNode) -> list:
        scope, chain = self.facts.scope_of(site), []
        while scope is not None and scope not in chain:
            chain.append(scope)
            scope = scope.parent
        return chain

    def string_device_nodes(self) -> set:
        """The targets the script binds a device string to (`device = "cuda" if ... else "cpu"`, `device = args.device`, `args = parser.parse_args()` of a `--device` flag)."""
        return {d.node for d in self.script.devices if d.kind in ("string", "parsed") and "[" not in d.name}

    def is_string_device(self, ref: Ref) -> bool:
        """Some binding of `ref` holds a string (or a `config["device"]` entry);
        for a parameter, what some caller passes does."""
        if "[" in ref.name:
            return True
        if ref.kind == "param":
            passed = self.passed.get(ref.key)
            return passed is not None and any(self.is_string_device(source) for _, source in passed[1])
        nodes = self.string_device_nodes()
        return any(isinstance(line, cst.SimpleStatementLine) and any(n in nodes for n in walk(line)) for line in ref.bindings)

    def is_device_object(self, ref: Ref, depth: int = 0) -> bool:
        """Every binding of `ref` provably holds a `torch.device` (built by
        `torch.device(...)` or `get_device()`, or read from a tensor's or
        parameter's `.device`); for a parameter, what every caller passes
        does. Anything else (an attribute set from an argument, a default
        string) may be a string, whose type `torch.device(x).type` reads alike."""
        if ref.kind == "param":
            passed = self.passed.get(ref.key)
            default = next((b.value for b in ref.home.bindings.get(ref.name, ()) if b.kind == "param"), None)
            if default is not None and not self._makes_device_object(default, depth + 1):
                return False  # a call from elsewhere that leaves it out passes the default (`device="cuda"`)
            return passed is not None and depth < 4 and all(self.is_device_object(source, depth + 1) for _, source in passed[1])
        if ref.key in self.model_devices:
            return True  # bound by amp itself: `next(model.parameters()).device`
        values = [self._bound_value(line) for line in ref.bindings]
        return bool(values) and all(value is not None and self._makes_device_object(value, depth) for value in values)

    @staticmethod
    def _bound_value(line: cst.CSTNode) -> Optional[cst.BaseExpression]:
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], (cst.Assign, cst.AnnAssign)):
            return line.body[0].value
        return None

    def _makes_device_object(self, value: cst.BaseExpression, depth: int = 0) -> bool:
        if isinstance(value, cst.IfExp):
            return self._makes_device_object(value.body, depth) and self._makes_device_object(value.orelse, depth)
        if isinstance(value, cst.BooleanOperation):  # `device or torch.device("cpu")`
            return self._makes_device_object(value.left, depth) and self._makes_device_object(value.right, depth)
        if isinstance(value, cst.Name) and value.value == "None":
            return True  # the `or` above chooses the other side
        if isinstance(value, cst.Name) and depth < 4:  # a parameter every caller passes a device to
            ref = self.device_named(value.value, value, depth + 1) or self.passed_in(value.value, value, self.device_passed, depth + 1, optional=True)
            return ref is not None and not self.is_string_device(ref) and self.is_device_object(ref, depth + 1)
        if isinstance(value, cst.Attribute) and value.attr.value == "device":
            return True  # `next(model.parameters()).device`, `x.device`
        return self.value_kind(value) == "device" or isinstance(value, cst.Call) and bool(
            self.qualified_names(value.func) & {"torch.device", "accelmigrate.runtime.device.get_device"}
        )

    def device_names(self) -> list:
        """Names and `x.attr` spellings that the script binds a device to
        (`device` first), including those of the model's parameters."""
        names = {d.name for d in self.script.devices if d.kind in ("torch.device", "get_device", "parsed") or d.kind == "string" and "[" not in d.name}
        names |= self.facts.parameter_device_names()
        names = {n for n in names if n.count(".") <= 1}
        return sorted(names, key=lambda n: (n.rsplit(".", 1)[-1] != "device", "." in n, n))

    def is_instance_attribute(self, name: str, site: cst.CSTNode) -> bool:
        owner = self.method_owner(site)
        return owner is not None and name.startswith(owner[1] + ".")

    def device_named(self, name: str, site: cst.CSTNode, depth: int = 0) -> Optional[Ref]:
        """The device `name` (or `args.device`) holds at `site`: bound in
        reach, or passed in by every caller."""
        root, _, attribute = name.partition(".")
        if not attribute:
            return self.resolve_name(name, site, ("device",)) or self.passed_in(name, site, self.device_passed, depth) or self.passed_from_elsewhere(name, site)
        roots = self.facts.bindings_of(root, site)
        if len(roots) == 1 and roots[0].kind == "param":
            return self.passed_in(root, site, lambda e, s, d: self.attribute_device(e, attribute, s, d), depth, name)
        ref = self.resolve_name(name, site, ("device",)) or self.parsed_device(name, roots, site)
        return ref if ref is not None and roots and roots[0].scope is ref.home else None

    def parsed_device(self, name: str, roots: list, site: cst.CSTNode) -> Optional[Ref]:
        """`args.device` of a `--device` string flag, never assigned: bound
        where every binding of `args` in reach parses the arguments."""
        parsed = {d.node for d in self.script.devices if d.kind == "parsed" and d.name == name}
        lines = [self.assignment_line(root) for root in roots if root.node in parsed]
        if not roots or len(lines) != len(roots) or None in lines:
            return None
        if roots[0].scope is self.facts.scope_of(site) and not any(self.ends_before(line, site) for line in lines):
            return None  # parsed only further down
        return Ref("name", name, roots[0].scope, sorted(lines, key=self.order))

    def attribute_device(self, expression: cst.BaseExpression, attribute: str, site: cst.CSTNode, depth: int) -> Optional[Ref]:
        """`<expression>.<attribute>` as a device at a call site."""
        if not isinstance(expression, cst.Name):
            return None
        return self.device_named(f"{expression.value}.{attribute}", site, depth)

    def device_value(self, value: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`value` (a name, `args.device`, `self.device`, `device or
        torch.device(...)`) holds a device at `site`."""
        key = id(site)
        if key in self.resolving:
            return False
        self.resolving.add(key)
        try:
            if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
                return self.value_kind(value.right) == "device" and self.optional_device(value.left, site)
            if not isinstance(value, (cst.Name, cst.Attribute)):
                return False
            name = self.dotted(value)
            if name is None or name.count(".") > 1:
                return False
            if self.is_instance_attribute(name, site):
                return self.resolve_ref(value, site, ("device",)) is not None
            return self.device_named(name, site) is not None
        finally:
            self.resolving.discard(key)

    def optimizer_handed_in(self, value: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`optimizer` in `self.optimizer = optimizer` (in `__init__`, or any
        method): a parameter of the method that every call in the file
        passes an optimizer traced to its constructor (never None: a scaler
        bound next to it would step nothing)."""
        if not isinstance(value, cst.Name) or self.method_owner(site) is None:
            return False
        key = ("optimizer", id(site))
        if key in self.resolving:
            return False
        self.resolving.add(key)
        try:
            return self.passed_in(value.value, site, self.optimizer_passed, 0) is not None
        finally:
            self.resolving.discard(key)

    def optional_device(self, value: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`device` in `device or torch.device(...)`: a parameter defaulting
        to None that every call in the file leaves out or passes a device."""
        bindings = self.facts.bindings_of(value.value, site) if isinstance(value, cst.Name) else []
        function = self.facts.function_at(site)
        if len(bindings) != 1 or bindings[0].kind != "param" or function is None or not function.callers:
            return False
        default = bindings[0].value
        if not (isinstance(default, cst.Name) and default.value == "None"):
            return False
        for call_site in function.callers:
            argument = call_site.arguments.get(value.value)
            if not call_site.complete or (argument is not None and self.device_passed(argument, call_site.call) is None):
                return False
        return True

    def cpu_only(self) -> Optional[Ref]:
        """The CPU, for a script that never names a device: its tensors and
        modules stay where torch makes them."""
        return None if self.facts.names_a_device() else self.cpu_ref()

    def optimizer_of(self, receiver: cst.BaseExpression, site: cst.CSTNode) -> Optional[Ref]:
        return self.optimizer_passed(receiver, site)

    def is_known_other(self, receiver: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """`receiver` is bound only to things that are not optimizers: a
        learning-rate scheduler, None, an instance of a plain class of the file. (Anything else built by a call may be an
        optimizer from a factory, whose step must go through the scaler.)"""
        return self.resolve_ref(receiver, site, ("scheduler", "plain", "other")) is not None

    def may_be_optimizer(self, receiver: cst.BaseExpression) -> bool:
        """The script treats the untraced `receiver` of a `.step()` as an
        optimizer: it builds it from a model's parameters (a factory, a
        hand-written optimizer class), zeroes its gradients, reads its
        param_groups or hands it to a learning-rate scheduler. What else is
        stepped (an environment, a scheduler from a factory) is no optimizer."""
        spelled = self.dotted(receiver)
        if spelled is None:
            return True  # `make()[0].step()`: nothing to tell it by
        bindings = {id(b) for b in self.script.bindings_of_reference(receiver)}
        for binding in self.script.bindings_of_reference(receiver):
            if binding.value is not None and self.built_from_parameters(binding.value):
                return True
        return any(
            not bindings or bindings & {id(b) for b in self.script.bindings_of_reference(spelling)}
            for spelling in self.used_as_optimizer().get(spelled, ())
        )

    def used_as_optimizer(self) -> dict:
        """Spelling -> the expressions of the file used as an optimizer is
        (`x` of `x.zero_grad()`, `x.param_groups`, `StepLR(x, ...)`), found once."""
        if self.optimizer_uses is None:
            self.optimizer_uses = {}
            for node in self.script.index.nodes:
                if isinstance(node, cst.Attribute) and node.attr.value in OPTIMIZER_USES:
                    spelling = node.value
                elif isinstance(node, cst.Call) and node.args and any(v.is_scheduler(n) for n in self.qualified_names(node.func)):
                    spelling = node.args[0].value
                else:
                    continue
                self.optimizer_uses.setdefault(self.dotted(spelling), []).append(spelling)
        return self.optimizer_uses

    def built_from_parameters(self, value: cst.BaseExpression) -> bool:
        """A call given a model or its parameters, or an instance of a class
        of the file that reads gradients."""
        if not isinstance(value, cst.Call):
            return False
        if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in PARAMETER_METHODS for n in walk(value)):
            return True
        if any(self.script.kind_of(argument.value) == "model" for argument in value.args):
            return True
        if isinstance(value.func, cst.Name):
            scope = self.script.index.scope_of(value)
            definitions = [d for d in self.script.index.bindings_of(value.func.value, scope) if d.kind == "class"]
            return any(self.may_train(d.node) or not (self.is_plain_class_name(value.func.value, scope, set()) or _steps_with_argument(d.node)) for d in definitions)
        return False

    # -- torch's name here ------------------------------------------------------------------

    def module_imports(self) -> list:
        """The `import ...` bindings at module level."""
        return [b for b in self.script.imports if b.scope.kind == "module" and isinstance(b.statement, cst.Import)]

    def torch_alias(self) -> str:
        """The name a module-level `import torch [as th]` binds (else `torch`,
        imported when needed)."""
        for binding in self.module_imports():
            if binding.qualified == "torch" and binding.name != "torch":
                return binding.name
        return "torch"

    def need_torch(self) -> None:
        if not any(b.name == self.torch and b.qualified.split(".")[0] == "torch" for b in self.module_imports()):
            self.add_import("torch")

    def is_attribute_name(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.Attribute) and parent.attr is node

    @staticmethod
    def dotted(node: cst.CSTNode) -> Optional[str]:
        return dotted_name(node) or None


def _steps_with_argument(klass: cst.ClassDef) -> bool:
    """The class's own `step` needs an argument (`env.step(action)`): an
    optimizer's takes none but an optional closure."""
    for statement in klass.body.body if isinstance(klass.body, cst.IndentedBlock) else ():
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "step":
            required = [p for p in statement.params.params if p.default is None]
            return len(required) > 1 or any(p.default is None for p in statement.params.kwonly_params)
    return False


def _root_name(expression: cst.BaseExpression) -> cst.BaseExpression:
    """`model` of `model.module.generate`."""
    while isinstance(expression, cst.Attribute):
        expression = expression.value
    return expression


def _moves_name(name: str, nodes) -> bool:
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Name)
        and n.func.value.value == name and n.func.attr.value in MOVES
        for n in nodes
    )
