"""What the interpreter computes with: the unknown value, symbolic tensors
(:class:`Node`), modules built in ``__init__`` (:class:`Instance`) and their
parameters, references to the source's classes and functions and to names
outside it, bound methods, and the state of one path through a function."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autoport_cst.research.sources import SourceModule


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


class Raised(Exception):
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
    # what ``torch.full`` fills the tensor with (``torch.finfo(x.dtype).min``: a node), else None
    value: Any = field(default=None, compare=False)


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
    # attributes last assigned a constant written in the code (``self.scaling = 1.0``)
    literal_attrs: set[str] = field(default_factory=set)
    # the config keys an attribute read while it held None, before it was
    # assigned again (``self.s = config.s; if self.s is None: self.s = ...``):
    # the field whose None the code replaces by a default
    none_reads: dict[str, frozenset[str]] = field(default_factory=dict)

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


@dataclass(frozen=True)
class SliceSym:
    lower: Any
    upper: Any
    step: Any


@dataclass(frozen=True)
class FirstOnly:
    """A loop over the layers of a model: analysed for the first one."""

    value: Any


class ScalarTensor(float):
    """A number made a 0-dim tensor (``torch.tensor(x)``, a buffer of one).
    ``rounded``: made in, or cast to, a dtype other than float32 (Gemma's
    ``torch.tensor(s, dtype=hidden_states.dtype)``, ``embed_scale.to(weight.dtype)``):
    multiplied into a bfloat16 tensor it is the number rounded to bfloat16;
    a float32 one, like a Python float, multiplies unrounded."""

    rounded: bool

    def __new__(cls, value: float, rounded: bool) -> ScalarTensor:
        made = super().__new__(cls, value)
        made.rounded = rounded
        return made


def float32_dtype(value: Any) -> bool:
    """``value`` names float32 or float64 (``torch.float32``, ``torch.float``)."""
    return isinstance(value, External) and value.short in ("float32", "float", "float64", "double")


_CONCRETE = (int, float, str, bool, type(None), tuple, list, dict, set, frozenset, range, slice)


def is_concrete(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(is_concrete(v) for v in value)
    return isinstance(value, _CONCRETE) and not isinstance(value, _Unknown)


def number_like(value: Any) -> bool:
    return isinstance(value, (int, float)) and value is not UNKNOWN


def symbolic(value: Any) -> Any:
    """``value`` as an operand of a node: parameters and modules as nodes."""
    if isinstance(value, Param):
        return Node("param", value.name or "", ref=value)
    if isinstance(value, Instance):
        return Node("instance", value.name or "", ref=value)
    return value


def call_node(kind: str, name: str, args: list, kwargs: dict, ref: Any = None) -> Node:
    """A call's node: its arguments and keyword arguments as operands."""
    return Node(
        kind,
        name,
        tuple(symbolic(a) for a in args),
        tuple((k, symbolic(v)) for k, v in kwargs.items()),
        ref=ref,
    )


def merge_returns(states: list[State]) -> Any:
    """The value a call returns over its paths (a choice when they differ)."""
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
    return Node("choice", "", tuple(symbolic(v) for v in values))


def clone_instance(instance: Instance) -> Instance:
    return Instance(
        instance.cls,
        dict(instance.attrs),
        dict(instance.args),
        dict(instance.reads),
        instance.name,
        dict(instance.attr_reads),
        set(instance.literal_attrs),
        dict(instance.none_reads),
    )
