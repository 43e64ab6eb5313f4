"""Calls: binding arguments to a function's parameters (symbolic inputs for
those a method is run without), running functions of the source (methods
inlined, concrete functions computed), constructing classes, and the nodes
calls become in ``forward`` (submodules, functions, tensor methods); the
methods of module lists, ``super()`` and Python values."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.core import MAX_DEPTH, PLAIN, CallOptions, FunctionNode
from autoport_cst.research.interp.expressions import AUTO
from autoport_cst.research.interp.externals import (
    EXTERNAL_MODULES,
    call_external,
    external_instance,
    transformers_activation,
)
from autoport_cst.research.interp.python_builtins import BUILTIN_FUNCS
from autoport_cst.research.interp.statements import Statements
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    UNKNOWN,
    ActFn,
    BoundBuiltin,
    BoundMethod,
    External,
    FuncRef,
    Instance,
    Node,
    Param,
    ScalarTensor,
    SourceClass,
    State,
    SuperRef,
    call_node,
    float32_dtype,
    is_concrete,
    merge_returns,
    symbolic,
)
from autoport_cst.research.sources import SourceModule, module_directory_name


class Calls(Statements):
    # ---- running functions of the source -------------------------------------------

    def call_function(
        self, module: SourceModule, fn: FunctionNode, args: list, kwargs: dict, how: CallOptions = PLAIN
    ) -> list[State]:
        """Run ``fn`` and return its end states (one per path)."""
        env = self.bind(fn, args, kwargs, how.inputs_symbolic)
        if how.record is not None:
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
            for name in params + [a.arg for a in fn.args.kwonlyargs]:
                if name in env:
                    how.record.args[name] = env[name]
            if how.reads:
                how.record.reads = dict(how.reads)
        if how.owner is not None:
            env["__class__"] = how.owner
        env["__module__"] = module
        if self.depth > MAX_DEPTH:
            return [State(env, True, UNKNOWN)]
        self.depth += 1
        try:
            states = self.exec_block(fn.body, [State(env)], module)
        finally:
            self.depth -= 1
        return states

    def bind(self, fn: FunctionNode, args: list, kwargs: dict, symbolic: bool) -> dict[str, Any]:
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
        how = CallOptions(owner=klass, inputs_symbolic=symbolic)
        return self.call_function(klass.module, fn, [instance, *args], kwargs or {}, how)

    # ---- call expressions ------------------------------------------------------------

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
                value = self._unpackable(value)
                if isinstance(value, (list, tuple)):
                    args.extend(value)
                elif isinstance(value, Node):  # its length unknown: kept in its place (view(*shape, -1, d))
                    args.append(Node("starred", "", (value,)))
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
                return call_node("call", f"{func.module.dotted}.{func.name}", args, kwargs)
            return self.instantiate(func, args, kwargs, self.constructor_reads(func, reads))
        if isinstance(func, External):
            act = transformers_activation(func)
            if act is not None:
                return Node("act", act.name, tuple(symbolic(a) for a in args), ref=act)
            value = call_external(func, args, kwargs, reads)
            if isinstance(value, Node) and value.kind == "call":
                return self._framework_function(func, args, kwargs, value)
            return value
        if isinstance(func, BoundMethod):
            call_args = ([func.obj] if func.obj is not None else []) + args
            if _is_staticmethod(func.node):
                call_args = args
            states = self.call_function(
                func.cls.module, func.node, call_args, kwargs, CallOptions(owner=func.cls)
            )
            return merge_returns(states)
        if isinstance(func, FuncRef):
            return self._call_source_function(func, args, kwargs)
        if isinstance(func, Instance):
            if func.cls == MODULE_LIST:
                return self._sequential(func, args, kwargs, expr, module, env)
            return call_node("module", func.name or "", args, kwargs, ref=func)
        if isinstance(func, ActFn):
            return Node("act", func.name, tuple(symbolic(a) for a in args), ref=func)
        if isinstance(func, BoundBuiltin):
            return self.call_builtin_method(func, args, kwargs)
        if func is super:
            obj = env.get("self")
            owner = env.get("__class__")
            if isinstance(obj, Instance) and isinstance(owner, SourceClass):
                return SuperRef(obj, owner)
            return UNKNOWN
        return self._call_value(func, args, kwargs)

    def _sequential(self, modules: Instance, args: list, kwargs: dict, expr: ast.Call, module, env) -> Any:
        """An ``nn.Sequential`` called on one input: each item called on what
        the one before returned (CTRL's ``ffn``: Linear, ReLU, Linear);
        unknown for a module list, which is not callable."""
        items = modules.attrs.get("items", [])
        if not modules.attrs.get("sequential") or len(args) != 1 or kwargs or not items:
            return UNKNOWN
        value = args[0]
        for item in items:
            value = self.call(item, [value], {}, {}, expr, module, env)
        return value

    def from_config(self, cls: SourceClass, config: Any, kwargs: dict) -> Any:
        """``cls._from_config(config, **kwargs)``: the class constructed on
        ``config``, the keywords PreTrainedModel takes for itself (dtype,
        attention implementation) left out, the others given to ``__init__``;
        for an auto class (``AutoModel.from_config(config.text_config)``),
        the base model class transformers maps the config's model_type to."""
        if cls.module.dotted.startswith(AUTO):
            if not isinstance(config, ConfigProxy) or cls.name != "AutoModel":
                return UNKNOWN
            dotted = base_model_class(config.read("model_type", None))
            found = self.resolve_dotted(dotted) if dotted else None
            if not isinstance(found, SourceClass):
                return UNKNOWN
            cls = found
        own = {k: v for k, v in kwargs.items() if k not in ("dtype", "torch_dtype", "attn_implementation")}
        return self.instantiate(cls, [config], own, {})

    def _unpackable(self, value: Any) -> Any:
        """A starred argument: a call of a source function on tensors (a
        ``func`` node) is run for what it returns when that is a tuple of its
        operands (Nemotron's ``F.layer_norm(*_cast_if_autocast_enabled(...))``)."""
        if not (isinstance(value, Node) and value.kind == "func" and isinstance(value.ref, FuncRef)):
            return value
        ref = value.ref
        returned = merge_returns(
            self.call_function(ref.module, ref.node, list(value.args), dict(value.kwargs))
        )
        return returned if isinstance(returned, (list, tuple)) else value

    def _call_source_function(self, func: FuncRef, args: list, kwargs: dict) -> Any:
        """A function of the source: computed when its arguments are concrete
        (and so is what it returns), a ``func`` node otherwise."""
        if all(is_concrete(a) or isinstance(a, ConfigProxy) for a in [*args, *kwargs.values()]):
            states = self.call_function(func.module, func.node, args, kwargs)
            value = merge_returns(states)
            if value is not UNKNOWN and not isinstance(value, Node):
                return value
        return call_node("func", func.name, args, kwargs, ref=func)

    def _framework_function(self, func: External, args: list, kwargs: dict, node: Node) -> Any:
        """A function of transformers outside the models (a helper the
        modeling code imports, as ``modeling_rope_utils.yarn_apply_mscale``):
        read from its source and computed, as a function of the modeling file
        is, when its arguments are concrete and so is what it returns;
        ``node``, the external call, otherwise."""
        if not func.qualname.startswith("transformers.") or not (args or kwargs):
            return node
        found = self.library.resolve(func.qualname)
        if found is None or found[1] not in found[0].functions:
            return node
        computed = self._call_source_function(FuncRef(found[0], found[0].functions[found[1]]), args, kwargs)
        return node if isinstance(computed, Node) else computed

    def _call_value(self, func: Any, args: list, kwargs: dict) -> Any:
        """A call of a computed value: a tensor method, a builtin, a tensor
        called, or an unknown callable on tensors."""
        if isinstance(func, Node) and func.kind == "attr":
            return Node(
                "method",
                func.name,
                (func.args[0], *(symbolic(a) for a in args)),
                tuple((k, symbolic(v)) for k, v in kwargs.items()),
            )
        if callable(func) and func in BUILTIN_FUNCS:
            return BUILTIN_FUNCS[func](self, args, kwargs)
        if isinstance(func, Node):
            return Node(
                "call",
                "?",
                (func, *(symbolic(a) for a in args)),
                tuple((k, symbolic(v)) for k, v in kwargs.items()),
            )
        if any(isinstance(a, Node) for a in [*args, *kwargs.values()]):
            return call_node("call", "?", args, kwargs)
        return UNKNOWN

    # ---- methods of module lists, super() and Python values ------------------------------

    def call_builtin_method(self, func: BoundBuiltin, args: list, kwargs: dict) -> Any:
        obj, name = func.obj, func.name
        if name == "__identity__":
            return obj
        if isinstance(obj, ScalarTensor) and name.startswith("__scalar_"):
            cast = name[len("__scalar_") : -2]
            target = args[0] if args else kwargs.get("dtype")
            if cast == "to" and (target is None or (isinstance(target, Node) and target.name == "device")):
                return obj  # moved, not cast
            return ScalarTensor(obj, cast != "float" and not (cast == "to" and float32_dtype(target)))
        if name == "get_text_config" and isinstance(obj, ConfigProxy):
            return obj.text_config()
        if name == "__from_config__" and isinstance(obj, SourceClass) and args:
            return self.from_config(obj, args[0], kwargs)
        if isinstance(obj, SuperRef):
            if name == "__init__":
                self._super_init(obj, args, kwargs)
                return None
            return Node("call", f"super.{name}", tuple(symbolic(a) for a in args))
        if isinstance(obj, Instance) and obj.cls == MODULE_LIST:
            if name in ("append", "extend") and args:
                items = obj.attrs.setdefault("items", [])
                if name == "append":
                    items.append(args[0])
                elif isinstance(args[0], (list, tuple)):
                    items.extend(args[0])
            return None
        if isinstance(obj, list) and name == "append":
            if len(args) != 1 or not isinstance(args[0], Instance):
                return UNKNOWN  # only modules are appended (Jamba's decoder_layers.append(layer_class(...)))
            obj.append(args[0])
            return None
        if not all(is_concrete(a) for a in [*args, *kwargs.values()]):
            return UNKNOWN
        try:
            return getattr(obj, name)(*args, **kwargs)
        except Exception:
            return UNKNOWN

    def _super_init(self, obj: SuperRef, args: list, kwargs: dict) -> None:
        """``super().__init__(...)`` into a torch module: its arguments
        recorded (where the source's ``__init__`` did not set them, or set
        them to other values than the module is built with: OPT's position
        table takes ``num_embeddings`` and builds ``num_embeddings + 2`` rows)."""
        for qual in self.external_bases(obj.obj.cls):
            short = qual.rsplit(".", 1)[-1]
            if short in EXTERNAL_MODULES:
                inner = external_instance(External(qual), args, kwargs, {})
                for key, value in inner.args.items():
                    if is_concrete(value) and value is not None:
                        obj.obj.args[key] = value
                    else:
                        obj.obj.args.setdefault(key, value)
                obj.obj.attrs.setdefault("__base_module__", short)
                if short == "LayerNorm":  # the parameters torch's LayerNorm creates, read by the forward
                    _layer_norm_parameters(obj.obj)
                break


def _layer_norm_parameters(instance: Instance) -> None:
    """``weight`` (ones) and ``bias`` (zeros) of a LayerNorm subclass, as the
    base class creates them (``elementwise_affine``, ``bias``)."""
    args = instance.args
    if args.get("elementwise_affine", True) is not True:
        return
    width = args.get("normalized_shape")
    shape = (width,) if isinstance(width, int) else tuple(width) if isinstance(width, (list, tuple)) else None
    instance.attrs.setdefault("weight", Param(shape, "ones", name="weight"))
    if args.get("bias", True) is True:
        instance.attrs.setdefault("bias", Param(shape, "zeros", name="bias"))


def _is_none(default: ast.expr | None) -> bool:
    return isinstance(default, ast.Constant) and default.value is None


def _literal(expr: ast.expr) -> Any:
    try:
        return ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


def _is_staticmethod(fn: FunctionNode) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def base_model_class(model_type: Any) -> str | None:
    """The dotted name of the base model class transformers maps
    ``model_type`` to (``AutoModel``), in the modeling file of its
    directory, or None."""
    if not isinstance(model_type, str):
        return None
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    except Exception:  # transformers missing or changed
        return None
    name = MODEL_MAPPING_NAMES.get(model_type)
    if not isinstance(name, str):
        return None
    directory = module_directory_name(model_type)
    return f"transformers.models.{directory}.modeling_{directory}.{name}"
