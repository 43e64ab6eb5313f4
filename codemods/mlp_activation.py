"""mlp-activation: the activation function of the dense MLP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.mlp import MLP_KEYWORDS, TORCH_MLP, mlp_classes, parse_mlp_call
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import dotted, keyword_arg, walk
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.parameters import ACT_TYPES
from autoport_cst.transform.edit.tree import rewrite

# spec activation -> NF.mlp kernel activation (nkilib ActFnType member)
KERNEL = {"silu": "SiLU", "gelu": "GELU", "gelu_tanh": "GELU_Tanh_Approx"}
# activations the kernel lacks: computed by torch_mlp, added to the model file
OUTSIDE_KERNEL = ("relu", "relu2", "quick_gelu")
GUARD = "mlp-activation: an activation outside the NF.mlp kernel is not implemented for this quantized MLP"
KERNEL_OPTIONS = ("hidden", "gate_w", "up_w", "down_w", "skip_gate", "act_fn", "gate_b", "up_b", "down_b")

TORCH_MLP_CODE = '''
def torch_mlp(hidden, gate_w, up_w, down_w, skip_gate=False, act_fn="relu", gate_b=None, up_b=None, down_b=None):
    """The dense MLP of NF.mlp in plain torch, for an activation the kernel
    does not provide: "relu", "relu2" (squared ReLU) or "quick_gelu"
    (x * sigmoid(1.702 x)). Same arguments and layouts as NF.mlp: weights
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
    activation: Literal["silu", "gelu", "gelu_tanh", "relu", "relu2", "quick_gelu"] = field(
        default="silu",
        metadata={
            "doc": "Activation: silu; gelu (exact, erf); gelu_tanh (tanh approximation: HF gelu_new, "
            "gelu_pytorch_tanh, gelu_fast); relu, relu2, quick_gelu (computed outside the kernel)."
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
    named. Gemma configs that say ``gelu`` mean the tanh form (transformers
    rewrites it to ``gelu_pytorch_tanh``).

    ``relu``, ``relu2`` and ``quick_gelu`` are not kernel activations: the call
    becomes ``torch_mlp(...)``, a plain-torch function with the same arguments
    (added to the model file), with ``act_fn="relu"`` etc. Switching back to a
    kernel activation turns it into ``NF.mlp`` again.

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


                def torch_mlp(hidden, gate_w, up_w, down_w, skip_gate=False, act_fn="relu", gate_b=None, up_b=None, down_b=None):
                    """The dense MLP of NF.mlp in plain torch, for an activation the kernel
                    does not provide: "relu", "relu2" (squared ReLU) or "quick_gelu"
                    (x * sigmoid(1.702 x)). Same arguments and layouts as NF.mlp: weights
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
        for mlp in mlp_classes(module, ctx):
            if mlp.quantized and activation not in KERNEL:
                edits.update(guard_edit(mlp.cls, GUARD, module))
                declare_guarded(mlp.cls, ctx, GUARD)
                continue
            for call in mlp.calls:
                if not mlp.quantized:
                    parse_mlp_call(module, ctx, call)
                edit = (
                    self._kernel_edit(call, module)
                    if activation in KERNEL
                    else self._torch_edit(call, module, ctx)
                )
                if edit is not None:
                    edits[id(call)] = edit
                    if activation not in KERNEL and mlp.name not in torch_after:
                        torch_after.append(mlp.name)
        if not edits:
            return module
        module = rewrite(module, edits)
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
        if (
            dotted(call.func) == TORCH_MLP
            and current is not None
            and isinstance(current.value, cst.SimpleString)
            and current.value.evaluated_value == activation
        ):
            return None
        return lambda updated: set_keyword(
            updated.with_changes(func=cst.Name(TORCH_MLP)), "act_fn", value, order=MLP_KEYWORDS
        )

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
