"""RoPE frequency variants the spec has no value for, named from what
transformers computes for them: the config's ``rope_type`` (per layer type,
or one for every layer) whose inverse frequencies transformers' own
function (``ROPE_INIT_FUNCTIONS``) gives, measured on the model's config.

Gemma 4's ``proportional`` type on its full-attention layers rotates only
the first ``partial_rotary_factor`` of the frequency pairs of each head, at
the frequencies of the whole head (``base ** (-2i / head_dim)``), and leaves
the other pairs unrotated (their frequency 0) with the halves still
``head_dim / 2`` apart: not the spec's partial rotary embedding, which
rotates the first ``rotary_dim`` channels at ``base ** (-2i / rotary_dim)``.

Each is an ``unsupported.<name>`` finding whose value is the RoPE fields it
explains (the type the config analysis could not classify, the rotary
dimension the code analysis could not read from an init function it does
not follow)."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.config_proxy import ConfigProxy

# the rope types the spec describes (spec.model.RopeType)
SPEC_TYPES = frozenset({"default", "llama3", "linear", "dynamic", "yarn", "longrope", "none"})
ALIASES = {"su": "longrope", "ntk": "dynamic"}
EXPLAINS = ("rope.type", "rope.partial_rotary_factor")


def analyze(st: AnalyzerState, where: str) -> None:
    """Name each RoPE type of the config the spec has no value for."""
    config = st.interp.config
    if not config.has("rope_parameters"):  # a model whose text model has its own config (Gemma 4 assistant)
        config = config.text_config()
    params = config.read("rope_parameters", None) if isinstance(config, ConfigProxy) else None
    if not isinstance(params, dict) or not params:
        return
    per_type = params if all(isinstance(v, dict) for v in params.values()) else {None: params}
    for layer_type, entry in sorted(per_type.items(), key=lambda kv: str(kv[0])):
        rope_type = entry.get("rope_type", entry.get("type")) or "default"
        if ALIASES.get(rope_type, rope_type) in SPEC_TYPES:
            continue
        on = f"{layer_type} layers" if layer_type is not None else "every layer"
        measured = _frequencies(config.wrapped, rope_type, layer_type)
        described = _proportional(measured, entry) if measured is not None else None
        if described is not None:
            st.add(
                known(
                    EXPLAINS,
                    "unsupported.proportional_rope",
                    CODE,
                    f"{where}: transformers' rope_type {rope_type!r} ({on}): {described}",
                )
            )
        else:
            shown = "not computable" if measured is None else f"{len(measured)} frequencies"
            st.add(
                known(
                    EXPLAINS,
                    "unsupported.rope_frequencies",
                    CODE,
                    f"{where}: transformers' rope_type {rope_type!r} ({on}): inverse frequencies "
                    f"{shown}, not those of a RoPE variant the spec describes",
                )
            )
        return


def _frequencies(config: Any, rope_type: str, layer_type: str | None) -> list[float] | None:
    """The inverse frequencies transformers computes for ``rope_type`` on
    ``config`` (the layer type's own config for a heterogeneous one)."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        function = ROPE_INIT_FUNCTIONS[rope_type]
        per_layer = getattr(config, "per_layer_config", None) if layer_type is not None else None
        own = per_layer[layer_type] if per_layer is not None else config
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        inv_freq, _ = function(own, None, **kwargs)
        return [float(x) for x in inv_freq.flatten().tolist()]
    except Exception:  # noqa: BLE001 - a type transformers cannot compute here is named as such
        return None


def _proportional(inv_freq: list[float], entry: dict) -> str | None:
    """The measured frequencies described when they are the whole head's
    ``base ** (-2i / head_dim)`` on the first pairs and 0 on the others;
    None otherwise."""
    base = entry.get("rope_theta")
    pairs = len(inv_freq)
    rotated = next((i for i, f in enumerate(inv_freq) if f == 0.0), pairs)
    if not isinstance(base, (int, float)) or rotated == pairs or rotated == 0:
        return None
    if any(f != 0.0 for f in inv_freq[rotated:]):
        return None
    head = 2 * pairs
    if not all(
        math.isclose(f, base ** (-2 * i / head), rel_tol=1e-5) for i, f in enumerate(inv_freq[:rotated])
    ):
        return None
    return (
        f"the first {rotated} of the {pairs} frequency pairs of each head rotate, at the whole head's "
        f"frequencies (base ** (-2i / {head})), the other {pairs - rotated} stay unrotated"
    )
