"""vision-gated-mlp: the tower blocks' MLP gated, down(act(gate(x)) * up(x)) with biases (Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    is_call,
    keyword_arg,
    method,
    self_attr,
    statements,
    walk,
)
from autoport_cst.transform.edit.tree import Edit, rewrite
from autoport_cst.transform.realizes import Realizes, from_to

UP, GATE = "up_proj", "gate_proj"
MAPPINGS_METHOD = "_vision_mappings"


@dataclass(frozen=True)
class VisionGatedMlpParams:
    gate_name: str = field(
        default="mlp.gate_proj",
        metadata={
            "doc": "The checkpoint name of the gate projection under a block.",
            "examples": ["mlp.gate"],
        },
    )


class VisionGatedMlp(Codemod):
    """Gate the tower blocks' MLP: ``down(act(gate(x)) * up(x))``, every projection with a bias.

    Qwen3-VL's tower MLP is plain (``fc2(act(fc1(x)))``); Qwen2.5-VL's is
    gated like its decoder's, with biases (``gate_proj``, ``up_proj``,
    ``down_proj``). In the tower file, the MLP class whose forward calls
    ``NF.mlp(..., skip_gate=True, ...)`` gets ``gate_proj_weight`` and
    ``gate_proj_bias`` built and loaded as its up projection's are (sharded
    over the intermediate dimension), and the call takes them: the gate
    weight in the gate slot, ``gate_b=``, no ``skip_gate``. In the model
    file, each checkpoint mapping of the up projection's weight and bias is
    followed by the gate's, read from ``<block>.<gate_name>``. The activation
    is the config's ``hidden_act`` (the reference's table).

    Precondition: that ``NF.mlp`` call, and the up projection's mappings in
    ``_vision_mappings`` (the decoder's gated MLP maps its own elsewhere).
    """

    ID = "vision-gated-mlp"
    REALIZES = Realizes({"vision.mlp_kind": from_to("plain", "gated")})
    Params = VisionGatedMlpParams
    FILES = ("model", "tower")
    EXAMPLES = (
        Example(
            title="the tower's MLP",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(8, 16))
                        self.up_proj_bias = nn.Parameter(torch.empty(1, 16))
                        set_weight_loader(self.up_proj_weight, sharding_weight_loader(shard_dim=1))

                    def forward(self, hidden_states):
                        return NF.mlp(
                            hidden_states,
                            self.up_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            skip_gate=True,
                            act_fn=self.act_fn,
                            up_b=self.up_proj_bias,
                        )
            """,
            after="""
                class Qwen3VLVisionMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(8, 16))
                        self.gate_proj_weight = nn.Parameter(torch.empty(8, 16))
                        self.up_proj_bias = nn.Parameter(torch.empty(1, 16))
                        self.gate_proj_bias = nn.Parameter(torch.empty(1, 16))
                        set_weight_loader(self.up_proj_weight, sharding_weight_loader(shard_dim=1))
                        set_weight_loader(self.gate_proj_weight, sharding_weight_loader(shard_dim=1))

                    def forward(self, hidden_states):
                        return NF.mlp(
                            hidden_states,
                            self.gate_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            act_fn=self.act_fn,
                            gate_b=self.gate_proj_bias,
                            up_b=self.up_proj_bias,
                        )
            """,
        ),
        Example(
            title="its checkpoint mappings",
            params={"gate_name": "mlp.gate_proj"},
            before="""
                def _vision_mappings(self):
                    mappings[f"{prefix}.mlp.up_proj_weight"] = f"{source}.mlp.linear_fc1.weight"
            """,
            after="""
                def _vision_mappings(self):
                    mappings[f"{prefix}.mlp.up_proj_weight"] = f"{source}.mlp.linear_fc1.weight"
                    mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{source}.mlp.gate_proj.weight"
            """,
        ),
        Example(
            title="no plain MLP call",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionMLP(nn.Module):
                    def forward(self, hidden_states):
                        return hidden_states @ self.up_proj_weight
            """,
            raises="no NF.mlp(..., skip_gate=True) call",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionGatedMlpParams:
        names = target.vision.module_names or {}
        return VisionGatedMlpParams(gate_name=names.get("mlp_gate", "mlp.gate_proj"))

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "tower":
            return self._tower(module, ctx)
        tower_mappings = _statements_of(module, MAPPINGS_METHOD)
        mappings = [s for s in tower_mappings if _maps(s, UP)]
        if not mappings:
            raise ctx.refuse(f"no checkpoint mapping of the tower MLP's {UP}_weight in {MAPPINGS_METHOD}")
        if any(_maps(s, GATE) for s in tower_mappings):
            return module
        edits: dict[int, Edit] = {}
        for stmt in mappings:
            edits[id(stmt)] = lambda node, s=stmt: cst.FlattenSentinel([node, self._gate_mapping(s)])
        return rewrite(module, edits)

    def _gate_mapping(self, stmt: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        assign = stmt.body[0]
        assert isinstance(assign, cst.Assign)
        key = _renamed_text(assign.targets[0].target, f".mlp.{UP}_", f".mlp.{GATE}_")
        value = assign.value
        parts = value.parts if isinstance(value, cst.FormattedString) else []
        last = parts[-1] if parts else None
        if not isinstance(last, cst.FormattedStringText):
            return stmt
        suffix = last.value.rsplit(".", 1)[-1]
        new_value = value.with_changes(
            parts=[*parts[:-1], last.with_changes(value=f".{self.params.gate_name}.{suffix}")]
        )
        new_assign = assign.with_changes(
            targets=[assign.targets[0].with_changes(target=key)], value=new_value
        )
        return stmt.with_changes(body=[new_assign], leading_lines=[])

    def _tower(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict[int, Edit] = {}
        for cls in classes_with_role(module, "mlp"):
            forward = method(cls, "forward")
            if forward is None or any(self_attr(n) == f"{GATE}_weight" for n in walk(cls)):
                continue
            call = next((n for n in walk(forward) if isinstance(n, cst.Call) and is_call(n, "NF.mlp")), None)
            skip = keyword_arg(call, "skip_gate") if call is not None else None
            if call is None or skip is None:
                raise ctx.refuse("no NF.mlp(..., skip_gate=True) call", cls, module)
            edits[id(call)] = lambda node: _gated_call(node, module)
            for func in [f for f in walk(cls) if isinstance(f, cst.FunctionDef) and f is not forward]:
                for stmt in statements(func):
                    if any(self_attr(n) in (f"{UP}_weight", f"{UP}_bias") for n in walk(stmt)):
                        edits[id(stmt)] = lambda node: cst.FlattenSentinel([node, _renamed_statement(node)])
        return rewrite(module, edits)


def _statements_of(module: cst.Module, name: str) -> list[cst.SimpleStatementLine]:
    """The simple statements of the functions named ``name``."""
    funcs = [n for n in walk(module) if isinstance(n, cst.FunctionDef) and n.name.value == name]
    return [n for f in funcs for n in walk(f) if isinstance(n, cst.SimpleStatementLine)]


def _maps(stmt: cst.SimpleStatementLine, proj: str) -> bool:
    assign = stmt.body[0]
    if not (isinstance(assign, cst.Assign) and isinstance(assign.targets[0].target, cst.Subscript)):
        return False
    texts = [n.value for n in walk(assign.targets[0].target) if isinstance(n, cst.FormattedStringText)]
    return any(f".mlp.{proj}_" in t for t in texts)


def _renamed_text(node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression:
    edits: dict[int, Edit] = {
        id(n): (lambda t: t.with_changes(value=t.value.replace(old, new)))
        for n in walk(node)
        if isinstance(n, cst.FormattedStringText) and old in n.value
    }
    return rewrite(node, edits)


def _renamed_statement(stmt: cst.CSTNode) -> cst.CSTNode:
    edits: dict[int, Edit] = {}
    for n in walk(stmt):
        name = self_attr(n)
        if name in (f"{UP}_weight", f"{UP}_bias"):
            edits[id(n)] = lambda a, name=name: a.with_changes(attr=cst.Name(name.replace(UP, GATE)))
    renamed = rewrite(stmt, edits)
    return renamed.with_changes(leading_lines=[]) if isinstance(renamed, cst.SimpleStatementLine) else renamed


def _gated_call(call: cst.CSTNode, module: cst.Module) -> cst.CSTNode:
    assert isinstance(call, cst.Call)
    args = list(call.args)
    args[1] = args[1].with_changes(value=parse_expr(f"self.{GATE}_weight", module))
    skip = next(i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "skip_gate")
    del args[skip]
    up_b = next(
        (i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "up_b"), len(args)
    )
    keyword = next(a for a in args if a.keyword is not None)  # any keyword: its equal sign's spacing
    gate_b = keyword.with_changes(
        keyword=cst.Name("gate_b"), value=parse_expr(f"self.{GATE}_bias", module), comma=args[0].comma
    )
    args.insert(up_b, gate_b)
    return call.with_changes(args=args)
