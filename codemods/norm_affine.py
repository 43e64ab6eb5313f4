"""norm-affine: non-parametric decoder norms (no learned weight or bias, as in OLMo)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.classes import (
    defined_elsewhere,
    forward_path_functions,
    instances_of_role,
)
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    find_self_assignment,
    method,
    self_attr,
    walk,
)
from autoport_cst.transform.edit.layer_guards import guard_fused_norms, other_model_file
from autoport_cst.transform.edit.mappings import mapping_entries_of_attr
from autoport_cst.transform.edit.tree import removal_edits, rewrite
from autoport_cst.transform.realizes import Realizes, to

ID = "norm-affine"
AFFINE = ("weight", "bias")


class NormAffine(Codemod):
    """Make the decoder norms non-parametric: normalise only, with no learned
    weight or bias (OLMo's LayerNorm has neither).

    In the norm class (``<Prefix>RMSNorm`` / ``<Prefix>LayerNorm``):
    ``__init__`` loses its ``self.weight`` and ``self.bias`` parameters, and
    ``forward`` its affine step (``self.weight * h`` becomes ``h``, ``h +
    self.bias`` becomes ``h``). In ``load_weights`` the norms' ``.weight`` and
    ``.bias`` entries are removed: the checkpoint has no tensor for them, and
    the port has no parameter left to load.

    Runs after the codemods that add or rename norm entries (``swap-norm``,
    ``norm-placement``, ``parallel-residual``). Preconditions: exactly one norm
    class; no instance of it in the attention classes (q/k norms keep learned
    weights and share the class); the weight and bias read only in the norm's
    ``forward``, as a product or a sum (no kernel on the forward path is handed
    a norm's weight). A norm class without weight or bias is left as it is.
    """

    ID = ID
    REALIZES = Realizes({"norm.affine": to(False)})
    Params = NoParams
    PITFALLS = (
        Pitfall(
            170,
            lambda spec, facts: facts.value("code.norm_affine") is False,
            "the norms have no weight or bias (non-parametric): the spec cannot say so, a reference "
            "norm with parameters would expect tensors the checkpoint does not have",
        ),
    )
    FILES = ("model", "module")
    AFTER = ("swap-norm", "norm-placement", "parallel-residual", "norm-offset")
    EXAMPLES = (
        Example(
            title="OLMo: LayerNorm without weight or bias",
            before="""
                class LlamaLayerNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states):
                        mean = hidden_states.mean(-1, keepdim=True)
                        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
                        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states + self.bias).to(torch.float32)


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config):
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.input_layernorm.bias"] = f"{prefix}.input_layernorm.bias"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after="""
                class LlamaLayerNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.variance_epsilon = eps

                    def forward(self, hidden_states):
                        mean = hidden_states.mean(-1, keepdim=True)
                        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
                        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
                        return (hidden_states).to(torch.float32)


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config):
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
        ),
        Example(
            title="a kernel is handed a norm weight",
            before="""
                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))

                    def forward(self, hidden_states):
                        return self.weight * hidden_states


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config):
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, hidden_states):
                        return NF.mlp(hidden_states, ln_w=self.post_attention_layernorm.weight)
            """,
            raises="reads post_attention_layernorm.weight",
        ),
        Example(
            title="no norm class",
            before="""
                class LlamaMLP(nn.Module):
                    pass
            """,
            raises="expected exactly one norm class",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "non-parametric norms", guard=True)
        if defined_elsewhere(module, ctx, "norm") and not instances_of_role(module, "norm"):
            return module  # a file of sublayers beside the model file, with no norm of its own
        norm, init, forward = _norm_class(module, ctx)
        instances = instances_of_role(module, "norm")
        _refuse_attention_norms(module, norm.name.value, instances, ctx)
        edits, blocks = guard_fused_norms(
            module, ctx, "non-parametric norms: the FP8 kernels fuse a norm with a learned weight"
        )
        _refuse_affine_reads(
            module, {id(n) for n in walk(norm)} | {id(n) for b in blocks for n in walk(b)}, instances, ctx
        )
        doomed = [stmt for attr in AFFINE if (stmt := find_self_assignment(init, attr)) is not None]
        edits.update(_unscaled(forward, norm.name.value, module, ctx))
        entries = [
            e.statement
            for attr in instances
            for e in mapping_entries_of_attr(module, attr)
            if e.key.rsplit(".", 1)[-1] in AFFINE
        ]
        edits.update(removal_edits(module, doomed + entries))
        return rewrite(module, edits)


