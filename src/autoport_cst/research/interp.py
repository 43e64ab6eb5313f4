"""A small abstract interpreter for transformers modeling code.

It runs ``__init__`` methods concretely against the model's configuration
(so ``nn.Linear(..., bias=config.attention_bias)`` becomes a Linear with or
without a bias, per layer), and ``forward`` methods symbolically: tensors are
:class:`Node` graphs of the operations applied to the inputs, so an analysis
can ask "is the MLP input computed from the attention output" or "is this
norm applied to the sublayer output before the residual add".

Rules of the approximation (what it does not know it leaves unknown):

- ``if`` on a value it can compute (config flags, layer indices) takes one
  branch; on anything else both branches are followed as separate paths;
- loops over concrete sequences are unrolled (a bounded number of times),
  loops over tensors run their body once;
- calls to classes of the source construct :class:`Instance` objects
  (running their ``__init__``); calls to methods of ``self`` are inlined;
  calls to submodules and to functions in ``forward`` become nodes;
- every read of a configuration attribute is logged, so an analysis can name
  the config key that holds a value (``eps=config.layer_norm_eps``).

Nothing is imported from transformers or torch: the code is only read.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autoport_cst.research.sources import SourceLibrary, SourceModule

MAX_PATHS = 48
MAX_UNROLL = 512
MAX_DEPTH = 24


class _Unknown:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:  # pragma: no cover - guarded by callers
        raise TypeError("UNKNOWN has no truth value")


UNKNOWN = _Unknown()


class _Raised(Exception):
    """A path that raises: dropped."""


@dataclass(eq=False)
class Node:
    """A symbolic tensor value: ``kind`` is input, module (a submodule call),
    call (a function of an external library), func (a function of the
    source), method (a tensor method), attr, item, binop, unary, choice."""

    kind: str
    name: str = ""
    args: tuple = ()
    kwargs: tuple = ()  # ((key, value), ...)
    ref: Any = None
    maybe_none: bool = False

    def kwarg(self, key: str, default: Any = None) -> Any:
        for k, v in self.kwargs:
            if k == key:
                return v
        return default

    def __repr__(self) -> str:
        if self.kind == "input":
            return f"<{self.name}>"
        if self.kind == "module":
            return f"self.{self.name}(...)"
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class SourceClass:
    module: SourceModule
    node: ast.ClassDef

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def qualname(self) -> str:
        return f"{self.module.dotted}.{self.node.name}"


@dataclass(frozen=True)
class External:
    """A name from outside the analysed source (torch, transformers utils)."""

    qualname: str

    @property
    def short(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class FuncRef:
    module: SourceModule
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(eq=False)
class Param:
    """An ``nn.Parameter`` created in ``__init__``."""

    shape: tuple | None
    fill: str | None = None
    name: str | None = None
    float32: bool = False

    @property
    def numel(self) -> int | None:
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return math.prod(self.shape)


@dataclass(frozen=True)
class TensorInit:
    shape: tuple | None
    fill: str | None
    float32: bool = False


@dataclass(frozen=True)
class ActFn:
    """An activation function: its transformers name and the config key read."""

    name: str
    key: str | None = None


@dataclass(eq=False)
class Instance:
    """A module constructed in ``__init__``: its class, attributes, children,
    and the constructor arguments (with the config keys each one read)."""

    cls: SourceClass | External
    attrs: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, frozenset[str]] = field(default_factory=dict)
    name: str | None = None
    attr_reads: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def class_name(self) -> str:
        return self.cls.name if isinstance(self.cls, SourceClass) else self.cls.short

    @property
    def is_external(self) -> bool:
        return isinstance(self.cls, External)

    def children(self) -> Iterator[tuple[str, Instance]]:
        for key, value in self.attrs.items():
            if isinstance(value, Instance):
                if value.cls == MODULE_LIST:
                    for index, item in enumerate(value.attrs.get("items", [])):
                        if isinstance(item, Instance):
                            yield f"{key}.{index}", item
                else:
                    yield key, value

    def params(self) -> Iterator[tuple[str, Param]]:
        for key, value in self.attrs.items():
            if isinstance(value, Param):
                yield key, value


MODULE_LIST = External("torch.nn.ModuleList")


@dataclass
class BoundMethod:
    obj: Any  # Instance, or a SuperRef
    cls: SourceClass
    node: ast.FunctionDef


@dataclass
class SuperRef:
    obj: Instance
    start: SourceClass  # lookup starts after this class


@dataclass
class BoundBuiltin:
    obj: Any
    name: str


@dataclass
class State:
    env: dict[str, Any]
    returned: bool = False
    value: Any = None


class ConfigProxy:
    """Attribute access on the model configuration, logged. A copy the code
    makes (``copy.deepcopy(config)``) holds the attributes the code then
    sets on it (``overrides``); the configuration itself is never written."""

    def __init__(self, config: Any, log: list[set[str]], overrides: dict[str, Any] | None = None) -> None:
        self._config = config
        self._log = log
        self.overrides = overrides

    def copy(self) -> ConfigProxy:
        return ConfigProxy(self._config, self._log, dict(self.overrides or {}))

    def read(self, name: str, default: Any = UNKNOWN) -> Any:
        for frame in self._log:
            frame.add(name)
        if self.overrides is not None and name in self.overrides:
            return self.overrides[name]
        try:
            value = getattr(self._config, name) if not isinstance(self._config, dict) else self._config[name]
        except Exception:  # missing, or a config that refuses the access (per-layer attributes)
            return default
        return _freeze_config_value(value, self._log)

    def has(self, name: str) -> bool:
        if self.overrides is not None and name in self.overrides:
            return True
        if isinstance(self._config, dict):
            return name in self._config
        try:
            getattr(self._config, name)
        except Exception:
            return False
        return True


def _freeze_config_value(value: Any, log: list[set[str]]) -> Any:
    if hasattr(value, "to_dict") and hasattr(value, "model_type"):
        return ConfigProxy(value, log)  # a nested sub-config
    return value


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.MatMult: None,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_BINOP_NAMES = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "and",
    ast.BitOr: "or",
    ast.BitXor: "xor",
    ast.LShift: "lshift",
    ast.RShift: "rshift",
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SAFE_METHODS = {
    dict: {"get", "keys", "values", "items", "copy"},
    str: {"startswith", "endswith", "lower", "upper", "replace", "split", "format", "strip"},
    list: {"index", "count", "copy"},
    tuple: {"index", "count"},
}
_CONCRETE = (int, float, str, bool, type(None), tuple, list, dict, set, frozenset, range, slice)

# Signatures of the torch.nn modules the analysis looks into (torch API, not
# model names): positional parameter names and defaults.
EXTERNAL_MODULES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "Linear": (("in_features", "out_features", "bias"), {"bias": True}),
    "Embedding": (("num_embeddings", "embedding_dim", "padding_idx"), {"padding_idx": None}),
    "LayerNorm": (
        ("normalized_shape", "eps", "elementwise_affine", "bias"),
        {"eps": 1e-5, "elementwise_affine": True, "bias": True},
    ),
    "RMSNorm": (("normalized_shape", "eps", "elementwise_affine"), {"eps": None, "elementwise_affine": True}),
    "Dropout": (("p",), {"p": 0.5}),
    "Identity": ((), {}),
    "Conv1D": (("nf", "nx"), {}),
    "SiLU": ((), {}),
    "GELU": (("approximate",), {"approximate": "none"}),
    "ReLU": ((), {}),
    "Tanh": ((), {}),
    "Sigmoid": ((), {}),
}
# attributes every torch.nn.Module has without setting them
_MODULE_ATTRIBUTES = {"training", "dtype", "device", "_parameters", "_buffers", "_modules"}
_ACTIVATION_MODULES = {"SiLU": "silu", "GELU": "gelu", "ReLU": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}


def is_concrete(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(is_concrete(v) for v in value)
    return isinstance(value, _CONCRETE) and not isinstance(value, _Unknown)


class Interpreter:
    """Runs methods of source classes. One interpreter per configuration."""

    def __init__(self, library: SourceLibrary, config: Any) -> None:
        self.library = library
        self._log: list[set[str]] = []
        self.config = ConfigProxy(config, self._log)
        self.depth = 0
        self._globals: dict[tuple[int, str], Any] = {}
        self._mro: dict[Any, list] = {}
        # loops over a list of modules run for every item (what each layer is
        # passed), not only the first (what one layer computes)
        self.every_layer = False

    # ---- config-read capture -------------------------------------------------

    def capture(self) -> set[str]:
        frame: set[str] = set()
        self._log.append(frame)
        return frame

    def release(self, frame: set[str]) -> None:
        for index in range(len(self._log) - 1, -1, -1):
            if self._log[index] is frame:
                del self._log[index]
                return

    # ---- name resolution -----------------------------------------------------

    def global_value(self, module: SourceModule, name: str) -> Any:
        if name in module.classes:
            return SourceClass(module, module.classes[name])
        if name in module.functions:
            return FuncRef(module, module.functions[name])
        if name in module.imports:
            return self.resolve_dotted(module.imports[name])
        if name in module.assignments:
            key = (id(module), name)
            if key not in self._globals:
                self._globals[key] = UNKNOWN  # against self-reference
                self._globals[key] = self.eval(module.assignments[name], {}, module, None)
            return self._globals[key]
        return _BUILTINS.get(name, UNKNOWN)

    def resolve_dotted(self, dotted: str) -> Any:
        # model code lives under transformers.models; the framework around it
        # (PreTrainedModel, GenerationMixin, kernels hub decorators) is external
        found = self.library.resolve(dotted) if dotted.startswith("transformers.models.") else None
        if found is not None:
            module, name = found
            if name in module.classes:
                return SourceClass(module, module.classes[name])
            return FuncRef(module, module.functions[name])
        if dotted == "math":
            return External("math")
        return External(dotted)

    def bases(self, cls: SourceClass) -> list[SourceClass | External]:
        result = []
        for base in cls.node.bases:
            value = self.eval(base, {}, cls.module, None)
            if isinstance(value, (SourceClass, External)):
                result.append(value)
        return result

    def mro(self, cls: SourceClass | External) -> list[SourceClass | External]:
        """Depth-first, left-to-right linearisation (enough for these files)."""
        if cls in self._mro:
            return self._mro[cls]
        order: list[SourceClass | External] = []
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if current in order:
                continue
            order.append(current)
            if isinstance(current, SourceClass):
                stack = self.bases(current) + stack
        self._mro[cls] = order
        return order

    def find_method(self, cls: SourceClass | External, name: str, after: SourceClass | None = None):
        """(class, FunctionDef) of the first definition of ``name`` in the MRO."""
        order = self.mro(cls)
        if after is not None and after in order:
            order = order[order.index(after) + 1 :]
        for klass in order:
            if isinstance(klass, SourceClass):
                for stmt in klass.node.body:
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                        return klass, stmt
        return None

    def external_bases(self, cls: SourceClass | External) -> list[str]:
        return [k.qualname for k in self.mro(cls) if isinstance(k, External)]

    def class_attribute(self, cls: SourceClass, name: str) -> Any:
        for klass in self.mro(cls):
            if isinstance(klass, SourceClass):
                for stmt in klass.node.body:
                    targets: list[ast.expr] = []
                    if isinstance(stmt, ast.Assign):
                        targets, value = stmt.targets, stmt.value
                    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                        targets, value = [stmt.target], stmt.value
                    for target in targets:
                        if isinstance(target, ast.Name) and target.id == name:
                            return self.eval(value, {}, klass.module, None)
        return UNKNOWN

    # ---- construction --------------------------------------------------------

    def _is_data_class(self, cls: SourceClass) -> bool:
        """A @dataclass output container (ModelOutput subclass) defined in the
        modeling file, with no __init__ of its own."""
        if self.find_method(cls, "__init__") is not None:
            return False
        return any(
            qual.rsplit(".", 1)[-1].endswith("ModelOutput")
            or qual.rsplit(".", 1)[-1].endswith("OutputWithPast")
            for qual in self.external_bases(cls)
        )

    def instantiate(self, cls: SourceClass | External, args: list, kwargs: dict, reads: dict) -> Any:
        if isinstance(cls, External):
            return self._external_instance(cls, args, kwargs, reads)
        instance = Instance(cls)
        found = self.find_method(cls, "__init__")
        if found is None:
            ext = self.external_bases(cls)
            for qual in ext:
                short = qual.rsplit(".", 1)[-1]
                if short in EXTERNAL_MODULES:
                    inner = self._external_instance(External(qual), args, kwargs, reads)
                    instance.args, instance.reads, instance.attrs = inner.args, inner.reads, inner.attrs
                    break
            return instance
        klass, init = found
        self.call_function(
            klass.module, init, [instance, *args], kwargs, reads=reads, owner=klass, record=instance
        )
        return instance

    def _external_instance(self, cls: External, args: list, kwargs: dict, reads: dict) -> Any:
        short = cls.short
        if cls.qualname.endswith("ModuleList") or cls.qualname.endswith("Sequential"):
            items = []
            if args and isinstance(args[0], (list, tuple)):
                items = list(args[0])
            elif cls.qualname.endswith("Sequential"):
                items = list(args)
            return Instance(MODULE_LIST, attrs={"items": items})
        if short in ("Parameter", "Buffer"):
            data = args[0] if args else kwargs.get("data", UNKNOWN)
            if short == "Buffer":
                return data if is_concrete(data) else UNKNOWN
            if isinstance(data, TensorInit):
                return Param(data.shape, data.fill, float32=data.float32)
            return Param(None)
        if short in _ACTIVATION_MODULES:
            return ActFn(
                _ACTIVATION_MODULES[short]
                if short != "GELU" or kwargs.get("approximate", "none") == "none"
                else "gelu_pytorch_tanh"
            )
        instance = Instance(cls)
        positional, defaults = EXTERNAL_MODULES.get(short, ((), {}))
        bound = dict(defaults)
        for name, value in zip(positional, args, strict=False):
            bound[name] = value
        for name, value in kwargs.items():
            bound[name] = value
        if short == "Conv1D":  # transformers' transposed linear: always a bias
            bound.setdefault("bias", True)
            bound["out_features"], bound["in_features"] = bound.get("nf"), bound.get("nx")
        instance.args = bound
        instance.reads = reads
        return instance

    # ---- calls ---------------------------------------------------------------

    def call_function(
        self,
        module: SourceModule,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        args: list,
        kwargs: dict,
        reads: dict | None = None,
        owner: SourceClass | None = None,
        record: Instance | None = None,
        inputs_symbolic: bool = False,
    ) -> list[State]:
        """Run ``fn`` and return its end states (one per path)."""
        env = self.bind(fn, args, kwargs, inputs_symbolic)
        if record is not None:
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
            for name in params + [a.arg for a in fn.args.kwonlyargs]:
                if name in env:
                    record.args[name] = env[name]
            if reads:
                record.reads = dict(reads)
        if owner is not None:
            env["__class__"] = owner
        env["__module__"] = module
        if self.depth > MAX_DEPTH:
            return [State(env, True, UNKNOWN)]
        self.depth += 1
        try:
            states = self.exec_block(fn.body, [State(env)], module)
        finally:
            self.depth -= 1
        return states

    def bind(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list, kwargs: dict, symbolic: bool
    ) -> dict[str, Any]:
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        env: dict[str, Any] = {}
        module = None
        for index, param in enumerate(positional):
            if index < len(args):
                env[param.arg] = args[index]
            elif param.arg in kwargs:
                env[param.arg] = kwargs[param.arg]
            elif symbolic:
                default = defaults[index]
                env[param.arg] = Node("input", param.arg, maybe_none=_is_none(default))
            elif (given := defaults[index]) is not None:
                env[param.arg] = self.eval(given, {}, module, None) if module else _literal(given)
            else:
                env[param.arg] = UNKNOWN
        for param, default in zip(a.kwonlyargs, a.kw_defaults, strict=False):
            if param.arg in kwargs:
                env[param.arg] = kwargs[param.arg]
            elif symbolic:
                env[param.arg] = Node("input", param.arg, maybe_none=_is_none(default))
            elif default is not None:
                env[param.arg] = _literal(default)
            else:
                env[param.arg] = UNKNOWN
        if a.vararg:
            env[a.vararg.arg] = tuple(args[len(positional) :])
        if a.kwarg:
            known = {p.arg for p in positional} | {p.arg for p in a.kwonlyargs}
            env[a.kwarg.arg] = {k: v for k, v in kwargs.items() if k not in known}
        return env

    def run_method(
        self, instance: Instance, name: str, args: list, kwargs: dict | None = None, symbolic: bool = True
    ) -> list[State]:
        """Run a method of an instance with symbolic inputs for the parameters
        not given. Returns end states; [] when the method is not in the source."""
        if not isinstance(instance.cls, SourceClass):
            return []
        found = self.find_method(instance.cls, name)
        if found is None:
            return []
        klass, fn = found
        return self.call_function(
            klass.module, fn, [instance, *args], kwargs or {}, owner=klass, inputs_symbolic=symbolic
        )

    # ---- statements ----------------------------------------------------------

    def exec_block(self, body: list[ast.stmt], states: list[State], module: SourceModule) -> list[State]:
        for stmt in body:
            live = [s for s in states if not s.returned]
            done = [s for s in states if s.returned]
            if not live:
                return states
            new: list[State] = []
            for state in live:
                try:
                    new.extend(self.exec_stmt(stmt, state, module))
                except _Raised:
                    continue
            states = done + new
            if len(states) > MAX_PATHS:
                states = states[:MAX_PATHS]
        return states

    def exec_stmt(self, stmt: ast.stmt, state: State, module: SourceModule) -> list[State]:
        env = state.env
        if isinstance(stmt, ast.Assign):
            frame = self.capture()
            try:
                value = self.eval(stmt.value, env, module, state)
            finally:
                self.release(frame)
            for target in stmt.targets:
                self.assign(target, value, env, module, state)
                if isinstance(target, ast.Attribute):
                    base = env.get(target.value.id) if isinstance(target.value, ast.Name) else None
                    if isinstance(base, Instance):
                        base.attr_reads[target.attr] = frozenset(frame)
            return [state]
        if isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.assign(stmt.target, self.eval(stmt.value, env, module, state), env, module, state)
            return [state]
        if isinstance(stmt, ast.AugAssign):
            current = self.eval(_load(stmt.target), env, module, state)
            value = self.binop(stmt.op, current, self.eval(stmt.value, env, module, state))
            self.assign(stmt.target, value, env, module, state)
            return [state]
        if isinstance(stmt, ast.Expr):
            value = self.eval(stmt.value, env, module, state)
            call = stmt.value
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.attr.endswith("_")
                and not call.func.attr.startswith("_")
                and isinstance(env.get(call.func.value.id), Node)
                and isinstance(value, Node)
            ):
                env[call.func.value.id] = value  # in-place tensor update (index_add_, mul_)
            return [state]
        if isinstance(stmt, ast.Return):
            value = self.eval(stmt.value, env, module, state) if stmt.value is not None else None
            return [State(env, True, value)]
        if isinstance(stmt, ast.Raise):
            raise _Raised()
        if isinstance(stmt, ast.If):
            test = self.truth(self.eval(stmt.test, env, module, state))
            if test is True:
                return self.exec_block(stmt.body, [state], module)
            if test is False:
                return self.exec_block(stmt.orelse, [state], module)
            a = self.exec_block(stmt.body, [State(dict(env))], module)
            b = self.exec_block(stmt.orelse, [State(dict(env))], module)
            return a + b
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            return self.exec_for(stmt, state, module)
        if isinstance(stmt, ast.While):
            states = self.exec_block(stmt.body, [state], module)
            return self.exec_block(stmt.orelse, states, module) if stmt.orelse else states
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                value = self.eval(item.context_expr, env, module, state)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, env, module, state)
            return self.exec_block(stmt.body, [state], module)
        if isinstance(stmt, ast.Try):
            states = self.exec_block(stmt.body, [state], module)
            states = self.exec_block(stmt.orelse, states, module) if stmt.orelse else states
            return self.exec_block(stmt.finalbody, states, module) if stmt.finalbody else states
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            env[stmt.name] = FuncRef(module, stmt)
            return [state]
        return [state]  # pass, assert, import, global, del, break, continue

    def exec_for(self, stmt: ast.For | ast.AsyncFor, state: State, module: SourceModule) -> list[State]:
        iterable = self.eval(stmt.iter, state.env, module, state)
        items = self.iterate(iterable)
        if items is None or len(items) > MAX_UNROLL:
            item = Node("iter", "", (iterable,))
            if isinstance(iterable, Instance) and iterable.cls == MODULE_LIST and iterable.attrs["items"]:
                item = iterable.attrs["items"][0]
            self.assign(stmt.target, item, state.env, module, state)
            states = self.exec_block(stmt.body, [state], module)
        else:
            states = [state]
            for item in items:
                live = [s for s in states if not s.returned]
                if not live:
                    break
                for s in live:
                    self.assign(stmt.target, item, s.env, module, s)
                states = [s for s in states if s.returned] + self.exec_block(stmt.body, live, module)
        return self.exec_block(stmt.orelse, states, module) if stmt.orelse else states

    def iterate(self, value: Any) -> list | None:
        if isinstance(value, (list, tuple, range)):
            return list(value)
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, _FirstOnly):
            return [value.value]
        if isinstance(value, Instance) and value.cls == MODULE_LIST:
            items = value.attrs.get("items", [])
            if self.every_layer:
                return list(items)
            return items[:1] if items else None  # a loop over layers: the first one
        return None

    def assign(
        self, target: ast.expr, value: Any, env: dict, module: SourceModule, state: State | None
    ) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            star = next((i for i, e in enumerate(elts) if isinstance(e, ast.Starred)), None)
            if isinstance(value, (tuple, list)) and star is None and len(value) == len(elts):
                for elt, item in zip(elts, value, strict=False):
                    self.assign(elt, item, env, module, state)
            else:
                for index, elt in enumerate(elts):
                    if isinstance(elt, ast.Starred):
                        self.assign(elt.value, UNKNOWN, env, module, state)
                        continue
                    if isinstance(value, Node):
                        item = Node("item", "", (value, index))
                    elif isinstance(value, (tuple, list)) and index < len(value) and star is None:
                        item = value[index]
                    else:
                        item = UNKNOWN
                    self.assign(elt, item, env, module, state)
        elif isinstance(target, ast.Attribute):
            base = self.eval(target.value, env, module, state)
            if isinstance(base, ConfigProxy) and base.overrides is not None:
                base.overrides[target.attr] = value  # a copy of the config the code modifies
            if isinstance(base, Instance):
                if isinstance(value, (Instance, Param)) and value.name is None:
                    value.name = target.attr
                if isinstance(value, Instance) and value.cls == MODULE_LIST:
                    for index, item in enumerate(value.attrs.get("items", [])):
                        if isinstance(item, Instance) and item.name is None:
                            item.name = f"{target.attr}.{index}"
                base.attrs[target.attr] = value
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value, env, module, state)
        # subscript targets: in-place tensor writes, not tracked

    # ---- expressions -----------------------------------------------------------

    def eval(self, expr: ast.expr | None, env: dict, module: SourceModule | None, state: State | None) -> Any:
        if expr is None:
            return None
        method = getattr(self, f"_eval_{type(expr).__name__}", None)
        if method is None:
            return UNKNOWN
        return method(expr, env, module, state)

    def _eval_Constant(self, expr, env, module, state):
        return expr.value

    def _eval_Name(self, expr, env, module, state):
        if expr.id in env:
            return env[expr.id]
        if module is None:
            return _BUILTINS.get(expr.id, UNKNOWN)
        return self.global_value(module, expr.id)

    def _eval_Attribute(self, expr, env, module, state):
        base = self.eval(expr.value, env, module, state)
        return self.getattr(base, expr.attr)

    def getattr(self, base: Any, name: str, default: Any = UNKNOWN) -> Any:
        if isinstance(base, ConfigProxy):
            return base.read(name, default)
        if isinstance(base, Instance):
            if name in base.attrs:
                return base.attrs[name]
            if name == "training":
                return False
            if name == "config" and "config" not in base.attrs:
                return self.config
            if isinstance(base.cls, SourceClass):
                found = self.find_method(base.cls, name)
                if found is not None:
                    if any(isinstance(d, ast.Name) and d.id == "property" for d in found[1].decorator_list):
                        states = self.call_function(found[0].module, found[1], [base], {}, owner=found[0])
                        return _merge_returns(states)
                    return BoundMethod(base, found[0], found[1])
                value = self.class_attribute(base.cls, name)
                if value is not UNKNOWN:
                    return value
            if base.cls == MODULE_LIST:
                return BoundBuiltin(base, name)
            if name in base.args:
                return base.args[name]
            if default is not UNKNOWN:
                return default
            if (
                isinstance(base.cls, SourceClass)
                and name not in _MODULE_ATTRIBUTES
                and not any(q.rsplit(".", 1)[-1] in EXTERNAL_MODULES for q in self.external_bases(base.cls))
            ):
                # __init__ never set it: this path would raise AttributeError
                raise _Raised()
            return Node("attr", name, (base,))
        if isinstance(base, SuperRef):
            found = self.find_method(base.obj.cls, name, after=base.start)
            if found is not None:
                return BoundMethod(base.obj, found[0], found[1])
            return BoundBuiltin(base, name)
        if isinstance(base, External):
            return External(f"{base.qualname}.{name}")
        if isinstance(base, SourceClass):
            found = self.find_method(base, name)
            if found is not None:
                return BoundMethod(None, found[0], found[1])
            return self.class_attribute(base, name)
        if isinstance(base, Node):
            return Node("attr", name, (base,))
        if isinstance(base, Param):
            return Node("attr", name, (Node("param", base.name or "", ref=base),))
        if isinstance(base, (int, float)) and not isinstance(base, bool):
            if name in ("to", "float", "item", "type_as", "clone", "detach", "half", "bfloat16"):
                return BoundBuiltin(base, "__identity__")
            return UNKNOWN
        for kind, allowed in _SAFE_METHODS.items():
            if isinstance(base, kind) and name in allowed:
                return BoundBuiltin(base, name)
        if isinstance(base, (TensorInit, ActFn)):
            return UNKNOWN
        return default

    def _eval_Subscript(self, expr, env, module, state):
        base = self.eval(expr.value, env, module, state)
        index = self.eval(expr.slice, env, module, state)
        if isinstance(base, External) and base.short in ("ACT2FN", "ACT2CLS") and isinstance(index, str):
            return ActFn(index, _config_key_in(expr.slice))
        if isinstance(base, Instance) and base.cls == MODULE_LIST:
            items = base.attrs.get("items", [])
            if isinstance(index, int) and -len(items) <= index < len(items):
                return items[index]
            if isinstance(index, slice):
                return Instance(MODULE_LIST, attrs={"items": items[index]})
            return items[0] if items else UNKNOWN
        if is_concrete(base) and is_concrete(index):
            try:
                return base[index]
            except (KeyError, IndexError, TypeError, ValueError):
                return UNKNOWN
        if isinstance(base, (Node, Param)):
            if isinstance(base, Param):
                base = Node("param", base.name or "", ref=base)
            return Node("item", "", (base, index))
        return UNKNOWN

    def _eval_Slice(self, expr, env, module, state):
        lower = self.eval(expr.lower, env, module, state)
        upper = self.eval(expr.upper, env, module, state)
        step = self.eval(expr.step, env, module, state)
        if all(v is None or isinstance(v, int) for v in (lower, upper, step)):
            return slice(lower, upper, step)
        return SliceSym(lower, upper, step)

    def _eval_Tuple(self, expr, env, module, state):
        return tuple(self._elements(expr.elts, env, module, state))

    def _eval_List(self, expr, env, module, state):
        return list(self._elements(expr.elts, env, module, state))

    def _eval_Set(self, expr, env, module, state):
        return UNKNOWN

    def _elements(self, elts, env, module, state) -> list:
        out: list = []
        for elt in elts:
            if isinstance(elt, ast.Starred):
                value = self.eval(elt.value, env, module, state)
                if isinstance(value, (list, tuple)):
                    out.extend(value)
                else:
                    out.append(Node("starred", "", (value,)) if isinstance(value, Node) else UNKNOWN)
            else:
                out.append(self.eval(elt, env, module, state))
        return out

    def _eval_Dict(self, expr, env, module, state):
        result = {}
        for key, value in zip(expr.keys, expr.values, strict=False):
            if key is None:  # {**mapping, ...}
                unpacked = self.eval(value, env, module, state)
                if isinstance(unpacked, dict):
                    result.update(unpacked)
                continue
            k = self.eval(key, env, module, state)
            if isinstance(k, (str, int, float, bool)) or k is None:
                result[k] = self.eval(value, env, module, state)
        return result

    def _eval_JoinedStr(self, expr, env, module, state):
        return UNKNOWN

    def _eval_Lambda(self, expr, env, module, state):
        return UNKNOWN

    def _eval_NamedExpr(self, expr, env, module, state):
        value = self.eval(expr.value, env, module, state)
        env[expr.target.id] = value
        return value

    def _eval_Starred(self, expr, env, module, state):
        return self.eval(expr.value, env, module, state)

    def _eval_BinOp(self, expr, env, module, state):
        return self.binop(
            expr.op, self.eval(expr.left, env, module, state), self.eval(expr.right, env, module, state)
        )

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        func = _BINOPS.get(type(op))
        if func is not None and _number_like(left) and _number_like(right):
            try:
                return func(left, right)
            except (ArithmeticError, TypeError, ValueError):
                return UNKNOWN
        if isinstance(left, (str, tuple, list)) and isinstance(right, type(left)) and isinstance(op, ast.Add):
            return operator.add(left, right)
        if left is UNKNOWN and right is UNKNOWN:
            return UNKNOWN
        return Node("binop", _BINOP_NAMES[type(op)], (_symbolic(left), _symbolic(right)))

    def _eval_UnaryOp(self, expr, env, module, state):
        value = self.eval(expr.operand, env, module, state)
        if isinstance(expr.op, ast.Not):
            truth = self.truth(value)
            return (not truth) if isinstance(truth, bool) else UNKNOWN
        if _number_like(value):
            return _UNARY[type(expr.op)](value)
        if isinstance(value, (Node, Param)):
            return Node("unary", type(expr.op).__name__.lower(), (_symbolic(value),))
        return UNKNOWN

    def _eval_BoolOp(self, expr, env, module, state):
        is_and = isinstance(expr.op, ast.And)
        result: Any = None
        for value_expr in expr.values:
            value = self.eval(value_expr, env, module, state)
            truth = self.truth(value)
            if not isinstance(truth, bool):
                return UNKNOWN
            result = value
            if is_and and not truth:
                return value
            if not is_and and truth:
                return value
        return result

    def _eval_Compare(self, expr, env, module, state):
        left = self.eval(expr.left, env, module, state)
        for op, right_expr in zip(expr.ops, expr.comparators, strict=False):
            right = self.eval(right_expr, env, module, state)
            outcome = self.compare(op, left, right)
            if outcome is not True:
                return outcome
            left = right
        return True

    def compare(self, op: ast.cmpop, left: Any, right: Any) -> Any:
        if isinstance(op, (ast.Is, ast.IsNot)) and right is None:
            if isinstance(left, Node):
                if left.maybe_none:
                    return UNKNOWN
                return isinstance(op, ast.IsNot)
            if isinstance(left, (Instance, Param, ActFn, BoundMethod, FuncRef)):
                return isinstance(op, ast.IsNot)
        if left is UNKNOWN or right is UNKNOWN or not is_concrete(left) or not is_concrete(right):
            return UNKNOWN
        try:
            return bool(_CMPOPS[type(op)](left, right))
        except TypeError:
            return UNKNOWN

    def _eval_IfExp(self, expr, env, module, state):
        truth = self.truth(self.eval(expr.test, env, module, state))
        if truth is True:
            return self.eval(expr.body, env, module, state)
        if truth is False:
            return self.eval(expr.orelse, env, module, state)
        a = self.eval(expr.body, env, module, state)
        b = self.eval(expr.orelse, env, module, state)
        if is_concrete(a) and is_concrete(b) and a == b:
            return a
        return Node("choice", "", (_symbolic(a), _symbolic(b)))

    def truth(self, value: Any) -> bool | None:
        if value is UNKNOWN:
            return None
        if isinstance(value, Node):
            return None
        if isinstance(value, (Instance, Param, ActFn, FuncRef, BoundMethod, SourceClass)):
            return True
        if is_concrete(value):
            return bool(value)
        return None

    def _eval_ListComp(self, expr, env, module, state):
        return self._comprehension(expr, env, module, state)

    def _eval_GeneratorExp(self, expr, env, module, state):
        return self._comprehension(expr, env, module, state)

    def _eval_SetComp(self, expr, env, module, state):
        items = self._comprehension(expr, env, module, state)
        if isinstance(items, list) and all(is_concrete(i) for i in items):
            try:
                return set(items)
            except TypeError:  # unhashable items
                return UNKNOWN
        return UNKNOWN

    def _eval_DictComp(self, expr, env, module, state):
        """``{key: value for ...}`` as a dict when every key is concrete."""
        pair = ast.Tuple(elts=[expr.key, expr.value], ctx=ast.Load())
        items = self._comprehension(ast.ListComp(elt=pair, generators=expr.generators), env, module, state)
        if not isinstance(items, list) or not all(isinstance(i, tuple) and is_concrete(i[0]) for i in items):
            return UNKNOWN
        try:
            return dict(items)
        except TypeError:  # an unhashable key
            return UNKNOWN

    def _comprehension(self, expr, env, module, state):
        if len(expr.generators) != 1:
            return UNKNOWN
        gen = expr.generators[0]
        iterable = self.eval(gen.iter, env, module, state)
        items = self.iterate(iterable)
        if items is None:
            return UNKNOWN
        target_names = {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        uses_target = any(isinstance(n, ast.Name) and n.id in target_names for n in ast.walk(expr.elt))
        out = []
        local = dict(env)
        if not uses_target and not gen.ifs and items:
            self.assign(gen.target, items[0], local, module, state)
            first = self.eval(expr.elt, local, module, state)
            if isinstance(first, Instance):
                # the same module, constructed once per item: share the evaluation
                return [first] + [_clone_instance(first) for _ in items[1:]]
            return [first] * len(items)
        for item in items[:MAX_UNROLL]:
            self.assign(gen.target, item, local, module, state)
            if gen.ifs and not all(self.truth(self.eval(c, local, module, state)) is True for c in gen.ifs):
                continue
            out.append(self.eval(expr.elt, local, module, state))
        return out

    def _eval_Call(self, expr, env, module, state):
        func = self.eval(expr.func, env, module, state)
        args: list = []
        reads: dict[str, frozenset[str]] = {}
        for index, arg in enumerate(expr.args):
            frame = self.capture()
            try:
                value = self.eval(arg.value if isinstance(arg, ast.Starred) else arg, env, module, state)
            finally:
                self.release(frame)
            if isinstance(arg, ast.Starred):
                if isinstance(value, (list, tuple)):
                    args.extend(value)
                continue
            reads[str(index)] = frozenset(frame)
            args.append(value)
        kwargs: dict[str, Any] = {}
        for kw in expr.keywords:
            frame = self.capture()
            try:
                value = self.eval(kw.value, env, module, state)
            finally:
                self.release(frame)
            if kw.arg is None:
                if isinstance(value, dict):
                    kwargs.update({k: v for k, v in value.items() if isinstance(k, str)})
                continue
            reads[kw.arg] = frozenset(frame)
            kwargs[kw.arg] = value
        return self.call(func, args, kwargs, reads, expr, module, env)

    def call(self, func: Any, args: list, kwargs: dict, reads: dict, expr: ast.Call, module, env) -> Any:
        if isinstance(func, SourceClass):
            if self._is_data_class(func):  # a ModelOutput built in forward: a value, like the external ones
                return Node(
                    "call",
                    f"{func.module.dotted}.{func.name}",
                    tuple(_symbolic(a) for a in args),
                    tuple((k, _symbolic(v)) for k, v in kwargs.items()),
                )
            init_reads = _map_reads(self, func, reads, len(args))
            return self.instantiate(func, args, kwargs, init_reads)
        if isinstance(func, External):
            return self.call_external(func, args, kwargs, reads)
        if isinstance(func, BoundMethod):
            obj = func.obj
            call_args = ([obj] if obj is not None else []) + args
            if _is_staticmethod(func.node):
                call_args = args
            states = self.call_function(func.cls.module, func.node, call_args, kwargs, owner=func.cls)
            return _merge_returns(states)
        if isinstance(func, FuncRef):
            if all(is_concrete(a) or isinstance(a, ConfigProxy) for a in [*args, *kwargs.values()]):
                states = self.call_function(func.module, func.node, args, kwargs)
                value = _merge_returns(states)
                if value is not UNKNOWN and not isinstance(value, Node):
                    return value
            return Node(
                "func",
                func.name,
                tuple(_symbolic(a) for a in args),
                tuple((k, _symbolic(v)) for k, v in kwargs.items()),
                ref=func,
            )
        if isinstance(func, Instance):
            if func.cls == MODULE_LIST:
                return UNKNOWN
            return Node(
                "module",
                func.name or "",
                tuple(_symbolic(a) for a in args),
                tuple((k, _symbolic(v)) for k, v in kwargs.items()),
                ref=func,
            )
        if isinstance(func, ActFn):
            return Node("act", func.name, tuple(_symbolic(a) for a in args), ref=func)
        if isinstance(func, BoundBuiltin):
            return self.call_builtin_method(func, args, kwargs)
        if func is super:
            obj = env.get("self")
            owner = env.get("__class__")
            if isinstance(obj, Instance) and isinstance(owner, SourceClass):
                return SuperRef(obj, owner)
            return UNKNOWN
        if isinstance(func, Node) and func.kind == "attr":
            return Node(
                "method",
                func.name,
                (func.args[0], *(_symbolic(a) for a in args)),
                tuple((k, _symbolic(v)) for k, v in kwargs.items()),
            )
        if callable(func) and func in _BUILTIN_FUNCS:
            return _BUILTIN_FUNCS[func](self, args, kwargs)
        if isinstance(func, Node):
            return Node(
                "call",
                "?",
                (func, *(_symbolic(a) for a in args)),
                tuple((k, _symbolic(v)) for k, v in kwargs.items()),
            )
        if any(isinstance(a, Node) for a in [*args, *kwargs.values()]):
            return Node(
                "call",
                "?",
                tuple(_symbolic(a) for a in args),
                tuple((k, _symbolic(v)) for k, v in kwargs.items()),
            )
        return UNKNOWN

    def call_external(self, func: External, args: list, kwargs: dict, reads: dict) -> Any:
        qual = func.qualname
        short = func.short
        modules = set(EXTERNAL_MODULES) | {"ModuleList", "Sequential", "Parameter", "Buffer"}
        if short in modules and qual.startswith(("torch", "transformers.pytorch_utils")):
            named = _map_external_reads(short, reads)
            return self._external_instance(func, args, kwargs, named)
        if short in ("empty", "zeros", "ones", "randn", "rand", "full") and qual.startswith("torch"):
            dims = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
            if short == "full":
                dims = args[0] if args else ()
            shape = tuple(dims) if all(isinstance(d, int) for d in dims) else None
            dtype = kwargs.get("dtype")
            f32 = isinstance(dtype, External) and dtype.short in ("float32", "float")
            return TensorInit(shape, short, f32)
        if short == "tensor" and qual.startswith("torch") and args and _number_like(args[0]):
            return args[0]
        if qual.startswith("math.") and all(_number_like(a) for a in args):
            fn = getattr(math, short, None)
            if fn is not None:
                try:
                    return fn(*args)
                except (ValueError, TypeError, ArithmeticError):
                    return UNKNOWN
        if qual in ("copy.deepcopy", "copy.copy") and len(args) == 1 and isinstance(args[0], ConfigProxy):
            return args[0].copy()
        if short == "get_activation" and args and isinstance(args[0], str):
            return ActFn(args[0])
        return Node(
            "call",
            qual,
            tuple(_symbolic(a) for a in args),
            tuple((k, _symbolic(v)) for k, v in kwargs.items()),
        )

    def call_builtin_method(self, func: BoundBuiltin, args: list, kwargs: dict) -> Any:
        obj, name = func.obj, func.name
        if name == "__identity__":
            return obj
        if isinstance(obj, SuperRef):
            if name == "__init__":
                for qual in self.external_bases(obj.obj.cls):
                    short = qual.rsplit(".", 1)[-1]
                    if short in EXTERNAL_MODULES:
                        inner = self._external_instance(External(qual), args, kwargs, {})
                        for key, value in inner.args.items():
                            obj.obj.args.setdefault(key, value)
                        obj.obj.attrs.setdefault("__base_module__", short)
                        break
                return None
            return Node("call", f"super.{name}", tuple(_symbolic(a) for a in args))
        if isinstance(obj, Instance) and obj.cls == MODULE_LIST:
            if name in ("append", "extend") and args:
                items = obj.attrs.setdefault("items", [])
                if name == "append":
                    items.append(args[0])
                elif isinstance(args[0], (list, tuple)):
                    items.extend(args[0])
            return None
        if not all(is_concrete(a) for a in [*args, *kwargs.values()]):
            return UNKNOWN
        try:
            return getattr(obj, name)(*args, **kwargs)
        except Exception:
            return UNKNOWN


@dataclass(frozen=True)
class SliceSym:
    lower: Any
    upper: Any
    step: Any


_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}


def _number_like(value: Any) -> bool:
    return isinstance(value, (int, float)) and value is not UNKNOWN


def _symbolic(value: Any) -> Any:
    if isinstance(value, Param):
        return Node("param", value.name or "", ref=value)
    if isinstance(value, Instance):
        return Node("instance", value.name or "", ref=value)
    return value


def _load(target: ast.expr) -> ast.expr:
    clone: Any = ast.copy_location(type(target)(**{f: getattr(target, f) for f in target._fields}), target)
    clone.ctx = ast.Load()  # a Name, Attribute, Subscript, ... target: each has a ctx
    return clone


def _is_none(default: ast.expr | None) -> bool:
    return isinstance(default, ast.Constant) and default.value is None


def _literal(expr: ast.expr) -> Any:
    try:
        return ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


def _is_staticmethod(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _config_key_in(expr: ast.expr) -> str | None:
    """The config attribute an expression reads (``config.hidden_act``)."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            base = node.value
            base_name = base.id if isinstance(base, ast.Name) else base.attr
            if base_name == "config":
                return node.attr
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            return node.args[1].value
    return None


