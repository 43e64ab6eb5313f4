"""Names from outside the analysed source: the ``torch.nn`` modules the
analysis looks into (built from their signatures), tensor factories,
``math`` on numbers, copies of the configuration and activation lookups;
any other external call is a node."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    UNKNOWN,
    ActFn,
    External,
    Instance,
    Node,
    Param,
    ScalarTensor,
    TensorInit,
    call_node,
    float32_dtype,
    is_concrete,
    number_like,
)

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
    "Softmax": (("dim",), {"dim": None}),  # called, a softmax (analysis.state.softmax_modules)
}
# attributes every torch.nn.Module has without setting them
MODULE_ATTRIBUTES = {"training", "dtype", "device", "_parameters", "_buffers", "_modules"}
_ACTIVATION_MODULES = {"SiLU": "silu", "GELU": "gelu", "ReLU": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
_TENSOR_FACTORIES = ("empty", "zeros", "ones", "randn", "rand", "full")
# the activation objects transformers.activations defines at module level
# (``gelu_new = get_activation("gelu_new")``, ...), which older modeling code
# imports by name (OpenAI GPT's ``ACT_FNS``): their ACT2FN names
_TRANSFORMERS_ACTIVATION_OBJECTS = {
    "gelu": "gelu",
    "gelu_fast": "gelu_fast",
    "gelu_new": "gelu_new",
    "gelu_python": "gelu_python",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "mish": "mish",
    "linear_act": "linear",
}


def transformers_activation(func: External) -> ActFn | None:
    """The activation ``func`` is when it names one of the activation objects
    of transformers.activations, else None."""
    module, _, short = func.qualname.rpartition(".")
    if module != "transformers.activations" or short not in _TRANSFORMERS_ACTIVATION_OBJECTS:
        return None
    return ActFn(_TRANSFORMERS_ACTIVATION_OBJECTS[short])


def external_instance(cls: External, args: list, kwargs: dict, reads: dict) -> Any:
    """What constructing the external module ``cls`` builds: a module list,
    a parameter, a buffer's value, an activation, or an instance with its
    arguments bound to the module's signature."""
    short = cls.short
    if cls.qualname.endswith("ModuleList") or cls.qualname.endswith("Sequential"):
        items = []
        if args and isinstance(args[0], (list, tuple)):
            items = list(args[0])
        elif cls.qualname.endswith("Sequential"):
            items = list(args)
        if cls.qualname.endswith("Sequential"):  # called, it runs its items in turn (calls.Calls.call)
            return Instance(MODULE_LIST, attrs={"items": items, "sequential": True})
        return Instance(MODULE_LIST, attrs={"items": items})
    if short in ("Parameter", "Buffer"):
        data = args[0] if args else kwargs.get("data", UNKNOWN)
        if (
            short == "Buffer"
        ):  # a table computed by a function of the source stays that call (CTRL's positions)
            # a mask computed from triangles is kept; a bare factory (DeepSeek V3's
            # Buffer(torch.zeros(n)), a learned routing bias) is not a value
            computed = isinstance(data, Node) and (data.kind == "func" or _triangles(data))
            kept = is_concrete(data) or computed
            return data if kept else UNKNOWN
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


def call_external(func: External, args: list, kwargs: dict, reads: dict) -> Any:
    qual = func.qualname
    short = func.short
    modules = set(EXTERNAL_MODULES) | {"ModuleList", "Sequential", "Parameter", "Buffer"}
    if short in modules and qual.startswith(("torch", "transformers.pytorch_utils")):
        return external_instance(func, args, kwargs, _map_external_reads(short, reads))
    if short in _TENSOR_FACTORIES and qual.startswith("torch"):
        return _tensor_init(short, args, kwargs)
    if short == "tensor" and qual.startswith("torch") and args and number_like(args[0]):
        if isinstance(args[0], float):  # a 0-dim tensor: rounded when made in the activations' dtype
            dtype = kwargs.get("dtype")
            return ScalarTensor(args[0], dtype is not None and not float32_dtype(dtype))
        return args[0]
    if qual.startswith(("math.", "numpy.")) and all(number_like(a) for a in args):  # np.sqrt(d) on a number
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
    if short == "is_flash_attention_requested" and qual.startswith("transformers"):
        return False  # research follows the eager computation (no flash-attention kernel on a CPU)
    if qual in ("torch.is_autocast_enabled", "torch.is_autocast_cpu_enabled"):
        return False  # inference runs outside autocast: a norm that casts under it (Nemotron's) does not
    return call_node("call", qual, args, kwargs)


# what a boolean mask built from triangles of a tensor factory is computed with
_MASK_OPS = frozenset(
    {"tril", "triu", "bitwise_xor", "logical_xor", "bitwise_and", "logical_and", "xor", "and"}
    | {"view", "reshape", "bool", "to", "contiguous"}
)


def _triangles(value: Any, depth: int = 0) -> bool:
    """``value`` is a mask computed from tensor factories by triangles and
    their combinations alone (GPT-Neo's ``tril(ones(n, n)) ^ tril(ones(n,
    n), -window)``), none of the module's inputs or parameters: a buffer
    that keeps it keeps the computation (``analysis.band_mask`` reads it)."""
    if isinstance(value, TensorInit):
        return True
    if not isinstance(value, Node) or value.kind not in ("call", "method", "binop") or depth > 32:
        return False
    if value.kind == "call" and not value.name.startswith("torch."):
        return False
    if value.name.rsplit(".", 1)[-1] not in _MASK_OPS:
        return False
    operands = (*value.args, *(v for _, v in value.kwargs))
    return all(
        _triangles(a, depth + 1) if isinstance(a, Node) else isinstance(a, (int, TensorInit, External))
        for a in operands
    ) and any(isinstance(a, (Node, TensorInit)) for a in operands)


def _tensor_init(short: str, args: list, kwargs: dict) -> TensorInit:
    """``torch.zeros(...)`` and the like: the shape (when every size is
    known), the fill and whether the dtype is float32."""
    dims = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    if short == "full":
        dims = args[0] if args else ()
    shape = tuple(dims) if all(isinstance(d, int) for d in dims) else None
    dtype = kwargs.get("dtype")
    f32 = isinstance(dtype, External) and dtype.short in ("float32", "float")
    value = None
    if short == "full":
        value = args[1] if len(args) > 1 else kwargs.get("fill_value")
    return TensorInit(shape, short, f32, value)


def _map_external_reads(short: str, reads: dict) -> dict[str, frozenset[str]]:
    """The config keys each argument read, keyed by the module's parameter names."""
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
