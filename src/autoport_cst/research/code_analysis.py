"""What the transformers modeling code computes, read from its source.

The causal-LM class named by the config's ``architectures`` is constructed
by the abstract interpreter of :mod:`autoport_cst.research.interp` against
the configuration (every layer), which gives the module tree (which
projections exist, with or without bias, their sizes, the parameter names a
checkpoint must hold). The ``forward`` methods are then run symbolically and
classified by what they compute:

- a norm by its arithmetic: mean subtraction (LayerNorm), root mean square
  only (RMSNorm), an additive bias, a ``(1 + weight)`` offset; never by the
  class name;
- the decoder layer by its data flow: which norm feeds each sublayer (pre),
  which norm is applied to a sublayer output before the residual add (post),
  whether the MLP reads the attention output (sequential) or not (parallel
  residual), scalars applied to sublayer outputs (residual multiplier);
- attention: input and output projections, q/k norms and their width, the
  keyword arguments given to the attention kernel (scaling, sliding window,
  softcap, sinks), the rotation function (halves or interleaved pairs);
- the MLP: an activation multiplied by a second projection (gated) or not
  (plain), fused gate/up projections, biases;
- MoE blocks: top-k routing, the score function, renormalisation, shared
  experts and their gate, router and routing biases;
- the backbone and head: scalars applied to embeddings (and extra
  embeddings added to them: learned positions), logit divisors and
  multipliers with the config field they come from, tanh softcapping;
- module names: which module plays each canonical (Llama-style) role, for
  ``checkpoint.key_map`` (see :mod:`autoport_cst.research.keys`);
- where q/k norms apply (to the projections, or to the rotated queries and
  keys: after RoPE);
- what the spec cannot describe (``attention.kind``, an attention-output
  norm, clamped projections, learned parameters in the attention, layers
  without softmax attention), for the planner to refuse.

Anything that does not match a known computation is reported as unknown,
with what was seen.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from autoport_cst.research.findings import CODE, INFERRED, Finding, known, unknown
from autoport_cst.research.interp import (
    MODULE_LIST,
    UNKNOWN,
    External,
    FuncRef,
    Instance,
    Interpreter,
    Node,
    Param,
    SliceSym,
    SourceClass,
    State,
    depends_on,
    walk,
)
from autoport_cst.research.sources import ModelingSource

# transformers activation names -> spec activation (a property of the
# activation functions, not of any model)
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "relu2": "relu2",
    "quick_gelu": "quick_gelu",
}
_TORCH_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu"}
_CASTS = {"to", "float", "type_as", "contiguous", "half", "bfloat16", "type", "clone"}


@dataclass
class CodeAnalysis:
    """The result: findings by spec field, plus the module tree facts the
    checkpoint cross-check needs."""

    module_path: str
    causal_lm: str
    findings: list[Finding] = field(default_factory=list)
    expected: dict[str, tuple | None] = field(default_factory=dict)  # state-dict key -> shape
    expert_keys: set[str] = field(default_factory=set)
    roles: dict[str, str] = field(default_factory=dict)  # module path -> role
    head_key: str | None = None
    embed_key: str | None = None
    tied_keys_declared: bool = False
    qkv_modules: list[str] = field(default_factory=list)  # module paths of layer 0
    o_module: str | None = None
    mlp_modules: list[str] = field(default_factory=list)
    norm_modules: list[str] = field(default_factory=list)
    qk_norm_modules: list[str] = field(default_factory=list)
    sink_keys: list[str] = field(default_factory=list)
    router_modules: list[str] = field(default_factory=list)
    layer_count: int | None = None
    dense_layers: list[int] = field(default_factory=list)
    moe_layers: list[int] = field(default_factory=list)
    # canonical (Llama-style) module path -> the module path the code builds.
    # Top-level entries are full paths (model, model.layers, model.embed_tokens,
    # model.norm, lm_head); decoder-layer entries are relative to a layer
    # (self_attn, self_attn.q_proj, mlp.down_proj, input_layernorm, ...).
    module_names: dict[str, str] = field(default_factory=dict)
    final_norm_key: str | None = None
    linear_modules: list[str] = field(default_factory=list)  # torch base of the layer projections: Linear | Conv1D

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def get(self, name: str) -> Finding | None:
        for finding in reversed(self.findings):
            if finding.field == name:
                return finding
        return None


class _Analyzer:
    def __init__(self, source: ModelingSource, config: Any, dims: dict[str, Any]) -> None:
        self.source = source
        self.interp = Interpreter(source.library, config)
        self.dims = dims
        self._forward_cache: dict[int, list[State]] = {}
        self._role_cache: dict[int, str] = {}
        self._norm_cache: dict[int, dict[str, Any]] = {}

    # ---- generic helpers ---------------------------------------------------

    def where(self, instance: Instance, method: str = "forward") -> str:
        if isinstance(instance.cls, SourceClass):
            found = self.interp.find_method(instance.cls, method)
            if found is not None:
                return f"{found[0].name}.{method} ({found[0].module.path.name}:{found[1].lineno})"
            return instance.cls.name
        return instance.cls.qualname

    def forward(self, instance: Instance) -> list[State]:
        key = id(instance)
        if key not in self._forward_cache:
            try:
                states = self.interp.run_method(instance, "forward", [])
            except RecursionError:  # pragma: no cover - pathological source
                states = []
            self._forward_cache[key] = [s for s in states if s.returned]
        return self._forward_cache[key]

    def outputs(self, instance: Instance) -> list[Any]:
        """The main output of each forward path (first element of a tuple)."""
        values = []
        for state in self.forward(instance):
            value = state.value
            if isinstance(value, (tuple, list)) and value:
                value = value[0]
            values.append(value)
        return values

    def base_module(self, instance: Instance) -> str | None:
        """torch.nn module kind of an instance (Linear, LayerNorm...)."""
        if isinstance(instance.cls, External):
            return instance.cls.short
        if "__base_module__" in instance.attrs:
            return instance.attrs["__base_module__"]
        if isinstance(instance.cls, SourceClass) and self.interp.find_method(instance.cls, "forward") is None:
            for qual in self.interp.external_bases(instance.cls):
                short = qual.rsplit(".", 1)[-1]
                if short in ("Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "Conv1D"):
                    return short
        return None

    def role(self, instance: Instance) -> str:
        key = id(instance)
        if key in self._role_cache:
            return self._role_cache[key]
        self._role_cache[key] = "other"  # against recursion
        role = self._role(instance)
        self._role_cache[key] = role
        return role

    def _role(self, instance: Instance) -> str:
        base = self.base_module(instance)
        if base in ("Linear", "Conv1D"):
            return "linear"
        if base == "Embedding":
            return "embedding"
        if base in ("LayerNorm", "RMSNorm"):
            return "norm"
        if base in ("Dropout", "Identity"):
            return "dropout"
        if instance.is_external:
            return "other"
        nodes = [n for state in self.forward(instance) for n in walk(state.value)]
        names = {n.name.rsplit(".", 1)[-1] for n in nodes if n.kind in ("call", "method")}
        if "topk" in names or any(
            "topk" in {m.name.rsplit(".", 1)[-1] for st in self.forward(child) for m in walk(st.value)
                       if m.kind in ("call", "method")}
            for _, child in instance.children()
            if not child.is_external
        ):
            return "moe"
        if self._calls_attention_kernel(instance, nodes) or names & {"softmax", "scaled_dot_product_attention"}:
            return "attention"
        if self.norm_info(instance)["kind"] is not None:
            return "norm"
        children = [child for _, child in instance.children()]
        if children and all(self.role(c) == "norm" for c in children):
            return "norm"
        if {"cos", "sin"} <= names:
            return "rotary"
        if any(n.kind == "act" or _torch_activation(n) for n in nodes) and any(
            n.kind == "module" and self.role(n.ref) == "linear" for n in nodes
        ):
            return "mlp"
        if any(isinstance(v, Param) and v.numel is not None and len(v.shape) == 3 for v in instance.attrs.values()):
            return "experts"
        return "other"

    def _calls_attention_kernel(self, instance: Instance, nodes: list[Node]) -> bool:
        for node in nodes:
            if node.kind == "call" and any(
                isinstance(a, Node) and a.kind == "instance" and a.ref is instance for a in node.args
            ):
                return True
        return False

    # ---- norms ---------------------------------------------------------------

    def norm_info(self, instance: Instance) -> dict[str, Any]:
        key = id(instance)
        if key not in self._norm_cache:
            self._norm_cache[key] = self._norm_info(instance)
        return self._norm_cache[key]

    def _norm_info(self, instance: Instance) -> dict[str, Any]:
        info: dict[str, Any] = {"kind": None, "bias": None, "unit_offset": None, "affine": True,
                                "evidence": "", "eps": None, "eps_key": None, "width": None}
        base = self.base_module(instance)
        args = instance.args
        info["width"] = _first_int(args)
        for name, value in args.items():
            if "eps" in name:
                info["eps"] = value if isinstance(value, (int, float)) else None
                keys = instance.reads.get(name, frozenset())
                info["eps_key"] = sorted(keys)[0] if len(keys) == 1 else None
                break
        own_forward = isinstance(instance.cls, SourceClass) and self.interp.find_method(instance.cls, "forward")
        if own_forward and base in ("LayerNorm", "RMSNorm"):
            base = None  # a subclass with its own forward: classified by what that computes
        if base == "LayerNorm":
            affine = args.get("elementwise_affine", True)
            info.update(kind="layernorm", bias=bool(affine and args.get("bias", True)), unit_offset=False,
                        affine=bool(affine), evidence=f"torch.nn.LayerNorm (bias={args.get('bias', True)})")
            return info
        if base == "RMSNorm":
            info.update(kind="rmsnorm", bias=False, unit_offset=False, evidence="torch.nn.RMSNorm")
            return info
        if instance.is_external:
            return info
        values = self.outputs(instance)
        if not values:
            return info
        kinds = {self._classify_norm_graph(instance, v)["kind"] for v in values}
        result = self._classify_norm_graph(instance, values[0])
        if len(kinds) > 1:
            return info
        result.update(width=info["width"], eps=info["eps"] if info["eps"] is not None else result.get("eps_constant"),
                      eps_key=info["eps_key"])
        if result["kind"] is not None:
            result["evidence"] = f"{self.where(instance)}: " + result["evidence"]
        return result

    def _classify_norm_graph(self, instance: Instance, value: Any) -> dict[str, Any]:
        info: dict[str, Any] = {"kind": None, "bias": None, "unit_offset": None, "affine": True, "evidence": ""}
        nodes = list(walk(value))
        inputs = [n for n in nodes if n.kind == "input"]
        if not inputs:
            return info
        params = {id(p): p for p in instance.attrs.values() if isinstance(p, Param)}

        def is_param(v: Any) -> Param | None:
            v = _strip_casts(v)
            if isinstance(v, Node) and v.kind == "param" and isinstance(v.ref, Param):
                return v.ref
            return None

        for n in nodes:
            short = n.name.rsplit(".", 1)[-1]
            if n.kind == "call" and short in ("layer_norm", "rms_norm"):
                weight = n.args[2] if len(n.args) > 2 else n.kwarg("weight")
                bias = n.args[3] if len(n.args) > 3 else n.kwarg("bias")
                info["kind"] = "layernorm" if short == "layer_norm" else "rmsnorm"
                eps = n.args[4] if len(n.args) > 4 else n.kwarg("eps")
                if _number(eps):
                    info["eps_constant"] = float(eps)
                info["bias"] = is_param(bias) is not None
                # the weight argument may be the parameter plus one (Nemotron's LayerNorm1P)
                offset = _strip_casts(weight)
                info["unit_offset"] = bool(
                    isinstance(offset, Node) and offset.kind == "binop" and offset.name == "add"
                    and any(_is_one(a) and _param_inside(b) for a, b in (offset.args, offset.args[::-1]))
                )
                info["affine"] = is_param(weight) is not None or info["unit_offset"]
                shown = "1 + param" if info["unit_offset"] else "param" if info["affine"] else repr(weight)
                info["evidence"] = f"calls {n.name}(weight={shown}, bias={'param' if info['bias'] else 'none'})"
                return info
        means = [n for n in nodes if (n.kind == "method" and n.name == "mean") or
                 (n.kind == "call" and n.name.endswith(".mean"))]
        variances = [n for n in nodes if n.kind in ("method", "call") and n.name.rsplit(".", 1)[-1] == "var"]
        squares = set()
        for m in means:
            operand = _strip_casts(m.args[0]) if m.args else None
            if _is_square(operand):
                squares.add(id(m))
        plain_means = [m for m in means if id(m) not in squares]
        subtracted = any(
            n.kind == "binop" and n.name == "sub" and any(depends_on(n.args[1], m) for m in plain_means)
            and depends_on(n.args[0], inputs[0])
            for n in nodes
        )
        root = any(n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] in ("rsqrt", "sqrt") for n in nodes)
        if (subtracted or variances) and root:
            info["kind"] = "layernorm"
            info["evidence"] = "subtracts the mean, divides by the standard deviation"
        elif squares and root and not subtracted:
            info["kind"] = "rmsnorm"
            info["evidence"] = "divides by the root mean square, no mean subtraction"
        else:
            return info
        # weight and bias: parameters multiplied / added to the normalised value
        info["unit_offset"] = False
        info["bias"] = False
        weight_used = False
        for n in nodes:
            if n.kind == "binop" and n.name == "add":
                a, b = n.args
                pa, pb = is_param(a), is_param(b)
                if (_is_one(a) and _param_inside(b)) or (_is_one(b) and _param_inside(a)):
                    info["unit_offset"] = True
                elif (pa is not None and depends_on(b, inputs[0])) or (pb is not None and depends_on(a, inputs[0])):
                    info["bias"] = True
            if n.kind == "binop" and n.name == "mul" and any(_param_inside(x) for x in n.args):
                weight_used = True
        info["affine"] = weight_used or bool(params)
        extras = []
        if info["unit_offset"]:
            extras.append("weight applied as (1 + weight)")
        if info["bias"]:
            extras.append("adds a bias")
        if extras:
            info["evidence"] += "; " + ", ".join(extras)
        return info

    # ---- the module tree -------------------------------------------------------

    def tree_keys(self, instance: Instance, prefix: str, out: dict[str, tuple | None],
                  roles: dict[str, str], experts: set[str], in_experts: bool = False) -> None:
        base = self.base_module(instance)
        path = prefix[:-1]
        role = self.role(instance)
        roles[path] = role
        in_experts = in_experts or role == "experts"
        args = instance.args

        def put(name: str, shape: tuple | None) -> None:
            out[prefix + name] = shape
            if in_experts:
                experts.add(prefix + name)

        if base in ("Linear",):
            i, o = args.get("in_features"), args.get("out_features")
            put("weight", (o, i) if isinstance(i, int) and isinstance(o, int) else None)
            if args.get("bias") is True:
                put("bias", (o,) if isinstance(o, int) else None)
        elif base == "Conv1D":
            nf, nx = args.get("nf"), args.get("nx")
            put("weight", (nx, nf) if isinstance(nf, int) and isinstance(nx, int) else None)
            put("bias", (nf,) if isinstance(nf, int) else None)
        elif base == "Embedding":
            n, d = args.get("num_embeddings"), args.get("embedding_dim")
            put("weight", (n, d) if isinstance(n, int) and isinstance(d, int) else None)
        elif base in ("LayerNorm", "RMSNorm"):
            shape = args.get("normalized_shape")
            shape = (shape,) if isinstance(shape, int) else tuple(shape) if isinstance(shape, (tuple, list)) else None
            if args.get("elementwise_affine", True):
                put("weight", shape)
                if base == "LayerNorm" and args.get("bias", True):
                    put("bias", shape)
        for name, param in instance.params():
            put(name, param.shape if param.shape is not None and all(isinstance(d, int) for d in param.shape)
                else None)
        for name, child in instance.children():
            self.tree_keys(child, f"{prefix}{name}.", out, roles, experts, in_experts)


def _first_int(args: dict[str, Any]) -> int | None:
    for key, value in args.items():
        if key == "config":
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, (tuple, list)) and value and isinstance(value[-1], int):
            return value[-1]
    return None


def _strip_casts(value: Any) -> Any:
    """Drop dtype casts and dropout (the identity at inference)."""
    while isinstance(value, Node) and value.args and (
        (value.kind == "method" and value.name in _CASTS)
        or (value.kind == "call" and value.name.rsplit(".", 1)[-1] == "dropout")
    ):
        value = value.args[0]
    return value


def _is_square(value: Any) -> bool:
    if not isinstance(value, Node):
        return False
    if value.kind == "method" and value.name == "pow" and len(value.args) > 1 and value.args[1] == 2:
        return True
    if value.kind == "call" and value.name.endswith(".pow") and len(value.args) > 1 and value.args[1] == 2:
        return True
    if value.kind == "binop" and value.name == "pow" and value.args[1] == 2:
        return True
    if value.kind == "method" and value.name == "square":
        return True
    if value.kind == "binop" and value.name == "mul":
        a, b = (_strip_casts(x) for x in value.args)
        return a is b
    return False


def _is_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def _param_inside(value: Any) -> bool:
    return any(n.kind == "param" for n in walk(value))


def _torch_activation(node: Node) -> str | None:
    if node.kind != "call":
        return None
    short = node.name.rsplit(".", 1)[-1]
    if short in _TORCH_ACTIVATIONS and ("functional" in node.name or node.name.startswith("torch")):
        if short == "gelu" and node.kwarg("approximate") == "tanh":
            return "gelu_pytorch_tanh"
        return short
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar_path(value: Any, stop: Callable[[Any], bool], max_steps: int = 64,
                 transparent: Callable[[Node], bool] | None = None) -> tuple[float, list[str], bool]:
    """Follow ``value`` down through casts, dropout and scalar products/
    quotients until ``stop`` matches. Returns (product of the scalars, the
    operations seen, whether ``stop`` was reached)."""
    factor = 1.0
    ops: list[str] = []
    for _ in range(max_steps):
        if stop(value):
            return factor, ops, True
        if not isinstance(value, Node):
            return factor, ops, False
        if _strip_casts(value) is not value:
            value = _strip_casts(value)
            continue
        if value.kind == "binop" and value.name in ("mul", "div"):
            a, b = value.args
            if value.name == "mul" and _number(b):
                factor *= b
                ops.append(f"* {b:g}")
                value = a
                continue
            if value.name == "mul" and _number(a):
                factor *= a
                ops.append(f"* {a:g}")
                value = b
                continue
            if value.name == "div" and _number(b) and b != 0:
                factor /= b
                ops.append(f"/ {b:g}")
                value = a
                continue
        if value.kind == "module" and value.ref is not None and value.args:
            if transparent is not None and transparent(value):
                value = value.args[0]
                continue
            return factor, ops, False
        if value.kind == "item" and value.args and isinstance(value.args[1], int):
            inner = value.args[0]
            if stop(inner):
                return factor, ops, True
            value = inner
            continue
        return factor, ops, False
    return factor, ops, False


def analyze_code(source: ModelingSource, config: Any, architecture: str, dims: dict[str, Any]) -> CodeAnalysis:
    """Analyse the modeling source of ``architecture`` against ``config``.

    ``dims`` holds the config analysis' sizes (hidden_size, num_heads,
    num_kv_heads, head_dim, vocab_size) used to tell q from k/v projections
    and per-head from full-width norms."""
    analyzer = _Analyzer(source, config, dims)
    module = source.module
    result = CodeAnalysis(str(source.path), architecture)
    if architecture not in module.classes:
        found = source.library.resolve(f"{module.dotted}.{architecture}")
        if found is None or architecture not in found[0].classes:
            result.add(unknown("code.causal_lm", CODE,
                               f"{architecture} is not defined in {source.path.name}"))
            return result
        module = found[0]
    cls = SourceClass(module, module.classes[architecture])
    interp = analyzer.interp
    try:
        top = interp.instantiate(cls, [interp.config], {}, {})
    except RecursionError:  # pragma: no cover
        result.add(unknown("code.causal_lm", CODE, f"could not evaluate {architecture}.__init__"))
        return result
    _Run(analyzer, result, top, cls).run()
    return result


class _Run:
    """One analysis: fills ``result`` from the instance tree ``top``."""

    def __init__(self, analyzer: _Analyzer, result: CodeAnalysis, top: Instance, cls: SourceClass) -> None:
        self.a = analyzer
        self.r = result
        self.top = top
        self.cls = cls
        self.dims = analyzer.dims

    def add(self, finding: Finding) -> None:
        self.r.add(finding)

    def run(self) -> None:
        a, r = self.a, self.r
        a.tree_keys(self.top, "", r.expected, r.roles, r.expert_keys)
        backbone, layers_attr, layers = self.find_backbone()
        if backbone is None or not layers:
            self.add(unknown("code.decoder_layers", CODE,
                             f"no list of decoder layers found under {self.cls.name}" + self.layer_list_shape()))
            return
        backbone_path, backbone_inst = backbone
        r.layer_count = len(layers)
        self.add(known(len(layers), "num_layers", CODE,
                       f"{backbone_inst.class_name}.{layers_attr}: {len(layers)} decoder layers built"))
        self.layers = layers
        self.layer_prefix = f"{backbone_path}.{layers_attr}." if backbone_path else f"{layers_attr}."
        r.module_names["model"] = backbone_path
        r.module_names["model.layers"] = self.layer_prefix[:-1]
        others = [i for i, layer in enumerate(layers)
                  if not any(self.a.role(c) == "attention" for _, c in layer.children())]
        if others:
            kinds = sorted({layers[i].class_name for i in others})
            self.add(known(tuple(others), "attention.other_mixer_layers", CODE,
                           f"{backbone_inst.class_name}.{layers_attr}: layers {_ranges(others)} of {len(layers)} "
                           f"have no softmax attention ({', '.join(kinds)})"))
        self.analyze_layers()
        self.analyze_backbone(backbone_path, backbone_inst)
        self.analyze_head(backbone_inst)

    # ---- structure -----------------------------------------------------------

    def find_backbone(self):
        """The instance holding the decoder layers (a ModuleList whose items
        have an attention and an MLP child)."""
        queue: list[tuple[str, Instance]] = [("", self.top)]
        seen = 0
        while queue and seen < 64:
            path, inst = queue.pop(0)
            seen += 1
            for name, value in inst.attrs.items():
                if isinstance(value, Instance) and value.cls == MODULE_LIST:
                    items = [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
                    if items and any(self.is_decoder_layer(item) for item in items):
                        return (path, inst), name, items
            for name, child in inst.children():
                if "." not in name:
                    queue.append((f"{path}.{name}" if path else name, child))
        return None, None, []

    def layer_list_shape(self) -> str:
        """What the first list of modules holds, when it is not a list of
        decoder layers with one attention and one MLP module; and whether
        the module owning it adds a second embedding (positions) to the
        token embedding."""
        queue: list[Instance] = [self.top]
        seen = 0
        while queue and seen < 64:
            inst = queue.pop(0)
            seen += 1
            for value in inst.attrs.values():
                if isinstance(value, Instance) and value.cls == MODULE_LIST:
                    items = [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
                    if not items:
                        continue
                    children = ", ".join(f"{n} ({self.a.role(c)})" for n, c in items[0].children())
                    text = f": its layers ({items[0].class_name}) hold {children or 'no modules'}, not one " \
                           "attention and one MLP module"
                    positions = self.added_embeddings(inst)
                    if positions:
                        text += f"; {inst.class_name} adds {', '.join(positions)} to the token embedding"
                        self.add(known(True, "embedding.learned_positions", CODE,
                                       f"{inst.class_name}.forward adds {', '.join(positions)} to the token embedding"))
                    return text
            queue += [c for n, c in inst.children() if "." not in n]
        return ""

    def added_embeddings(self, owner: Instance) -> list[str]:
        """Embeddings (other than the first) whose output ``owner``'s forward
        adds to another embedding's output."""
        embeds = {id(c): n for n, c in owner.children() if self.a.role(c) == "embedding"}
        if len(embeds) < 2:
            return []
        found = set()
        for state in self.a.forward(owner):
            for node in walk(state.value):
                if node.kind == "binop" and node.name == "add":
                    sides = [{embeds[id(m.ref)] for m in walk(arg) if m.kind == "module" and id(m.ref) in embeds}
                             for arg in node.args]
                    if all(sides) and sides[0] != sides[1]:
                        found |= (sides[0] | sides[1]) - {next(iter(embeds.values()))}
        return sorted(found)

    def is_decoder_layer(self, inst: Instance) -> bool:
        roles = {self.a.role(c) for _, c in inst.children()}
        return "attention" in roles and bool(roles & {"mlp", "moe"})

    # ---- decoder layers ------------------------------------------------------

    def analyze_layers(self) -> None:
        a = self.a
        layer0 = self.layers[0]
        children = dict(layer0.children())
        attn_names = [n for n, c in children.items() if a.role(c) == "attention"]
        if len(attn_names) != 1:
            self.add(unknown("code.attention", CODE, f"{layer0.class_name} has {len(attn_names)} attention modules"))
            return
        self.attn_name = attn_names[0]
        self.analyze_decoder_flow(layer0)
        self.analyze_attention(layer0)
        self.analyze_ffn()

    def analyze_decoder_flow(self, layer: Instance) -> None:
        a = self.a
        outs = a.outputs(layer)
        where = a.where(layer)
        if not outs:
            for name in ("norm.placement", "residual.parallel"):
                self.add(unknown(name, CODE, f"{where}: forward could not be followed"))
            return
        verdicts = [self.decoder_verdict(layer, value) for value in outs]
        first = verdicts[0]
        for key in ("placement", "parallel", "multiplier", "norm_names", "norm_roles"):
            values = {repr(v[key]) for v in verdicts}
            if len(values) > 1:
                first[key] = None
                first["why_" + key] = "differs between the paths of forward (a run-time condition)"
        # norms of the decoder layer
        norm_names = first.get("norm_names") or []
        norms = [dict(layer.children())[n] for n in norm_names if n in dict(layer.children())]
        self.r.norm_modules = [f"{self.layer_prefix}0.{n}" for n in norm_names]
        self.classify_norms(norms, norm_names, layer)
        self.canonical_norm_names(first.get("norm_roles"), first.get("placement"))
        if first["placement"] is None:
            self.add(unknown("norm.placement", CODE, f"{where}: {first.get('why_placement', '')}"))
        else:
            self.add(known(first["placement"], "norm.placement", CODE, f"{where}: {first['placement_evidence']}"))
        if first["parallel"] is None:
            self.add(unknown("residual.parallel", CODE, f"{where}: {first.get('why_parallel', '')}"))
        else:
            self.add(known(first["parallel"], "residual.parallel", CODE, f"{where}: {first['parallel_evidence']}"))
        if first["multiplier"] is None and "why_multiplier" in first:
            self.add(unknown("residual.multiplier", CODE, f"{where}: {first['why_multiplier']}"))
        else:
            value = first["multiplier"]
            self.add(known(value, "residual.multiplier", CODE,
                           f"{where}: sublayer outputs scaled by {value:g} before the residual add"
                           if value is not None else f"{where}: sublayer outputs added unscaled"))

    def canonical_norm_names(self, roles: dict[str, str | None] | None, placement: str | None) -> None:
        """The decoder-layer norms under the names the references load:
        input_layernorm before the attention; post_attention_layernorm before
        the MLP (pre-norm) or on the attention output (post, sandwich);
        pre_feedforward_layernorm before the MLP (sandwich);
        post_feedforward_layernorm on the MLP output."""
        if not roles or placement is None:
            return
        names = self.r.module_names
        if placement == "pre":
            canonical = {"pre_attention": "input_layernorm", "pre_mlp": "post_attention_layernorm"}
            if roles.get("pre_attention") is not None and roles.get("pre_attention") == roles.get("pre_mlp"):
                canonical.pop("pre_mlp")  # one norm feeds both sublayers (parallel residual)
        elif placement == "sandwich":
            canonical = {"pre_attention": "input_layernorm", "post_attention": "post_attention_layernorm",
                         "pre_mlp": "pre_feedforward_layernorm", "post_mlp": "post_feedforward_layernorm"}
        else:
            canonical = {"post_attention": "post_attention_layernorm", "post_mlp": "post_feedforward_layernorm"}
        for role, name in canonical.items():
            if roles.get(role):
                names[name] = roles[role]

    def decoder_verdict(self, layer: Instance, value: Any) -> dict[str, Any]:
        a = self.a
        calls = [n for n in walk(value) if n.kind == "module" and n.ref is not None]
        subs = [n for n in calls if a.role(n.ref) in ("attention", "mlp", "moe")]
        attn = [n for n in subs if a.role(n.ref) == "attention"]
        ffn = [n for n in subs if a.role(n.ref) in ("mlp", "moe")]
        verdict: dict[str, Any] = {"placement": None, "parallel": None, "multiplier": None, "norm_names": [],
                                   "norm_roles": None}
        if len(attn) != 1 or len(ffn) != 1:
            verdict["why_placement"] = verdict["why_parallel"] = (
                f"found {len(attn)} attention and {len(ffn)} MLP calls in the output")
            return verdict
        S = {"attention": attn[0], "mlp": ffn[0]}
        pre: dict[str, Instance | None] = {}
        post: dict[str, Instance | None] = {}
        mults: dict[str, float] = {}
        for kind, call in S.items():
            arg = call.args[0] if call.args else call.kwarg("hidden_states")
            pre[kind] = self.norm_call(arg)
            branch = self.residual_branch(value, call)
            if branch is None:
                verdict["why_placement"] = f"no residual add found around the {kind} output"
                return verdict
            post[kind], mults[kind] = self.post_of(branch, call)
        names = []
        for kind in ("attention", "mlp"):
            for norm in (pre[kind], post[kind]):
                if norm is not None and norm.name and norm.name not in names:
                    names.append(norm.name)
        verdict["norm_names"] = names
        verdict["norm_roles"] = {
            f"{when}_{kind}": (norm.name if norm is not None else None)
            for kind in ("attention", "mlp") for when, norm in (("pre", pre[kind]), ("post", post[kind]))
        }
        has_pre = {k: v is not None for k, v in pre.items()}
        has_post = {k: v is not None for k, v in post.items()}
        desc = ", ".join(
            f"{k}: {'norm ' + (pre[k].name or '?') + ' before' if pre[k] else 'no norm before'}"
            f"{', norm ' + (post[k].name or '?') + ' on the output' if post[k] else ''}"
            for k in ("attention", "mlp"))
        if all(has_pre.values()) and not any(has_post.values()):
            verdict["placement"] = "pre"
        elif all(has_post.values()) and not any(has_pre.values()):
            verdict["placement"] = "post"
        elif all(has_pre.values()) and all(has_post.values()):
            verdict["placement"] = "sandwich"
        else:
            verdict["why_placement"] = f"mixed norm placement ({desc})"
        verdict["placement_evidence"] = desc
        mlp_arg = S["mlp"].args[0] if S["mlp"].args else S["mlp"].kwarg("hidden_states")
        if depends_on(mlp_arg, S["attention"]):
            verdict["parallel"] = "none"
            verdict["parallel_evidence"] = "the MLP input is computed from the attention output"
        else:
            shared = pre["attention"] is not None and pre["attention"] is pre["mlp"]
            attn_arg = S["attention"].args[0] if S["attention"].args else S["attention"].kwarg("hidden_states")
            shared = shared or attn_arg is mlp_arg
            verdict["parallel"] = "shared_norm" if shared else "separate_norms"
            verdict["parallel_evidence"] = (
                "attention and MLP read the same input and are summed"
                + (" (one norm)" if shared else " (separate norms)"))
        values = set(mults.values())
        if len(values) == 1:
            m = values.pop()
            verdict["multiplier"] = None if math.isclose(m, 1.0) else m
        else:
            verdict["why_multiplier"] = f"different scalars on the sublayer outputs: {mults}"
        return verdict

    def norm_call(self, value: Any) -> Instance | None:
        value = _strip_casts(value)
        for _ in range(8):
            if isinstance(value, Node) and value.kind == "module" and value.ref is not None:
                role = self.a.role(value.ref)
                if role == "norm":
                    return value.ref
                if role == "dropout" and value.args:
                    value = _strip_casts(value.args[0])
                    continue
            return None
        return None

    def residual_branch(self, value: Any, call: Node) -> Any:
        """The operand that carries ``call``'s output into the residual add
        closest to it."""
        candidates = []
        for node in walk(value):
            if node.kind != "binop" or node.name != "add":
                continue
            a_in, b_in = depends_on(node.args[0], call), depends_on(node.args[1], call)
            if a_in == b_in:
                continue
            branch = node.args[0] if a_in else node.args[1]
            other_subs = [n for n in walk(branch) if n.kind == "module" and n is not call
                          and self.a.role(n.ref) in ("attention", "mlp", "moe") and depends_on(n, call)]
            if not other_subs:
                candidates.append((node, branch))
        for node, branch in candidates:  # the innermost add: no other candidate inside its branch
            if not any(other is not node and depends_on(branch, other) for other, _ in candidates):
                return branch
        return None

    def post_of(self, branch: Any, call: Node) -> tuple[Instance | None, float]:
        """A norm applied to the sublayer output, and a scalar factor."""
        factor, _, reached = _scalar_path(branch, lambda v: v is call)
        if reached:
            return None, factor
        value = branch
        factor = 1.0
        for _ in range(8):
            f, _, _ = _scalar_path(value, lambda v: isinstance(v, Node) and v.kind == "module")
            factor *= f
            value = _peel_scalars(value)
            if isinstance(value, Node) and value.kind == "module" and value.ref is not None:
                role = self.a.role(value.ref)
                if role == "norm" and value.args and depends_on(value.args[0], call):
                    inner_factor, _, _ = _scalar_path(value.args[0], lambda v: v is call)
                    return value.ref, factor * inner_factor
                if role == "dropout" and value.args:
                    value = value.args[0]
                    continue
            break
        return None, factor

    def classify_norms(self, norms: list[Instance], names: list[str], layer: Instance) -> None:
        a = self.a
        if not norms:
            self.add(unknown("norm.kind", CODE, f"{layer.class_name}: no norm found in front of or after the sublayers"))
            return
        infos = [a.norm_info(n) for n in norms]
        for field_name in ("kind", "bias", "unit_offset"):
            values = {info[field_name] for info in infos}
            evidence = "; ".join(f"{name}: {info['evidence'] or 'unclassified'}" for name, info in zip(names, infos))
            if None in values or len(values) != 1:
                self.add(unknown(f"norm.{field_name}", CODE, evidence or "norm forward not classified"))
            else:
                self.add(known(values.pop(), f"norm.{field_name}", CODE, evidence))
        affine = {info["affine"] for info in infos}
        if affine == {False}:
            self.add(known(False, "code.norm_affine", CODE, "the decoder norms have no weight (non-parametric)"))
        eps_keys = {info["eps_key"] for info in infos}
        eps = {info["eps"] for info in infos}
        if len(eps_keys) == 1 and None not in eps_keys:
            key = eps_keys.pop()
            self.add(known(key, "norm.eps_key", CODE, f"{norms[0].class_name}(eps=config.{key})"))
        elif eps_keys == {None} and len(eps) == 1 and None not in eps:
            self.add(unknown("norm.eps_key", CODE, f"{norms[0].class_name}: the epsilon {next(iter(eps)):g} is a "
                                                   "constant in the code, not a config field"))
        else:
            self.add(unknown("norm.eps_key", CODE, f"norm eps read from {sorted(map(str, eps_keys))}"))
        if len(eps) == 1 and None not in eps:
            self.add(known(eps.pop(), "norm.eps", CODE, f"{norms[0].class_name} eps argument"))

    # ---- attention -------------------------------------------------------------

    def analyze_attention(self, layer0: Instance) -> None:
        a = self.a
        attn = dict(layer0.children())[self.attn_name]
        where = a.where(attn)
        prefix = f"{self.layer_prefix}0.{self.attn_name}."
        outs = a.outputs(attn)
        if not outs:
            self.add(unknown("attention.qkv_bias", CODE, f"{where}: forward could not be followed"))
            return
        out = outs[0]
        nodes = list(walk(out))
        linear_calls = [n for n in nodes if n.kind == "module" and n.ref is not None and a.role(n.ref) == "linear"]
        inputs, outputs = [], []
        for call in linear_calls:
            arg = call.args[0] if call.args else None
            if any(depends_on(arg, other) for other in linear_calls if other is not call):
                outputs.append(call)
            else:
                inputs.append(call)
        order = list(attn.attrs)
        in_insts = sorted(_unique([c.ref for c in inputs]), key=lambda i: order.index(i.name) if i.name in order else 99)
        out_insts = _unique([c.ref for c in outputs])
        self.r.qkv_modules = [prefix + (i.name or "?") for i in in_insts]
        self.r.o_module = prefix + (out_insts[0].name or "?") if len(out_insts) == 1 else None
        nh, nkv, hd = self.dims.get("num_heads"), self.dims.get("num_kv_heads"), self.dims.get("head_dim")
        code_hd = attn.attrs.get("head_dim", attn.attrs.get("head_size"))
        if isinstance(code_hd, int):
            hd = code_hd
        widths = [i.args.get("out_features") for i in in_insts]
        q_width = out_insts[0].args.get("in_features") if len(out_insts) == 1 else None
        if isinstance(hd, int) and hd and isinstance(q_width, int) and all(isinstance(w, int) for w in widths) \
                and widths and q_width % hd == 0 and (sum(widths) - q_width) % (2 * hd) == 0:
            nh, nkv = q_width // hd, (sum(widths) - q_width) // (2 * hd)
            self.add(known(nh, "attention.num_heads", CODE,
                           f"{where}: output projection reads {q_width} = {nh} heads x {hd}"))
            self.add(known(nkv, "attention.num_kv_heads", CODE,
                           f"{where}: input projections {widths} = q {q_width} + 2 x {nkv} KV heads x {hd}"))
        desc = ", ".join(f"{i.name}(out={i.args.get('out_features')}, bias={i.args.get('bias')})" for i in in_insts)
        biases = {i.args.get("bias") for i in in_insts}
        if not in_insts:
            self.add(unknown("attention.qkv_bias", CODE, f"{where}: no input projection found"))
        elif len(biases) == 1 and biases <= {True, False}:
            self.add(known(biases.pop(), "attention.qkv_bias", CODE, f"{where}: {desc}"))
        else:
            self.add(unknown("attention.qkv_bias", CODE, f"{where}: projections disagree: {desc}"))
        if len(out_insts) == 1 and out_insts[0].args.get("bias") in (True, False):
            o = out_insts[0]
            self.add(known(o.args["bias"], "attention.o_bias", CODE,
                           f"{where}: output projection {o.name}(bias={o.args['bias']})"))
        else:
            self.add(unknown("attention.o_bias", CODE, f"{where}: {len(out_insts)} output projections"))
        # fused projections
        if len(in_insts) == 1 and isinstance(nh, int) and isinstance(nkv, int) and isinstance(hd, int):
            width = in_insts[0].args.get("out_features")
            evidence = (f"{where}: one input projection {in_insts[0].name} of width {width}"
                        f" ((heads + 2 kv heads) x head_dim = {(nh + 2 * nkv) * hd})")
            if width == (nh + 2 * nkv) * hd:
                self.add(known(True, "code.fused_qkv", CODE, evidence))
                self.add(known(self.qkv_layout(nodes, inputs[0]), "code.qkv_layout", CODE,
                               f"{where}: how the fused output is split"))
            else:
                self.add(unknown("code.fused_qkv", CODE, evidence))
        elif len(in_insts) == 3:
            self.add(known(False, "code.fused_qkv", CODE, f"{where}: separate projections {desc}"))
        # head_dim as the code computes it
        head_dim = attn.attrs.get("head_dim", attn.attrs.get("head_size"))
        if isinstance(head_dim, int):
            self.add(known(head_dim, "attention.head_dim", CODE, f"{attn.class_name}.head_dim = {head_dim}"))
        # q/k norms: applied to a projection before the scores; a norm of the
        # attention's result (before the output projection) is something else
        kernels = self.kernel_calls(attn, nodes)
        mixers = kernels + [n for n in nodes if n.kind in ("call", "method")
                            and n.name.rsplit(".", 1)[-1] in ("softmax", "scaled_dot_product_attention")]
        qk, after = [], []
        for n in nodes:
            if n.kind == "module" and n.ref is not None and a.role(n.ref) == "norm":
                arg = n.args[0] if n.args else None
                if any(depends_on(arg, m) for m in mixers):
                    after.append(n)
                elif any(depends_on(arg, c) for c in inputs):
                    qk.append(n.ref)
                    if any(depends_on(arg, r) for r in nodes if self.is_rotation(r)):
                        self.add(known("after_rope", "attention.qk_norm_position", CODE,
                                       f"{where}: {n.ref.name} normalises the rotated {n.ref.name[:1]} (after RoPE)"))
        qk = _unique(qk)
        out_norms = _unique([n.ref for n in after if any(depends_on(o.args[0] if o.args else None, n) for o in outputs)])
        if out_norms:
            self.add(known(True, "attention.output_norm", CODE,
                           f"{where}: {', '.join(q.name or '?' for q in out_norms)} normalises the attention "
                           "output before the output projection"))
        else:
            self.add(known(False, "attention.output_norm", CODE, f"{where}: the output projection reads the "
                                                                "attention output directly"))
        self.attention_kind(attn, nodes, inputs, outputs, kernels, where)
        self.r.qk_norm_modules = [prefix + (q.name or "?") for q in qk]
        if not qk:
            self.add(known("none", "attention.qk_norm", CODE, f"{where}: no norm applied to queries or keys"))
        else:
            widths = {self.norm_width(q) for q in qk}
            kinds = {a.norm_info(q)["kind"] or self.child_norm_kind(q) for q in qk}
            if widths == {hd}:
                verdict = "per_head"
            elif isinstance(nh, int) and isinstance(hd, int) and widths <= {nh * hd, (nkv or 0) * hd} and widths:
                verdict = "full_width"
            else:
                verdict = None
            names = ", ".join(f"{q.name}(width {self.norm_width(q)})" for q in qk)
            if verdict is None:
                self.add(unknown("attention.qk_norm", CODE, f"{where}: q/k norms {names}, width not classified"))
            else:
                self.add(known(verdict, "attention.qk_norm", CODE, f"{where}: {names} applied to the projections"))
            if kinds and kinds != {"rmsnorm"}:
                self.add(known(sorted(k or "unknown" for k in kinds)[0], "code.qk_norm_kind", CODE,
                               f"{where}: q/k norm computes {kinds}"))
        # kernel keyword arguments
        kernel = self.kernel_call(attn, nodes)
        if kernel is None:
            self.explicit_attention(nodes, inputs, where, hd)
        else:
            self.kernel_arguments(attn, kernel, where, hd)
        self.attention_names(nodes, inputs, in_insts, out_insts, kernel)
        self.per_layer_attention(where)
        self.rope_style(nodes, inputs, attn, where)

    def attention_names(self, nodes: list[Node], inputs: list[Node], in_insts: list[Instance],
                        out_insts: list[Instance], kernel: Node | None) -> None:
        """Canonical names of the attention's modules: which input projection
        produces the queries, keys and values (the kernel's query, key and
        value arguments), the output projection, and the q/k norms."""
        a = self.a
        names = self.r.module_names
        base = self.attn_name
        names["self_attn"] = base
        for inst in in_insts + out_insts:
            self.r.linear_modules.append(a.base_module(inst) or "?")
        if len(out_insts) == 1 and out_insts[0].name:
            names["self_attn.o_proj"] = f"{base}.{out_insts[0].name}"
        if len(in_insts) == 1 and in_insts[0].name:
            names["self_attn.qkv_proj"] = f"{base}.{in_insts[0].name}"
        roles: dict[str, Instance] = {}
        if len(in_insts) == 3:
            if kernel is not None and len(kernel.args) >= 4:
                for role, arg in zip(("q_proj", "k_proj", "v_proj"), kernel.args[1:4]):
                    sources = _unique([c.ref for c in inputs if depends_on(arg, c)])
                    if len(sources) == 1:
                        roles[role] = sources[0]
            if len({id(v) for v in roles.values()}) != 3:
                roles = dict(zip(("q_proj", "k_proj", "v_proj"), in_insts))  # declaration order
            for role, inst in roles.items():
                if inst.name:
                    names[f"self_attn.{role}"] = f"{base}.{inst.name}"
        for n in nodes:
            if n.kind == "module" and n.ref is not None and a.role(n.ref) == "norm" and n.args and n.ref.name:
                normed = self.unrotated(n.args[0])
                for role, proj in (("q_norm", roles.get("q_proj")), ("k_norm", roles.get("k_proj"))):
                    if proj is not None and any(depends_on(normed, c) for c in inputs if c.ref is proj):
                        names[f"self_attn.{role}"] = f"{base}.{n.ref.name}"

    def unrotated(self, value: Any) -> Any:
        """What a rotated query or key was rotated from: the ``i``-th result
        of a RoPE function (``q, k = apply_rotary_pos_emb(q, k, cos, sin)``)
        is its ``i``-th argument rotated. Any other value is returned as it
        is. (Both results depend on both arguments through the call, so a
        norm after RoPE would otherwise read as a norm of q and of k.)"""
        if isinstance(value, Node) and value.kind == "item" and len(value.args) == 2:
            call, index = value.args
            if isinstance(call, Node) and isinstance(index, int) and self.is_rotation(call) and index < len(call.args):
                return call.args[index]
        return value

    def norm_width(self, inst: Instance) -> int | None:
        width = self.a.norm_info(inst)["width"]
        if width is None:
            width = _first_int(inst.args)
        return width

    def child_norm_kind(self, inst: Instance) -> str | None:
        kinds = {self.a.norm_info(c)["kind"] for _, c in inst.children()}
        return kinds.pop() if len(kinds) == 1 else None

    def qkv_layout(self, nodes: list[Node], proj: Node) -> str:
        for n in nodes:
            if n.kind == "method" and n.name in ("view", "reshape") and n.args and n.args[0] is proj:
                for m in nodes:
                    if m.kind == "method" and m.name in ("chunk", "split") and m.args and depends_on(m.args[0], n):
                        return "per_head_interleaved"
        return "concatenated"

    def kernel_calls(self, attn: Instance, nodes: list[Node]) -> list[Node]:
        return [n for n in nodes if n.kind == "call" and any(
            isinstance(x, Node) and x.kind == "instance" and x.ref is attn for x in n.args)]

    def attention_kind(self, attn: Instance, nodes: list[Node], inputs: list[Node], outputs: list[Node],
                       kernels: list[Node], where: str) -> None:
        """softmax (one kernel call on projections of the layer input),
        differential (the kernel called twice and the results combined) or
        latent (queries, keys or values from a projection of another
        projection); and learned parameters of the attention module that its
        computation uses beyond the projections, norms and sinks."""
        kind, evidence = "softmax", "one attention over projections of the layer input"
        if len(kernels) > 1:
            kind, evidence = "differential", f"the attention kernel is called {len(kernels)} times and combined"
        elif kernels and len(kernels[0].args) >= 4:
            chained = _unique([c.ref for c in outputs if any(depends_on(arg, c) for arg in kernels[0].args[1:4])])
            if chained:
                kind = "latent"
                evidence = (f"queries/keys/values come from {', '.join(c.name or '?' for c in chained)}, "
                            "projections of other projections (low-rank latent attention)")
        self.add(known(kind, "attention.kind", CODE, f"{where}: {evidence}"))
        clipped = [n for n in nodes if n.kind in ("method", "call") and n.args
                   and n.name.rsplit(".", 1)[-1] in ("clamp", "clamp_", "clip", "clip_")
                   and any(depends_on(n.args[0], c) for c in inputs)
                   and not any(depends_on(n.args[0], k) for k in kernels)]
        if clipped:
            self.add(known(True, "code.qkv_clip", CODE,
                           f"{where}: the projections are clamped before the attention ({clipped[0].name})"))
        sinks = {id(v.ref) for k in kernels for _, v in k.kwargs if isinstance(v, Node) and v.kind == "param"}
        own = [n for n in nodes if n.kind == "param" and isinstance(n.ref, Param) and id(n.ref) not in sinks
               and any(n.ref is p for _, p in attn.params())]
        names = sorted({name for name, p in attn.params() if any(p is n.ref for n in own)})
        if names:
            self.add(known(names, "code.attention_parameters", CODE,
                           f"{where}: the attention computation uses the parameters {', '.join(names)}"))

    def kernel_call(self, attn: Instance, nodes: list[Node]) -> Node | None:
        for n in nodes:
            if n.kind == "call" and any(
                isinstance(x, Node) and x.kind == "instance" and x.ref is attn for x in n.args
            ):
                return n
        return None

    def kernel_arguments(self, attn: Instance, kernel: Node, where: str, hd: Any) -> None:
        kwargs = dict(kernel.kwargs)
        scaling = kwargs.get("scaling", None)
        if "scaling" not in kwargs:
            self.add(known(None, "attention.scale", CODE, f"{where}: no scaling argument (kernel default)"))
        elif _number(scaling) and isinstance(hd, int):
            default = hd ** -0.5
            if math.isclose(scaling, default, rel_tol=1e-9):
                self.add(known(None, "attention.scale", CODE, f"{where}: scaling = head_dim ** -0.5"))
            else:
                self.add(known(float(scaling), "attention.scale", CODE,
                               f"{where}: scaling = {scaling:g} (head_dim ** -0.5 would be {default:g})"))
                self.scale_source(attn, float(scaling), where)
        else:
            self.add(unknown("attention.scale", CODE, f"{where}: scaling not computable from the config"))
        softcap = kwargs.get("softcap", None)
        if softcap is None or _number(softcap):
            self.add(known(float(softcap) if softcap is not None else None, "attention.softcap", CODE,
                           f"{where}: softcap={softcap!r}"))
        else:
            self.add(unknown("attention.softcap", CODE, f"{where}: softcap not computable"))
        sinks = [k for k, v in kernel.kwargs if isinstance(v, Node) and v.kind == "param"]
        if sinks:
            names = ", ".join(f"{k}=self.{dict(kernel.kwargs)[k].name}" for k in sinks)
            self.add(known(True, "attention.sinks", CODE, f"{where}: learned per-head logits passed to the kernel ({names})"))
            self.r.sink_keys = [f"{self.layer_prefix}0.{self.attn_name}.{dict(kernel.kwargs)[k].name}" for k in sinks]
        else:
            self.add(known(False, "attention.sinks", CODE, f"{where}: no parameter passed to the kernel"))

    def scale_source(self, attn: Instance, scaling: float, where: str) -> None:
        """The config field a non-default attention scale comes from, and how:
        the field itself (Granite's attention_multiplier) or its inverse
        square root (Gemma's query_pre_attn_scalar ** -0.5)."""
        config = self.a.interp.config
        candidates = []
        for attr, value in attn.attrs.items():
            if not (_number(value) and math.isclose(value, scaling, rel_tol=1e-9)):
                continue
            for key in sorted(attn.attr_reads.get(attr, ())):
                field_value = config.read(key, None) if config.has(key) else None
                if not _number(field_value) or field_value <= 0:
                    continue
                if math.isclose(field_value, scaling, rel_tol=1e-9):
                    candidates.append((key, "multiplier", f"self.{attr} = config.{key}"))
                elif math.isclose(field_value ** -0.5, scaling, rel_tol=1e-9):
                    candidates.append((key, "inverse_sqrt", f"self.{attr} = config.{key} ** -0.5"))
        found = {(k, f) for k, f, _ in candidates}
        if len(found) == 1:
            key, form, evidence = candidates[0]
            self.add(known(key, "attention.scale_key", CODE, f"{where}: {evidence}"))
            self.add(known(form, "attention.scale_form", CODE, f"{where}: {evidence}"))
        else:
            seen = ", ".join(e for _, _, e in candidates) or "no config field gives it"
            self.add(unknown("attention.scale_key", CODE, f"{where}: scaling {scaling:g}: {seen}"))

    def explicit_attention(self, nodes: list[Node], inputs: list[Node], where: str, hd: Any) -> None:
        """Attention written out (matmul, softmax) instead of a kernel call:
        the scale is the scalar applied to q @ k^T."""
        scores = [n for n in nodes if n.kind == "call" and n.name.endswith("matmul") and len(n.args) == 2
                  and all(any(depends_on(a, c) for c in inputs) for a in n.args)]
        softmax = [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax"]
        if not scores or not softmax:
            self.add(unknown("attention.scale", CODE, f"{where}: attention kernel call not found"))
            return
        factor, ops, reached = _scalar_path(_strip_casts(softmax[0].args[0]) if softmax[0].args else None,
                                            lambda v: any(v is s for s in scores))
        if not reached or not isinstance(hd, int):
            self.add(unknown("attention.scale", CODE, f"{where}: scores scaling not traced"))
            return
        default = hd ** -0.5
        if math.isclose(factor, default, rel_tol=1e-9):
            self.add(known(None, "attention.scale", CODE, f"{where}: scores scaled by head_dim ** -0.5"))
        else:
            self.add(known(float(factor), "attention.scale", CODE, f"{where}: scores {' '.join(ops) or 'unscaled'}"))
        self.add(known(False, "attention.sinks", CODE, f"{where}: explicit softmax over the scores only",
                       confidence=INFERRED))
        if any(n.kind == "call" and n.name.endswith("tanh") and any(depends_on(n, s) for s in scores) for n in nodes):
            self.add(unknown("attention.softcap", CODE, f"{where}: tanh applied to the scores"))
        else:
            self.add(known(None, "attention.softcap", CODE, f"{where}: no tanh on the scores"))

    def per_layer_attention(self, where: str) -> None:
        """Sliding window per layer: the kernel's ``sliding_window`` argument
        evaluated for every layer's attention module."""
        a = self.a
        windows = []
        rotary = []
        for layer in self.layers:
            attn = dict(layer.children()).get(self.attn_name)
            if attn is None:
                windows.append(UNKNOWN)
                continue
            outs = a.outputs(attn)
            if not outs:
                windows.append(UNKNOWN)
                continue
            nodes = list(walk(outs[0]))
            kernel = self.kernel_call(attn, nodes)
            value = dict(kernel.kwargs).get("sliding_window", None) if kernel is not None else UNKNOWN
            windows.append(value)
            rotary.append(any(n.kind == "func" for n in nodes if self.is_rotation(n)))
        if any(w is UNKNOWN or not (w is None or _number(w)) for w in windows):
            self.add(unknown("attention.sliding_window", CODE,
                             f"{where}: sliding_window argument not computable for every layer"))
        else:
            on = [w is not None and w > 0 for w in windows]
            if not any(on):
                self.add(known("none", "attention.sliding_window", CODE, f"{where}: no sliding window on any layer"))
            elif all(on):
                self.add(known("all", "attention.sliding_window", CODE,
                               f"{where}: sliding_window={windows[0]} on every layer"))
            else:
                layers = [i for i, o in enumerate(on) if o]
                self.add(known("per_layer", "attention.sliding_window", CODE,
                               f"{where}: sliding window on layers {_ranges(layers)} of {len(on)}"))
            sizes = {w for w in windows if w}
            if len(sizes) == 1:
                self.add(known(int(sizes.pop()), "attention.sliding_window_size", CODE, f"{where}: window length"))
        if rotary and not all(rotary) and any(rotary):
            nope = tuple(i for i, r in enumerate(rotary) if not r)
            self.add(known(nope, "rope.nope_layers", CODE, f"{where}: no rotation applied on layers {_ranges(list(nope))}"))
        elif rotary and all(rotary):
            self.add(known(None, "rope.nope_layers", CODE, f"{where}: rotation applied on every layer"))
        elif rotary:
            self.no_rotation = True
            self.add(known(None, "rope.nope_layers", CODE, f"{where}: no layer applies a rotation"))

    def is_rotation(self, node: Node) -> bool:
        if node.kind != "func" or not isinstance(node.ref, FuncRef):
            return False
        return _rotation_style(node.ref, self.a.interp) is not None

    def rope_style(self, nodes: list[Node], inputs: list[Node], attn: Instance, where: str) -> None:
        funcs = [n for n in nodes if n.kind == "func" and isinstance(n.ref, FuncRef)
                 and any(depends_on(arg, c) for arg in n.args for c in inputs)]
        styles = {}
        for n in funcs:
            style = _rotation_style(n.ref, self.a.interp)
            if style is not None:
                styles[n.ref.name] = style
        if not styles:
            rotary = self.find_rotary()
            if rotary is None or getattr(self, "no_rotation", False):
                self.add(known("none", "rope.type", CODE, f"{where}: no rotary embedding module and no rotation applied"))
            else:
                self.add(unknown("rope.style", CODE, f"{where}: rotation function not recognised"))
            return
        values = set(styles.values())
        names = ", ".join(f"{k} ({v})" for k, v in styles.items())
        if len(values) == 1:
            self.add(known(values.pop(), "rope.style", CODE, f"{where}: {names}"))
        else:
            self.add(unknown("rope.style", CODE, f"{where}: {names}"))
        self.rotary_dim(where)

    def find_rotary(self) -> Instance | None:
        stack = [self.top]
        seen = 0
        while stack and seen < 256:
            inst = stack.pop(0)
            seen += 1
            for _, child in inst.children():
                if self.a.role(child) == "rotary":
                    return child
                if not child.is_external and child.cls != MODULE_LIST and "." not in (child.name or ""):
                    stack.append(child)
        return None

    def rotary_dim(self, where: str) -> None:
        rotary = self.find_rotary()
        hd = self.dims.get("head_dim")
        if rotary is None or not isinstance(rotary.cls, SourceClass):
            self.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary embedding module not found"))
            return
        interp = self.a.interp
        dims = []
        for name in ("compute_default_rope_parameters", "__init__"):
            found = interp.find_method(rotary.cls, name)
            if found is None:
                continue
            klass, fn = found
            args = [interp.config] if name != "__init__" else [Instance(rotary.cls), interp.config]
            try:
                states = interp.call_function(klass.module, fn, args, {}, owner=klass)
            except RecursionError:  # pragma: no cover
                states = []
            for state in states:
                for value in [state.value, *state.env.values()]:
                    for n in walk(value):
                        if n.kind == "call" and n.name.endswith("arange") and len(n.args) >= 3 \
                                and n.args[0] == 0 and n.args[2] == 2 and isinstance(n.args[1], int):
                            dims.append(n.args[1])
            if dims:
                evidence = f"{klass.name}.{name}: inv_freq over {dims[0]} of head_dim {hd}"
                break
        if not dims or not isinstance(hd, int):
            self.add(unknown("rope.partial_rotary_factor", CODE,
                             f"{where}: rotary dimension not computable from {rotary.class_name}"))
            return
        if len(set(dims)) != 1:
            self.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary dims {sorted(set(dims))}"))
            return
        self.add(known(dims[0] / hd, "rope.partial_rotary_factor", CODE, evidence))

    # ---- MLP / MoE ---------------------------------------------------------------

    def analyze_ffn(self) -> None:
        a = self.a
        kinds_per_layer = []
        ffn_name = None
        for index, layer in enumerate(self.layers):
            children = dict(layer.children())
            names = [n for n, c in children.items() if a.role(c) in ("mlp", "moe")]
            if len(names) != 1:
                kinds_per_layer.append(None)
                continue
            ffn_name = ffn_name or names[0]
            kinds_per_layer.append(a.role(children[names[0]]))
        self.r.moe_layers = [i for i, k in enumerate(kinds_per_layer) if k == "moe"]
        self.r.dense_layers = [i for i, k in enumerate(kinds_per_layer) if k == "mlp"]
        if None in kinds_per_layer or ffn_name is None:
            self.add(unknown("mlp.kind", CODE, "a decoder layer has no single MLP or MoE module"))
            return
        if self.r.moe_layers and self.r.dense_layers:
            self.add(known(self.r.dense_layers, "code.dense_layers", CODE,
                           f"dense MLP on layers {_ranges(self.r.dense_layers)}, MoE on {_ranges(self.r.moe_layers)}"))
        dense_layer = self.layers[self.r.dense_layers[0]] if self.r.dense_layers else None
        moe_layer = self.layers[self.r.moe_layers[0]] if self.r.moe_layers else None
        if dense_layer is not None:
            idx = self.r.dense_layers[0]
            mlp = dict(dense_layer.children())[ffn_name]
            self.analyze_mlp(mlp, f"{self.layer_prefix}{idx}.{ffn_name}.", "mlp")
        if moe_layer is not None:
            idx = self.r.moe_layers[0]
            block = dict(moe_layer.children())[ffn_name]
            self.analyze_moe(block, f"{self.layer_prefix}{idx}.{ffn_name}.")
        else:
            self.add(known(None, "moe", CODE, "no top-k routed block in any decoder layer"))

    def mlp_facts(self, inst: Instance) -> dict[str, Any]:
        a = self.a
        facts: dict[str, Any] = {"kind": None, "act": None, "act_key": None, "bias": None, "fused": None,
                                 "intermediate": None, "evidence": "", "interleaved_gate_up": False}
        outs = a.outputs(inst)
        if not outs:
            facts["evidence"] = "forward could not be followed"
            return facts
        nodes = list(walk(outs[0]))
        acts = [n for n in nodes if n.kind == "act" or _torch_activation(n)]
        linear_calls = [n for n in nodes if n.kind == "module" and n.ref is not None and a.role(n.ref) == "linear"]
        order = list(inst.attrs)
        lin_insts = sorted(_unique([c.ref for c in linear_calls]),
                           key=lambda i: order.index(i.name) if i.name in order else 99)
        param_mm = [n for n in nodes if n.kind in ("binop", "call") and (n.name == "matmul" or n.name.endswith(".linear"))
                    and any(_param_inside(x) for x in n.args)]
        projections = linear_calls + param_mm
        if acts:
            act = acts[0]
            if act.kind == "act":
                facts["act"] = act.ref.name
                facts["act_key"] = act.ref.key
            else:
                facts["act"] = _torch_activation(act)
        else:
            sig = [n for n in nodes if n.kind == "call" and n.name.rsplit(".", 1)[-1] == "sigmoid"]
            facts["evidence"] = ("custom activation (x * sigmoid(alpha * x)-like)" if sig
                                 else "no activation function found")
            clamped = _clamped_swiglu(nodes)
            if clamped is not None:
                facts["act"], facts["glu"], facts["evidence"] = "silu", clamped, clamped["evidence"]
        gated = False
        for n in nodes:
            if n.kind == "binop" and n.name == "mul":
                x, y = n.args
                ax = any(m.kind == "act" or _torch_activation(m) or (m.kind == "call" and m.name.endswith("sigmoid"))
                         for m in walk(x))
                ay = any(m.kind == "act" or _torch_activation(m) or (m.kind == "call" and m.name.endswith("sigmoid"))
                         for m in walk(y))
                if ax != ay:
                    other = y if ax else x
                    act_side = x if ax else y
                    if any(depends_on(other, p) for p in projections) and not _only_scalar(other) and \
                            any(depends_on(act_side, p) for p in projections):
                        gated = True
                        break
        if acts or gated:
            facts["kind"] = "gated" if gated else "plain"
        chunks = [n for n in nodes if n.kind == "method" and n.name in ("chunk", "split") or
                  (n.kind == "call" and n.name.rsplit(".", 1)[-1] in ("chunk", "split"))]
        step2 = [n for n in nodes if n.kind == "item" and isinstance(n.args[1], (slice, tuple))
                 and _has_step2(n.args[1])]
        fused = bool(gated and (chunks or step2) and len(_unique([p.ref for p in linear_calls])) <= 2)
        if param_mm and gated and (chunks or step2):
            fused = True
        facts["fused"] = fused
        facts["interleaved_gate_up"] = bool(gated and step2)
        biases = [i.args.get("bias") for i in lin_insts]
        param_biases = [name for name, p in inst.params() if "bias" in name]
        if lin_insts and all(b in (True, False) for b in biases):
            facts["bias"] = any(biases) if len(set(biases)) == 1 else None
        elif param_mm:
            facts["bias"] = bool(param_biases)
        up = [i for i in lin_insts if isinstance(i.args.get("out_features"), int)
              and i.args.get("out_features") != self.dims.get("hidden_size")]
        if up:
            width = up[0].args["out_features"]
            facts["intermediate"] = width // 2 if fused else width
        facts["linears"] = [(i.name, i.args.get("out_features"), i.args.get("bias")) for i in lin_insts]
        facts["roles"] = self.mlp_roles(linear_calls, acts, gated, fused)
        return facts

    def mlp_roles(self, calls: list[Node], acts: list[Node], gated: bool, fused: bool) -> dict[str, str]:
        """Canonical MLP projection names (gate_proj, up_proj, down_proj,
        gate_up_proj) -> the attribute names the code uses."""
        outputs = [c for c in calls if any(depends_on(c.args[0] if c.args else None, o) for o in calls if o is not c)]
        inputs = [c for c in calls if not any(c is o for o in outputs)]
        out_insts = _unique([c.ref for c in outputs])
        in_insts = _unique([c.ref for c in inputs])
        roles: dict[str, str] = {}
        if len(out_insts) == 1 and out_insts[0].name:
            roles["down_proj"] = out_insts[0].name
        if len(in_insts) == 1 and in_insts[0].name:
            roles["gate_up_proj" if fused else "up_proj"] = in_insts[0].name
        elif len(in_insts) == 2 and gated:
            activated = [i for i in in_insts if any(
                depends_on(act, c) for act in acts for c in inputs if c.ref is i)]
            if len(activated) == 1:
                gate = activated[0]
                up = in_insts[1] if in_insts[0] is gate else in_insts[0]
                if gate.name and up.name:
                    roles["gate_proj"], roles["up_proj"] = gate.name, up.name
        return roles

    def analyze_mlp(self, mlp: Instance, prefix: str, field_prefix: str) -> None:
        where = self.a.where(mlp)
        facts = self.mlp_facts(mlp)
        self.r.mlp_modules = [prefix + (name or "?") for name, _, _ in facts.get("linears", [])]
        if field_prefix == "mlp":
            ffn = prefix[len(self.layer_prefix):].split(".", 1)[1].rstrip(".")  # "<index>.mlp." -> "mlp"
            self.r.module_names["mlp"] = ffn
            for role, name in facts.get("roles", {}).items():
                self.r.module_names[f"mlp.{role}"] = f"{ffn}.{name}"
            self.r.linear_modules += [self.a.base_module(c) or "?" for _, c in mlp.children()
                                      if self.a.role(c) == "linear"]
        self.mlp_findings(facts, where, field_prefix)
        if facts["intermediate"] is not None:
            self.add(known(facts["intermediate"], "mlp.intermediate_size", CODE,
                           f"{where}: projection width {facts['intermediate']}"))

    def mlp_findings(self, facts: dict[str, Any], where: str, field_prefix: str) -> None:
        if facts["kind"] is None:
            self.add(unknown(f"{field_prefix}.kind", CODE, f"{where}: {facts['evidence'] or 'not classified'}"))
        else:
            detail = "activation output multiplied by a second projection" if facts["kind"] == "gated" \
                else "activation applied to one projection, no product"
            self.add(known(facts["kind"], f"{field_prefix}.kind", CODE, f"{where}: {detail}"))
        act = facts["act"]
        glu = facts.get("glu")
        if act is None:
            self.add(unknown(f"{field_prefix}.activation", CODE, f"{where}: {facts['evidence'] or 'no activation'}"))
        elif glu is not None:
            self.add(known("silu", f"{field_prefix}.activation", CODE, f"{where}: {glu['evidence']}"))
        elif act not in ACTIVATIONS:
            self.add(unknown(f"{field_prefix}.activation", CODE, f"{where}: activation {act!r} has no spec value"))
        else:
            key = f" (config.{facts['act_key']} = {act!r})" if facts["act_key"] else f" ({act})"
            self.add(known(ACTIVATIONS[act], f"{field_prefix}.activation", CODE, f"{where}: ACT2FN{key}"))
        if facts["act_key"]:
            self.add(known(facts["act_key"], "code.activation_key", CODE, f"{where}: activation read from config.{facts['act_key']}"))
        if glu is not None:
            self.add(known("clamped_swiglu", f"{field_prefix}.glu", CODE, f"{where}: {glu['evidence']}"))
            self.add(known(glu["alpha"], f"{field_prefix}.glu_alpha", CODE, f"{where}: sigmoid gain {glu['alpha']}"))
            self.add(known(glu["limit"], f"{field_prefix}.glu_limit", CODE, f"{where}: clamp bound {glu['limit']}"))
        elif facts["kind"] == "gated":
            self.add(known("standard", f"{field_prefix}.glu", CODE, f"{where}: act(gate) * up"))
        if facts["bias"] is None:
            self.add(unknown(f"{field_prefix}.bias", CODE, f"{where}: projection biases not determined"))
        else:
            self.add(known(facts["bias"], f"{field_prefix}.bias", CODE,
                           f"{where}: " + (", ".join(f"{n}(bias={b})" for n, _, b in facts.get("linears", []))
                                           or ("bias parameters" if facts["bias"] else "no bias parameters"))))
        self.add(known(bool(facts["fused"]), "code.fused_gate_up", CODE,
                       f"{where}: " + ("gate and up come from one projection, split in forward"
                                       if facts["fused"] else "separate gate and up projections or no gate")))
        if facts["interleaved_gate_up"]:
            self.add(known(True, "code.interleaved_gate_up", CODE,
                           f"{where}: gate and up are the even and odd columns of the fused projection"))

    def analyze_moe(self, block: Instance, prefix: str) -> None:
        a = self.a
        where = a.where(block)
        children = list(block.children())
        # routing: the forward with the top-k call (the block's or a child's)
        routing_owner, routing_out = None, None
        for owner in [block] + [c for _, c in children if not c.is_external]:
            for value in [st.value for st in a.forward(owner)]:
                if any(n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk" for n in walk(value)):
                    routing_owner, routing_out = owner, value
                    break
            if routing_owner is not None:
                break
        facts: dict[str, Any] = {}
        rwhere = a.where(routing_owner) if routing_owner else where
        if routing_out is not None:
            facts.update(self.routing(routing_owner, routing_out, block))
        experts = None
        experts_name = None
        for name, child in block.attrs.items():
            if isinstance(child, Instance) and child.cls == MODULE_LIST:
                items = child.attrs.get("items", [])
                if len(items) > 1 and all(isinstance(i, Instance) and a.role(i) == "mlp" for i in items[:2]):
                    experts, experts_name = items, name
            elif isinstance(child, Instance) and a.role(child) == "experts":
                experts, experts_name = child, name
        shared = [(n, c) for n, c in children if a.role(c) == "mlp" and n != experts_name and "." not in n]
        gates = [(n, c) for n, c in children if a.base_module(c) == "Linear" and c.args.get("out_features") == 1]
        # number of experts and their width
        num_experts = None
        intermediate = None
        expert_facts = None
        if isinstance(experts, list):
            num_experts = len(experts)
            expert_facts = self.mlp_facts(experts[0])
            intermediate = expert_facts["intermediate"]
        elif isinstance(experts, Instance):
            shapes = [p.shape for _, p in experts.params() if p.shape and len(p.shape) == 3]
            firsts = {s[0] for s in shapes}
            num_experts = firsts.pop() if len(firsts) == 1 else None
            expert_facts = self.mlp_facts(experts)
            intermediate = self.expert_width(experts, shapes)
        if num_experts is None:
            router_width = facts.get("router_width")
            num_experts = router_width
        self.r.router_modules = [prefix + n for n, c in children
                                 if c is routing_owner or (a.base_module(c) == "Linear"
                                                           and c.args.get("out_features") == num_experts)]
        values = {
            "moe.num_experts": (num_experts, f"{where}: {experts_name} holds {num_experts} experts"),
            "moe.top_k": (facts.get("top_k"), f"{rwhere}: topk(k={facts.get('top_k')})"),
            "moe.intermediate_size": (intermediate, f"{where}: expert projection width {intermediate}"),
            "moe.router_activation": (facts.get("activation"), f"{rwhere}: {facts.get('activation_evidence', '')}"),
            "moe.norm_topk_prob": (facts.get("renorm"), f"{rwhere}: {facts.get('renorm_evidence', '')}"),
            "moe.router_bias": (facts.get("router_bias"), f"{rwhere}: {facts.get('router_bias_evidence', '')}"),
            "moe.routing_bias": (facts.get("routing_bias"), f"{rwhere}: {facts.get('routing_bias_evidence', '')}"),
        }
        for name, (value, evidence) in values.items():
            if value is None:
                self.add(unknown(name, CODE, evidence))
            else:
                self.add(known(value, name, CODE, evidence))
        self.add(known(len(shared), "moe.shared_experts", CODE,
                       f"{where}: " + (", ".join(f"{n} (width {self.mlp_facts(c)['intermediate']})" for n, c in shared)
                                       or "no always-on expert")))
        if shared:
            width = self.mlp_facts(shared[0][1])["intermediate"]
            if width is not None:
                self.add(known(width, "code.shared_expert_intermediate", CODE, f"{where}: {shared[0][0]} width"))
        has_gate = bool(gates and shared)
        self.add(known(has_gate, "moe.shared_expert_gate", CODE,
                       f"{where}: " + (f"{gates[0][0]} (width 1) gates the shared expert" if has_gate
                                       else "no gate on a shared expert")))
        if expert_facts is not None:
            self.mlp_findings(expert_facts, a.where(experts[0] if isinstance(experts, list) else experts), "mlp")
        if isinstance(experts, Instance):
            self.add(known(True, "code.stacked_experts", CODE,
                           f"{where}: experts stored as 3-D parameters {[n for n, _ in experts.params()]}"))
        if not self.r.dense_layers:
            self.add(known(None, "mlp.intermediate_size", CODE, f"{where}: no dense MLP layer"))
        router_params = [p for _, c in children if c is routing_owner for _, p in c.params()]
        router_f32 = any(p.float32 for p in router_params)
        self.add(known(router_f32, "code.router_param_float32", CODE,
                       f"{rwhere}: router weight created in {'float32' if router_f32 else 'the model dtype'}"))
        self.moe_extras(facts, rwhere, where, expert_facts, experts)
        if isinstance(experts, Instance):
            self.expert_input(block, experts, where)

    def expert_input(self, block: Instance, experts: Instance, where: str) -> None:
        """Experts that read the router-weighted input (Llama 4: experts(x *
        score), weights not applied to their outputs): no spec field describes it."""
        for out in self.a.outputs(block):
            nodes = list(walk(out))
            topks = [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk"]
            routed = [n for n in nodes if n.kind == "module" and n.ref is experts]
            for call in routed:
                first = call.args[0] if call.args else call.kwarg("hidden_states")
                scores = [n for n in nodes if n.kind == "module" and isinstance(n.ref, Instance)
                          and n.ref is not experts and self.a.role(n.ref) in ("router", "linear")]
                if isinstance(first, Node) and any(depends_on(first, t) for t in topks + scores):
                    self.add(known("router-weighted expert input", "unsupported.moe.expert_input_scaling", CODE,
                                   f"{where}: the experts read the hidden states multiplied by the router "
                                   "scores, not the hidden states"))
                    return

    def moe_extras(self, facts: dict[str, Any], rwhere: str, where: str, expert_facts: dict[str, Any] | None,
                   experts: Any) -> None:
        """The routed scaling factor, the dense layers, and what the spec cannot
        describe (``unsupported.moe.*`` findings: the plan refuses them)."""
        if "routed_scaling_evidence" in facts:
            self.add(known(facts.get("routed_scaling"), "moe.routed_scaling_factor", CODE,
                           f"{rwhere}: {facts['routed_scaling_evidence']}"))
        dense = tuple(self.r.dense_layers) if self.r.moe_layers and self.r.dense_layers else None
        self.add(known(dense, "moe.dense_layers", CODE,
                       f"{where}: " + (f"dense MLP instead of experts on layers {_ranges(list(dense))}" if dense
                                       else "experts on every layer")))
        if facts.get("group_limited"):
            self.add(known("group-limited routing", "unsupported.moe.group_limited_routing", CODE,
                           f"{rwhere}: {facts['group_evidence']}"))
        if expert_facts is not None and (expert_facts["kind"] is None or expert_facts["act"] is None):
            ewhere = self.a.where(experts[0] if isinstance(experts, list) else experts)
            self.add(known("expert computation", "unsupported.moe.expert_mlp", CODE,
                           f"{ewhere}: the experts are not act(x W_gate) * (x W_up) W_down with a known activation "
                           f"({expert_facts['evidence'] or 'not classified'})"))

    def expert_width(self, experts: Instance, shapes: list[tuple]) -> int | None:
        keys = [v for k, v in experts.attrs.items()
                if isinstance(v, int) and any("intermediate" in r for r in experts.attr_reads.get(k, ()))]
        hidden = self.dims.get("hidden_size")
        if len(set(keys)) == 1:
            return keys[0]
        dims = {d for s in shapes for d in s[1:] if d != hidden}
        if len(dims) == 2:
            small, big = sorted(dims)
            if big == 2 * small:
                return small
        if len(dims) == 1:
            return dims.pop()
        return None

    def routing(self, owner: Instance, value: Any, block: Instance | None = None) -> dict[str, Any]:
        nodes = list(walk(value))
        topk = next(n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk")
        facts: dict[str, Any] = {}
        k = topk.args[1] if len(topk.args) > 1 else topk.kwarg("k")
        facts["top_k"] = k if isinstance(k, int) else None
        scores = topk.args[0] if topk.args else None
        before = list(walk(scores))
        fn_before = [n.name.rsplit(".", 1)[-1] for n in before if n.kind in ("call", "method")
                     and n.name.rsplit(".", 1)[-1] in ("softmax", "sigmoid")]
        after_softmax = [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax"
                         and depends_on(n, topk)]
        if fn_before:
            facts["activation"] = "softmax" if fn_before[0] == "softmax" else "sigmoid"
            facts["activation_evidence"] = f"{fn_before[0]} over the router logits, then top-k"
        elif after_softmax:
            facts["activation"] = "softmax"
            facts["activation_evidence"] = "top-k of the logits, then softmax over the k values"
        elif any(n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "sigmoid" and depends_on(n, topk)
                 for n in nodes):
            # sigmoid is monotonic: the same experts as sigmoid first, then top-k
            facts["activation"] = "sigmoid"
            facts["activation_evidence"] = "top-k of the logits, then sigmoid of the k values"
        else:
            facts["activation_evidence"] = "no softmax or sigmoid around the top-k"
        renorm = any(
            n.kind == "binop" and n.name == "div" and depends_on(n.args[0], topk)
            and any(m.kind == "method" and m.name == "sum" for m in walk(n.args[1]))
            for n in nodes
        )
        if fn_before:
            facts["renorm"] = renorm
            facts["renorm_evidence"] = ("top-k weights divided by their sum" if renorm
                                        else "top-k weights used as computed")
        elif after_softmax:
            facts["renorm"] = True
            facts["renorm_evidence"] = "softmax over the top-k values sums to 1"
        elif facts.get("activation") == "sigmoid":
            facts["renorm"] = renorm
            facts["renorm_evidence"] = ("top-k weights divided by their sum" if renorm
                                        else "top-k weights used as computed")
        # router bias: the logits projection has a bias
        proj = [n for n in before if n.kind == "call" and n.name.endswith(".linear")]
        lin = [n for n in before if n.kind == "module" and n.ref is not None and self.a.base_module(n.ref) == "Linear"]
        if proj:
            bias = proj[0].args[2] if len(proj[0].args) > 2 else proj[0].kwarg("bias")
            facts["router_bias"] = isinstance(bias, Node) and bias.kind == "param"
            facts["router_bias_evidence"] = f"logits = linear(x, weight, bias={'param' if facts['router_bias'] else 'none'})"
            weight = proj[0].args[1] if len(proj[0].args) > 1 else None
            if isinstance(weight, Node) and isinstance(weight.ref, Param) and weight.ref.shape:
                facts["router_width"] = weight.ref.shape[0]
        elif lin:
            facts["router_bias"] = bool(lin[0].ref.args.get("bias"))
            facts["router_bias_evidence"] = f"router {lin[0].ref.name}(bias={lin[0].ref.args.get('bias')})"
            facts["router_width"] = lin[0].ref.args.get("out_features")
        else:
            facts["router_bias_evidence"] = "router projection not found"
        added = [n for n in before if n.kind == "binop" and n.name == "add" and any(
            isinstance(x, Node) and x.kind == "param" for x in map(_strip_casts, n.args))]
        facts["routing_bias"] = bool(added)
        facts["routing_bias_evidence"] = ("a per-expert parameter is added to the scores before top-k" if added
                                          else "top-k of the scores as computed")
        if not added:
            elsewhere = self.routing_bias_elsewhere(owner, block, before, facts.get("router_width"))
            if elsewhere:
                facts["routing_bias"] = True
                facts["routing_bias_evidence"] = elsewhere
        facts.update(self.routed_scaling(nodes, topk))
        facts.update(self.group_routing(nodes, topk, facts.get("router_width")))
        return facts

    def routing_bias_elsewhere(self, owner: Instance, block: Instance | None, before: list[Any],
                               experts: int | None) -> str | None:
        """A per-expert vector added to the scores that is not a parameter of
        the router's forward: a buffer (``nn.Buffer``), a vector the MoE block
        passes in, or the output of a submodule that adds one (ERNIE's
        ``moe_statics``). Returns the evidence, or None."""
        for n in before:
            if n.kind == "module" and isinstance(n.ref, Instance) and self.a.base_module(n.ref) != "Linear":
                for out in self.a.outputs(n.ref):
                    if any(m.kind == "binop" and m.name == "add"
                           and any(isinstance(x, Node) and x.kind == "param" for x in map(_strip_shape, m.args))
                           for m in walk(out)):
                        return (f"{n.ref.class_name} (self.{n.name}) adds a per-expert parameter to the scores "
                                "before top-k")
            if n.kind != "binop" or n.name != "add":
                continue
            for x in map(_strip_casts, n.args):
                if isinstance(x, Node) and x.kind == "input":
                    holders = [i for i in (owner, block) if isinstance(i, Instance)]
                    if any(name == x.name and p.shape and max(p.shape) == experts and _vector(p.shape)
                           for i in holders for name, p in i.params()) \
                            or any(x.name in _buffers(i) for i in holders):
                        return f"the per-expert vector {x.name} is passed in and added to the scores before top-k"
                elif x is UNKNOWN:
                    buffers = _added_buffers(owner)
                    if buffers:
                        return f"the per-expert buffer self.{buffers[0]} is added to the scores before top-k"
        return None

    def routed_scaling(self, nodes: list[Any], topk: Node) -> dict[str, Any]:
        """A constant the chosen experts' weights are multiplied by."""
        for n in nodes:
            if n.kind != "binop" or n.name != "mul":
                continue
            for x, y in (n.args, tuple(reversed(n.args))):
                if isinstance(y, (int, float)) and not isinstance(y, bool) and isinstance(x, Node) \
                        and depends_on(x, topk):
                    if math.isclose(float(y), 1.0):
                        return {"routed_scaling": None,
                                "routed_scaling_evidence": "top-k weights multiplied by 1.0 (no scaling)"}
                    return {"routed_scaling": float(y),
                            "routed_scaling_evidence": f"top-k weights multiplied by {float(y):g}"}
        return {"routed_scaling": None, "routed_scaling_evidence": "top-k weights not scaled by a constant"}

    def group_routing(self, nodes: list[Any], topk: Node, experts: int | None) -> dict[str, Any]:
        """Group-limited routing (DeepSeek-V3's n_group / topk_group): a top-k
        over per-group scores that masks the experts before the final top-k.
        It changes nothing when every group is kept."""
        inner = [n for n in nodes if n is not topk and n.kind in ("call", "method")
                 and n.name.rsplit(".", 1)[-1] == "topk" and depends_on(topk, n)]
        if not inner:
            return {}
        groups = None
        for n in nodes:
            if n.kind == "method" and n.name in ("view", "reshape") and len(n.args) == 4 \
                    and all(isinstance(d, int) for d in n.args[1:]) and n.args[1] == -1:
                g, per = n.args[2], n.args[3]
                if experts is None or g * per == experts:
                    groups = g
                    break
        kept = None
        for n in inner:
            source = n.args[0] if n.args else None
            if isinstance(source, Node) and source.kind == "method" and source.name == "sum":
                k = n.args[1] if len(n.args) > 1 else n.kwarg("k")
                kept = k if isinstance(k, int) else None
        if groups is not None and kept is not None and (groups == 1 or kept >= groups):
            return {"group_limited": False,
                    "group_evidence": f"{kept} of {groups} expert group(s) kept: no restriction"}
        detail = (f"experts restricted to the top {kept} of {groups} groups before the top-k"
                  if groups is not None and kept is not None
                  else "a top-k over expert groups masks the experts before the top-k")
        return {"group_limited": True, "group_evidence": detail}

    # ---- backbone and head --------------------------------------------------------

    def analyze_backbone(self, path: str, backbone: Instance) -> None:
        a = self.a
        where = a.where(backbone)
        embeds = [(n, c) for n, c in backbone.children() if a.role(c) == "embedding"]
        if len(embeds) < 1:
            self.add(unknown("embedding.scale", CODE, f"{where}: no token embedding found"))
            return
        embed_name, embed = embeds[0]
        self.r.embed_key = f"{path}.{embed_name}.weight" if path else f"{embed_name}.weight"
        self.r.module_names["model.embed_tokens"] = self.r.embed_key[: -len(".weight")]
        self.final_norm(path, backbone)
        if len(embeds) > 1:
            self.add(known([n for n, _ in embeds[1:]], "code.extra_embeddings", CODE,
                           f"{where}: more embeddings than the token embedding (absolute positions?)"))
            extra = {id(c): n for n, c in embeds[1:]}
            added = sorted({extra[id(n.ref)] for state in a.forward(backbone) for call in walk(state.value)
                            if call.kind == "module" and call.ref is self.layers[0]
                            for n in walk(call.args[0] if call.args else call.kwarg("hidden_states"))
                            if n.kind == "module" and id(n.ref) in extra})
            if added:
                self.add(known(True, "embedding.learned_positions", CODE,
                               f"{where}: the first layer's input adds {', '.join(added)} to the token embedding"))
        first_layer = self.layers[0]
        factors = set()
        evidence = []
        for state in a.forward(backbone):
            calls = [n for n in walk(state.value) if n.kind == "module" and n.ref is first_layer]
            for call in calls:
                arg = call.args[0] if call.args else call.kwarg("hidden_states")
                f, ops, reached = _scalar_path(
                    arg, lambda v: isinstance(v, Node) and v.kind == "module" and v.ref is embed,
                    transparent=lambda n: a.role(n.ref) == "dropout")
                if reached:
                    inner, inner_ops = self.embedding_factor(embed)
                    if inner is None:
                        factors.add(None)
                    else:
                        factors.add(round(f * inner, 9))
                        evidence = ops + inner_ops
        if not factors:
            self.add(unknown("embedding.scale", CODE, f"{where}: the first layer's input is not traced to {embed_name}"))
            return
        if len(factors) > 1 or None in factors:
            self.add(unknown("embedding.scale", CODE, f"{where}: embedding scaling differs between paths"))
            return
        factor = factors.pop()
        hidden = self.dims.get("hidden_size")
        ops = " ".join(evidence) or "none"
        if math.isclose(factor, 1.0):
            self.add(known("none", "embedding.scale", CODE, f"{where}: embeddings enter the first layer unscaled"))
            self.add(known(None, "embedding.multiplier", CODE, f"{where}: no constant multiplier"))
        elif isinstance(hidden, int) and math.isclose(factor, math.sqrt(hidden), rel_tol=1e-6):
            self.add(known("sqrt_hidden", "embedding.scale", CODE,
                           f"{where}: embeddings multiplied by {factor:g} = sqrt(hidden_size) ({ops})"))
            self.add(known(None, "embedding.multiplier", CODE, f"{where}: the scale is sqrt(hidden_size)"))
        else:
            self.add(known("none", "embedding.scale", CODE, f"{where}: scale is a constant, not sqrt(hidden_size)"))
            self.add(known(factor, "embedding.multiplier", CODE, f"{where}: embeddings multiplied by {factor:g} ({ops})"))

    def final_norm(self, path: str, backbone: Instance) -> None:
        """The norm the backbone applies to the last layer's output."""
        a = self.a
        layer_ids = {id(layer) for layer in self.layers}  # a loop over the layers may be summarised as one call
        found = []
        for state in a.forward(backbone):
            for n in walk(state.value):
                if n.kind == "module" and n.ref is not None and a.role(n.ref) == "norm" and n.args \
                        and any(m.kind == "module" and id(m.ref) in layer_ids for m in walk(n.args[0])):
                    found.append(n.ref)
        found = _unique(found)
        names = {name: child for name, child in backbone.children()}
        owned = [name for name, child in names.items() if any(child is f for f in found)]
        if len(owned) == 1:
            full = f"{path}.{owned[0]}" if path else owned[0]
            self.r.final_norm_key = full
            self.r.module_names["model.norm"] = full

    def embedding_factor(self, embed: Instance) -> tuple[float | None, list[str]]:
        if embed.is_external or self.a.interp.find_method(embed.cls, "forward") is None:
            return 1.0, []
        factors = set()
        ops_seen: list[str] = []
        for value in self.a.outputs(embed):
            f, ops, reached = _scalar_path(value, lambda v: isinstance(v, Node) and v.kind == "call"
                                           and v.name.startswith("super."))
            if not reached:
                return None, []
            factors.add(round(f, 9))
            ops_seen = ops
        if len(factors) != 1:
            return None, []
        return factors.pop(), ops_seen

    def analyze_head(self, backbone: Instance) -> None:
        a = self.a
        where = a.where(self.top)
        vocab = self.dims.get("vocab_size")
        heads = [(n, c) for n, c in self.top.children()
                 if a.base_module(c) == "Linear" and c.args.get("out_features") == vocab]
        if len(heads) != 1:
            self.add(unknown("lm_head.bias", CODE, f"{where}: {len(heads)} projections to the vocabulary"))
            return
        name, head = heads[0]
        self.r.head_key = f"{name}.weight"
        self.r.module_names["lm_head"] = name
        self.add(known(bool(head.args.get("bias")), "lm_head.bias", CODE, f"{where}: {name}(bias={head.args.get('bias')})"))
        tied = self.a.interp.class_attribute(self.cls, "_tied_weights_keys")
        self.r.tied_keys_declared = bool(tied) if tied is not UNKNOWN else False
        verdicts = set()
        for state in a.forward(self.top):
            logits = self.logits_of(state.value, head)
            if logits is None:
                continue
            verdicts.add(self.head_ops(logits, head))
        verdicts.discard(None)
        if len(verdicts) != 1:
            self.add(unknown("lm_head.softcap", CODE, f"{where}: logits not traced to {name}"))
            self.add(unknown("lm_head.logits_divisor", CODE, f"{where}: logits not traced to {name}"))
            return
        softcap, divisor = verdicts.pop()
        self.add(known(softcap, "lm_head.softcap", CODE,
                       f"{where}: " + (f"logits = tanh(logits / {softcap:g}) * {softcap:g}" if softcap else "no tanh softcap")))
        self.add(known(divisor, "lm_head.logits_divisor", CODE,
                       f"{where}: " + (f"logits divided by {divisor:g}" if divisor else "logits not rescaled")))
        if divisor is not None:
            self.logits_source(divisor, where)

    def logits_source(self, divisor: float, where: str) -> None:
        """The config field the logits are rescaled by: divided by it
        (Granite's logits_scaling) or multiplied by it (Cohere's logit_scale)."""
        config = self.a.interp.config
        found = set()
        for attr, value in self.top.attrs.items():
            if not _number(value) or value == 0 or not (
                    math.isclose(value, divisor, rel_tol=1e-9) or math.isclose(1.0 / value, divisor, rel_tol=1e-9)):
                continue
            for key in sorted(self.top.attr_reads.get(attr, frozenset())):
                field_value = config.read(key, None) if config.has(key) else None
                if not _number(field_value) or field_value == 0:
                    continue
                if math.isclose(field_value, divisor, rel_tol=1e-9):
                    found.add((key, "divisor", f"self.{attr} = config.{key}; logits / {field_value:g}"))
                elif math.isclose(1.0 / field_value, divisor, rel_tol=1e-9):
                    found.add((key, "multiplier", f"self.{attr} = config.{key}; logits * {field_value:g}"))
        forward = self.a.interp.find_method(self.cls, "forward")
        if not found and forward is not None:  # read in forward: logits / self.config.<key>
            read = sorted({node.attr for node in ast.walk(forward[1]) if isinstance(node, ast.Attribute)
                           and isinstance(node.value, ast.Attribute) and node.value.attr == "config"})
            for key in read:
                field_value = config.read(key, None) if config.has(key) else None
                if not _number(field_value) or field_value == 0:
                    continue
                if math.isclose(field_value, divisor, rel_tol=1e-9):
                    found.add((key, "divisor", f"forward divides the logits by self.config.{key} = {field_value:g}"))
                elif math.isclose(1.0 / field_value, divisor, rel_tol=1e-9):
                    found.add((key, "multiplier", f"forward multiplies the logits by self.config.{key} = {field_value:g}"))
        if len({(k, f) for k, f, _ in found}) == 1:
            key, form, evidence = found.pop()
            self.add(known(key, "lm_head.logits_key", CODE, f"{where}: {evidence}"))
            self.add(known(form, "lm_head.logits_form", CODE, f"{where}: {evidence}"))
        else:
            self.add(unknown("lm_head.logits_key", CODE,
                             f"{where}: no single config field gives the logits factor ({len(found)} candidates)"))

    def logits_of(self, value: Any, head: Instance) -> Any:
        if isinstance(value, Node) and value.kind == "call":
            logits = value.kwarg("logits")
            if logits is not None:
                return logits
        if isinstance(value, (tuple, list)):
            for item in value:
                if any(n.kind == "module" and n.ref is head for n in walk(item)):
                    return item
        if isinstance(value, Node) and any(n.kind == "module" and n.ref is head for n in walk(value)):
            return value
        return None

    def head_ops(self, value: Any, head: Instance) -> tuple[float | None, float | None] | None:
        softcap = None
        divisor = 1.0
        for _ in range(16):
            value = _strip_casts(value)
            if isinstance(value, Node) and value.kind == "module" and value.ref is head:
                return softcap, (None if math.isclose(divisor, 1.0) else divisor)
            if not isinstance(value, Node):
                return None
            if value.kind == "binop" and value.name == "mul":
                x, c = value.args
                if _number(x):
                    x, c = c, x
                inner = _strip_casts(x)
                if _number(c) and isinstance(inner, Node) and inner.kind == "call" and inner.name.endswith("tanh"):
                    arg = _strip_casts(inner.args[0]) if inner.args else None
                    if isinstance(arg, Node) and arg.kind == "binop" and arg.name == "div" and _number(arg.args[1]) \
                            and math.isclose(arg.args[1], c):
                        softcap = float(c)
                        value = arg.args[0]
                        continue
                if _number(c) and c != 0:
                    divisor /= c
                    value = x
                    continue
                return None
            if value.kind == "binop" and value.name == "div" and _number(value.args[1]):
                divisor *= value.args[1]
                value = value.args[0]
                continue
            if value.kind in ("item", "func", "call") and value.args:
                # slicing helpers (logits_to_keep) before the head
                if any(n.kind == "module" and n.ref is head for n in walk(value.args[0])):
                    if value.kind == "item":
                        value = value.args[0]
                        continue
            return None
        return None


def _peel_scalars(value: Any) -> Any:
    for _ in range(16):
        value = _strip_casts(value)
        if isinstance(value, Node) and value.kind == "binop" and value.name in ("mul", "div"):
            a, b = value.args
            if _number(b):
                value = a
                continue
            if value.name == "mul" and _number(a):
                value = b
                continue
        return value
    return value


def _only_scalar(value: Any) -> bool:
    return _number(value)


def _clamp_bounds(value: Any) -> tuple[Any, Any, Any] | None:
    """``x.clamp(min, max)`` / ``torch.clamp(x, min, max)`` -> (x, min, max)."""
    if not isinstance(value, Node) or value.kind not in ("method", "call") or \
            value.name.rsplit(".", 1)[-1] not in ("clamp", "clamp_", "clip", "clip_") or not value.args:
        return None
    rest = list(value.args[1:]) + [None, None]
    return value.args[0], value.kwarg("min", rest[0]), value.kwarg("max", rest[1])


def _gain_sigmoid(value: Any) -> tuple[Any, float] | None:
    """``g * sigmoid(alpha * g)`` (either operand order) -> (g, alpha)."""
    if not (isinstance(value, Node) and value.kind == "binop" and value.name == "mul" and len(value.args) == 2):
        return None
    for g, sig in (value.args, value.args[::-1]):
        if not (isinstance(sig, Node) and sig.kind in ("call", "method") and sig.args
                and sig.name.rsplit(".", 1)[-1] == "sigmoid"):
            continue
        inner = sig.args[0]
        if isinstance(inner, Node) and inner.kind == "binop" and inner.name == "mul" and len(inner.args) == 2:
            for x, alpha in (inner.args, inner.args[::-1]):
                if _number(alpha) and not isinstance(alpha, bool) and (x is g or x == g):
                    return g, float(alpha)
    return None


def _clamped_swiglu(nodes: list[Node]) -> dict[str, Any] | None:
    """The clamped SwiGLU of GPT-OSS, by its arithmetic: ``g = clamp(gate,
    max=L)``, ``u = clamp(up, -L, L)``, ``g * sigmoid(alpha g) * (u + 1)``.
    Any other bound, offset or gate function is not this computation."""
    for node in nodes:
        if not (node.kind == "binop" and node.name == "mul" and len(node.args) == 2):
            continue
        for glu, shifted in (node.args, node.args[::-1]):
            gated = _gain_sigmoid(glu)
            if gated is None or not (isinstance(shifted, Node) and shifted.kind == "binop"
                                     and shifted.name == "add" and len(shifted.args) == 2):
                continue
            up = next((x for x, one in (shifted.args, shifted.args[::-1]) if _is_one(one)), None)
            gate_bounds, up_bounds = _clamp_bounds(gated[0]), _clamp_bounds(up)
            if gate_bounds is None or up_bounds is None:
                continue
            limit = gate_bounds[2]
            if gate_bounds[1] is None and _number(limit) and up_bounds[2] == limit and _number(up_bounds[1]) \
                    and up_bounds[1] == -limit:
                return {"alpha": gated[1], "limit": float(limit),
                        "evidence": f"clamped SwiGLU: g = gate.clamp(max={limit}), u = up.clamp({-limit}, {limit}), "
                                    f"g * sigmoid({gated[1]} * g) * (u + 1)"}
    return None


def _has_step2(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, slice) and i.step == 2 for i in items) or any(
        isinstance(i, SliceSym) and i.step == 2 for i in items)


def _unique(items: list) -> list:
    out = []
    for item in items:
        if not any(item is o for o in out):
            out.append(item)
    return out


def _ranges(values: list[int]) -> str:
    if not values:
        return "none"
    parts = []
    start = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _rotation_style(func: FuncRef, interp: Interpreter, depth: int = 0) -> str | None:
    """rotate_half (pairs i, i + d/2) or interleaved (pairs 2i, 2i + 1), from
    the slicing a rotation function (and the functions it calls) applies."""
    if depth > 3:
        return None
    interleaved = halves = False
    negation = False
    callees: list[FuncRef] = []
    for node in ast.walk(func.node):
        if isinstance(node, ast.Subscript):
            for sl in _slices(node.slice):
                if isinstance(sl.step, ast.Constant) and sl.step.value == 2:
                    interleaved = True
                for bound in (sl.lower, sl.upper):
                    if isinstance(bound, ast.BinOp) and isinstance(bound.op, ast.FloorDiv) and \
                            isinstance(bound.right, ast.Constant) and bound.right.value == 2:
                        halves = True
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node.func, ast.Name) else "")
            if name == "repeat_interleave":
                interleaved = True
            if name == "chunk" and any(isinstance(a, ast.Constant) and a.value == 2 for a in node.args):
                halves = True
            if isinstance(node.func, ast.Name):
                target = interp.global_value(func.module, node.func.id)
                if isinstance(target, FuncRef) and target.node is not func.node:
                    callees.append(target)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            negation = True
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            negation = True
    for callee in callees:
        style = _rotation_style(callee, interp, depth + 1)
        if style == "interleaved":
            interleaved = True
        elif style == "rotate_half":
            halves = True
    if interleaved:
        return "interleaved"
    if halves and (negation or callees):
        return "rotate_half"
    return None


def _slices(node: ast.expr) -> list[ast.Slice]:
    if isinstance(node, ast.Slice):
        return [node]
    if isinstance(node, ast.Tuple):
        return [e for e in node.elts if isinstance(e, ast.Slice)]
    return []


def _vector(shape: tuple) -> bool:
    """A shape ``[n]`` or ``[1, n]``."""
    return len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)


