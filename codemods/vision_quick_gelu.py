"""vision-quick-gelu: the tower blocks' MLP with quick GELU, x * sigmoid(1.702 x) (Qwen2-VL)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    is_call,
    keyword_arg,
    method,
    simple_assign,
    statements,
    walk,
)
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

COMMENT = "<-- MODEL-SPECIFIC: quick GELU x * sigmoid(1.702 x) (no kernel activation), in the model dtype"
QUICK_GELU = """
hidden = torch.addmm(self.up_proj_bias, hidden_states.to(self.dtype), self.up_proj_weight)
hidden = hidden * torch.sigmoid(1.702 * hidden)
output = hidden @ self.down_proj_weight
"""
CHECK = """
if config.hidden_act != "quick_gelu":
    raise NotImplementedError(f"vision hidden_act {config.hidden_act!r}: this port computes quick_gelu")
"""


@dataclass(frozen=True)
class VisionQuickGeluParams:
    pass


class VisionQuickGelu(Codemod):
    """Compute the tower blocks' plain MLP with quick GELU.

    Qwen2-VL's vision MLP is ``fc2(quick_gelu(fc1(x)))`` with
    ``quick_gelu(x) = x * sigmoid(1.702 x)``, which no MLP kernel activation
    computes. In the tower's file, the MLP class whose forward calls
    ``NF.mlp(..., skip_gate=True, ...)`` computes it in torch instead, as
    transformers does in the model dtype: ``addmm`` of the up projection
    with its bias, the activation, the down projection; the partial sums'
    all-reduce and the down bias after it are kept. Its ``__init__`` stops
    reading the kernel activation table and refuses any other
    ``hidden_act``. The weights, their layouts and loaders are unchanged.

    Precondition: a plain (``skip_gate=True``) ``NF.mlp`` call assigned to
    ``output`` in an MLP class's forward of the file.
    """

    ID = "vision-quick-gelu"
    REALIZES = Realizes({"vision.activation": to("quick_gelu")})
    Params = VisionQuickGeluParams
    FILES = ("tower",)
    EXAMPLES = (
        Example(
            title="Qwen2-VL",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        if config.hidden_act not in _ACTIVATIONS:
                            raise NotImplementedError(f"vision hidden_act {config.hidden_act!r} is not supported")
                        self.act_fn = _ACTIVATIONS[config.hidden_act]

                    def forward(self, hidden_states):
                        output = NF.mlp(
                            hidden_states.to(self.dtype),
                            self.up_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            skip_gate=True,
                            act_fn=self.act_fn,
                            up_b=self.up_proj_bias,
                        )
                        return output + self.down_proj_bias
            """,
            after="""
                class Qwen3VLVisionMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        if config.hidden_act != "quick_gelu":
                            raise NotImplementedError(f"vision hidden_act {config.hidden_act!r}: this port computes quick_gelu")

                    def forward(self, hidden_states):
                        # <-- MODEL-SPECIFIC: quick GELU x * sigmoid(1.702 x) (no kernel activation), in the model dtype
                        hidden = torch.addmm(self.up_proj_bias, hidden_states.to(self.dtype), self.up_proj_weight)
                        hidden = hidden * torch.sigmoid(1.702 * hidden)
                        output = hidden @ self.down_proj_weight
                        return output + self.down_proj_bias
            """,
        ),
        Example(
            title="a gated MLP",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionMLP(nn.Module):
                    def forward(self, hidden_states):
                        output = NF.mlp(hidden_states, self.gate, self.up, self.down, act_fn=self.act_fn)
                        return output
            """,
            raises="no plain NF.mlp(..., skip_gate=True) call assigned to output",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionQuickGeluParams:
        return VisionQuickGeluParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        mlps = [c for c in classes_with_role(module, "mlp") if method(c, "forward") is not None]
        if not mlps:
            return module
        edits: dict[int, object] = {}
        for cls in mlps:
            forward = method(cls, "forward")
            assert forward is not None
            if _already(forward):
                continue
            site = _plain_mlp_statement(forward)
            if site is None:
                raise ctx.refuse("no plain NF.mlp(..., skip_gate=True) call assigned to output", cls, module)
            new = parse_statements(QUICK_GELU, module)
            new[0] = with_comment(new[0], COMMENT)
            edits[id(site)] = lambda node, new=new: cst.FlattenSentinel(new)
            init = method(cls, "__init__")
            for stmt in statements(init) if init is not None else []:
                if _reads_activation_table(stmt):
                    check = parse_statement(CHECK, module) if isinstance(stmt, cst.If) else None
                    edits[id(stmt)] = lambda node, check=check: check or cst.RemoveFromParent()
        return rewrite(module, edits)


def _already(forward: cst.FunctionDef) -> bool:
    return any(isinstance(n, cst.Call) and dotted(n.func) == "torch.sigmoid" for n in walk(forward))


def _plain_mlp_statement(forward: cst.FunctionDef) -> cst.CSTNode | None:
    for stmt in statements(forward):
        calls = [n for n in walk(stmt) if isinstance(n, cst.Call) and is_call(n, "NF.mlp")]
        assigned = simple_assign(stmt)
        if (
            calls
            and assigned is not None
            and isinstance(assigned[0], cst.Name)
            and assigned[0].value == "output"
        ):
            skip = keyword_arg(calls[0], "skip_gate")
            if skip is not None and isinstance(skip.value, cst.Name) and skip.value.value == "True":
                return stmt
    return None


def _reads_activation_table(stmt: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "hidden_act" for n in walk(stmt))
