"""Properties of the MLP / norm / residual / embedding / LM-head / checkpoint
codemods on real model files (the generated sources of tests/codemods have no
MLP, backbone or LM head for them to transform):

- idempotence: T(T(x)) == T(x), and every output compiles;
- any order of a set of these codemods that respects their AFTER constraints
  gives the same file;
- pairs that edit the same classes commute when no AFTER orders them.

Sources: the llama3 and starcoder2 reference models, and llama3 after other
codemods (LayerNorm with bias, Q/K/V and O biases, a new class prefix).
"""

from __future__ import annotations

import itertools
import json
import random
from functools import cache

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import FileContext, PortContext, defined_classes
from autoport_cst.transform.library import get_codemod

from .conftest import ROOT

LLAMA3 = (ROOT / "reference_models" / "llama3" / "model.py").read_text(encoding="utf-8")
STARCODER2 = (ROOT / "reference_models" / "starcoder2" / "model.py").read_text(encoding="utf-8")

# codemod -> parameter variants
PARAMS = {
    "mlp-activation": [{"activation": "gelu_tanh"}, {"activation": "relu2"}],
    "mlp-kind": [{}],
    "mlp-bias": [{}],
    "norm-offset": [{}],
    "norm-placement": [{"placement": "sandwich"}, {"placement": "post"}],
    "parallel-residual": [{"kind": "shared_norm"}, {"kind": "separate_norms"}],
    "embedding-scale": [{}],
    "embedding-multiplier": [{}, {"inside": True}],
    "residual-multiplier": [{}],
    "logits-divisor": [{}],
    "logit-softcap": [{}],
    "lm-head-bias": [{}],
    "fused-checkpoint": [{"qkv": True, "gate_up": True}, {"qkv": True, "qkv_layout": "per_head"}],
    "checkpoint-keys": [
        {"renames": {"model": "transformer", "self_attn.o_proj": "attn.c_proj", "norm": "ln_f"}}
    ],
}


def _apply(codemod_id: str, params: dict, module: cst.Module) -> cst.Module:
    cls = get_codemod(codemod_id)
    codemod = cls(cls.parse_params(params))
    port = PortContext(package_classes=frozenset(defined_classes(module)))
    return codemod.transform_module(module, FileContext("model.py", "model", port, codemod=cls.ID))


def _prepared() -> dict[str, cst.Module]:
    llama = cst.parse_module(LLAMA3)
    biased = _apply("swap-norm", {"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"}, llama)
    biased = _apply("add-qkv-bias", {"qkv": True, "o": True}, biased)
    biased = _apply("rename-classes", {"old_prefix": "Llama", "new_prefix": "Neo"}, biased)
    return {"llama3": llama, "starcoder2": cst.parse_module(STARCODER2), "llama3-biased-renamed": biased}


SOURCES = _prepared()


@cache
def _once(codemod_id: str, params_json: str, source: str) -> cst.Module | PreconditionError:
    """``codemod_id`` with ``params_json`` applied once to ``SOURCES[source]``,
    or its refusal: computed once for the tests that start from it (the
    idempotence case, the pairs the codemod is in, the orders that start with it)."""
    try:
        return _apply(codemod_id, json.loads(params_json), SOURCES[source])
    except PreconditionError as error:
        return error


def _applied_once(codemod_id: str, params: dict, source: str) -> cst.Module:
    """``_once`` as ``_apply`` would return it: the module, or its refusal raised."""
    once = _once(codemod_id, json.dumps(params, sort_keys=True), source)
    if isinstance(once, PreconditionError):
        raise once
    return once


CASES = [
    pytest.param(codemod_id, params, source, id=f"{codemod_id}-{index}-{source}")
    for codemod_id, variants in PARAMS.items()
    for index, params in enumerate(variants)
    for source in SOURCES
]


@pytest.mark.parametrize("codemod_id, params, source", CASES)
def test_idempotent_and_compiles(codemod_id, params, source):
    try:
        once = _applied_once(codemod_id, params, source)
    except PreconditionError as error:
        # refusals must name the codemod and the file
        assert codemod_id in str(error) and "model.py" in str(error)
        return
    code = once.code
    compile(code, "model.py", "exec")
    again = _apply(codemod_id, params, cst.parse_module(code))
    assert again.code == code