def _merge_returns(states: list[State]) -> Any:
    values = [s.value for s in states if s.returned]
    if not values:
        return None if states else UNKNOWN
    first = values[0]
    if all(v is first for v in values):
        return first
    if all(is_concrete(v) for v in values) and all(v == first for v in values):
        return first
    if len(values) == 1:
        return first
    return Node("choice", "", tuple(_symbolic(v) for v in values))


def _clone_instance(instance: Instance) -> Instance:
    return Instance(
        instance.cls,
        dict(instance.attrs),
        dict(instance.args),
        dict(instance.reads),
        instance.name,
        dict(instance.attr_reads),
    )


def _map_reads(interp: Interpreter, cls: SourceClass, reads: dict, nargs: int) -> dict[str, frozenset[str]]:
    found = interp.find_method(cls, "__init__")
    if found is None:
        return dict(reads)
    params = [a.arg for a in found[1].args.posonlyargs + found[1].args.args][1:]
    out = {}
    for key, value in reads.items():
        if key.isdigit():
            index = int(key)
            if index < len(params):
                out[params[index]] = value
        else:
            out[key] = value
    return out


def _map_external_reads(short: str, reads: dict) -> dict[str, frozenset[str]]:
    positional = EXTERNAL_MODULES.get(short, ((), {}))[0]
    out = {}
    for key, value in reads.items():
        if key.isdigit():
            index = int(key)
            if index < len(positional):
                out[positional[index]] = value
        else:
            out[key] = value
    return out


