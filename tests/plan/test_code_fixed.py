"""A feature the reference reads from a config key that the model's config
lacks is fixed in code by the plan: the port's config dataclass would
otherwise keep the reference's own value (qwen3_moe renormalizes the top-k
weights when a config has no norm_topk_prob; Llama 4's code never does)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from autoport_cst.plan import from_research
from autoport_cst.plan.code_fixed import code_fixed_steps
from autoport_cst.research.findings import CODE, CONFIG, Finding, known
from autoport_cst.spec import ArchSpec
from autoport_cst.spec.model import MoESpec


@dataclass(frozen=True)
class Found:
    spec: ArchSpec
    findings: tuple[Finding, ...]
    architecture: str = "NoSuchMoeForCausalLM"  # no transformers class: no key-formats step to research

    def finding(self, name, source=None):
        for f in reversed(self.findings):
            if f.field == name and (source is None or f.source == source):
                return f
        return None


def moe_spec(renormalize: bool) -> ArchSpec:
    moe = MoESpec(num_experts=4, top_k=2, intermediate_size=64, norm_topk_prob=renormalize)
    return dataclasses.replace(ArchSpec(), moe=moe)


CODE_SAYS_NO = known(False, "moe.norm_topk_prob", CODE, "top-k weights used as computed")
CONFIG_SAYS = {
    v: known(v, "moe.norm_topk_prob", CONFIG, "norm_topk_prob (config.json)") for v in (True, False)
}
QWEN3_MOE = moe_spec(True)
READS = {"moe.norm_topk_prob": [True, False]}


def test_a_value_the_config_cannot_carry_is_fixed_in_code():
    """Llama 4: no norm_topk_prob in config.json nor its config class, its
    sigmoid top-k weights used as computed: the step says so."""
    found = Found(moe_spec(False), (CODE_SAYS_NO,))
    assert code_fixed_steps(found, QWEN3_MOE, READS) == [("norm-topk-prob", {"renormalize": False})]


@pytest.mark.parametrize(
    "found, reads",
    [
        # Qwen2-MoE: its config holds norm_topk_prob (False): read at run time
        (Found(moe_spec(False), (CODE_SAYS_NO, CONFIG_SAYS[False])), READS),
        # Mixtral: no key, renormalizes as the reference does without it
        (Found(moe_spec(True), ()), READS),
        # a reference that does not read the feature from the config: the composer's diff step
        (Found(moe_spec(False), (CODE_SAYS_NO,)), {}),
        # a dense model
        (Found(ArchSpec(), ()), READS),
    ],
    ids=["key-in-config", "reference-value", "not-config-driven", "dense"],
)
def test_no_step_where_the_config_carries_the_value_or_none_is_needed(found, reads):
    assert code_fixed_steps(found, QWEN3_MOE, reads) == []


def test_the_plan_holds_the_step_and_applies_it_before_the_config():
    """From research to plan on the qwen3_moe reference: the written plan
    names the step, whose codemod realizes the field (the composer does
    not fall back to the config)."""
    from autoport_cst.apply.composer import compose
    from autoport_cst.apply.reference import load_reference

    plan = from_research(Found(moe_spec(False), (CODE_SAYS_NO,)), "llama4_text", "qwen3_moe", "test")
    steps = [(s.codemod, s.params) for s in plan.steps]
    assert ("norm-topk-prob", {"renormalize": False}) in steps
    composition = compose(plan, load_reference("qwen3_moe"))
    realized = {step.id: step.realizes for step in composition.steps}
    assert realized["norm-topk-prob"] == ("moe.norm_topk_prob",)
    assert "moe.norm_topk_prob" not in {d.path for d in composition.by_config}
    with_key = Found(moe_spec(False), (CODE_SAYS_NO, CONFIG_SAYS[False]))
    read = from_research(with_key, "qwen2_moe", "qwen3_moe", "test")
    assert "norm-topk-prob" not in {s.codemod for s in read.steps}


@dataclass(frozen=True)
class Probe:
    field: str
    changes: tuple = ()
    unknown: tuple = ()
    error: str | None = None
    given: tuple = ()


@dataclass(frozen=True)
class Change:
    path: str


@dataclass(frozen=True)
class Dependence:
    probes: tuple[Probe, ...]


@dataclass(frozen=True)
class FoundWithProbes(Found):
    config_dependence: Dependence | None = None


CODE_SAYS_YES = known(True, "moe.norm_topk_prob", CODE, "softmax over the top-k values sums to 1")


def test_a_key_the_config_holds_but_the_code_does_not_follow_is_fixed_in_code():
    """Cohere2 MoE: norm_topk_prob in its config (read by the sigmoid router
    only), its softmax over the top-k logits renormalized whatever the key
    says: research run again with the key flipped keeps the value."""
    ignored = Dependence((Probe("norm_topk_prob"),))
    found = FoundWithProbes(moe_spec(True), (CODE_SAYS_YES, CONFIG_SAYS[True]), config_dependence=ignored)
    assert code_fixed_steps(found, QWEN3_MOE, READS) == [("norm-topk-prob", {"renormalize": True})]


@pytest.mark.parametrize(
    "probes",
    [
        (Probe("norm_topk_prob", changes=(Change("moe.norm_topk_prob"),)),),  # followed: read at run time
        (Probe("norm_topk_prob", unknown=("moe.norm_topk_prob",)),),  # the varied config left it unclassified
        (Probe("norm_topk_prob", error="could not research"),),
        (),  # never varied
    ],
    ids=["followed", "unclassified", "probe-failed", "no-probe"],
)
def test_a_key_the_config_holds_is_read_at_run_time_unless_shown_ignored(probes):
    found = FoundWithProbes(
        moe_spec(True), (CODE_SAYS_YES, CONFIG_SAYS[True]), config_dependence=Dependence(probes)
    )
    assert code_fixed_steps(found, QWEN3_MOE, READS) == []
