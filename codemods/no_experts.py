"""no-experts: every decoder layer has the dense MLP; the routed experts go (dense MLA models)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.vocabulary import (
    classes,
    classes_with_role,
    code_of,
    dotted,
    has_comment,
    method,
    self_assignment,
    walk,
)
from autoport_cst.transform.edit.tree import removal_edits, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

ID = "no-experts"
COMMENT = "<-- MODEL-SPECIFIC: a dense MLP on every layer (no routed experts)"
# what a class holding routed experts assigns in its __init__
EXPERT_ATTRS = ("router_weight", "gate_weight", "experts")


class NoExperts(Codemod):
    """Give every decoder layer the dense MLP of the reference; the routed experts go.

    A reference for mixture-of-experts models with dense layers first
    (DeepSeek-V3's ``first_k_dense_replace``) already has a dense MLP class;
    a model with the same attention and no routed experts at all (MiniCPM3,
    Youtu: multi-latent attention with a SiLU-gated MLP on every layer) is
    that reference with every layer dense. The decoder layer's choice
    between the MoE class (a class whose ``__init__`` assigns
    ``self.router_weight``, ``self.gate_weight`` or ``self.experts``) and the
    dense class (an ``if``/``else`` over ``self.mlp = ...``, or a conditional
    expression) becomes ``self.mlp = <Dense>(...)``, and the statements that
    only computed the condition go. ``load_weights``' ``if
    isinstance(layer.mlp, <MoE>): ... else: ...`` keeps its ``else`` branch.
    Then the MoE class goes, and with it every module-level function or
    class and every method that only it (or another removed definition)
    used: the router, the experts' loaders, the checkpoint-key helpers. The
    MoE fields of the config dataclass stay (unread).

    Preconditions: a decoder layer whose ``__init__`` chooses ``self.mlp``
    between an MoE class and another class.
    """

    ID = ID
    REALIZES = Realizes({"moe": to(None)})
    EXAMPLES = (
        Example(
            title="the dense MLP on every layer; the MoE class and what only it used go",
            before="""
                def group_limited_topk(scores, top_k):
                    return scores.topk(top_k, dim=-1).indices


                class DeepseekV3DenseMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(4, 8))


                class DeepseekV3MoE(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(4, 8))

                    def forward(self, hidden_states):
                        return group_limited_topk(hidden_states @ self.router_weight.T, 2)


                class DeepseekV3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size)
                        dense = layer_idx < config.first_k_dense_replace
                        if not dense:
                            self.mlp = DeepseekV3MoE(config)
                        else:
                            self.mlp = DeepseekV3DenseMLP(config)


                class DeepseekV3ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path):
                        mappings = {}
                        for layer_id, layer in enumerate(self.model.layers):
                            prefix = f"model.layers.{layer_id}"
                            if isinstance(layer.mlp, DeepseekV3MoE):
                                mappings.update(self._moe_keys(prefix))
                            else:
                                mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                        return mappings

                    def _moe_keys(self, prefix):
                        return {f"{prefix}.mlp.router_weight": f"{prefix}.mlp.gate.weight"}
            """,
            after="""
                class DeepseekV3DenseMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(4, 8))


                class DeepseekV3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size)
                        # <-- MODEL-SPECIFIC: a dense MLP on every layer (no routed experts)
                        self.mlp = DeepseekV3DenseMLP(config)


                class DeepseekV3ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path):
                        mappings = {}
                        for layer_id, layer in enumerate(self.model.layers):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                        return mappings
            """,
        ),
        Example(
            title="no choice between experts and a dense MLP",
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.mlp = LlamaMLP(config)
            """,
            raises="chooses no self.mlp between",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        moe_names = {c.name.value for c in classes(module) if _holds_experts(c)}
        counts = _references(module)
        live = {d.name.value for d in _definitions(module) if _used(counts, d)}
        edits: dict = {}
        for layer in classes_with_role(module, "decoder_layer"):
            init = method(layer, "__init__")
            choice = _mlp_choice(init, moe_names) if init is not None else None
            if choice is None and init is not None and has_comment(init, COMMENT):
                continue  # applied already
            if choice is None:
                raise ctx.precondition(
                    f"no-experts: {layer.name.value}.__init__ chooses no self.mlp between a class holding "
                    f"routed experts ({', '.join(sorted(moe_names)) or 'none in this file'}) and a dense one",
                    layer,
                    module,
                )
            _dense_layer_edits(init, *choice, edits)  # type: ignore[arg-type]
        for node in walk(module):
            if isinstance(node, cst.If) and _isinstance_of(node.test, moe_names) and node.orelse is not None:
                kept = list(node.orelse.body.body)  # type: ignore[union-attr]
                edits[id(node)] = lambda updated, kept=kept: cst.FlattenSentinel(kept)
        module = rewrite(module, edits)
        return _drop_dead(module, moe_names, live)


def _holds_experts(cls: cst.ClassDef) -> bool:
    init = method(cls, "__init__")
    return init is not None and any(
        (pair := self_assignment(n)) is not None and pair[0] in EXPERT_ATTRS
        for n in walk(init)
        if isinstance(n, cst.SimpleStatementLine)
    )


def _call_of(value: cst.BaseExpression, names: set[str], inside: bool) -> bool:
    return isinstance(value, cst.Call) and (dotted(value.func) in names) == inside


