"""Expression evaluation: one ``_eval_<node type>`` method per expression
kind (calls are in ``calls``), attribute access on every kind of value, and
comprehensions (unrolled over concrete iterables)."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.interp.classes import Classes
from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.core import MAX_UNROLL, CallOptions
from autoport_cst.research.interp.externals import EXTERNAL_MODULES, MODULE_ATTRIBUTES
from autoport_cst.research.interp.operators import binop, compare, truth, unary
from autoport_cst.research.interp.python_builtins import BUILTINS, SAFE_METHODS
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    UNKNOWN,
    ActFn,
    BoundBuiltin,
    BoundMethod,
    External,
    Instance,
    Node,
    Param,
    Raised,
    ScalarTensor,
    SliceSym,
    SourceClass,
    State,
    SuperRef,
    TensorInit,
    clone_instance,
    is_concrete,
    merge_returns,
    symbolic,
)
from autoport_cst.research.sources import SourceModule

# casts of a 0-dim tensor: its dtype (values.ScalarTensor.rounded) follows
_SCALAR_CASTS = ("to", "type_as", "half", "bfloat16", "float")
_IDENTITY_METHODS = ("to", "float", "item", "type_as", "clone", "detach", "half", "bfloat16")
# torch.nn.Module methods that return the module itself (moved or cast: InklingShortConvolution(...).to(dtype=...))
_MODULE_SELF_METHODS = ("to", "float", "half", "bfloat16", "double", "cpu", "requires_grad_", "train", "eval")
# the PreTrainedModel class methods that construct the class from a config (``MllamaTextModel._from_config``)
FROM_CONFIG = ("_from_config", "from_config")
# the package of transformers' auto classes (AutoModel.from_config builds the class of the config's model_type)
AUTO = "transformers.models.auto."


class Expressions(Classes):
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
            return BUILTINS.get(expr.id, UNKNOWN)
        return self.global_value(module, expr.id)

    def _eval_Attribute(self, expr, env, module, state):
        base = self.eval(expr.value, env, module, state)
        return self.getattr(base, expr.attr)

    # ---- attribute access ------------------------------------------------------

    def getattr(self, base: Any, name: str, default: Any = UNKNOWN) -> Any:
        if isinstance(base, ConfigProxy):
            if name == "get_text_config":
                return BoundBuiltin(base, name)  # calls.call_builtin_method
            return base.read(name, default)
        if isinstance(base, Instance):
            return self._instance_attribute(base, name, default)
        if isinstance(base, SuperRef):
            found = self.find_method(base.obj.cls, name, after=base.start)
            if found is not None:
                return BoundMethod(base.obj, found[0], found[1])
            return BoundBuiltin(base, name)
        if isinstance(base, External):
            return External(f"{base.qualname}.{name}")
        if isinstance(base, SourceClass):
            found = self.find_method(base, name)
            if name in FROM_CONFIG and (found is None or base.module.dotted.startswith(AUTO)):
                return BoundBuiltin(base, "__from_config__")  # calls.call_builtin_method
            if found is not None:
                return BoundMethod(None, found[0], found[1])
            return self.class_attribute(base, name)
        if isinstance(base, (Node, Param)) and name == "is_cuda":
            return False  # the code as it runs on CPU and Neuron: never a CUDA-only fast path
        if isinstance(base, Node):
            return Node("attr", name, (base,))
        if isinstance(base, Param):
            return Node("attr", name, (Node("param", base.name or "", ref=base),))
        if isinstance(base, ScalarTensor) and name in _SCALAR_CASTS:
            return BoundBuiltin(base, f"__scalar_{name}__")  # calls.call_builtin_method: the cast
        if isinstance(base, (int, float)) and not isinstance(base, bool):
            if name in _IDENTITY_METHODS:
                return BoundBuiltin(base, "__identity__")
            return UNKNOWN
        if isinstance(base, list) and name == "append":
            return BoundBuiltin(base, name)  # modules appended to a list (calls.call_builtin_method)
        for kind, allowed in SAFE_METHODS.items():
            if isinstance(base, kind) and name in allowed:
                return BoundBuiltin(base, name)
        if isinstance(base, (TensorInit, ActFn)):
            return UNKNOWN
        return default

    def _instance_attribute(self, base: Instance, name: str, default: Any) -> Any:
        """``module.name``: what ``__init__`` set, a method or property of its
        class, a class attribute, a constructor argument of a torch module;
        raises (drops the path) where the source's ``__init__`` never set it."""
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
                    states = self.call_function(
                        found[0].module, found[1], [base], {}, CallOptions(owner=found[0])
                    )
                    return merge_returns(states)
                return BoundMethod(base, found[0], found[1])
            value = self.class_attribute(base.cls, name)
            if value is not UNKNOWN:
                return value
        if base.cls == MODULE_LIST:
            return BoundBuiltin(base, name)
        if name in _MODULE_SELF_METHODS:
            return BoundBuiltin(base, "__identity__")
        if name in base.args:
            return base.args[name]
        if default is not UNKNOWN:
            return default
        if (
            isinstance(base.cls, SourceClass)
            and name not in MODULE_ATTRIBUTES
            and not any(q.rsplit(".", 1)[-1] in EXTERNAL_MODULES for q in self.external_bases(base.cls))
        ):
            # __init__ never set it: this path would raise AttributeError
            raise Raised()
        return Node("attr", name, (base,))

    # ---- subscripts and displays -------------------------------------------------

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
        if isinstance(base, tuple) and base and all(isinstance(b, ConfigProxy) for b in base):
            # a heterogeneous config's per-layer configs (config.per_layer_config[layer_idx])
            return base[index] if isinstance(index, int) and -len(base) <= index < len(base) else UNKNOWN
        if is_concrete(base) and is_concrete(index):
            try:
                return base[index]
            except (KeyError, IndexError, TypeError, ValueError):
                return _eager_default(base, index)
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
            if isinstance(k, (str, int, float, bool)) or k is None or _hashable_tuple(k):
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

    # ---- operators -------------------------------------------------------------

    def _eval_BinOp(self, expr, env, module, state):
        return binop(
            expr.op, self.eval(expr.left, env, module, state), self.eval(expr.right, env, module, state)
        )

    def _eval_UnaryOp(self, expr, env, module, state):
        return unary(expr.op, self.eval(expr.operand, env, module, state))

    def _eval_BoolOp(self, expr, env, module, state):
        is_and = isinstance(expr.op, ast.And)
        result: Any = None
        for value_expr in expr.values:
            value = self.eval(value_expr, env, module, state)
            known = truth(value)
            if not isinstance(known, bool):
                return UNKNOWN
            result = value
            if is_and and not known:
                return value
            if not is_and and known:
                return value
        return result

    def _eval_Compare(self, expr, env, module, state):
        left = self.eval(expr.left, env, module, state)
        for op, right_expr in zip(expr.ops, expr.comparators, strict=False):
            right = self.eval(right_expr, env, module, state)
            outcome = compare(op, left, right)
            if outcome is not True:
                return outcome
            left = right
        return True

    def _eval_IfExp(self, expr, env, module, state):
        known = truth(self.eval(expr.test, env, module, state))
        if known is True:
            return self.eval(expr.body, env, module, state)
        if known is False:
            return self.eval(expr.orelse, env, module, state)
        a = self.eval(expr.body, env, module, state)
        b = self.eval(expr.orelse, env, module, state)
        if is_concrete(a) and is_concrete(b) and a == b:
            return a
        return Node("choice", "", (symbolic(a), symbolic(b)))

    # ---- comprehensions ----------------------------------------------------------

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
                return [first] + [clone_instance(first) for _ in items[1:]]
            return [first] * len(items)
        for item in items[:MAX_UNROLL]:
            self.assign(gen.target, item, local, module, state)
            if gen.ifs and not all(truth(self.eval(c, local, module, state)) is True for c in gen.ifs):
                continue
            out.append(self.eval(expr.elt, local, module, state))
        return out


def _hashable_tuple(value: Any) -> bool:
    """A tuple of plain values, usable as a dict key (Inkling 2 Loop's layer
    classes keyed by ``(is_sliding, is_loop_layer)``)."""
    return isinstance(value, tuple) and all(
        isinstance(v, (str, int, float, bool)) or v is None or _hashable_tuple(v) for v in value
    )


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


def _eager_default(table: Any, index: Any) -> Any:
    """A table of implementations looked up by the config's attention
    implementation, which is None until transformers loads a model: the
    eager one (the computation the others reproduce)."""
    if index is None and isinstance(table, dict) and "eager" in table:
        return table["eager"]
    return UNKNOWN
