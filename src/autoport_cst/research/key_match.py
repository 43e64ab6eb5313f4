"""The checkpoint key of every tensor a port loads, read from the
checkpoint's safetensors header by structure.

A port loads tensors under canonical (Llama- and Qwen-MoE-style) names,
renamed by ``checkpoint.key_map``. The code analysis tells which module of
the model plays each canonical role and the tensors transformers' code
creates (its state-dict names and shapes); a checkpoint may store them under
other names (a hub checkpoint saved before a rename: ``embed_out`` for the
head, ``router.layer`` for the router, ``input_linear`` for the fused
experts) or in another layout (one tensor per expert). Each wanted tensor is
looked up under the code's name first; when the header has no such key, the
stored tensor of the same layer with the same shape that no other wanted
tensor claims is taken, the one sharing the most leading and trailing path
segments with the code's name winning (a tie is no match). Experts the code
stacks and the checkpoint stores one per expert are matched by the
per-expert shapes (down ``[hidden, width]``; gate and up ``[width,
hidden]``, told apart by their names, as are square experts). Never by model name.

``match_keys`` returns the stored module path of every canonical module
(from which ``keys.derive_key_map`` makes the key map) and the wanted
tensors the header has no key for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# canonical names of the MoE tensors (the reference's hub layout: Qwen-MoE)
MOE_BLOCK = "mlp"
ROUTER = "mlp.gate"
FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"
PER_EXPERT = ("gate_proj", "up_proj", "down_proj")
ROUTING_BIAS = "mlp.gate.e_score_correction_bias"
SHARED = "mlp.shared_experts"
SHARED_GATE = "mlp.shared_expert_gate"
# per-expert names of the gate and up projections (the module path suffixes
# checkpoints use; down is told by its shape)
GATE_NAMES = ("gate_proj", "w1", "gate", "wi_0")
UP_NAMES = ("up_proj", "w3", "up", "wi_1")
DOWN_NAMES = ("down_proj", "w2", "down", "wo")
_EXPERT_INDEX = re.compile(r"^(?P<experts>.+)\.0\.(?P<leaf>[^.]+)\.weight$")


@dataclass(frozen=True)
class Wanted:
    """One tensor a port loads: its canonical module path (``leaf`` is the
    tensor name under it, empty for a bare parameter such as the stacked
    experts), the code's full key for layer ``layer`` and its shape."""

    canonical: str
    leaf: str
    code_key: str
    shape: tuple[int, ...] | None
    layer: int | None
    alternatives: tuple[tuple[int, ...], ...] = ()  # other shapes it may be stored in ([E] or [1, E])


