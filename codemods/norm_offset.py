"""norm-offset: the norm weight is applied as (1 + weight), in float32 (Gemma)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.classes import (
    defined_elsewhere,
    forward_path_functions,
    instances_of_role,
    param_ctor,
)
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    find_self_assignment,
    method,
    nodes_of,
    self_attr,
    walk,
)
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to


def _offset(weight: str, module: cst.Module) -> cst.BaseExpression:
    return parse_expr(f"(1.0 + {weight}.to(torch.float32))", module)


def _is_offset(node: cst.CSTNode) -> bool:
    """``1.0 + <x>.weight.to(torch.float32)`` (or ``.float()``)."""
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)):
        return False
    if not (isinstance(node.left, (cst.Float, cst.Integer)) and float(node.left.value) == 1.0):
        return False
    right = node.right
    return (
        isinstance(right, cst.Call)
        and isinstance(right.func, cst.Attribute)
        and right.func.attr.value in ("to", "float")
        and isinstance(right.func.value, cst.Attribute)
        and right.func.value.attr.value == "weight"
    )


class NormOffset(Codemod):
    """Apply the norm weight as ``(1 + weight)``, computed in float32 (Gemma's RMSNorm).

    Gemma stores norm weights centred on zero and computes ``norm(x.float()) *
    (1.0 + weight.float())``, then casts to the input dtype. In the norm class
    (``<Prefix>RMSNorm`` or ``<Prefix>LayerNorm``), every read of
    ``self.weight`` in ``forward`` becomes ``(1.0 + self.weight.to(torch.float32))``
    (the reference already normalizes in float32 and casts at the end), and
    ``self.weight`` is created with ``torch.zeros`` (the identity of the new
    form). A norm weight passed directly to a kernel on the forward path
    (``self.q_norm.weight.view(1, -1)`` as a QK-norm gamma, or a fused
    pre-norm gamma) gets the same offset, since the kernels multiply by the
    gamma they are given.

    Runs after ``swap-norm`` (which rewrites the norm's forward) and
    ``qk-norm`` (whose kernel gammas it offsets). Preconditions:
    exactly one norm class, whose ``__init__`` creates ``self.weight =
    nn.Parameter(torch.<ctor>(...))`` and whose ``forward`` reads
    ``self.weight``. Already offset (``1.0 + self.weight...`` in forward): no change.
    """

    ID = "norm-offset"
    REALIZES = Realizes({"norm.unit_offset": to(True)})
    Params = NoParams
    PITFALLS = (
        Pitfall(
            20,
            lambda spec, facts: spec.norm.unit_offset,
            "norm weight applied as (1 + weight): the stored weights are offsets, not scales",
        ),
    )
    FILES = ("model", "module")
    AFTER = ("swap-norm", "qk-norm")
    EXAMPLES = (
        Example(
            title="Gemma RMSNorm",
            before="""
                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        variance = hidden_states.pow(2).mean(-1, keepdim=True)
                        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states).to(input_dtype)


                class LlamaAttention(nn.Module):
                    def __init__(self, config):
                        self.q_norm = LlamaRMSNorm(config.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, x):
                        return NF.qkv_proj(hidden=x, qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1))
            """,
            after="""
                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        variance = hidden_states.pow(2).mean(-1, keepdim=True)
                        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                        return ((1.0 + self.weight.to(torch.float32)) * hidden_states).to(input_dtype)


                class LlamaAttention(nn.Module):
                    def __init__(self, config):
                        self.q_norm = LlamaRMSNorm(config.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, x):
                        return NF.qkv_proj(hidden=x, qk_norm_pre_rope_q_gamma=(1.0 + self.q_norm.weight.to(torch.float32)).view(1, -1))
            """,
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
            return other_model_file(module, ctx, self.touches(), "(1 + weight) norms", guard=True)
        if defined_elsewhere(module, ctx, "norm") and not instances_of_role(module, "norm"):
            return module  # a file of sublayers beside the model file, with no norm of its own
        norms = [
            c for c in classes_with_role(module, "norm") if c.name.value.endswith(("RMSNorm", "LayerNorm"))
        ]
        if len(norms) != 1:
            found = ", ".join(c.name.value for c in norms) or "none"
            raise ctx.precondition(
                f"{self.ID}: expected exactly one norm class (<Prefix>RMSNorm or <Prefix>LayerNorm), found: {found}"
            )
        norm = norms[0]
        name = norm.name.value
        init, forward = method(norm, "__init__"), method(norm, "forward")
        if init is None or forward is None:
            raise ctx.precondition(f"{self.ID}: norm class {name} needs __init__ and forward", norm, module)
        weight = find_self_assignment(init, "weight")
        ctor = param_ctor(weight) if weight is not None else None
        if ctor is None:
            raise ctx.precondition(
                f"{self.ID}: {name}.__init__ must create self.weight = nn.Parameter(torch.<ctor>(...))",
                init,
                module,
            )
        if any(_is_offset(n) for n in nodes_of(forward, cst.BinaryOperation)):
            return module
        reads = [n for n in walk(forward) if self_attr(n) == "weight"]
        if not reads:
            raise ctx.precondition(f"{self.ID}: {name}.forward does not read self.weight", forward, module)
        edits: dict = {id(n): (lambda updated: _offset("self.weight", module)) for n in reads}
        if dotted(ctor.func) != "torch.zeros":
            edits[id(ctor.func)] = lambda updated: parse_expr("torch.zeros", module)
        # gammas handed to kernels: <...>.<norm attribute>.weight on the forward path
        norm_attrs = set(instances_of_role(module, "norm"))
        inside = {id(n) for n in walk(norm)}
        for fn in forward_path_functions(module):
            if id(fn) in inside:
                continue
            offset_parts = {
                id(m) for n in nodes_of(fn, cst.BinaryOperation) if _is_offset(n) for m in walk(n)
            }
            for node in nodes_of(fn, cst.Attribute):
                if (
                    node.attr.value == "weight"
                    and isinstance(node.value, cst.Attribute)
                    and node.value.attr.value in norm_attrs
                    and id(node) not in offset_parts
                ):
                    code = cst.Module([]).code_for_node(node)
                    edits[id(node)] = lambda updated, code=code: _offset(code, module)
        return rewrite(module, edits)