def _norm_class(
    module: cst.Module, ctx: FileContext
) -> tuple[cst.ClassDef, cst.FunctionDef, cst.FunctionDef]:
    """The file's one norm class, with its ``__init__`` and ``forward``."""
    norms = [c for c in classes_with_role(module, "norm") if c.name.value.endswith(("RMSNorm", "LayerNorm"))]
    if len(norms) != 1:
        found = ", ".join(c.name.value for c in norms) or "none"
        raise ctx.precondition(
            f"{ID}: expected exactly one norm class (<Prefix>RMSNorm or <Prefix>LayerNorm), found: {found}"
        )
    norm = norms[0]
    init, forward = method(norm, "__init__"), method(norm, "forward")
    if init is None or forward is None:
        raise ctx.precondition(f"{ID}: norm class {norm.name.value} needs __init__ and forward", norm, module)
    return norm, init, forward


def _refuse_attention_norms(module: cst.Module, name: str, instances, ctx: FileContext) -> None:
    """The norm class is also the attention's (QK norms), whose weights stay learned."""
    in_attention = {id(n) for cls in classes_with_role(module, "attention") for n in walk(cls)}
    shared = sorted(attr for attr, stmts in instances.items() if any(id(s) in in_attention for s in stmts))
    if shared:
        raise ctx.precondition(
            f"{ID}: the attention class also builds {name} ({', '.join(shared)}), whose weights are "
            "learned: the decoder norms cannot drop theirs in the shared class"
        )


def _refuse_affine_reads(module: cst.Module, inside: set[int], instances, ctx: FileContext) -> None:
    """No forward-path code outside ``inside`` (the norm class and the guarded
    fused blocks) reads a norm instance's weight or bias."""
    for fn in forward_path_functions(module):
        if id(fn) in inside:
            continue
        for node in walk(fn):
            if id(node) in inside:
                continue
            if (
                isinstance(node, cst.Attribute)
                and node.attr.value in AFFINE
                and isinstance(node.value, cst.Attribute)
                and node.value.attr.value in instances
            ):
                raise ctx.precondition(
                    f"{ID}: {fn.name.value} reads {node.value.attr.value}.{node.attr.value} (a kernel given "
                    "the norm's affine parameters); make the norm a module call first",
                    node,
                    module,
                )


def _unscaled(forward: cst.FunctionDef, name: str, module: cst.Module, ctx: FileContext) -> dict:
    """Edits of the norm's ``forward``: ``weight * h`` becomes ``h`` and
    ``h + bias`` becomes ``h``; any other use of them is refused."""
    edits: dict = {}
    handled: set[int] = set()
    for node in walk(forward):
        if not isinstance(node, cst.BinaryOperation):
            continue
        for attr, operator, sides in (
            ("weight", cst.Multiply, ("left", "right")),
            ("bias", cst.Add, ("right",)),
        ):
            if not isinstance(node.operator, operator):
                continue
            for side in sides:
                if self_attr(getattr(node, side)) == attr:
                    handled.add(id(getattr(node, side)))
                    edits[id(node)] = lambda updated, side=side: (
                        updated.right if side == "left" else updated.left
                    ).with_changes(lpar=updated.lpar, rpar=updated.rpar)
    stray = [n for n in walk(forward) if self_attr(n) in AFFINE and id(n) not in handled]
    if stray:
        raise ctx.precondition(
            f"{ID}: {name}.forward uses self.{self_attr(stray[0])} other than as `weight * h` or `h + bias`",
            stray[0],
            module,
        )
    return edits
