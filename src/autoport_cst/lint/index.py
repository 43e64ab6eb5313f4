"""What the traversal learns about a module: its classes, functions, call
sites and assignments, and the two sets the rules are scoped by.

**Forward path.** Roots are methods named ``forward`` or ``forward_*`` /
``_forward_*`` (plus configured extra roots). From a root the path follows,
inside the same file:

- ``self.m(...)`` / ``cls.m(...)``: method ``m`` of the class, found in the
  class or its in-file bases, and every override in in-file subclasses;
- ``super().m(...)``: ``m`` of an in-file base;
- ``Klass.m(...)``: ``m`` of an in-file class;
- ``f(...)``: a function defined in an enclosing function (a closure), else a
  module-level function;
- ``self.p`` where ``p`` is a ``@property`` of the class;
- every closure defined inside a function on the path.

It never enters the load-time and set-up methods of the vllm_neuron
convention (``__init__``, ``_setup_weight_loaders``, ``load_weights``,
``load_weights_lite``, ``_load_*``, ``_cast_to_model_dtype``,
``_lookup_parameter``, ``get_kv_spec``, ``bind_kv_cache``, ``from_configs``,
the Eagle3 setters) nor functions decorated with ``torch.compiler.disable``,
``torch._dynamo.disable``, ``torch.jit.ignore`` or ``torch.jit.unused``,
which are not traced.

**Init path.** ``__init__`` of every ``nn.Module`` class (a class whose bases
are ``nn.*`` / ``torch.nn.*`` classes, ``*Module`` or ``*PreTrainedModel``
names, role-named classes such as an imported ``LlamaAttention``, or in-file
module classes), and what it calls the same way, except closures: a closure
defined in ``__init__`` (a weight-loader transform) runs later, at load time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.cst.roles import class_role

FORWARD_ROOT = re.compile(r"^(forward|_?forward_\w+)$")

# load-time and set-up functions that the forward path never enters (anatomy §5.2)
FORWARD_EXCLUDED = frozenset(
    {
        "__init__",
        "_setup_weight_loaders",
        "load_weights",
        "load_weights_lite",
        "_cast_to_model_dtype",
        "_lookup_parameter",
        "get_kv_spec",
        "bind_kv_cache",
        "from_configs",
        "set_aux_hidden_state_layers",
        "get_eagle3_aux_hidden_state_layers",
    }
)
FORWARD_EXCLUDED_PREFIXES = ("_load_",)

# decorators that keep a function out of the torch.compile graph
NOT_TRACED_DECORATORS = frozenset(
    {
        "torch.compiler.disable",
        "torch._dynamo.disable",
        "torch.jit.ignore",
        "torch.jit.unused",
        "compiler.disable",
        "_dynamo.disable",
    }
)

UNKNOWN = None  # an assignment whose value is not an expression we can read


@dataclass(eq=False)
class CallSite:
    node: cst.Call
    kind: str  # "self" | "super" | "name" | "class"
    name: str
    owner: str | None = None  # class name for kind "class"
    statement: cst.CSTNode | None = None  # the statement that contains the call


@dataclass(eq=False)
class FunctionInfo:
    name: str
    qualname: str
    node: cst.FunctionDef
    cls: ClassInfo | None  # the class whose body defines it (methods)
    parent: FunctionInfo | None  # the enclosing function (closures)
    decorators: tuple[str, ...] = ()
    params: dict[str, cst.BaseExpression | None] = field(default_factory=dict)
    nested: dict[str, FunctionInfo] = field(default_factory=dict)
    calls: list[CallSite] = field(default_factory=list)
    # local name -> assigned values (None: unknown, e.g. a loop target)
    assigns: dict[str, list[cst.BaseExpression | None]] = field(default_factory=dict)
    self_loads: set[str] = field(default_factory=set)

    @property
    def method_class(self) -> ClassInfo | None:
        """The class ``self`` refers to: the class of the method, or of the
        method a closure is nested in."""
        fn: FunctionInfo | None = self
        while fn is not None:
            if fn.cls is not None:
                return fn.cls
            fn = fn.parent
        return None

    def is_property(self) -> bool:
        return any(d in ("property", "functools.cached_property", "cached_property") for d in self.decorators)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<function {self.qualname}>"


@dataclass(eq=False)
class ClassInfo:
    name: str
    qualname: str
    node: cst.ClassDef
    bases: tuple[str | None, ...]
    top_level: bool
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    # self.<attr> = value, per attribute, with the function that assigns it
    attrs: dict[str, list[tuple[FunctionInfo, cst.BaseExpression]]] = field(default_factory=dict)
    subclasses: list[ClassInfo] = field(default_factory=list)
    in_file_bases: list[ClassInfo] = field(default_factory=list)
    _is_module: bool | None = None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<class {self.qualname}>"


def _external_module_base(name: str | None) -> bool:
    if name is None:
        return False
    if name.startswith(("nn.", "torch.nn.")):
        return True
    last = name.rsplit(".", 1)[-1]
    if last == "Module" or last.endswith("Module") or last.endswith("PreTrainedModel"):
        return True
    role = class_role(last)
    return role is not None and role != "config"


class ModuleIndex:
    def __init__(self) -> None:
        self.classes: list[ClassInfo] = []
        self.top_classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, FunctionInfo] = {}  # module level
        self.all_functions: list[FunctionInfo] = []
        self._forward: set[FunctionInfo] | None = None
        self._forward_key: tuple | None = None
        self._finalized = False

    # -- building ---------------------------------------------------------------

    def finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        for cls in self.classes:
            for base in cls.bases:
                target = self.top_classes.get(base or "")
                if target is not None and target is not cls:
                    cls.in_file_bases.append(target)
                    target.subclasses.append(cls)

    # -- queries -----------------------------------------------------------------

    def is_module(self, cls: ClassInfo, _seen: frozenset = frozenset()) -> bool:
        """Whether ``cls`` is an ``nn.Module`` (as far as this file tells)."""
        if cls._is_module is not None:
            return cls._is_module
        result = False
        for base in cls.bases:
            if _external_module_base(base):
                result = True
                break
        if not result:
            for parent in cls.in_file_bases:
                if parent not in _seen and self.is_module(parent, _seen | {cls}):
                    result = True
                    break
        cls._is_module = result
        return result

    def lookup_method(self, cls: ClassInfo, name: str, _seen: set | None = None) -> FunctionInfo | None:
        seen = _seen if _seen is not None else set()
        if id(cls) in seen:
            return None
        seen.add(id(cls))
        found = cls.methods.get(name)
        if found is not None:
            return found
        for base in cls.in_file_bases:
            found = self.lookup_method(base, name, seen)
            if found is not None:
                return found
        return None

    def overrides(self, cls: ClassInfo, name: str) -> list[FunctionInfo]:
        out: list[FunctionInfo] = []
        stack = list(cls.subclasses)
        seen: set[int] = set()
        while stack:
            sub = stack.pop()
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            if name in sub.methods:
                out.append(sub.methods[name])
            stack.extend(sub.subclasses)
        return out

    def resolve(self, fn: FunctionInfo, site: CallSite) -> list[FunctionInfo]:
        """The in-file functions a call site may reach."""
        if site.kind == "self":
            cls = fn.method_class
            if cls is None:
                return []
            found = self.lookup_method(cls, site.name)
            out = [found] if found is not None else []
            return out + self.overrides(cls, site.name)
        if site.kind == "super":
            cls = fn.method_class
            if cls is None:
                return []
            for base in cls.in_file_bases:
                found = self.lookup_method(base, site.name)
                if found is not None:
                    return [found]
            return []
        if site.kind == "class":
            cls = self.top_classes.get(site.owner or "")
            if cls is None:
                return []
            found = self.lookup_method(cls, site.name)
            return [found] if found is not None else []
        # a plain name: a closure of an enclosing function, else module level
        scope: FunctionInfo | None = fn
        while scope is not None:
            if site.name in scope.nested:
                return [scope.nested[site.name]]
            scope = scope.parent
        found = self.functions.get(site.name)
        return [found] if found is not None else []

    def property_targets(self, fn: FunctionInfo) -> list[FunctionInfo]:
        cls = fn.method_class
        if cls is None or not fn.self_loads:
            return []
        out = []
        for attr in fn.self_loads:
            target = self.lookup_method(cls, attr)
            if target is not None and target.is_property():
                out.append(target)
        return out

    def forward_path(
        self, extra_roots: Iterable[str] = (), extra_excluded: Iterable[str] = ()
    ) -> set[FunctionInfo]:
        key = (tuple(extra_roots), tuple(extra_excluded))
        if self._forward is not None and self._forward_key == key:
            return self._forward
        roots_extra = set(key[0])
        excluded_extra = set(key[1])

        def excluded(fn: FunctionInfo) -> bool:
            if fn.name in FORWARD_EXCLUDED or fn.name in excluded_extra:
                return True
            if fn.name.startswith(FORWARD_EXCLUDED_PREFIXES):
                return True
            return any(d in NOT_TRACED_DECORATORS for d in fn.decorators)

        todo = [
            fn
            for fn in self.all_functions
            if fn.cls is not None
            and (FORWARD_ROOT.match(fn.name) or fn.name in roots_extra)
            and not excluded(fn)
        ]
        seen: set[FunctionInfo] = set()
        while todo:
            fn = todo.pop()
            if fn in seen:
                continue
            seen.add(fn)
            for site in fn.calls:
                for target in self.resolve(fn, site):
                    if target not in seen and not excluded(target):
                        todo.append(target)
            for target in self.property_targets(fn):
                if target not in seen and not excluded(target):
                    todo.append(target)
            for nested in fn.nested.values():
                if nested not in seen and not excluded(nested):
                    todo.append(nested)
        self._forward, self._forward_key = seen, key
        return seen

    def init_roots(self) -> list[FunctionInfo]:
        return [
            cls.methods["__init__"]
            for cls in self.classes
            if "__init__" in cls.methods and self.is_module(cls)
        ]

    def init_callees(self, fn: FunctionInfo) -> list[tuple[CallSite, FunctionInfo]]:
        """Call sites in ``fn`` itself (not in closures defined in it, which
        run later) and the in-file functions they reach."""
        return [(site, target) for site in fn.calls for target in self.resolve(fn, site)]


@dataclass(frozen=True)
class Site:
    """Where a node was seen: its function, class, statement and whether it
    is inside a lambda."""

    function: FunctionInfo | None
    cls: ClassInfo | None
    statement: cst.CSTNode | None
    in_lambda: bool