@dataclass
class KeyMatch:
    """Canonical module path -> stored module path (relative to the layer
    for layer modules); the wanted tensors without a key, with what the
    header stores near them; how each key was found."""

    modules: dict[str, str] = field(default_factory=dict)
    missing: list[tuple[Wanted, list[str]]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    per_expert: bool = False


def layer_prefix(code_key: str, layer: int | None) -> str:
    """The layer container of a full key (``model.layers.3``), or ''."""
    if layer is None:
        return ""
    marker = f".{layer}."
    at = code_key.find(marker)
    return code_key[: at + len(marker) - 1] if at >= 0 else ""


def _relative(key: str, prefix: str) -> str:
    return key[len(prefix) + 1 :] if prefix and key.startswith(prefix + ".") else key


def _module(relative: str, leaf: str) -> str:
    return relative[: -len(leaf) - 1] if leaf and relative.endswith("." + leaf) else relative


def _similarity(a: str, b: str) -> tuple[int, int]:
    """Leading then trailing dotted segments two paths share."""
    x, y = a.split("."), b.split(".")
    lead = 0
    while lead < min(len(x), len(y)) and x[lead] == y[lead]:
        lead += 1
    trail = 0
    while trail < min(len(x), len(y)) - lead and x[-1 - trail] == y[-1 - trail]:
        trail += 1
    return lead, trail


def match_keys(wanted: list[Wanted], stored: dict, expected: dict) -> KeyMatch:
    """Find every wanted tensor in ``stored`` (name -> TensorInfo);
    ``expected`` (the code's keys -> shapes) tells which stored keys another
    tensor of the code already claims."""
    out = KeyMatch()
    claimed = {k for k in expected if k in stored}
    for item in wanted:
        key = _find(item, stored, claimed, out)
        if key is None:
            if item.canonical in (FUSED_GATE_UP, FUSED_DOWN) and _per_expert(
                item, wanted, stored, claimed, out
            ):
                continue
            out.missing.append((item, _near(item, stored)))
            continue
        claimed.add(key)
        prefix = layer_prefix(item.code_key, item.layer)
        module = _module(_relative(key, prefix), item.leaf)
        if item.leaf and not key.endswith("." + item.leaf):
            module = _relative(key, prefix)  # a bare parameter stored as a module's weight
        previous = out.modules.setdefault(item.canonical, module)
        if previous != module:
            out.missing.append((item, [f"{key} (its module is named {previous} elsewhere)"]))
    _containers(out)
    return out


def _containers(out: KeyMatch) -> None:
    """A container whose children are all stored under one other container
    with their own names (``mlp.shared_experts.gate_proj`` ->
    ``mlp.shared_mlp.gate_proj``, ...) is renamed as a whole."""
    parents: dict[str, set[str]] = {}
    for canonical, stored in out.modules.items():
        parent, _, child = canonical.rpartition(".")
        if parent and "*" not in canonical and stored.endswith("." + child):
            parents.setdefault(parent, set()).add(stored[: -len(child) - 1])
        elif parent:
            parents.setdefault(parent, set()).add("")
        # a deeper descendant stored under its own path says where each of
        # its ancestors is (AfMoE's experts under mlp, its router one level
        # down in mlp.router.gate: mlp is not renamed to mlp.router)
        parts = canonical.split(".")
        for depth in range(1, len(parts) - 1):
            ancestor, rest = ".".join(parts[:depth]), ".".join(parts[depth:])
            if "*" not in canonical and stored.endswith("." + rest):
                parents.setdefault(ancestor, set()).add(stored[: -len(rest) - 1])
    for parent, holders in parents.items():
        if len(holders) == 1 and "" not in holders and parent not in out.modules:
            out.modules[parent] = holders.pop()


def _find(item: Wanted, stored: dict, claimed: set[str], out: KeyMatch) -> str | None:
    if item.code_key in stored:
        return item.code_key
    prefix = layer_prefix(item.code_key, item.layer)
    same_place = [
        k
        for k, info in stored.items()
        if k not in claimed
        and (k.startswith(prefix + ".") if prefix else not _in_layers(k))
        and _fits(item, tuple(info.shape))
    ]
    if not same_place:
        return None
    wanted_path = _relative(item.code_key, prefix)
    scored = sorted(((_similarity(wanted_path, _relative(k, prefix)), k) for k in same_place), reverse=True)
    best = scored[0]
    if len(scored) > 1 and sum(scored[1][0]) == sum(best[0]):
        return None  # two stored tensors fit equally: no structural match
    out.evidence.append(f"{item.code_key} is stored as {best[1]} (same shape {tuple(item.shape or ())})")
    return best[1]


def _fits(item: Wanted, shape: tuple[int, ...]) -> bool:
    return item.shape is not None and (shape == tuple(item.shape) or shape in item.alternatives)


def _in_layers(key: str) -> bool:
    return any(segment.isdigit() for segment in key.split("."))


def _per_expert(item: Wanted, wanted: list[Wanted], stored: dict, claimed: set[str], out: KeyMatch) -> bool:
    """Stacked experts of the code stored one tensor per expert: record the
    per-expert names (``mlp.experts.*.gate_proj`` ...) and the experts'
    container; False when the header has no such layout."""
    prefix = layer_prefix(item.code_key, item.layer)
    block = _relative(item.code_key, prefix).split(".")[0]  # the code's routed block
    if item.shape is None or len(item.shape) != 3:
        return False
    groups: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, info in stored.items():
        m = _EXPERT_INDEX.match(_relative(key, prefix))
        if m and m["experts"].startswith(block + ".") and key.startswith(prefix + "."):
            groups.setdefault(m["experts"], {})[m["leaf"]] = tuple(info.shape)
    stacked = {w.canonical: w.shape for w in wanted if w.canonical in (FUSED_GATE_UP, FUSED_DOWN)}
    for experts, leaves in groups.items():
        names = _expert_roles(leaves, stacked)
        if names is None:
            continue
        for role, name in zip(PER_EXPERT, names, strict=True):
            out.modules[f"mlp.experts.*.{role}"] = f"{experts}.*.{name}"
        out.modules["mlp.experts"] = experts
        out.per_expert = True
        claimed.update(
            k
            for k in stored
            if k.startswith(f"{prefix}.{experts}.") and k[len(prefix) + len(experts) + 2 :][:1].isdigit()
        )
        out.evidence.append(
            f"{item.code_key} is stored per expert: {prefix}.{experts}.<j>.{{{', '.join(names)}}}"
        )
        return True
    return False


def _expert_roles(
    leaves: dict[str, tuple[int, ...]], stacked: dict[str, tuple[int, ...] | None]
) -> tuple[str, str, str] | None:
    """(gate, up, down) names among one expert's stored projections: down
    is shaped like a slice of the stacked down tensor, gate and up like its
    transpose; where shapes do not tell them apart (a square expert), names
    do."""
    down_shape = stacked.get(FUSED_DOWN)
    if down_shape is None or len(leaves) != 3:
        return None
    down_slice = tuple(down_shape[1:])
    if any(s not in (down_slice, tuple(reversed(down_slice))) for s in leaves.values()):
        return None
    downs = [n for n, s in leaves.items() if s == down_slice]
    if len(downs) != 1:
        downs = [n for n in downs if n in DOWN_NAMES]
    rest = [n for n in leaves if n not in downs]
    gate = [n for n in rest if n in GATE_NAMES]
    up = [n for n in rest if n in UP_NAMES]
    if len(downs) != 1 or len(rest) != 2 or len(gate) != 1 or len(up) != 1:
        return None
    return gate[0], up[0], downs[0]


def _near(item: Wanted, stored: dict, limit: int = 12) -> list[str]:
    """Stored keys near a missing tensor: its layer's keys (else the
    top-level ones), with shapes."""
    prefix = layer_prefix(item.code_key, item.layer)
    keys = [k for k in stored if (k.startswith(prefix + ".") if prefix else not _in_layers(k))]
    shown = [f"{k} {tuple(stored[k].shape)}" for k in sorted(keys)[:limit]]
    if len(keys) > limit:
        shown.append(f"... {len(keys) - limit} more")
    return shown