# Codemod sets ports use together (Gemma 2, GPT-NeoX / Phi-like, Granite + biases, Phi-3, MiniCPM3).
SETS = {
    "sandwich": [
        ("norm-offset", {}),
        ("embedding-scale", {}),
        ("mlp-activation", {"activation": "gelu_tanh"}),
        ("norm-placement", {"placement": "sandwich"}),
        ("logit-softcap", {}),
        ("logits-divisor", {}),
        ("residual-multiplier", {}),
    ],
    "parallel": [
        ("mlp-kind", {}),
        ("mlp-bias", {}),
        ("mlp-activation", {"activation": "gelu"}),
        ("parallel-residual", {"kind": "separate_norms"}),
        ("lm-head-bias", {}),
        ("fused-checkpoint", {"qkv": True, "qkv_layout": "per_head"}),
        # GPT-NeoX's names: the whole attention module renamed (its FP8 scale keys follow it)
        (
            "checkpoint-keys",
            {
                "renames": {
                    "model": "gpt_neox",
                    "self_attn.qkv_proj": "attention.query_key_value",
                    "self_attn.o_proj": "attention.dense",
                }
            },
        ),
        ("embedding-multiplier", {}),
        ("residual-multiplier", {}),
    ],
    # MiniCPM3: the embedding module scales, residual and logits multipliers
    "minicpm3": [
        ("embedding-multiplier", {"inside": True}),
        ("residual-multiplier", {}),
        ("logits-divisor", {}),
    ],
    "fused": [
        ("mlp-bias", {}),
        ("fused-checkpoint", {"qkv": True, "gate_up": True}),
        ("lm-head-bias", {}),
        ("norm-placement", {"placement": "post"}),
        ("checkpoint-keys", {"renames": {"model": "m"}}),
    ],
}


def _valid_order(steps, rng: random.Random):
    """A random order of ``steps`` that respects every AFTER constraint."""
    remaining = list(steps)
    order = []
    while remaining:
        ready = [
            s for s in remaining if not any(o[0] in get_codemod(s[0]).AFTER for o in remaining if o is not s)
        ]
        pick = rng.choice(ready)
        order.append(pick)
        remaining.remove(pick)
    return order


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16))
@pytest.mark.parametrize("name", sorted(SETS))
def test_any_valid_order_gives_the_same_port(name, seed):
    rng = random.Random(seed)
    steps = SETS[name]
    outputs = set()
    for _ in range(2):
        order = _valid_order(steps, rng)
        module = _applied_once(*order[0], "llama3")
        for codemod_id, params in order[1:]:
            module = _apply(codemod_id, params, module)
        outputs.add(module.code)
    assert len(outputs) == 1


def _same_class_pairs():
    """Unordered pairs of codemods that edit the same class or mapping."""
    groups = [
        ["norm-placement", "norm-offset", "residual-multiplier", "lm-head-bias", "mlp-bias"],
        ["embedding-scale", "embedding-multiplier"],
        ["lm-head-bias", "logits-divisor", "logit-softcap"],
        ["mlp-activation", "mlp-kind", "mlp-bias", "fused-checkpoint"],
    ]
    seen = set()
    for group in groups:
        for a, b in itertools.combinations(group, 2):
            if a in get_codemod(b).AFTER or b in get_codemod(a).AFTER or (a, b) in seen:
                continue
            seen.add((a, b))
            yield pytest.param(a, b, id=f"{a}+{b}")


@pytest.mark.parametrize("first, second", list(_same_class_pairs()))
def test_unordered_pairs_commute(first, second):
    p1, p2 = PARAMS[first][0], PARAMS[second][0]
    try:  # each codemod's own application on llama3 computed once (``_once``)
        ab = _apply(second, p2, _applied_once(first, p1, "llama3")).code
        ba = _apply(first, p1, _applied_once(second, p2, "llama3")).code
    except PreconditionError:
        return
    assert ab == ba
