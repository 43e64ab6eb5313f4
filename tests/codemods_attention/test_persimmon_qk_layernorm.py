"""Persimmon's q/k norms: a LayerNorm with weight and bias of head_dim on
each query and key head, before its partial RoPE (the layer norms are
LayerNorms with bias too). Research reads them as the layer norms' kind
(nothing unsupported) and names their checkpoint tensors; qk-norm builds
them with the port's LayerNorm class and applies them op by op on every
attention path (no kernel normalises q/k heads with a mean and a bias);
partial-rotary reorders their weight and bias with the head columns.

The port of the tiny checkpoint validates at TP=1 in fp32 and bf16 and at
TP=2; the same port with the q/k norms' bias dropped, or without them in
decode, does not."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import validate_model

pytest.importorskip("transformers")

STEPS = 4
NORM_ARGUMENT = "qk_norm=self._per_head_qk_norm"


@pytest.fixture(scope="module")
def persimmon(tmp_path_factory):
    """(research of the tiny checkpoint, the checkpoint, the port's package)."""
    from autoport_cst.port import port
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    work = tmp_path_factory.mktemp("persimmon")
    source = work / "checkpoint"
    build_tiny_checkpoint("PersimmonForCausalLM", source, seed=0)
    outcome = port(str(source), "persimmon", work / "out", tp=2, checkpoint="source", steps=STEPS)
    return research(str(source)), source, work / "out" / "vllm_neuron" / "model" / "persimmon", outcome


def test_research_reads_the_qk_layernorms(persimmon):
    found, _, _, _ = persimmon
    spec = found.spec
    assert spec.unsupported is None
    assert (spec.norm.kind, spec.norm.bias) == ("layernorm", True)
    assert (spec.attention.qk_norm, spec.attention.qk_norm_position) == ("per_head", "before_rope")
    assert spec.checkpoint.key_map["self_attn.q_norm"] == "self_attn.q_layernorm"
    assert spec.checkpoint.key_map["self_attn.k_norm"] == "self_attn.k_layernorm"


def test_port_validates_at_tp1_fp32_bf16_and_tp2(persimmon):
    _, _, package, outcome = persimmon
    runs = {(r.tp, r.dtype): r for r in outcome.runs}
    assert set(runs) == {(1, "fp32"), (1, "bf16"), (2, "fp32")}
    assert all(r.equivalent for r in runs.values()), [r.summary for r in runs.values()]
    code = (package / "model.py").read_text(encoding="utf-8")
    # every path: the two prefill projections and the decode kernel, op by op with the norms
    assert code.count("qk_norm=self._per_head_qk_norm") == 3
    assert "NF.attention_decode(" not in code.split("class PersimmonAttention", 1)[1].split("\nclass ", 1)[0]
    for tensor in ("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"):
        assert (
            f'self_attn.{tensor}"] = f"{{prefix}}.self_attn.{tensor.replace("_norm", "_layernorm")}"' in code
        )
        assert f"get_weight_loader(self.{tensor})" in code  # reordered with the RoPE columns


def _mutant(package: Path, tmp: Path, old: str, new: str) -> Path:
    copy = tmp / "vllm_neuron" / "model" / "persimmon_mutant"
    shutil.copytree(package, copy)
    path = copy / "model.py"
    code = path.read_text(encoding="utf-8")
    assert len(re.findall(re.escape(old), code)) >= 1
    path.write_text(code.replace(old, new), encoding="utf-8")
    return copy


def test_the_port_without_the_norms_bias_diverges(persimmon, tmp_path):
    _, source, package, _ = persimmon
    mutant = _mutant(
        package,
        tmp_path,
        "return self.q_norm(q), self.k_norm(k)",
        "return self.q_norm(q) - self.q_norm.bias.to(q.dtype), self.k_norm(k) - self.k_norm.bias.to(k.dtype)",
    )
    report = validate_model(mutant, source, dtype="fp32", steps=STEPS)
    assert not report.equivalent
    diverging = report.first_diverging
    assert diverging is not None and (diverging.component, diverging.phase) == (
        "layers.0.attention",
        "prefill",
    )


@pytest.mark.parametrize(
    "site, phase",
    [(0, "prefill"), (1, "prefill"), (2, "decode")],
    ids=["chunked-prefill", "prefill", "decode"],
)
def test_the_port_without_the_norms_on_one_path_diverges(site, phase, persimmon, tmp_path):
    """Each of the three sites the norms were given (the chunked prefill's
    projection, the whole prefill's, the decode attention) without them."""
    _, source, package, _ = persimmon
    code = (package / "model.py").read_text(encoding="utf-8")
    sites = [m.start() for m in re.finditer(re.escape(NORM_ARGUMENT), code)]
    at = sites[site]
    copy = tmp_path / "vllm_neuron" / "model" / "persimmon_mutant"
    shutil.copytree(package, copy)
    (copy / "model.py").write_text(
        code[:at] + "qk_norm=None" + code[at + len(NORM_ARGUMENT) :], encoding="utf-8"
    )
    report = validate_model(copy, source, dtype="fp32", steps=STEPS)
    assert not report.equivalent
    diverging = report.first_diverging
    assert diverging is not None and (diverging.component, diverging.phase) == ("layers.0.attention", phase)
