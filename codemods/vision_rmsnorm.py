"""vision-rmsnorm: the tower's norms (blocks and merger) as RMSNorm without a bias (Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_statements
from autoport_cst.transform.cst.vocabulary import classes_with_role, method, self_assignment, statements, walk
from autoport_cst.transform.edit.functions import parse_method
from autoport_cst.transform.edit.tree import Edit, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

RMS_FORWARD = '''
def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """RMSNorm in float32 (no mean subtracted, no bias), the weight applied in the input dtype."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''
FILTER_COMMENT = "<-- MODEL-SPECIFIC: only the parameters the tower has (its norms have no bias)"
FILTER = """
parameters = dict(self.named_parameters())
mappings = {name: key for name, key in mappings.items() if name in parameters}
"""
MAPPINGS_METHOD = "_vision_mappings"


@dataclass(frozen=True)
class VisionRmsnormParams:
    norm: Literal["rmsnorm"] = field(default="rmsnorm", metadata={"doc": "The blocks' norm."})
    merger_norm: Literal["rmsnorm"] = field(default="rmsnorm", metadata={"doc": "The merger's norm."})
    bias: bool = field(default=False, metadata={"doc": "A bias in the norms (RMSNorm has none)."})


class VisionRmsnorm(Codemod):
    """Make the tower's norms RMSNorm without a bias, in the blocks and the merger alike.

    Qwen3-VL's tower normalizes with LayerNorm (mean subtracted, a bias);
    Qwen2.5-VL's blocks and patch merger with RMSNorm (``x / rms(x)`` in
    float32, times the weight in the input dtype; no bias). The tower's norm
    class (one class serves blocks and merger) loses its bias parameter and
    computes RMSNorm; in the model file, ``_vision_mappings`` keeps only the
    entries of parameters the model has, so the norms' bias keys are not
    asked of the checkpoint. A tower whose blocks and merger differ is refused
    (``check_params``): one class cannot be both.

    Precondition: a norm class in the tower file with ``self.weight`` and
    ``self.bias``; a ``_vision_mappings`` method ending in a return.
    """

    ID = "vision-rmsnorm"
    REALIZES = Realizes(
        {"vision.norm": to("rmsnorm"), "vision.merger_norm": to("rmsnorm"), "vision.norm_bias": to(False)}
    )
    Params = VisionRmsnormParams
    FILES = ("model", "tower")
    EXAMPLES = (
        Example(
            title="the tower's norm",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states):
                        mean = hidden_states.mean(-1, keepdim=True)
                        return self.weight * (hidden_states - mean) + self.bias
            """,
            after='''
                class Qwen3VLVisionLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        """RMSNorm in float32 (no mean subtracted, no bias), the weight applied in the input dtype."""
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        variance = hidden_states.pow(2).mean(-1, keepdim=True)
                        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                        return self.weight * hidden_states.to(input_dtype)
            ''',
        ),
        Example(
            title="the mappings",
            before="""
                class Qwen3VLForConditionalGeneration(nn.Module):
                    def _vision_mappings(self):
                        mappings = {"visual.merger.norm.bias": "model.visual.merger.norm.bias"}
                        return mappings
            """,
            after="""
                class Qwen3VLForConditionalGeneration(nn.Module):
                    def _vision_mappings(self):
                        mappings = {"visual.merger.norm.bias": "model.visual.merger.norm.bias"}
                        # <-- MODEL-SPECIFIC: only the parameters the tower has (its norms have no bias)
                        parameters = dict(self.named_parameters())
                        mappings = {name: key for name, key in mappings.items() if name in parameters}
                        return mappings
            """,
        ),
        Example(
            title="no tower mappings",
            before="""
                class LlamaForCausalLM(nn.Module):
                    pass
            """,
            raises="no _vision_mappings method ending in a return",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionRmsnormParams:
        vision = target.vision
        return VisionRmsnormParams(norm=vision.norm, merger_norm=vision.merger_norm, bias=vision.norm_bias)

    @classmethod
    def check_params(cls, params: VisionRmsnormParams) -> list[str]:
        wanted = (params.norm, params.merger_norm, params.bias)
        if wanted != ("rmsnorm", "rmsnorm", False):
            return [
                f"norm {params.norm}, merger norm {params.merger_norm}, bias {params.bias}: only RMSNorm "
                "without a bias in the blocks and the merger alike"
            ]
        return []

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "tower":
            return _rms_norm_class(module)
        site = _mappings_return(module)
        if site is None:
            raise ctx.refuse(f"no {MAPPINGS_METHOD} method ending in a return")
        func, last = site
        if any(self_assignment(s) is None and "named_parameters" in _names(s) for s in statements(func)):
            return module
        new = parse_statements(FILTER, module)
        new[0] = with_comment(new[0], FILTER_COMMENT)
        return rewrite(module, {id(last): lambda node: cst.FlattenSentinel([*new, node])})


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def _rms_norm_class(module: cst.Module) -> cst.Module:
    edits: dict[int, Edit] = {}
    for cls in classes_with_role(module, "norm"):
        init, forward = method(cls, "__init__"), method(cls, "forward")
        if init is None or forward is None:
            continue
        bias = [s for s in statements(init) if (self_assignment(s) or ("",))[0] == "bias"]
        if not bias and "rsqrt" in _names(forward) and "mean" in _names(forward):
            continue  # done
        for stmt in bias:
            edits[id(stmt)] = lambda node: cst.RemoveFromParent()
        new = parse_method(RMS_FORWARD, module).with_changes(leading_lines=forward.leading_lines)
        edits[id(forward)] = lambda node, new=new: new
    return rewrite(module, edits)


def _mappings_return(module: cst.Module) -> tuple[cst.FunctionDef, cst.SimpleStatementLine] | None:
    for func in [
        n for n in walk(module) if isinstance(n, cst.FunctionDef) and n.name.value == MAPPINGS_METHOD
    ]:
        body = statements(func)
        last = body[-1] if body else None
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return):
            return func, last
    return None
