"""A port loads a checkpoint in either of transformers' key formats: the
module tree's names (tiny checkpoints by default) and what save_pretrained
writes (the hub's: GPT-NeoX's embed_out, MiniMax-M2's block_sparse_moe and
w1/w2/w3 experts), the pairs derived from transformers' own conversion
(research.key_formats), a key under neither name refused at load by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _helper():
    from codemods.key_formats import HELPER, HELPER_CODE

    scope: dict = {}
    exec(HELPER_CODE, scope)  # noqa: S102 - the helper the codemod writes into a port
    return scope[HELPER]


def test_transformers_conversion_gives_the_pairs_of_both_formats():
    from autoport_cst.research.key_formats import key_format_renames

    assert key_format_renames("GPTNeoXForCausalLM") == (("lm_head.weight", "embed_out.weight"),)
    assert key_format_renames("LlamaForCausalLM") == ()
    assert key_format_renames("NoSuchModelForCausalLM") == ()


@pytest.mark.slow
def test_fused_experts_pair_per_expert_in_transformers_concatenation_order():
    from autoport_cst.research.key_formats import key_format_renames

    minimax = dict(key_format_renames("MiniMaxM2ForCausalLM"))
    assert minimax["mlp.gate.weight"] == "block_sparse_moe.gate.weight"
    # fused experts: the canonical per-expert names, in transformers' concatenation order
    assert minimax["mlp.experts.*.gate_proj.weight"] == "block_sparse_moe.experts.*.w1.weight"
    assert minimax["mlp.experts.*.up_proj.weight"] == "block_sparse_moe.experts.*.w3.weight"
    assert minimax["mlp.experts.*.down_proj.weight"] == "block_sparse_moe.experts.*.w2.weight"


def test_a_parameter_loaded_under_its_own_name_takes_its_other_format_name():
    """The real vllm_neuron llama3 maps only the keys it renames; the loader
    reads every other parameter under its own name (``mappings.get(name,
    name)``), so a port of it must resolve those too."""
    resolve = _helper()
    renames = {"lm_head.weight": "embed_out.weight"}
    saved = {"embed_out.weight", "model.norm.weight"}
    own = ["lm_head.weight", "model.norm.weight", "model.extra.weight"]
    assert resolve({}, saved, renames, own=own) == {"lm_head.weight": "embed_out.weight"}
    # present under its own name, or under neither: no entry (the loader reads or refuses it by name)
    assert resolve({}, {"lm_head.weight"}, renames, own=own) == {}


def test_a_missing_key_takes_its_other_format_name_either_way():
    resolve = _helper()
    renames = {
        "lm_head.weight": "embed_out.weight",
        "mlp.experts.*.gate_proj.weight": "moe.experts.*.w1.weight",
    }
    saved = {"embed_out.weight", "model.layers.3.moe.experts.7.w1.weight", "model.norm.weight"}
    mappings = {
        "lm_head.weight": "lm_head.weight",
        "model.norm.weight": "model.norm.weight",
        "gate": ["model.layers.3.mlp.experts.7.gate_proj.weight"],
    }
    assert resolve(mappings, saved, renames) == {
        "lm_head.weight": "embed_out.weight",
        "model.norm.weight": "model.norm.weight",
        "gate": ["model.layers.3.moe.experts.7.w1.weight"],
    }
    tree = {"lm_head.weight"}
    assert resolve({"lm_head.weight": "embed_out.weight"}, tree, renames) == {
        "lm_head.weight": "lm_head.weight"
    }
    # under two other names (renames that permute names): the key stays, for the loader to name it
    permuting = {"a.weight": "b.weight", "b.weight": "a.weight", "c.weight": "b.weight"}
    assert resolve({"p": "x.b.weight"}, {"x.a.weight", "x.c.weight"}, permuting) == {"p": "x.b.weight"}
    # under neither name: the key stays, for the loader to name it
    assert resolve({"lm_head.weight": "lm_head.weight"}, {"other"}, renames) == {
        "lm_head.weight": "lm_head.weight"
    }


def test_a_plan_from_research_takes_the_key_formats_step(tmp_path):
    from autoport_cst.plan import from_research
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint("GPTNeoXForCausalLM", tmp_path / "neox", key_format="saved")
    plan = from_research(research(str(tmp_path / "neox")), "neox", "starcoder2", "")
    steps = {step.codemod: step.params for step in plan.steps}
    assert steps["key-formats"] == {"renames": {"lm_head.weight": "embed_out.weight"}}


@pytest.fixture(scope="module")
def neox_port(tmp_path_factory):
    out = tmp_path_factory.mktemp("neox-port")
    plan = EXAMPLES / "gpt_neox.plan.json"
    command = [
        sys.executable,
        "-m",
        "autoport_cst",
        "apply",
        "--ref",
        "llama3",
        "--plan",
        str(plan),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out / "vllm_neuron" / "model" / "gpt_neox"


def test_the_gpt_neox_example_port_resolves_its_keys_against_the_checkpoint(neox_port):
    text = (neox_port / "model.py").read_text()
    assert (
        'set(checkpoint.get_tensor_names()), {"lm_head.weight": "embed_out.weight"}, '
        "own=[name for name, _ in self.named_parameters()])"
    ) in text


@pytest.mark.slow
@pytest.mark.parametrize("key_format", ["saved", "model"])
def test_the_gpt_neox_example_validates_on_either_key_format(neox_port, tmp_path, key_format):
    from autoport_cst.research.checkpoint import read_checkpoint
    from autoport_cst.validate.api import validate_model
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = tmp_path / key_format
    build_tiny_checkpoint("GPTNeoXForCausalLM", checkpoint, key_format=key_format)
    head = "embed_out.weight" if key_format == "saved" else "lm_head.weight"
    assert head in read_checkpoint(checkpoint).tensors
    # the FP8 KV-cache variant reads its scales under the reference's keys (known wrong, its own test)
    report = validate_model(neox_port, checkpoint, steps=4, config_variants=False)
    assert report.equivalent, report.summary()


@pytest.mark.slow
def test_a_key_under_neither_name_is_refused_at_load_by_name(neox_port, tmp_path):
    from safetensors.torch import load_file, save_file

    from autoport_cst.errors import InputError
    from autoport_cst.validate.api import validate_model
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = tmp_path / "saved"
    build_tiny_checkpoint("GPTNeoXForCausalLM", checkpoint, key_format="saved")
    (file,) = checkpoint.glob("*.safetensors")
    state = load_file(file)
    state["elsewhere.weight"] = state.pop("embed_out.weight")
    save_file(state, file, metadata={"format": "pt"})
    with pytest.raises(InputError, match="has no tensor 'lm_head.weight' for parameter 'lm_head.weight'"):
        validate_model(neox_port, checkpoint, steps=4, config_variants=False)


def test_per_expert_tensors_whose_values_move_are_not_paired():
    import torch

    from autoport_cst.research.key_formats import _expert_pairs

    fused = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    saved = {
        "model.layers.0.moe.experts.0.w1.weight": fused[0, :2].clone(),
        "model.layers.0.moe.experts.0.w3.weight": fused[0, 2:].clone(),
        "model.layers.0.moe.experts.1.w1.weight": fused[1, :2].clone(),
    }
    assert _expert_pairs("mlp.experts.gate_up_proj", fused, saved) == [
        ("mlp.experts.*.gate_proj.weight", "moe.experts.*.w1.weight"),
        ("mlp.experts.*.up_proj.weight", "moe.experts.*.w3.weight"),
    ]
    transposed = {name: value.T.contiguous() for name, value in saved.items()}
    assert _expert_pairs("mlp.experts.gate_up_proj", fused, transposed) == []
    swapped = dict(zip(list(saved)[:2], [fused[0, 2:], fused[0, :2]], strict=True))
    assert _expert_pairs("mlp.experts.gate_up_proj", fused, swapped) == []
