"""Model-file variants the attention and RoPE codemods are property-tested on.

The generic sources of ``tests/codemods/model_sources.py`` have no RoPE call,
decode mask or KV-cache spec, so these codemods refuse them. The variants
here are real reference model files (``llama3``, ``qwen3``, ``smollm3``)
transformed by other codemods first: another class prefix, Q/K/V and O
biases, LayerNorm instead of RMSNorm. Each variant is built once and cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hypothesis import strategies as st

from autoport_cst.transform.base import Codemod, PortContext, run_on_source
from autoport_cst.transform.library import get_codemod, library
from tests.codemods.param_strategies import params_strategy

ROOT = Path(__file__).resolve().parents[2]
BASES = {"llama3": "Llama", "qwen3": "Qwen3", "smollm3": "SmolLM3"}


@dataclass(frozen=True)
class Variant:
    base: str = "llama3"
    prefix: str | None = None  # None: keep the base's
    bias: str = "none"  # none | qkv | qkv_o
    layernorm: bool = False

    @property
    def class_prefix(self) -> str:
        return self.prefix or BASES[self.base]


def apply(codemod_id: str, params: dict, source: str) -> str:
    cls = get_codemod(codemod_id)
    codemod: Codemod = cls(cls.parse_params(params))
    return run_on_source(codemod, source, "model.py", "model", PortContext())[0]


@cache
def variant_source(variant: Variant) -> str:
    source = (ROOT / "reference_models" / variant.base / "model.py").read_text(encoding="utf-8")
    if variant.prefix:
        source = apply(
            "rename-classes", {"old_prefix": BASES[variant.base], "new_prefix": variant.prefix}, source
        )
    if variant.bias != "none":
        source = apply("add-qkv-bias", {"qkv": True, "o": variant.bias == "qkv_o"}, source)
    if variant.layernorm:
        source = apply("swap-norm", {"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"}, source)
    return source


variants = st.builds(
    Variant,
    base=st.sampled_from(sorted(BASES)),
    prefix=st.sampled_from([None, "Foo", "Qwen9"]),
    bias=st.sampled_from(["none", "qkv", "qkv_o"]),
    layernorm=st.booleans(),
).filter(
    # swap-norm refuses a base whose decode kernel fuses the (RMS) q/k norms
    lambda v: not (v.layernorm and v.base == "qwen3")
)


def real_model_params(codemods: Mapping[str, type[Codemod]]) -> dict[str, st.SearchStrategy[dict]]:
    """The codemods that need a real model file, with strategies derived from
    their parameters (tests/codemods/param_strategies.py); the fast commute
    test runs each with its defaults."""
    return {codemod_id: params_strategy(cls) for codemod_id, cls in codemods.items() if cls.NEEDS_REAL_MODEL}


PARAMS = real_model_params(library())