def _strip_shape(value: Any) -> Any:
    """Drop casts and shape-only methods (``squeeze``, ``view``...)."""
    value = _strip_casts(value)
    while isinstance(value, Node) and value.kind == "method" and value.args \
            and value.name in ("squeeze", "unsqueeze", "view", "reshape", "flatten", "expand_as", "expand"):
        value = _strip_casts(value.args[0])
    return value


def _buffers(owner: Instance) -> list[str]:
    """Buffers of the owner's class: ``self.x = nn.Buffer(...)`` or
    ``self.register_buffer("x", ...)``."""
    node = getattr(owner.cls, "node", None)
    if not isinstance(node, ast.ClassDef):
        return []
    buffers: list[str] = []
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "Buffer":
                buffers += [t.attr for t in stmt.targets if isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name) and t.value.id == "self"]
        elif isinstance(stmt, ast.Call) and isinstance(stmt.func, ast.Attribute) \
                and stmt.func.attr == "register_buffer" and stmt.args \
                and isinstance(stmt.args[0], ast.Constant) and isinstance(stmt.args[0].value, str):
            buffers.append(stmt.args[0].value)
    return buffers


def _added_buffers(owner: Instance) -> list[str]:
    """Buffers of the owner's class that its methods add to a value
    (``... + self.x``): a per-expert routing bias held as a buffer, which the
    interpreter does not follow as a parameter."""
    node = getattr(owner.cls, "node", None)
    buffers = _buffers(owner)
    if not buffers or not isinstance(node, ast.ClassDef):
        return []
    added = []
    for expr in ast.walk(node):
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            for side in (expr.left, expr.right):
                if isinstance(side, ast.Attribute) and isinstance(side.value, ast.Name) \
                        and side.value.id == "self" and side.attr in buffers and side.attr not in added:
                    added.append(side.attr)
    return added