def _b_getattr(interp: Interpreter, args, kwargs):
    if len(args) >= 2 and isinstance(args[1], str):
        default = args[2] if len(args) > 2 else UNKNOWN
        return interp.getattr(args[0], args[1], default)
    return UNKNOWN


def _b_hasattr(interp: Interpreter, args, kwargs):
    if len(args) == 2 and isinstance(args[1], str):
        if isinstance(args[0], ConfigProxy):
            for frame in interp._log:
                frame.add(args[1])
            return args[0].has(args[1])
        if isinstance(args[0], Instance):
            return args[1] in args[0].attrs or UNKNOWN
    return UNKNOWN


def _concrete_builtin(fn):
    def run(interp, args, kwargs):
        if not all(is_concrete(a) for a in [*args, *kwargs.values()]):
            return UNKNOWN
        try:
            return fn(*args, **kwargs)
        except Exception:
            return UNKNOWN

    return run


def _b_enumerate(interp: Interpreter, args):
    if len(args) == 1 and isinstance(args[0], Instance) and args[0].cls == MODULE_LIST:
        items = args[0].attrs.get("items", [])
        if interp.every_layer:
            return list(enumerate(items))
        return _FirstOnly((0, items[0])) if items else UNKNOWN
    if len(args) == 1 and is_concrete(args[0]):
        return list(enumerate(args[0]))
    return UNKNOWN


