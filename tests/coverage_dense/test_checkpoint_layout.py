"""checkpoint.key_map and checkpoint.linear_layout = in_out, realized by the
composer from the spec alone (no explicit steps): a tiny Llama checkpoint
carries, beside the usual tensors that transformers loads, [in, out] copies
of every layer projection under other names (as a GPT-2 Conv1D checkpoint
stores them); the port must read only the copies, untransposed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from autoport_cst.cli import cli  # noqa: E402
from autoport_cst.validate import build_tiny_checkpoint, validate_model  # noqa: E402

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@pytest.fixture(scope="module")
def in_out_checkpoint(tmp_path_factory) -> Path:
    from safetensors.torch import load_file, save_file

    target = tmp_path_factory.mktemp("in-out") / "checkpoint"
    build_tiny_checkpoint("LlamaForCausalLM", target, seed=0)
    path = target / "model.safetensors"
    state = load_file(str(path))
    for key in [k for k in state if k.endswith(".weight")]:
        module = key[: -len(".weight")]
        if module.split(".", 3)[-1] in PROJECTIONS:  # model.layers.<i>.<projection>
            state[f"{module}_t.weight"] = state[key].T.contiguous()
    save_file(state, str(path), metadata={"format": "pt"})
    return target


def plan(tmp_path: Path, layout: str) -> Path:
    data = {
        "version": 1,
        "name": f"llama_{layout}",
        "architecture": "LlamaForCausalLM",
        "reference": "llama3",
        "spec": {
            "rope": {"type": "default"},
            "checkpoint": {"key_map": {p: f"{p}_t" for p in PROJECTIONS}, "linear_layout": layout},
        },
    }
    path = tmp_path / f"{layout}.plan.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def build(tmp_path: Path, layout: str) -> Path:
    out = tmp_path / f"out-{layout}"
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(plan(tmp_path, layout)), "--out", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    return out / "vllm_neuron" / "model" / f"llama_{layout}"


def test_in_out_projections_load_untransposed(tmp_path, in_out_checkpoint):
    package = build(tmp_path, "in_out")
    source = (package / "model.py").read_text(encoding="utf-8")
    assert "is_storage_transposed=True" not in source
    assert '"{prefix}.self_attn.o_proj_t.weight"' in source.replace('f"', '"')
    # no config variants: a variant checkpoint, written by transformers, lacks the hand-made [in, out] copies
    report = validate_model(package, in_out_checkpoint, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert report.equivalent, report.summary()
    # nor does the stand-in of TP=4 with KV heads replicated: reported as not run, naming the copies
    (replicated,) = [e for e in report.parallel_layouts if e["label"] == "TP=4, KV heads replicated"]
    assert replicated["equivalent"] is None
    assert "lacks 7 of its tensor names: model.layers.*.mlp.down_proj_t.weight" in replicated["summary"]


def test_out_in_loaders_on_in_out_tensors_do_not_load(tmp_path, in_out_checkpoint):
    """The same keys read with the usual transposing loaders: the tiny model's
    K/V and MLP projections are not square, so loading stops. The checkpoint
    is valid (transformers loads it): the port fails at load (exit 1), naming
    the parameter, not the input."""
    report = validate_model(build(tmp_path, "out_in"), in_out_checkpoint, tp=1, dtype="fp32", steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "load"
    assert re.search("k_proj|v_proj|gate_proj|up_proj|down_proj", report.failure.message)
