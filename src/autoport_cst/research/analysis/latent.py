"""Multi-latent attention (MLA, DeepSeek-V2/V3), recognized from what the
attention's forward computes, never from names: one projection of the
hidden state split into a key/value latent and one rotary key shared by the
heads; the latent normed and expanded by a second projection into per-head
keys without position and values (its output split in two); queries from a
projection of the hidden state, directly or through a low-rank projection,
a norm and an up-projection (query LoRA), each head split into a part
without position and a rotated part as wide as the shared key; the rotation
applied to both rotated parts.

A projection that reads another projection before the attention kernel is a
latent projection: it is neither the output projection nor a source of q/k
norms (the norms between them are latent norms). Attention whose latent
projections do not form that structure is named as unsupported."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance, Node
from autoport_cst.research.interp.walk import depends_on


@dataclass
class Latent:
    """What the attention section needs of a recognized latent attention."""

    graph: AttentionGraph  # outputs: the output projection only
    norms: list[Instance]  # latent norms (not q/k norms)
    query_head_dim: int | None  # qk_nope_head_dim + qk_rope_head_dim, None when not recognized


def analyze(st: AnalyzerState, g: AttentionGraph, kernels: list[Node]) -> Latent | None:
    """The latent attention of ``g`` and its findings; None when no
    projection reads another before the attention kernel."""
    _sparse_indexer(st, g)
    if len(kernels) != 1:
        return None
    kernel = kernels[0]
    latent = [c for c in g.outputs if not depends_on(c.args[0] if c.args else None, kernel)]
    if not latent:
        return None
    o_calls = [c for c in g.outputs if all(c is not x for x in latent)]
    graph = dataclasses.replace(g, outputs=o_calls, out_insts=_unique_refs(o_calls))
    found = _structure(st, g, latent)
    if isinstance(found, str):
        st.add(
            known(
                "latent attention",
                "unsupported.attention.latent",
                CODE,
                f"{g.where}: projections of other projections ({', '.join(_names(latent))}) that are not "
                f"multi-latent attention as recognized: {found}",
            )
        )
        st.add(known("latent", "attention.kind", CODE, f"{g.where}: projections of other projections"))
        norms = [n.ref for n in _norm_calls(st, g.nodes) if any(depends_on(c.args[0], n) for c in latent)]
        return Latent(graph, norms, None)
    _findings(st, g.where, found)
    _norm_eps(st, g.where, found["norms"])
    return Latent(graph, found["norms"], found["qk_nope_head_dim"] + found["qk_rope_head_dim"])


def _sparse_indexer(st: AnalyzerState, g: AttentionGraph) -> None:
    """A child of the attention that takes a top-k (DeepSeek-V3.2's DSA
    lightning indexer: its own projections score every key for each query
    and keep the best ``index_topk``, the attention sees only those) is
    named: no reference selects keys per query."""
    found = st.topk_children(g.attn)
    if found:
        shown = ", ".join(f"{name} ({child.class_name})" for name, child in found)
        st.add(
            known(
                ("attention",),
                "unsupported.sparse_indexer",
                CODE,
                f"{g.where}: {shown} scores the keys and keeps a top-k of them per query",
            )
        )


def _unique_refs(calls: list[Node]) -> list[Instance]:
    refs: list[Instance] = []
    for c in calls:
        if all(c.ref is not r for r in refs):
            refs.append(c.ref)
    return refs


def _names(calls: list[Node]) -> list[str]:
    return [c.ref.name or "?" for c in calls]


def _norm_calls(st: AnalyzerState, nodes: list[Node]) -> list[Node]:
    return [
        n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "norm" and n.args
    ]


def _rotary_key_norms(st: AnalyzerState, g: AttentionGraph, kv_split: Node) -> list[Node]:
    """Norm calls on the rotary key of the latent projection's split: a norm
    of its output that the rotation reads (Dots3's k_rope_only_layernorm)."""
    rotations = [r for r in g.nodes if st.is_rotation(r)]
    return [
        n
        for n in _norm_calls(st, g.nodes)
        if depends_on(n.args[0], kv_split) and any(depends_on(r, n) for r in rotations)
    ]


def _splits(nodes: list[Node]) -> list[Node]:
    """``torch.split(x, [a, b])`` / ``x.split([a, b])`` with two constant sizes."""
    return [
        n
        for n in nodes
        if n.kind in ("call", "method")
        and n.name.rsplit(".", 1)[-1] == "split"
        and len(n.args) >= 2
        and isinstance(n.args[1], (list, tuple))
        and len(n.args[1]) == 2
        and all(isinstance(x, int) for x in n.args[1])
    ]


def _width(call: Node) -> Any:
    return call.ref.args.get("out_features") if call.ref is not None else None


def _structure(st: AnalyzerState, g: AttentionGraph, latent: list[Node]) -> dict[str, Any] | str:
    """The MLA sizes and modules, or what is missing (a reason)."""
    splits = _splits(g.nodes)
    kv_split = next((s for s in splits if any(s.args[0] is c for c in g.inputs)), None)
    if kv_split is None:
        return "no input projection split into a latent and a rotary key"
    kv_a = next(c for c in g.inputs if kv_split.args[0] is c)
    rank, rope = kv_split.args[1]
    rotary_norms = _rotary_key_norms(st, g, kv_split)
    expanded = [
        (n, c)
        for n in _norm_calls(st, g.nodes)
        if depends_on(n.args[0], kv_split) and all(n is not r for r in rotary_norms)
        for c in latent
        if depends_on(c.args[0], n)
    ]
    if not expanded:
        return f"the latent of {kv_a.ref.name} is not normed and expanded by another projection"
    kv_norm, kv_b = expanded[0]
    kvb_split = next((s for s in splits if depends_on(s.args[0], kv_b)), None)
    if kvb_split is None:
        return f"{kv_b.ref.name}'s output is not split into keys and values"
    nope, v_dim = kvb_split.args[1]
    query = _query(st, g, latent, splits, {id(kv_split), id(kvb_split)}, (kv_a, kv_b))
    if isinstance(query, str):
        return query
    q_split, q_proj, q_a, q_norm = query
    if tuple(q_split.args[1]) != (nope, rope):
        return f"query heads split {list(q_split.args[1])}, keys [{nope}, {rope}]"
    if not any(st.is_rotation(r) and depends_on(r, q_split) and depends_on(r, kv_split) for r in g.nodes):
        return "the rotary key and the rotated query part are not rotated together"
    heads, rest = divmod(_width(kv_b) or 0, nope + v_dim)
    widths_agree = (
        _width(kv_a) == rank + rope
        and heads > 0
        and rest == 0
        and _width(q_proj) == heads * (nope + rope)
        and (q_a is None or _width(q_a) == q_proj.ref.args.get("in_features"))
    )
    if not widths_agree:
        return "projection widths do not match the latent, head and rotary sizes"
    if rotary_norms:
        names = ", ".join(_names(rotary_norms))
        st.add(
            known(
                ("attention.qk_norm",),
                "unsupported.rotary_key_norm",
                CODE,
                f"{g.where}: {names} normalises the rotary key split from {kv_a.ref.name} before the rotation",
            )
        )
    return {
        "kv_a": kv_a.ref.name,
        "kv_b": kv_b.ref.name,
        "q": q_proj.ref.name,
        "q_a": q_a.ref.name if q_a is not None else None,
        "norms": [kv_norm.ref] + ([q_norm.ref] if q_norm is not None else []),
        "q_lora_rank": _width(q_a) if q_a is not None else None,
        "kv_lora_rank": rank,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v_dim,
        "num_heads": heads,
    }


def _query(
    st: AnalyzerState,
    g: AttentionGraph,
    latent: list[Node],
    splits: list[Node],
    kv_splits: set[int],
    kv_calls: tuple[Node, Node],
) -> tuple[Node, Node, Node | None, Node | None] | str:
    """The query heads' split, the projection giving the queries and, with a
    query LoRA, the low-rank projection and the norm before it."""
    candidates = [c for c in g.inputs + latent if all(c is not k for k in kv_calls)]
    for s in splits:
        if id(s) in kv_splits:
            continue
        sources = [c for c in candidates if depends_on(s.args[0], c)]
        ups = [c for c in sources if any(c is x for x in latent)]
        if len(ups) == 1:
            up = ups[0]
            lows = [c for c in g.inputs if depends_on(up.args[0], c)]
            norms = [n for n in _norm_calls(st, g.nodes) if depends_on(up.args[0], n)]
            if len(lows) == 1 and len(norms) == 1:
                return s, up, lows[0], norms[0]
            return f"the query projection {up.ref.name} does not read one normed low-rank projection"
        if len(sources) == 1:
            return s, sources[0], None, None
    return "no query projection split into a part without position and a rotated part"


def _findings(st: AnalyzerState, where: str, found: dict[str, Any]) -> None:
    lora = (
        f"queries {found['q_a']} -> norm -> {found['q']} (query LoRA, rank {found['q_lora_rank']})"
        if found["q_a"]
        else f"queries {found['q']} (no query LoRA)"
    )
    evidence = (
        f"{where}: multi-latent attention: {found['kv_a']} split into a latent of {found['kv_lora_rank']} "
        f"and a rotary key of {found['qk_rope_head_dim']}, the latent normed and expanded by {found['kv_b']} "
        f"into {found['num_heads']} heads of keys ({found['qk_nope_head_dim']}) and values "
        f"({found['v_head_dim']}); {lora}, each head split [{found['qk_nope_head_dim']}, "
        f"{found['qk_rope_head_dim']}]"
    )
    st.add(known("latent", "attention.kind", CODE, evidence))
    st.add(known(found["q_a"] is not None, "attention.q_lora", CODE, evidence))
    for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        st.add(known(found[name], f"attention.{name}", CODE, evidence))
    st.add(known(found["num_heads"], "attention.num_heads", CODE, evidence))
    # no fused Q/K/V: a query projection's width equal to (heads + 2 KV heads) x head_dim proves nothing
    st.add(known(False, "code.fused_qkv", CODE, f"{where}: separate latent and query projections"))


# the latent norms' epsilon of the latent reference: RMSNorm's default, which
# DeepSeek-V2/V3 and GLM-4-MoE-Lite build them with (not rms_norm_eps)
LATENT_NORM_EPS = 1e-6


def _norm_eps(st: AnalyzerState, where: str, norms: list[Instance]) -> None:
    """Latent norms with another epsilon than RMSNorm's default (or one read
    from the config) are named: the latent reference fixes it."""
    for norm in norms:
        info = st.norm_info(norm)
        eps, key = info.get("eps"), info.get("eps_key")
        if key is not None or eps is None or not math.isclose(eps, LATENT_NORM_EPS, rel_tol=1e-9):
            shown = f"config.{key}" if key is not None else repr(eps)
            st.add(
                known(
                    "latent norm epsilon",
                    "unsupported.latent_norm_epsilon",
                    CODE,
                    f"{where}: the latent norm {norm.name} uses epsilon {shown}, not {LATENT_NORM_EPS}",
                )
            )
            return


def yarn_scale_factor(config: Any) -> float:
    """``mscale(factor, mscale_all_dim) ** 2`` of a scaled RoPE that sets
    ``mscale_all_dim`` (1.0 otherwise): the factor DeepSeek's latent
    attention folds into its softmax scale."""
    rope = config.read("rope_parameters", None) if config.has("rope_parameters") else None
    if not isinstance(rope, dict):
        rope = config.read("rope_scaling", None) if config.has("rope_scaling") else None
    if not isinstance(rope, dict) or (rope.get("rope_type") or rope.get("type") or "default") == "default":
        return 1.0
    factor, all_dim = rope.get("factor"), rope.get("mscale_all_dim")
    if not all_dim or not isinstance(factor, (int, float)) or factor <= 1:
        return 1.0
    return (0.1 * all_dim * math.log(factor) + 1.0) ** 2
