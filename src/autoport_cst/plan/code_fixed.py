"""Plan steps for features a reference reads from a config key the model's config lacks.

A reference reads some features from the config at run time
(``config_driven`` in its manifest: qwen3_moe's ``moe.norm_topk_prob`` from
``norm_topk_prob``), and the composer then realizes a target value by the
config alone. That holds only when the model's config carries the key: a
config without it (neither in config.json nor among the fields of its
transformers config class, whose defaults the serving engine hands over)
leaves the port's config dataclass at its default, the reference's own value.
Llama 4's ``Llama4TextConfig`` has no ``norm_topk_prob`` and its code never
renormalizes the sigmoid top-k weights, where the qwen3_moe port's default
renormalizes them.

So when the researched value differs from the reference's and the config
does not hold the key, the plan fixes the behaviour in code with an explicit
step of the codemod that realizes the feature. A model whose code computes
the reference's value without the key (Mixtral renormalizes, as qwen3_moe's
default does) needs no step; a config that holds the key is read at run
time as before, unless research, run again with the key varied, keeps the
value: the code holds the key but does not follow it (Cohere2 MoE's softmax
over the top-k logits sums to 1 whatever ``norm_topk_prob`` says); then the
plan fixes it in code too.
"""

from __future__ import annotations

from typing import Any

from autoport_cst.spec import get_field

# spec field -> (the config key a reference reads it from, the codemod that
# fixes it in code, that codemod's parameter holding the value)
CONFIG_READ_FEATURES: dict[str, tuple[str, str, str]] = {
    "moe.norm_topk_prob": ("norm_topk_prob", "norm-topk-prob", "renormalize"),
}


def code_fixed_steps(found: Any, spec: Any, config_driven: dict[str, Any]) -> list[tuple[str, dict]]:
    """``(codemod, params)`` per feature of ``spec`` that the reference
    (``config_driven``, its own ``spec``) reads from a config key that the
    researched model's config (``found.finding(field, "config")``) lacks,
    where the researched value differs from the reference's."""
    steps: list[tuple[str, dict]] = []
    finding = getattr(found, "finding", None)
    if finding is None:
        return steps
    for path, (_key, codemod, param) in CONFIG_READ_FEATURES.items():
        if path not in config_driven or _section_absent(found.spec, path):
            continue
        held = finding(path, "config")
        value = get_field(found.spec, path)
        if value is None:
            continue
        if held is not None and held.known:
            # read at run time, unless the model's computation does not follow the key
            if _ignored(found, _key, path):
                steps.append((codemod, {param: value}))
            continue
        if value == get_field(spec, path):
            continue
        steps.append((codemod, {param: value}))
    return steps


def _ignored(found: Any, key: str, path: str) -> bool:
    """Whether research, run again with the config's ``key`` varied, kept
    ``path`` as it was: the model's code holds the key but does not follow it
    (Cohere2 MoE reads ``norm_topk_prob`` for its sigmoid router only; its
    softmax over the top-k logits sums to 1 whatever the key says)."""
    dependence = getattr(found, "config_dependence", None)
    probes = [p for p in getattr(dependence, "probes", ()) if p.field == key and not p.given]
    return bool(probes) and all(
        p.error is None and path not in p.unknown and all(c.path != path for c in p.changes) for p in probes
    )


def _section_absent(spec: Any, path: str) -> bool:
    """Whether the spec has no section holding ``path`` (no ``moe``: a dense model)."""
    section = path.split(".", 1)[0] if "." in path else None
    return section is not None and getattr(spec, section, None) is None
