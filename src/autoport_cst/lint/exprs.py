"""What an expression is, as far as one file can tell: a tensor, a device,
a dtype. The answers are deliberately conservative: "unknown" never produces
a finding (anatomy §5.3)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.index import ClassInfo, FunctionInfo, ModuleIndex
from autoport_cst.transform.cst.vocabulary import dotted, method_name, self_attr, string_value, strip_optional

TORCH_DTYPES = frozenset(
    {
        "float32",
        "float",
        "float16",
        "half",
        "bfloat16",
        "float64",
        "double",
        "int8",
        "int16",
        "short",
        "int32",
        "int",
        "int64",
        "long",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "complex64",
        "complex128",
        "cfloat",
        "cdouble",
        "chalf",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "qint8",
        "quint8",
        "qint32",
    }
)
FLOAT32 = frozenset({"torch.float32", "torch.float"})

TENSOR_ANNOTATIONS = frozenset(
    {
        "torch.Tensor",
        "Tensor",
        "torch.FloatTensor",
        "torch.LongTensor",
        "torch.BoolTensor",
        "torch.IntTensor",
        "torch.HalfTensor",
        "torch.BFloat16Tensor",
        "torch.ByteTensor",
        "torch.DoubleTensor",
        "nn.Parameter",
        "torch.nn.Parameter",
        "Parameter",
    }
)

# torch functions that do not return tensors
NOT_TENSOR_FUNCTIONS = frozenset(
    {
        "device",
        "dtype",
        "finfo",
        "iinfo",
        "Size",
        "get_default_dtype",
        "is_tensor",
        "is_floating_point",
        "is_complex",
        "is_nonzero",
        "numel",
        "no_grad",
        "enable_grad",
        "inference_mode",
        "set_grad_enabled",
        "is_grad_enabled",
        "is_inference_mode_enabled",
        "manual_seed",
        "seed",
        "initial_seed",
        "set_default_dtype",
        "get_default_device",
        "set_default_device",
        "compile",
        "autocast",
        "set_printoptions",
        "typename",
        "is_storage",
        "result_type",
        "promote_types",
        "can_cast",
        "broadcast_shapes",
        "use_deterministic_algorithms",
        "are_deterministic_algorithms_enabled",
        "is_autocast_enabled",
        "get_num_threads",
        "set_num_threads",
        "equal",
        "allclose",
        "is_same_size",
        "sym_int",
        "sym_float",
        "sym_max",
        "sym_min",
    }
)
TENSOR_NAMESPACES = frozenset(
    {"torch", "torch.fft", "torch.linalg", "torch.special", "torch.nn.functional", "nn.functional", "F"}
)

# methods that exist on tensors and return tensors (and are unusual elsewhere)
TENSOR_METHODS = frozenset(
    {
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "prod",
        "norm",
        "std",
        "var",
        "abs",
        "any",
        "all",
        "float",
        "half",
        "bfloat16",
        "double",
        "long",
        "to",
        "view",
        "reshape",
        "contiguous",
        "clone",
        "detach",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "matmul",
        "cumsum",
        "cumprod",
        "sigmoid",
        "softmax",
        "log_softmax",
        "squeeze",
        "unsqueeze",
        "flatten",
        "masked_fill",
        "eq",
        "ne",
        "gt",
        "lt",
        "ge",
        "le",
        "count_nonzero",
        "nonzero",
        "transpose",
        "permute",
        "expand",
        "expand_as",
        "repeat",
        "repeat_interleave",
        "gather",
        "index_select",
        "cpu",
        "cuda",
        "type_as",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "new_tensor",
        "floor",
        "ceil",
        "clamp",
        "clip",
        "isnan",
        "isinf",
        "isfinite",
        "logical_and",
        "logical_or",
        "logical_not",
        "sub",
        "add",
        "mul",
        "div",
        "diff",
        "cos",
        "sin",
        "tanh",
        "relu",
        "narrow",
        "masked_fill_",
        "fill_",
        "zero_",
        "copy_",
        "index_put_",
        "add_",
        "mul_",
        "bool",
        "t",
        "sign",
        "neg",
        "reciprocal",
        "square",
        "logsumexp",
        "masked_select",
        "flip",
        "roll",
        "tril",
        "triu",
        "outer",
        "bmm",
        "mm",
        "einsum",
        "where",
        "sort",
        "topk",
        "argsort",
        "unique",
        "bincount",
        "int",
    }
)
NOT_TENSOR_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "names", "is_meta"}
)
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "grad", "real", "imag"})


def tensor_call(name: str | None) -> bool:
    """Whether a call of this dotted name returns a tensor (``torch.arange``,
    ``F.softmax``)."""
    if not name or "." not in name:
        return False
    namespace, _, function = name.rpartition(".")
    if namespace not in TENSOR_NAMESPACES:
        return False
    if function in NOT_TENSOR_FUNCTIONS:
        return False
    return function[:1].islower() or function == "Tensor"


def annotation_is_tensor(annotation: cst.BaseExpression | None) -> bool:
    for alternative in strip_optional(annotation):
        name = dotted(alternative) or (string_value(alternative) or "").strip()
        if name in TENSOR_ANNOTATIONS:
            return True
    return False


class Types:
    """Answers about expressions inside one function of one module. Looks at
    every assignment of a local (flow-insensitive): a name is a tensor when
    all its assignments are tensors, or when it is a parameter annotated as a
    tensor and never reassigned otherwise."""

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self._memo: dict[tuple[int, int], bool] = {}

    # -- tensors ------------------------------------------------------------

    def is_tensor(self, node: cst.BaseExpression, fn: FunctionInfo | None) -> bool:
        key = (id(node), id(fn))
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = False  # cycles: x = x + 1
        result = self._is_tensor(node, fn)
        self._memo[key] = result
        return result

    def _is_tensor(self, node: cst.BaseExpression, fn: FunctionInfo | None) -> bool:
        if isinstance(node, cst.Name):
            return self._name_is_tensor(node.value, fn)
        if isinstance(node, cst.Attribute):
            attr = node.attr.value
            if attr in NOT_TENSOR_ATTRIBUTES:
                return False
            owner = self_attr(node)
            if owner is not None and fn is not None:
                return self._attribute_is_tensor(owner, fn.method_class, fn)
            if attr in TENSOR_ATTRIBUTES:
                return self.is_tensor(node.value, fn)
            return False
        if isinstance(node, cst.Call):
            if tensor_call(dotted(node.func)):
                return True
            method = method_name(node)
            return method is not None and method in TENSOR_METHODS
        if isinstance(node, cst.Subscript):
            return self.is_tensor(node.value, fn)
        if isinstance(node, cst.BinaryOperation):
            return self.is_tensor(node.left, fn) or self.is_tensor(node.right, fn)
        if isinstance(node, cst.UnaryOperation):
            if isinstance(node.operator, cst.Not):
                return False
            return self.is_tensor(node.expression, fn)
        if isinstance(node, cst.Comparison):
            for target in node.comparisons:
                if isinstance(target.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)):
                    return False
            return self.is_tensor(node.left, fn) or any(
                self.is_tensor(t.comparator, fn) for t in node.comparisons
            )
        if isinstance(node, cst.IfExp):
            return self.is_tensor(node.body, fn) and self.is_tensor(node.orelse, fn)
        return False

    def _name_is_tensor(self, name: str, fn: FunctionInfo | None) -> bool:
        scope = fn
        while scope is not None:
            values = scope.assigns.get(name)
            if values:
                known = [v for v in values if v is not None]
                if len(known) < len(values):
                    return False
                return all(self.is_tensor(v, scope) for v in known)
            if name in scope.params:
                return annotation_is_tensor(scope.params[name])
            scope = scope.parent
        return False

    def _attribute_is_tensor(self, attr: str, cls: ClassInfo | None, fn: FunctionInfo) -> bool:
        if cls is None:
            return False
        values = cls.attrs.get(attr)
        if not values:
            return False
        for owner, value in values:
            name = dotted(value.func) if isinstance(value, cst.Call) else None
            if name in ("nn.Parameter", "torch.nn.Parameter", "Parameter"):
                continue
            if not self.is_tensor(value, owner):
                return False
        return True

    # -- devices and dtypes ------------------------------------------------

    def kind(self, node: cst.BaseExpression, fn: FunctionInfo | None, _depth: int = 0) -> str:
        """``device``, ``dtype``, ``none`` or ``unknown`` (anatomy §5.3)."""
        if isinstance(node, cst.Name):
            if node.value == "None":
                return "none"
            lowered = node.value.lower()
            if "dtype" in lowered:
                return "dtype"
            if "device" in lowered:
                return "device"
            return self._name_kind(node.value, fn, _depth)
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return "device"
        if isinstance(node, cst.Integer):
            return "device"  # .to(0) is cuda:0
        if isinstance(node, cst.Attribute):
            name = dotted(node)
            attr = node.attr.value
            if name is not None and name.startswith("torch.") and attr in TORCH_DTYPES:
                return "dtype"
            lowered = attr.lower()
            if "dtype" in lowered:
                return "dtype"
            if "device" in lowered:
                return "device"
            return "unknown"
        if isinstance(node, cst.Call):
            name = dotted(node.func)
            if name in ("torch.device", "device"):
                return "device"
            if name in ("torch.get_default_dtype", "torch.promote_types", "torch.result_type"):
                return "dtype"
            return "unknown"
        if isinstance(node, cst.IfExp):
            body = self.kind(node.body, fn, _depth + 1)
            orelse = self.kind(node.orelse, fn, _depth + 1)
            if body == orelse or orelse == "none":
                return body
            if body == "none":
                return orelse
            return "unknown"
        return "unknown"

    def _name_kind(self, name: str, fn: FunctionInfo | None, depth: int) -> str:
        if depth > 8:
            return "unknown"
        scope = fn
        while scope is not None:
            values = scope.assigns.get(name)
            if values:
                kinds = {"unknown" if v is None else self.kind(v, scope, depth + 1) for v in values}
                kinds.discard("none")
                return kinds.pop() if len(kinds) == 1 else "unknown"
            if name in scope.params:
                annotation = scope.params[name]
                for alternative in strip_optional(annotation):
                    text = dotted(alternative)
                    if text in ("torch.device", "device"):
                        return "device"
                    if text in ("torch.dtype", "dtype"):
                        return "dtype"
                return "unknown"
            scope = scope.parent
        return "unknown"


def dtype_name(node: cst.BaseExpression | None) -> str | None:
    """``torch.bfloat16`` for a dtype attribute, the text of a string."""
    if node is None:
        return None
    name = dotted(node)
    if name is not None:
        return name
    return string_value(node)
