"""The state every section of the code analysis shares.

:class:`CodeAnalysis` is the result (findings by spec field, and the module
tree facts the checkpoint cross-check needs); :class:`AnalyzerState` holds
one analysis: the modeling source, the interpreter handle ``interp``, the
causal LM instance tree and its decoder layers, the result being filled,
and the generic queries over the instance tree every section asks (where a
method is, a module's traced forward and outputs, its torch base module,
its role, a norm's classification, the state-dict keys of the tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoport_cst.research.analysis.graph import first_int, rotation_style, torch_activation
from autoport_cst.research.analysis.norms import classify_norm_graph
from autoport_cst.research.findings import Finding
from autoport_cst.research.interp.interpreter import Interpreter
from autoport_cst.research.interp.values import External, FuncRef, Instance, Node, Param, SourceClass
from autoport_cst.research.interp.values import State as PathState
from autoport_cst.research.interp.walk import walk
from autoport_cst.research.sources import ModelingSource


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
    linear_modules: list[str] = field(
        default_factory=list
    )  # torch base of the layer projections: Linear | Conv1D
    # every config field the code read while constructing and running the model
    config_reads: tuple[str, ...] = ()

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def get(self, name: str) -> Finding | None:
        for finding in reversed(self.findings):
            if finding.field == name:
                return finding
        return None


@dataclass
class AttentionGraph:
    """The traced forward of the first decoder layer's attention: what the
    attention section found, and the RoPE section reads."""

    attn: Instance
    where: str  # the attention's forward, for evidence
    nodes: list[Node]  # every node of its first output
    inputs: list[Node]  # projection calls reading the layer input (q, k, v or fused qkv)
    outputs: list[Node]  # projection calls reading another projection's result (o)
    in_insts: list[Instance]  # the input projection modules, in declaration order
    out_insts: list[Instance]
    # rows of the input projections that are an output gate's, not a query's, key's or value's
    # (a gate fused with the queries: query_gate)
    gate_rows: int = 0


class AnalyzerState:
    """What every section of one analysis shares: the modeling source, the
    interpreter (``interp``) with the configuration, the config's sizes
    (``dims``), the result being filled (findings, module names, the tensors
    the code creates), the causal LM instance tree and its decoder layers,
    and the caches of traced forwards, module roles and norm classifications."""

    def __init__(
        self,
        source: ModelingSource,
        interp: Interpreter,
        dims: dict[str, Any],
        result: CodeAnalysis,
        top: Instance,
        cls: SourceClass,
    ) -> None:
        self.source = source
        self.interp = interp
        self.dims = dims
        self.result = result
        self.top = top  # the causal LM, constructed against the configuration
        self.cls = cls
        # set by the orchestrator once the decoder layers are found
        self.layers: list[Instance] = []
        self.layer_prefix = ""  # state-dict prefix of the decoder layers ("model.layers.")
        self.attn_name = ""  # the attention child of a decoder layer
        # its weights' path in a layer when not attn_name: a pass-through wrapper's ("attn.attention")
        self.attn_path = ""
        self.layer_rotation: list[bool] = []  # per traced layer: does its attention rotate q/k
        self.backbone: Instance | None = None  # the module holding the decoder layers
        # per layer index, its calls in the backbone's forward run for every layer (layer_inputs)
        self.layer_calls: dict[int, list[Node]] | None = None
        self.no_rotation = False  # a rotary module exists but no layer applies a rotation
        self._forward_cache: dict[int, list[PathState]] = {}
        self._role_cache: dict[int, str] = {}
        self._norm_cache: dict[int, dict[str, Any]] = {}

    def reset_caches(self) -> None:
        """Forget forwards, roles and norms read (the instance tree changed)."""
        self._forward_cache.clear()
        self._role_cache.clear()
        self._norm_cache.clear()

    def add(self, finding: Finding) -> None:
        self.result.add(finding)

    def where(self, instance: Instance, method: str = "forward") -> str:
        if isinstance(instance.cls, SourceClass):
            found = self.interp.find_method(instance.cls, method)
            if found is not None:
                return f"{found[0].name}.{method} ({found[0].module.path.name}:{found[1].lineno})"
            return instance.cls.name
        return instance.cls.qualname

    def forward(self, instance: Instance) -> list[PathState]:
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
        if isinstance(instance.cls, SourceClass) and self._linear_forward(instance):
            return "Linear"
        return None

    def _linear_forward(self, instance: Instance) -> bool:
        """A subclass of torch's Linear whose own forward multiplies its input
        by its weight (``input @ self.weight.T``, plus the bias), as Linear does."""
        assert isinstance(instance.cls, SourceClass)
        bases = {q.rsplit(".", 1)[-1] for q in self.interp.external_bases(instance.cls)}
        if "Linear" not in bases or any(True for _ in instance.children()):
            return False
        outputs = [state.value for state in self.forward(instance)]
        return bool(outputs) and all(
            any(
                n.kind == "binop"
                and n.name == "matmul"
                and any(m.kind == "attr" and m.name == "weight" for m in walk(n.args[1]))
                and any(m.kind == "input" for m in walk(n.args[0]))
                for n in walk(value)
            )
            for value in outputs
        )

    def role(self, instance: Instance) -> str:
        """What a module is, by its torch base or what its forward computes:
        linear, embedding, norm, dropout, moe (a top-k in it or a child),
        attention, rotary, mlp, experts (3-D parameters) or other."""
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
        names = softmax_modules(nodes) | {
            n.name.rsplit(".", 1)[-1] for n in nodes if n.kind in ("call", "method")
        }
        if "topk" in names:
            return "moe"
        # a child's top-k makes a router, unless this module attends itself (DSA's
        # lightning indexer chooses the keys of an attention: research/analysis/latent.py)
        if self.topk_children(instance) and not self._calls_attention_kernel(instance, nodes):
            return "moe"
        if (
            self._calls_attention_kernel(instance, nodes)
            or "scaled_dot_product_attention" in names
            or ("softmax" in names and self._scores_product(instance, nodes, names))
        ):
            return "attention"
        if self.norm_info(instance)["kind"] is not None:
            return "norm"
        children = [child for _, child in instance.children()]
        if children and all(self.role(c) == "norm" for c in children):
            return "norm"
        if {"cos", "sin"} <= names or "polar" in names:  # cos/sin, or e^(i theta) as complex numbers
            return "rotary"
        if any(
            n.kind == "act"
            or torch_activation(n)
            or (n.kind == "module" and self.role(n.ref) == "activation")
            for n in nodes
        ) and any(n.kind == "module" and self.role(n.ref) == "linear" for n in nodes):
            return "mlp"
        if self._activation_module(instance, nodes):
            return "activation"
        if any(
            isinstance(v, Param) and v.shape is not None and v.numel is not None and len(v.shape) == 3
            for v in instance.attrs.values()
        ):
            return "experts"
        return "other"

    def topk_children(self, instance: Instance) -> list[tuple[str, Instance]]:
        """The children (of the source) whose forward takes a top-k."""
        return [
            (name, child)
            for name, child in instance.children()
            if not child.is_external
            and "topk"
            in {
                m.name.rsplit(".", 1)[-1]
                for path in self.forward(child)
                for m in walk(path.value)
                if m.kind in ("call", "method")
            }
        ]

    def _activation_module(self, instance: Instance, nodes: list[Node]) -> bool:
        """A module of the source with no parameters and no submodules whose
        forward takes one tensor and computes from it by calls it does not name as a
        projection or an attention: an elementwise activation (BLOOM's gelu
        written out, ...)."""
        if any(True for _ in instance.children()) or any(True for _ in instance.params()):
            return False
        found = (
            self.interp.find_method(instance.cls, "forward")
            if isinstance(instance.cls, SourceClass)
            else None
        )
        if found is None or len([*found[1].args.posonlyargs, *found[1].args.args]) != 2:
            return False  # forward(self, x): one tensor in
        if not nodes or any(n.kind in ("module", "instance", "param") for n in nodes):
            return False
        inputs = {n.name for n in nodes if n.kind == "input"}
        calls = [n for n in nodes if n.kind in ("call", "func", "act")]
        matmul = any(n.kind == "binop" and n.name == "matmul" for n in nodes)
        return len(inputs) == 1 and bool(calls) and not matmul

    def _scores_product(self, instance: Instance, nodes: list[Node], names: set[str]) -> bool:
        """A softmax in an attention: the module projects with linear children
        or multiplies tensors (matmul, bmm, einsum); DeepSeek-V4's
        hyper-connection, a softmax over mixing weights of its own parameter
        (``F.linear(x, self.fn)``), does neither."""
        if any(self.role(c) == "linear" for _, c in instance.children()):
            return True
        products = {n.name for n in nodes if n.kind == "binop"} | names
        return bool(products & {"matmul", "bmm", "baddbmm", "einsum"})

    def _calls_attention_kernel(self, instance: Instance, nodes: list[Node]) -> bool:
        for node in nodes:
            if node.kind == "call" and any(
                isinstance(a, Node) and a.kind == "instance" and a.ref is instance for a in node.args
            ):
                return True
        return False

    def norm_info(self, instance: Instance) -> dict[str, Any]:
        key = id(instance)
        if key not in self._norm_cache:
            self._norm_cache[key] = self._norm_info(instance)
        return self._norm_cache[key]

    def _norm_info(self, instance: Instance) -> dict[str, Any]:
        info: dict[str, Any] = {
            "kind": None,
            "bias": None,
            "unit_offset": None,
            "affine": True,
            "evidence": "",
            "eps": None,
            "eps_key": None,
            "width": None,
        }
        base = self.base_module(instance)
        args = instance.args
        info["width"] = first_int(args)
        for name, value in args.items():
            if "eps" in name:
                info["eps"] = value if isinstance(value, (int, float)) else None
                keys = instance.reads.get(name, frozenset())
                info["eps_key"] = sorted(keys)[0] if len(keys) == 1 else None
                break
        own_forward = isinstance(instance.cls, SourceClass) and self.interp.find_method(
            instance.cls, "forward"
        )
        if own_forward and base in ("LayerNorm", "RMSNorm"):
            base = None  # a subclass with its own forward: classified by what that computes
        if base == "LayerNorm":
            affine = args.get("elementwise_affine", True)
            info.update(
                kind="layernorm",
                bias=bool(affine and args.get("bias", True) and not _bias_removed(instance)),
                unit_offset=False,
                affine=bool(affine),
                evidence=f"torch.nn.LayerNorm (bias={args.get('bias', True)})",
            )
            return info
        if base == "RMSNorm":
            info.update(kind="rmsnorm", bias=False, unit_offset=False, evidence="torch.nn.RMSNorm")
            return info
        if instance.is_external:
            return info
        values = self.outputs(instance)
        if not values:
            return info
        kinds = {classify_norm_graph(instance, v)["kind"] for v in values}
        result = classify_norm_graph(instance, values[0])
        if len(kinds) > 1:
            return info
        result.update(
            width=info["width"],
            eps=info["eps"] if info["eps"] is not None else result.get("eps_constant"),
            eps_key=info["eps_key"],
        )
        if result["kind"] is not None:
            result["evidence"] = f"{self.where(instance)}: " + result["evidence"]
        return result

    def tree_keys(
        self,
        instance: Instance,
        prefix: str,
        out: dict[str, tuple | None],
        roles: dict[str, str],
        experts: set[str],
        in_experts: bool = False,
    ) -> None:
        """The state-dict keys (and shapes) the tree under ``instance``
        creates, the role of every module path, and the keys under experts."""
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
            shape = (
                (shape,)
                if isinstance(shape, int)
                else tuple(shape)
                if isinstance(shape, (tuple, list))
                else None
            )
            if args.get("elementwise_affine", True):
                put("weight", shape)
                if base == "LayerNorm" and args.get("bias", True) and not _bias_removed(instance):
                    put("bias", shape)
        for name, param in instance.params():
            put(
                name,
                param.shape
                if param.shape is not None and all(isinstance(d, int) for d in param.shape)
                else None,
            )
        for name, child in instance.children():
            self.tree_keys(child, f"{prefix}{name}.", out, roles, experts, in_experts)

    def is_rotation(self, node: Node) -> bool:
        """A call of a RoPE function (one whose slicing rotates halves or
        interleaved pairs)."""
        if node.kind != "func" or not isinstance(node.ref, FuncRef):
            return False
        return rotation_style(node.ref, self.interp) is not None


def _bias_removed(instance: Instance) -> bool:
    """The code set the module's bias to None after building it (MPT's
    ``norm.bias = None``): no bias tensor, no bias added."""
    return "bias" in instance.attrs and instance.attrs["bias"] is None


def softmax_modules(nodes: list[Node]) -> set[str]:
    """``{"softmax"}`` when one of ``nodes`` calls a torch ``nn.Softmax``
    module (CPM-Ant's ``self.softmax = nn.Softmax(dim=-1)``), as a call of
    ``softmax`` would."""
    return {
        "softmax"
        for n in nodes
        if n.kind == "module"
        and isinstance(n.ref, Instance)
        and n.ref.is_external
        and n.ref.class_name == "Softmax"
    }
