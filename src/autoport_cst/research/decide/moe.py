"""The MoE section of the spec: none when no layer routes to experts (a
note when the config sets experts anyway); else the routing, expert and
shared-expert fields from the code, sizes checked against the config."""

from __future__ import annotations

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CODE, CONFIG, known, unknown
from autoport_cst.spec import MoESpec


def moe(d: Decider) -> MoESpec | None:
    if d.code is None:
        experts = d.cfg.value("moe.num_experts")
        if experts:
            d.unknown.append("moe")
            d.decisions.append(
                unknown("moe", CONFIG, f"config has {experts} experts; no code to read routing from")
            )
        return None
    marker = d.code_finding("moe")
    if marker is not None and marker.known and marker.value is None:
        d.decisions.append(marker)
        experts = d.cfg.value("moe.num_experts")
        if experts:
            d.notes.append(
                known(
                    experts,
                    "config.num_experts_unused",
                    CONFIG,
                    f"config sets {experts} experts but no layer routes to experts",
                )
            )
        return None
    if d.code.get("moe.num_experts") is None:
        return None
    spec = MoESpec(
        num_experts=d.decide("moe.num_experts", None, (CODE, CONFIG)),
        top_k=d.decide("moe.top_k", None, (CODE, CONFIG)),
        intermediate_size=d.decide("moe.intermediate_size", None, (CODE, CONFIG)),
        shared_experts=d.decide("moe.shared_experts", 0, (CODE,)),
        shared_expert_gate=d.decide("moe.shared_expert_gate", False, (CODE,)),
        router_activation=d.decide("moe.router_activation", "softmax", (CODE,)),
        router_bias=d.decide("moe.router_bias", False, (CODE,)),
        routing_bias=d.decide("moe.routing_bias", False, (CODE,)),
        norm_topk_prob=d.decide("moe.norm_topk_prob", False, (CODE, CONFIG)),
        routed_scaling_factor=d.decide("moe.routed_scaling_factor", None, (CODE,)),
        dense_layers=d.decide("moe.dense_layers", None, (CODE,)),
        group_limit=d.flag("moe.group_limit", "none"),
        expert_input_scaling=d.flag("moe.expert_input_scaling", False),
    )
    for name in ("num_experts", "top_k", "intermediate_size"):
        c, k = d.cfg_finding(f"moe.{name}"), d.code_finding(f"moe.{name}")
        if c is not None and k is not None and c.known and k.known and c.value != k.value:
            d.conflict(
                f"moe.{name}",
                [(CONFIG, c.value, c.evidence), (CODE, k.value, k.evidence)],
                f"the spec takes {k.value}: the value the code builds",
            )
    return spec