def _mlp_choice(init: cst.FunctionDef, moe_names: set[str]):
    """The top-level statement of ``init`` choosing ``self.mlp``, and the dense call it keeps."""
    for stmt in init.body.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = self_assignment(stmt)
            if pair and pair[0] == "mlp" and isinstance(pair[1], cst.IfExp):
                calls = [pair[1].body, pair[1].orelse]
                if any(_call_of(c, moe_names, True) for c in calls):
                    dense = next((c for c in calls if _call_of(c, moe_names, False)), None)
                    return (stmt, dense) if dense is not None else None
        if isinstance(stmt, cst.If) and isinstance(stmt.orelse, cst.Else):
            values = [_mlp_value(stmt.body), _mlp_value(stmt.orelse.body)]
            if any(v is not None and _call_of(v, moe_names, True) for v in values):
                dense = next((v for v in values if v is not None and _call_of(v, moe_names, False)), None)
                return (stmt, dense) if dense is not None else None
    return None


def _mlp_value(suite: cst.BaseSuite) -> cst.BaseExpression | None:
    body = suite.body if isinstance(suite, cst.IndentedBlock) else ()
    if len(body) == 1 and (pair := self_assignment(body[0])) is not None and pair[0] == "mlp":
        return pair[1]
    return None


def _dense_layer_edits(
    init: cst.FunctionDef, choice: cst.BaseStatement, dense: cst.Call, edits: dict
) -> None:
    """``choice`` becomes ``self.mlp = <dense>``; the statements before it that
    only assign a name its condition reads (and nothing else reads) go."""
    new = cst.parse_statement(f"self.mlp = {code_of(dense)}\n")
    new = with_comment(new, COMMENT)
    edits[id(choice)] = lambda updated, new=new: new.with_changes(
        leading_lines=[*updated.leading_lines, *new.leading_lines]
    )
    test = choice.test if isinstance(choice, cst.If) else self_assignment(choice)[1].test  # type: ignore[index,union-attr]
    read = {n.value for n in walk(test) if isinstance(n, cst.Name)}
    rest = [s for s in init.body.body if s is not choice]
    for stmt in rest:
        assigned = _assigned_names(stmt)
        others = [s for s in rest if s is not stmt]
        used_elsewhere = any(isinstance(n, cst.Name) and n.value in assigned for s in others for n in walk(s))
        if assigned and assigned <= read and not used_elsewhere:
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()


def _assigned_names(stmt: cst.BaseStatement) -> set[str]:
    """The local names ``stmt`` assigns, when assigning them is all it does (an
    ``if``/``else`` whose branches only assign names counts)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        names = set()
        for small in stmt.body:
            if not (
                isinstance(small, cst.Assign) and all(isinstance(t.target, cst.Name) for t in small.targets)
            ):
                return set()
            names |= {t.target.value for t in small.targets}  # type: ignore[attr-defined]
        return names
    if isinstance(stmt, cst.If):
        branches = [stmt.body.body]
        orelse = stmt.orelse
        while orelse is not None:
            branches.append(orelse.body.body)  # type: ignore[union-attr]
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
        names = set()
        for body in branches:
            for inner in body:
                found = _assigned_names(inner)
                if not found:
                    return set()
                names |= found
        return names
    return set()


def _isinstance_of(test: cst.BaseExpression, names: set[str]) -> bool:
    return (
        isinstance(test, cst.Call)
        and dotted(test.func) == "isinstance"
        and len(test.args) == 2
        and dotted(test.args[1].value) in names
    )


def _references(module: cst.CSTNode) -> dict[str, int]:
    """How often each name is read: ``Name`` nodes and attribute names."""
    counts: dict[str, int] = {}
    for node in walk(module):
        name = node.value if isinstance(node, cst.Name) else None
        if isinstance(node, cst.Attribute):
            name = node.attr.value
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _definitions(module: cst.Module) -> list[cst.FunctionDef | cst.ClassDef]:
    """Module-level functions and classes, and the methods of the classes."""
    found: list[cst.FunctionDef | cst.ClassDef] = []
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            found.append(stmt)
        if isinstance(stmt, cst.ClassDef):
            found.extend(s for s in stmt.body.body if isinstance(s, cst.FunctionDef))
    return found


def _drop_dead(module: cst.Module, moe_names: set[str], live: set[str]) -> cst.Module:
    """Remove the MoE classes, then every definition of ``live`` (used before
    the edits) that is used no more (uses in its own body do not count)."""
    first = module.body[0] if module.body else None
    doomed = [d for d in _definitions(module) if isinstance(d, cst.ClassDef) and d.name.value in moe_names]
    while doomed:
        module = rewrite(module, removal_edits(module, doomed))
        counts = _references(module)
        doomed = [d for d in _definitions(module) if d.name.value in live and not _used(counts, d)]
    head = module.body[0] if module.body else None
    if head is not None and head is not first and not any(line.comment for line in head.leading_lines):
        module = module.with_changes(body=[head.with_changes(leading_lines=[]), *module.body[1:]])
    return module


def _used(counts: dict[str, int], definition: cst.FunctionDef | cst.ClassDef) -> bool:
    name = definition.name.value
    return counts.get(name, 0) > _references(definition).get(name, 0)