@dataclass(frozen=True)
class _FirstOnly:
    """A loop over the layers of a model: analysed for the first one."""

    value: Any


def _b_len(interp, args, kwargs):
    if args and isinstance(args[0], Instance) and args[0].cls == MODULE_LIST:
        return len(args[0].attrs.get("items", []))
    return _concrete_builtin(len)(interp, args, kwargs)


def _b_isinstance(interp, args, kwargs):
    if len(args) == 2 and is_concrete(args[0]) and args[1] in (int, float, str, bool, list, tuple, dict):
        return isinstance(args[0], args[1])
    return UNKNOWN


_BUILTINS: dict[str, Any] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "len": len,
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "sum": sum,
    "range": range,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "getattr": getattr,
    "hasattr": hasattr,
    "isinstance": isinstance,
    "super": super,
    "enumerate": enumerate,
    "zip": zip,
    "sorted": sorted,
    "any": any,
    "all": all,
    "True": True,
    "False": False,
    "None": None,
}
_BUILTIN_FUNCS = {
    int: _concrete_builtin(int),
    float: _concrete_builtin(float),
    bool: _concrete_builtin(bool),
    str: _concrete_builtin(str),
    len: _b_len,
    min: _concrete_builtin(min),
    max: _concrete_builtin(max),
    abs: _concrete_builtin(abs),
    round: _concrete_builtin(round),
    sum: _concrete_builtin(sum),
    range: _concrete_builtin(range),
    list: _concrete_builtin(list),
    tuple: _concrete_builtin(tuple),
    dict: _concrete_builtin(dict),
    getattr: _b_getattr,
    hasattr: _b_hasattr,
    isinstance: _b_isinstance,
    enumerate: lambda interp, args, kwargs: _b_enumerate(interp, args),
    zip: _concrete_builtin(lambda *x: list(zip(*x, strict=False))),
    sorted: _concrete_builtin(sorted),
    any: _concrete_builtin(any),
    all: _concrete_builtin(all),
}


# ---- graph helpers -------------------------------------------------------------


def children_of(value: Any) -> Iterable[Any]:
    if isinstance(value, Node):
        yield from value.args
        for _, v in value.kwargs:
            yield v
    elif isinstance(value, (tuple, list)):
        yield from value
    elif isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, SliceSym):
        yield from (value.lower, value.upper, value.step)


def walk(value: Any) -> Iterator[Node]:
    """Every Node reachable from ``value`` (each once)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            if id(current) in seen:
                continue
            seen.add(id(current))
            yield current
        if isinstance(current, (Node, tuple, list, dict, SliceSym)):
            stack.extend(children_of(current))


def depends_on(value: Any, target: Node) -> bool:
    return any(node is target for node in walk(value))


def module_calls(value: Any) -> list[Node]:
    return [n for n in walk(value) if n.kind == "module"]
