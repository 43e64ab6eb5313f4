"""The Falcon layouts beside the default (Falcon-7B: multi-query, parallel
attention and MLP from one LayerNorm), each its own tiny checkpoint built
from a copy of the default config with the fields real checkpoints set:

- ``parallel_attn=False``: sequential pre-norm blocks whose residual adds
  are inside ``dropout_add(x, residual, ...)``, a function of the modeling
  file (research ran it to see the add; before, norm.placement and
  residual.parallel were unclassified);
- ``multi_query=False``: a KV head per query head, the fused projection
  stored head by head ([q, k, v] per head);
- ``new_decoder_architecture=True`` (Falcon-40B/180B) is refused as
  qkv_head_groups (tests/coverage_dense/test_falcon.py).

The port made on the default checkpoint refuses each other layout by its
config field (config-guards), naming the field and both values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint

LAYOUTS = {
    "sequential": {"parallel_attn": False},
    "multi_head": {"multi_query": False},
    "groups": {
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
        "num_attention_heads": 128,
        "hidden_size": 8192,
    },
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("falcon_layouts")


def _checkpoint(workdir: Path, name: str) -> Path:
    """The tiny checkpoint of the default FalconConfig with ``LAYOUTS[name]``
    written into its config.json before shrinking."""
    from transformers import FalconConfig

    target = workdir / name
    if not (target / "config.json").exists():
        fields = {**FalconConfig().to_dict(), "architectures": ["FalconForCausalLM"], **LAYOUTS.get(name, {})}
        config = workdir / f"{name}.json"
        config.write_text(json.dumps(fields))
        build_tiny_checkpoint(str(config), target, seed=0)
    return target


def test_research_reads_the_sequential_blocks_through_dropout_add(workdir):
    found = research(str(_checkpoint(workdir, "sequential")))
    assert not found.spec.unsupported and not found.unknown
    assert (found.spec.residual.parallel, found.spec.norm.placement) == ("none", "pre")
    assert found.spec.attention.num_kv_heads == 1 and found.spec.checkpoint.qkv == "fused"


def test_research_reads_the_per_head_fused_projection(workdir):
    found = research(str(_checkpoint(workdir, "multi_head")))
    assert not found.spec.unsupported and not found.unknown
    assert (found.spec.attention.num_kv_heads, found.spec.checkpoint.qkv) == (4, "fused_per_head")
    assert found.spec.residual.parallel == "shared_norm"


def test_the_default_port_guards_the_layout_fields(workdir):
    """The fields that choose the layout are fixed in the default port's code."""
    from autoport_cst.plan.plan_file import assumptions_of

    guards = assumptions_of(research(str(_checkpoint(workdir, "default"))), "llama3").step()
    assumed = {entry["field"]: entry["value"] for entry in guards["params"]["assumed"]}
    assert {k: assumed.get(k) for k in ("multi_query", "parallel_attn", "new_decoder_architecture")} == {
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
    }


def _validate(package: Path, checkpoint: Path):
    from autoport_cst.validate import validate_model

    return validate_model(package, checkpoint, steps=4, config_variants=False, parallel_layouts=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "mutation", "diverging"),
    [
        ("sequential", None, None),
        ("multi_head", ("per_head=True,", "per_head=False,"), "layers.0.attention"),
    ],
)
def test_the_layout_ports_and_validates_and_a_mutant_fails(workdir, layout, mutation, diverging):
    """TP=1 fp32 (with its config variants and layouts), bf16 and TP=2 on the
    checkpoint's own weights; the multi-head port loading the fused rows as
    [q | k | v] blocks (per_head=False) fails at the attention."""
    from autoport_cst.port import port

    outcome = port(
        str(_checkpoint(workdir, layout)),
        f"falcon_{layout}",
        workdir / f"out_{layout}",
        tp=2,
        force=True,
        checkpoint="source",
        steps=8,
    )
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    if mutation is None:
        return
    package = workdir / f"out_{layout}" / "vllm_neuron" / "model" / f"falcon_{layout}"
    mutant = workdir / f"mutant_{layout}"
    shutil.copytree(package, mutant, dirs_exist_ok=True)
    code = (mutant / "model.py").read_text()
    assert mutation[0] in code
    (mutant / "model.py").write_text(code.replace(*mutation))
    report = _validate(mutant, _checkpoint(workdir, layout))
    assert not report.equivalent and report.first_diverging is not None
    assert report.first_diverging.component.startswith(diverging), report.first_diverging


@pytest.mark.slow
def test_the_default_port_refuses_the_other_layouts(workdir):
    """The port of the default checkpoint fails at build on each other layout,
    naming the field and both values; without its parallel_attn guard, it
    computes the sequential checkpoint's MLP wrong (layers.0.mlp), where the
    sequential port validates."""
    from autoport_cst.port import port

    outcome = port(
        str(_checkpoint(workdir, "default")), "falcon", workdir / "out_default", checkpoint="source", steps=8
    )
    assert outcome.validated
    package = workdir / "out_default" / "vllm_neuron" / "model" / "falcon"
    refusals = {
        "sequential": "config field parallel_attn is False, but this port was made for parallel_attn = True",
        "multi_head": "config field multi_query is False, but this port was made for multi_query = True",
        "groups": "config field new_decoder_architecture is True, but this port was made for "
        "new_decoder_architecture = False",
    }
    for layout, message in refusals.items():
        report = _validate(package, _checkpoint(workdir, layout))
        assert not report.equivalent and report.failure is not None
        assert (report.failure.stage, message in report.failure.message) == ("build", True), report.failure
    unguarded = workdir / "unguarded"
    shutil.copytree(package, unguarded, dirs_exist_ok=True)
    config = (unguarded / "config.py").read_text()
    guard = '("parallel_attn", True, True, None,'
    assert guard in config
    (unguarded / "config.py").write_text("\n".join(l for l in config.splitlines() if guard not in l) + "\n")
    report = _validate(unguarded, _checkpoint(workdir, "sequential"))
    assert not report.equivalent and report.first_diverging is not None
    assert report.first_diverging.component == "layers.0.mlp", report.first_diverging
