"""mlp-activation: the activation function of the dense MLP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import param_ctor, parameters
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.anatomy.mlp import (
    MLP_KEYWORDS,
    TORCH_MLP,
    mlp_classes,
    mlp_mapping_weights,
    parse_mlp_call,
)
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, dotted, keyword_arg, walk
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.mappings import map_value_strings
from autoport_cst.transform.edit.parameters import ACT_TYPES, WEIGHT_LOADERS
from autoport_cst.transform.edit.tree import replace_string_suffix, rewrite, with_comment

# spec activation -> NF.mlp kernel activation (nkilib ActFnType member)
KERNEL = {"silu": "SiLU", "gelu": "GELU", "gelu_tanh": "GELU_Tanh_Approx"}
# activations the kernel lacks: computed by torch_mlp, added to the model file
OUTSIDE_KERNEL = ("relu", "relu2", "quick_gelu", "xielu")
GUARD = "mlp-activation: an activation outside the NF.mlp kernel is not implemented for this quantized MLP"
KERNEL_OPTIONS = (
    "hidden",
    "gate_w",
    "up_w",
    "down_w",
    "skip_gate",
    "act_fn",
    "act_params",
    "gate_b",
    "up_b",
    "down_b",
)
# xIELU's learned parameters: (MLP attribute, its name under the activation
# module in the checkpoint, shape as transformers stores it)
XIELU_PARAMETERS = (
    ("act_alpha_p", "alpha_p", "1"),
    ("act_alpha_n", "alpha_n", "1"),
    ("act_beta", "beta", "()"),
    ("act_eps", "eps", "()"),
)
# the MLP's attribute holding the activation module in transformers' models
# (``self.act_fn``): the checkpoint keys of xIELU's parameters are beside the
# MLP's projections, ``<mlp>.act_fn.<parameter>``
ACTIVATION_MODULE = "act_fn"

TORCH_MLP_CODE = '''
def torch_mlp(hidden, gate_w, up_w, down_w, skip_gate=False, act_fn="relu", act_params=None, gate_b=None, up_b=None, down_b=None):
    """The dense MLP of NF.mlp in plain torch, for an activation the kernel
    does not provide: "relu", "relu2" (squared ReLU), "quick_gelu"
    (x * sigmoid(1.702 x)) or "xielu" (act_params: its stored alpha_p,
    alpha_n, beta and eps). Same arguments and layouts as NF.mlp: weights
    [H, I], [H, I] and [I, H], biases [1, N]; with skip_gate, act(x @ up + up_b)."""
    up = hidden @ up_w
    if up_b is not None:
        up = up + up_b
    inner = up if skip_gate else hidden @ gate_w
    if not skip_gate and gate_b is not None:
        inner = inner + gate_b
    if act_fn == "relu":
        inner = torch.relu(inner)
    elif act_fn == "relu2":
        inner = torch.square(torch.relu(inner))
    elif act_fn == "quick_gelu":
        inner = inner * torch.sigmoid(1.702 * inner)
    elif act_fn == "xielu":  # quadratic above 0, exponential below (clamped at eps); softplus of the stored alphas
        alpha_p, alpha_n, beta, eps = act_params
        negative = (torch.expm1(torch.minimum(inner, eps)) - inner) * (beta + torch.nn.functional.softplus(alpha_n))
        inner = torch.where(inner > 0, torch.nn.functional.softplus(alpha_p) * inner * inner, negative) + beta * inner
    else:
        raise ValueError(f"torch_mlp: unknown activation {act_fn!r}")
    if not skip_gate:
        inner = inner * up
    output = inner @ down_w
    if down_b is not None:
        output = output + down_b
    return output
'''


@dataclass(frozen=True)
class MlpActivationParams:
    activation: Literal["silu", "gelu", "gelu_tanh", "relu", "relu2", "quick_gelu", "xielu"] = field(
        default="silu",
        metadata={
            "doc": "Activation: silu; gelu (exact, erf); gelu_tanh (tanh approximation: HF gelu_new, "
            "gelu_pytorch_tanh, gelu_fast); relu, relu2, quick_gelu, xielu (computed outside the kernel; "
            "xielu with its learned parameters loaded per MLP)."
        },
    )


class MlpActivation(Codemod):
    """Change the activation function of the dense MLP (``NF.mlp``).

    The ``NF.mlp`` kernel computes SiLU (its default), exact GELU and the tanh
    approximation of GELU: the call gets ``act_fn=ActFnType.SiLU``, ``GELU`` or
    ``GELU_Tanh_Approx`` (``ActFnType`` imported from
    ``nkilib.core.utils.common_types``). Hugging Face ``hidden_act`` names map
    as: ``silu``/``swish`` -> silu; ``gelu`` -> gelu (erf, ``nn.functional.gelu``);
    ``gelu_new``, ``gelu_pytorch_tanh``, ``gelu_fast`` -> gelu_tanh (the same
    tanh formula, written three ways); ``relu``, ``relu2``, ``quick_gelu`` as
    named (and ``xielu``). Gemma configs that say ``gelu`` mean the tanh form (transformers
    rewrites it to ``gelu_pytorch_tanh``).

    ``relu``, ``relu2``, ``quick_gelu`` and ``xielu`` are not kernel activations: the call
    becomes ``torch_mlp(...)``, a plain-torch function with the same arguments
    (added to the model file), with ``act_fn="relu"`` etc. Switching back to a
    kernel activation turns it into ``NF.mlp`` again.

    ``xielu`` (Apertus) has learned parameters per MLP: ``alpha_p`` and
    ``alpha_n`` (``[1]``, stored before softplus) and the scalars ``beta``
    and ``eps``. Each MLP class gets ``self.act_alpha_p`` etc. after its down
    weight (same dtype; replicated: every rank loads them whole, the 0-dim
    ones through a loader reading ``[...]``), the calls pass them as
    ``act_params=(...)``, and ``load_weights`` maps them from the keys of
    transformers' activation module beside the projections
    (``...mlp.act_fn.alpha_p``: the down weight's key with ``down_proj.weight``
    replaced). Another activation on a call with ``act_params`` is refused
    (the parameters would stay loaded and unused).

    Every ``NF.mlp`` call of every ``<Prefix>MLP`` class changes, those of
    quantized MLPs (``quantization_type=``, the FP8 classes) included for a
    kernel activation: the activation is the kernel's own argument. A
    quantized MLP cannot run the plain-torch path: for ``relu``, ``relu2`` and
    ``quick_gelu`` it is guarded (its ``__init__`` raises
    ``NotImplementedError``).

    Preconditions: ``NF.mlp(hidden, self.<gate>, self.<up>, self.<down>,
    ...)`` calls in the MLP classes that are not quantized; for the
    plain-torch path, no fused-norm arguments (``ln_w``, ``norm_type``...) in
    them.
    """

    ID = "mlp-activation"
    REALIZES = ("mlp.activation",)
    Params = MlpActivationParams
    PITFALLS = (
        Pitfall(
            230,
            lambda spec, facts: facts.value("mlp.activation") is None and facts.unknown("mlp.activation"),
            "the MLP activation is not a standard one (see the findings): port its formula by hand",
        ),
    )
    EXAMPLES = (
        Example(
            title="tanh-approximated GELU (Gemma, Starcoder2)",
            params={"activation": "gelu_tanh"},
            before="""
                import vllm_neuron.functional as NF


                class LlamaMLP(nn.Module):
                    def forward(self, hidden_states, is_prefill):
                        return NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            after="""
                import vllm_neuron.functional as NF
                from nkilib.core.utils.common_types import ActFnType


                class LlamaMLP(nn.Module):
                    def forward(self, hidden_states, is_prefill):
                        return NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight, act_fn=ActFnType.GELU_Tanh_Approx)
            """,
        ),
        Example(
            title="squared ReLU is computed outside the kernel",
            params={"activation": "relu2"},
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return NF.mlp(
                            x,
                            self.up_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            skip_gate=True,
                        )
            """,
            after='''
                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return torch_mlp(
                            x,
                            self.up_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            skip_gate=True,
                            act_fn="relu2",
                        )


                def torch_mlp(hidden, gate_w, up_w, down_w, skip_gate=False, act_fn="relu", act_params=None, gate_b=None, up_b=None, down_b=None):
                    """The dense MLP of NF.mlp in plain torch, for an activation the kernel
                    does not provide: "relu", "relu2" (squared ReLU), "quick_gelu"
                    (x * sigmoid(1.702 x)) or "xielu" (act_params: its stored alpha_p,
                    alpha_n, beta and eps). Same arguments and layouts as NF.mlp: weights
                    [H, I], [H, I] and [I, H], biases [1, N]; with skip_gate, act(x @ up + up_b)."""
                    up = hidden @ up_w
                    if up_b is not None:
                        up = up + up_b
                    inner = up if skip_gate else hidden @ gate_w
                    if not skip_gate and gate_b is not None:
                        inner = inner + gate_b
                    if act_fn == "relu":
                        inner = torch.relu(inner)
                    elif act_fn == "relu2":
                        inner = torch.square(torch.relu(inner))
                    elif act_fn == "quick_gelu":
                        inner = inner * torch.sigmoid(1.702 * inner)
                    elif act_fn == "xielu":  # quadratic above 0, exponential below (clamped at eps); softplus of the stored alphas
                        alpha_p, alpha_n, beta, eps = act_params
                        negative = (torch.expm1(torch.minimum(inner, eps)) - inner) * (beta + torch.nn.functional.softplus(alpha_n))
                        inner = torch.where(inner > 0, torch.nn.functional.softplus(alpha_p) * inner * inner, negative) + beta * inner
                    else:
                        raise ValueError(f"torch_mlp: unknown activation {act_fn!r}")
                    if not skip_gate:
                        inner = inner * up
                    output = inner @ down_w
                    if down_b is not None:
                        output = output + down_b
                    return output
            ''',
        ),
        Example(
            title="xIELU (Apertus): its learned parameters loaded per MLP from the activation module's keys",
            params={"activation": "xielu"},
            before="""
                from vllm_neuron.utils.weight_loader import sharding_weight_loader


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=self.dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=self.dtype))

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, set_weight_loader, sharding_weight_loader


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=self.dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=self.dtype))
                        # xIELU's learned parameters, as stored (the alphas before softplus)
                        self.act_alpha_p = nn.Parameter(torch.zeros(1, dtype=self.dtype))
                        self.act_alpha_n = nn.Parameter(torch.zeros(1, dtype=self.dtype))
                        self.act_beta = nn.Parameter(torch.zeros((), dtype=self.dtype))
                        self.act_eps = nn.Parameter(torch.zeros((), dtype=self.dtype))
                        # 0-dim tensors: read whole ([:] does not index them), the same on every rank
                        for scalar in (self.act_beta, self.act_eps):
                            set_weight_loader(scalar, SafetensorsWeightLoader(lambda slices, rank: slices[0][...]))

                    def forward(self, x, is_prefill):
                        return torch_mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True, act_fn="xielu", act_params=(self.act_alpha_p, self.act_alpha_n, self.act_beta, self.act_eps))


                def torch_mlp(hidden, gate_w, up_w, down_w, skip_gate=False, act_fn="relu", act_params=None, gate_b=None, up_b=None, down_b=None):
                    """The dense MLP of NF.mlp in plain torch, for an activation the kernel
                    does not provide: "relu", "relu2" (squared ReLU), "quick_gelu"
                    (x * sigmoid(1.702 x)) or "xielu" (act_params: its stored alpha_p,
                    alpha_n, beta and eps). Same arguments and layouts as NF.mlp: weights
                    [H, I], [H, I] and [I, H], biases [1, N]; with skip_gate, act(x @ up + up_b)."""
                    up = hidden @ up_w
                    if up_b is not None:
                        up = up + up_b
                    inner = up if skip_gate else hidden @ gate_w
                    if not skip_gate and gate_b is not None:
                        inner = inner + gate_b
                    if act_fn == "relu":
                        inner = torch.relu(inner)
                    elif act_fn == "relu2":
                        inner = torch.square(torch.relu(inner))
                    elif act_fn == "quick_gelu":
                        inner = inner * torch.sigmoid(1.702 * inner)
                    elif act_fn == "xielu":  # quadratic above 0, exponential below (clamped at eps); softplus of the stored alphas
                        alpha_p, alpha_n, beta, eps = act_params
                        negative = (torch.expm1(torch.minimum(inner, eps)) - inner) * (beta + torch.nn.functional.softplus(alpha_n))
                        inner = torch.where(inner > 0, torch.nn.functional.softplus(alpha_p) * inner * inner, negative) + beta * inner
                    else:
                        raise ValueError(f"torch_mlp: unknown activation {act_fn!r}")
                    if not skip_gate:
                        inner = inner * up
                    output = inner @ down_w
                    if down_b is not None:
                        output = output + down_b
                    return output


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
                            mappings[f"{prefix}.mlp.act_alpha_p"] = f"{prefix}.mlp.act_fn.alpha_p"
                            mappings[f"{prefix}.mlp.act_alpha_n"] = f"{prefix}.mlp.act_fn.alpha_n"
                            mappings[f"{prefix}.mlp.act_beta"] = f"{prefix}.mlp.act_fn.beta"
                            mappings[f"{prefix}.mlp.act_eps"] = f"{prefix}.mlp.act_fn.eps"
            ''',
        ),
        Example(
            title="every MLP kernel call, the quantized ones too",
            params={"activation": "gelu"},
            before="""
                import vllm_neuron.functional as NF


                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)


                class QuantizedLlamaMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()

                    def forward(self, x, is_prefill):
                        if is_prefill:
                            gate_w, up_w = self.gate_proj_weight, self.up_proj_weight
                        else:
                            gate_w, up_w = self.gate_proj_weight_tkg, self.up_proj_weight_tkg
                        return NF.mlp(x, gate_w, up_w, self.down_proj_weight, quantization_type=QuantizationType.STATIC)
            """,
            after="""
                import vllm_neuron.functional as NF
                from nkilib.core.utils.common_types import ActFnType


                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight, act_fn=ActFnType.GELU)


                class QuantizedLlamaMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()

                    def forward(self, x, is_prefill):
                        if is_prefill:
                            gate_w, up_w = self.gate_proj_weight, self.up_proj_weight
                        else:
                            gate_w, up_w = self.gate_proj_weight_tkg, self.up_proj_weight_tkg
                        return NF.mlp(x, gate_w, up_w, self.down_proj_weight, quantization_type=QuantizationType.STATIC, act_fn=ActFnType.GELU)
            """,
        ),
        Example(
            title="xIELU's parameters are not dropped for another activation",
            params={"activation": "relu2"},
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return torch_mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True, act_fn="xielu", act_params=(self.act_alpha_p, self.act_alpha_n, self.act_beta, self.act_eps))
            """,
            raises="the MLP computes xIELU with learned parameters",
        ),
        Example(
            title="no NF.mlp call",
            params={"activation": "gelu"},
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return self.down(self.act(self.up(x)))
            """,
            raises="expected one <Prefix>MLP class with one NF.mlp(...) call",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> MlpActivationParams:
        return MlpActivationParams(activation=target.mlp.activation)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        activation = self.params.activation
        edits: dict = {}
        torch_after: list[str] = []  # MLP classes whose calls become torch_mlp
        mlps = mlp_classes(module, ctx)
        down_weights: list[str] = []  # the down weights of the MLPs given xIELU's parameters
        for mlp in mlps:
            if mlp.quantized and activation not in KERNEL:
                edits.update(guard_edit(mlp.cls, GUARD, module))
                declare_guarded(mlp.cls, ctx, GUARD)
                continue
            for call in mlp.calls:
                if not mlp.quantized:
                    parsed = parse_mlp_call(module, ctx, call)
                    if activation == "xielu" and parsed.down not in down_weights:
                        down_weights.append(parsed.down)
                if activation != "xielu" and keyword_arg(call, "act_params") is not None:
                    raise ctx.precondition(
                        f"{self.ID}: the MLP computes xIELU with learned parameters; another "
                        "activation would leave them loaded and unused",
                        call,
                        module,
                    )
                edit = (
                    self._kernel_edit(call, module)
                    if activation in KERNEL
                    else self._torch_edit(call, module, ctx)
                )
                if edit is not None:
                    edits[id(call)] = edit
                    if activation not in KERNEL and mlp.name not in torch_after:
                        torch_after.append(mlp.name)
        if activation == "xielu":
            for mlp in mlps:
                if not mlp.quantized:
                    edits.update(xielu_parameter_edits(mlp, module, ctx, self.ID))
            if not mlps:
                down_weights = [w for w in mlp_mapping_weights(module) if w.startswith("down")]
            edits.update(xielu_mapping_edits(module, down_weights, ctx, self.ID, required=bool(mlps)))
        if not edits:
            return module
        module = rewrite(module, edits)
        if activation == "xielu" and any(not mlp.quantized for mlp in mlps):
            for name in ("SafetensorsWeightLoader", "set_weight_loader"):
                module = ensure_import_from(module, WEIGHT_LOADERS, name)
        if activation in KERNEL:
            module = ensure_import_from(module, ACT_TYPES, "ActFnType")
            return self._drop_unused_helper(module)
        if torch_after and not any(
            isinstance(s, cst.FunctionDef) and s.name.value == TORCH_MLP for s in module.body
        ):
            helper = parse_statement(TORCH_MLP_CODE.strip("\n"), module).with_changes(
                leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
            )
            body = list(module.body)
            index = next(
                i
                for i, s in enumerate(body)
                if isinstance(s, cst.ClassDef) and s.name.value == torch_after[0]
            )
            body.insert(index + 1, helper)
            module = module.with_changes(body=body)
        return module

    def _kernel_edit(self, call: cst.Call, module: cst.Module):
        """The edit giving one call a kernel activation (None when it has it)."""
        kernel = KERNEL[self.params.activation]
        value = parse_expr(f"ActFnType.{kernel}", module)
        current = keyword_arg(call, "act_fn")
        is_torch = dotted(call.func) == TORCH_MLP
        if not is_torch and current is not None and dotted(current.value) == f"ActFnType.{kernel}":
            return None
        if not is_torch and current is None and self.params.activation == "silu":
            return None

        def edit(updated: cst.Call) -> cst.Call:
            if is_torch:
                updated = updated.with_changes(func=parse_expr("NF.mlp", module))
            return set_keyword(updated, "act_fn", value, order=MLP_KEYWORDS)

        return edit

    def _torch_edit(self, call: cst.Call, module: cst.Module, ctx: FileContext):
        """The edit turning one call into ``torch_mlp`` with an activation the
        kernel lacks (None when it is one already)."""
        activation = self.params.activation
        extra = [
            a.keyword.value
            for a in call.args
            if a.keyword is not None and a.keyword.value not in KERNEL_OPTIONS
        ]
        if extra:
            raise ctx.precondition(
                f"{self.ID}: {activation} is computed outside the NF.mlp kernel, which does not "
                f"support the call's fused-norm option(s) {', '.join(extra)}",
                call,
                module,
            )
        value = cst.SimpleString(f'"{activation}"')
        current = keyword_arg(call, "act_fn")
        params = parse_expr(XIELU_ARGUMENT, module) if activation == "xielu" else None
        if (
            dotted(call.func) == TORCH_MLP
            and current is not None
            and isinstance(current.value, cst.SimpleString)
            and current.value.evaluated_value == activation
            and (params is None or keyword_arg(call, "act_params") is not None)
        ):
            return None

        def edit(updated: cst.Call) -> cst.Call:
            updated = set_keyword(
                updated.with_changes(func=cst.Name(TORCH_MLP)), "act_fn", value, order=MLP_KEYWORDS
            )
            if params is not None:
                updated = set_keyword(updated, "act_params", params, order=MLP_KEYWORDS)
            return updated

        return edit

    @staticmethod
    def _drop_unused_helper(module: cst.Module) -> cst.Module:
        """Remove ``torch_mlp`` once no call uses it."""
        helper = next(
            (s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == TORCH_MLP), None
        )
        if helper is None:
            return module
        used = any(
            isinstance(n, cst.Call) and dotted(n.func) == TORCH_MLP
            for s in module.body
            if s is not helper
            for n in walk(s)
        )
        if used:
            return module
        return module.with_changes(body=[s for s in module.body if s is not helper])


XIELU_ARGUMENT = "(" + ", ".join(f"self.{attr}" for attr, _, _ in XIELU_PARAMETERS) + ")"


def xielu_parameter_edits(mlp, module: cst.Module, ctx: FileContext, codemod: str) -> dict:
    """xIELU's parameters in one MLP class, created right after its down
    weight with that weight's dtype: ``self.act_alpha_p =
    nn.Parameter(torch.zeros(1, dtype=...))`` and the like (the shapes
    transformers stores: the alphas [1], beta and eps scalars). They carry
    no loader: every rank loads them whole (replicated)."""
    params = parameters(mlp.cls)
    if all(attr in params for attr, _, _ in XIELU_PARAMETERS):
        return {}
    down = parse_mlp_call(module, ctx, mlp.calls[0]).down
    if down is None or down not in params or param_ctor(params[down]) is None:
        raise ctx.precondition(
            f"{codemod}: {mlp.name} has no self.<down> = nn.Parameter(torch.<ctor>(...)) for its NF.mlp down weight",
            mlp.cls,
            module,
        )
    ctor = param_ctor(params[down])
    assert ctor is not None  # checked above
    dtype = keyword_arg(ctor, "dtype")
    dtype_code = f", dtype={code_of(dtype.value)}" if dtype is not None else ""
    new = [
        parse_statement(f"self.{attr} = nn.Parameter(torch.zeros({shape}{dtype_code}))", module)
        for attr, _, shape in XIELU_PARAMETERS
        if attr not in params
    ]
    new[0] = with_comment(new[0], "xIELU's learned parameters, as stored (the alphas before softplus)")
    scalars = ", ".join(f"self.{attr}" for attr, _, shape in XIELU_PARAMETERS if shape == "()")
    new.append(
        with_comment(
            parse_statement(
                f"for scalar in ({scalars}):\n"
                "    set_weight_loader(scalar, SafetensorsWeightLoader(lambda slices, rank: slices[0][...]))\n",
                module,
            ),
            "0-dim tensors: read whole ([:] does not index them), the same on every rank",
        )
    )
    return {id(params[down]): lambda updated: cst.FlattenSentinel([updated, *new])}


def xielu_mapping_edits(
    module: cst.Module, down_weights: list[str], ctx: FileContext, codemod: str, required: bool
) -> dict:
    """A mapping entry per xIELU parameter after each ``...mlp.<down>``
    entry: ``...mlp.act_alpha_p`` from the checkpoint's
    ``...mlp.act_fn.alpha_p`` (the down weight's key with its module and
    ``.weight`` replaced)."""
    entries = mapping_entries(module)
    keys = {e.key for e in entries}
    edits: dict = {}
    for weight in down_weights:
        found = [e for e in entries if e.key.endswith("." + weight)]
        if not found and required:
            raise ctx.precondition(f"{codemod}: load_weights has no mappings[...{weight}] entry")
        stored = "." + weight.removesuffix("_weight") + ".weight"
        for entry in found:
            new = []
            for attr, name, _ in XIELU_PARAMETERS:
                if entry.key[: -len(weight)] + attr in keys:
                    continue
                key = replace_string_suffix(entry.key_node, weight, attr)
                value = map_value_strings(
                    entry.value,
                    lambda text, name=name, stored=stored: replace_string_suffix(
                        text, stored, f".{ACTIVATION_MODULE}.{name}"
                    ),
                )
                if key is None or value is None:
                    raise ctx.precondition(
                        f"{codemod}: cannot derive xIELU's checkpoint keys from the mapping of {entry.key} "
                        f"(expected checkpoint keys ending in {stored})",
                        entry.statement,
                        module,
                    )
                new.append(entry_statement(entry, key, value))
            if new:
                edits[id(entry.statement)] = lambda updated, new=new: cst.FlattenSentinel([updated, *new])
    return edits
