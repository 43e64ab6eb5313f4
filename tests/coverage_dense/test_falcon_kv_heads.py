"""Falcon without multi-query (Falcon-RW: 32 heads, 32 KV heads) needs
num_kv_heads equal to num_attention_heads; transformers cannot run any other
value. The research varies each head count alone (unsupported) and both
together (sizes only), so the port is guarded on the relation, not on the
tiny checkpoint's 4 heads: it builds and validates on a checkpoint with 8
heads and 8 KV heads, and refuses 8 heads with 4 KV heads by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint

HEADS = {"four": (4, 4), "eight": (8, 8), "inconsistent": (8, 4)}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("falcon_kv_heads")


def _checkpoint(workdir: Path, name: str) -> Path:
    """The tiny checkpoint of the default FalconConfig with multi_query=False
    and the head counts of ``HEADS[name]`` set after shrinking."""
    from transformers import FalconConfig

    target = workdir / name
    if not (target / "config.json").exists():
        fields = {**FalconConfig().to_dict(), "architectures": ["FalconForCausalLM"], "multi_query": False}
        config = workdir / "multi_head.json"
        config.write_text(json.dumps(fields))
        heads, kv_heads = HEADS[name]
        build_tiny_checkpoint(
            str(config), target, seed=0, dimensions={"num_attention_heads": heads, "num_kv_heads": kv_heads}
        )
    return target


def test_the_head_counts_are_read_and_guarded_by_their_relation(workdir):
    from autoport_cst.plan.plan_file import assumptions_of

    found = assumptions_of(research(str(_checkpoint(workdir, "four"))), "llama3")
    by_field = {g.field: g for g in found.guards}
    assert "num_attention_heads" not in by_field
    assert (by_field["num_kv_heads"].same_as, by_field["num_kv_heads"].value) == ("num_attention_heads", 4)
    assert {"num_attention_heads", "num_kv_heads"} <= set(found.sizes)


@pytest.mark.slow
def test_the_port_validates_on_other_head_counts_and_refuses_unequal_ones(workdir):
    from autoport_cst.port import port
    from autoport_cst.validate import validate_model

    outcome = port(
        str(_checkpoint(workdir, "four")),
        "falcon_rw",
        workdir / "out",
        checkpoint="source",
        steps=4,
        force=True,
    )
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    package = workdir / "out" / "vllm_neuron" / "model" / "falcon_rw"
    report = validate_model(
        package, _checkpoint(workdir, "eight"), steps=4, config_variants=False, parallel_layouts=False
    )
    assert report.equivalent and report.failure is None, (report.failure, report.first_diverging)
    report = validate_model(
        package, _checkpoint(workdir, "inconsistent"), steps=4, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent and report.failure is not None and report.failure.stage == "build"
    assert "num_kv_heads is 4, but this port needs num_kv_heads equal to num_attention_heads (here 8" in (
        report.failure.message
    )
