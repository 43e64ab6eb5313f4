"""Checkpoint keys read, not guessed: the key of every tensor a port loads
comes from the checkpoint's header, by structure (path suffixes, shapes),
and a tensor without a key refuses the plan naming it and what is stored.

The held-out checkpoints are written as ``save_pretrained`` writes them
(transformers' load-time renames and fusions reverted: the hub layout),
which is what a user's checkpoint looks like."""

from __future__ import annotations

import pytest

from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import TensorInfo
from autoport_cst.research.key_match import Wanted, match_keys


def _stored(shapes: dict[str, tuple[int, ...]]) -> dict[str, TensorInfo]:
    return {name: TensorInfo(name, "F32", shape, "model.safetensors") for name, shape in shapes.items()}


def test_a_head_stored_under_another_name_is_found_by_shape():
    stored = _stored({"embed_in.weight": (512, 64), "embed_out.weight": (512, 64), "norm.weight": (64,)})
    expected = {"embed_in.weight": (512, 64), "lm_head.weight": (512, 64), "norm.weight": (64,)}
    wanted = [Wanted("lm_head", "weight", "lm_head.weight", (512, 64), None)]
    match = match_keys(wanted, stored, expected)
    assert match.modules == {"lm_head": "embed_out"} and not match.missing


def test_a_router_under_a_submodule_and_renamed_stacked_experts():
    prefix = "model.layers.0.block_sparse_moe"
    stored = _stored(
        {
            f"{prefix}.router.layer.weight": (4, 64),
            f"{prefix}.input_linear.weight": (4, 256, 64),
            f"{prefix}.output_linear.weight": (4, 64, 128),
        }
    )
    wanted = [
        Wanted("mlp.gate", "weight", f"{prefix}.router.weight", (4, 64), 0),
        Wanted("mlp.experts.down_proj", "", f"{prefix}.experts.down_proj", (4, 64, 128), 0),
        Wanted("mlp.experts.gate_up_proj", "", f"{prefix}.experts.gate_up_proj", (4, 256, 64), 0),
    ]
    match = match_keys(wanted, stored, {w.code_key: w.shape for w in wanted})
    assert match.modules == {
        "mlp.gate": "block_sparse_moe.router.layer",
        "mlp.experts.down_proj": "block_sparse_moe.output_linear.weight",
        "mlp.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
    }


def test_square_per_expert_tensors_are_told_apart_by_name():
    # hidden == expert width: gate, up and down all [64, 64]
    prefix = "model.layers.1.block_sparse_moe"
    stored = _stored(
        {f"{prefix}.experts.{j}.{n}.weight": (64, 64) for j in range(2) for n in ("w1", "w2", "w3")}
    )
    wanted = [
        Wanted("mlp.experts.down_proj", "", f"{prefix}.experts.down_proj", (2, 64, 64), 1),
        Wanted("mlp.experts.gate_up_proj", "", f"{prefix}.experts.gate_up_proj", (2, 128, 64), 1),
    ]
    match = match_keys(wanted, stored, {w.code_key: w.shape for w in wanted})
    assert match.per_expert and not match.missing
    assert {k: v for k, v in match.modules.items() if "*" in k} == {
        "mlp.experts.*.gate_proj": "block_sparse_moe.experts.*.w1",
        "mlp.experts.*.up_proj": "block_sparse_moe.experts.*.w3",
        "mlp.experts.*.down_proj": "block_sparse_moe.experts.*.w2",
    }


def test_two_stored_tensors_that_fit_equally_are_no_match():
    stored = _stored({"a.weight": (8, 8), "b.weight": (8, 8)})
    wanted = [Wanted("lm_head", "weight", "lm_head.weight", (8, 8), None)]
    match = match_keys(wanted, stored, {"lm_head.weight": (8, 8)})
    assert match.modules == {} and match.missing[0][0].code_key == "lm_head.weight"
    assert match.missing[0][1] == ["a.weight (8, 8)", "b.weight (8, 8)"]


def test_a_routing_bias_stored_as_one_row():
    prefix = "model.layers.1.mlp"
    stored = _stored(
        {f"{prefix}.gate.weight": (4, 64), f"{prefix}.moe_statics.e_score_correction_bias": (1, 4)}
    )
    wanted = [
        Wanted("mlp.gate", "weight", f"{prefix}.gate.weight", (4, 64), 1),
        Wanted(
            "mlp.gate.e_score_correction_bias",
            "",
            f"{prefix}.gate.e_score_correction_bias",
            (4,),
            1,
            ((1, 4),),
        ),
    ]
    match = match_keys(wanted, stored, {wanted[0].code_key: (4, 64)})
    assert match.modules["mlp.gate.e_score_correction_bias"] == "mlp.moe_statics.e_score_correction_bias"


# -- held-out checkpoints, as save_pretrained writes them -------------------------

HELD_OUT = {
    "gpt_neox": {"lm_head": "embed_out", "model": "gpt_neox", "self_attn.o_proj": "attention.dense"},
    "granitemoe": {
        "mlp": "block_sparse_moe",
        "mlp.gate": "block_sparse_moe.router.layer",
        "mlp.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
        "mlp.experts.down_proj": "block_sparse_moe.output_linear.weight",
    },
    "hy_v3": {
        "mlp.gate": "mlp.router.gate",
        "mlp.gate.e_score_correction_bias": "mlp.expert_bias",
        "mlp.shared_experts": "mlp.shared_mlp",
    },
    "ernie4_5_moe": {"mlp.gate.e_score_correction_bias": "mlp.moe_statics.e_score_correction_bias"},
    "hunyuan_v1_moe": {
        "mlp.gate": "mlp.gate.wg",
        "mlp.shared_experts": "mlp.shared_mlp",
    },  # the router's projection
    "aria_text": {
        "mlp.gate": "mlp.router",
        "mlp.experts.gate_up_proj": "mlp.experts.fc1.weight",
        "mlp.experts.down_proj": "mlp.experts.fc2.weight",
    },
}
PER_EXPERT = {"hy_v3", "ernie4_5_moe", "hunyuan_v1_moe"}


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    pytest.importorskip("transformers")
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("held-out")

    def build(model_type: str, key_format: str = "saved"):
        directory = root / f"{model_type}-{key_format}"
        if not directory.is_dir():
            build_tiny_checkpoint(model_type, directory, seed=3, key_format=key_format)
        return directory

    return build


@pytest.mark.parametrize(
    "model_type",
    [pytest.param(m, marks=pytest.mark.slow) if m == "aria_text" else m for m in sorted(HELD_OUT)],
)  # Aria's modeling code takes ~20 s to analyse
def test_the_key_map_is_read_from_the_header(held_out, model_type):
    from autoport_cst.research import research

    result = research(str(held_out(model_type)))
    key_map = result.spec.checkpoint.key_map or {}
    assert {k: key_map.get(k) for k in HELD_OUT[model_type]} == HELD_OUT[model_type]
    assert result.spec.checkpoint.gate_up == ("separate" if model_type in PER_EXPERT else "fused") or (
        result.spec.moe is None
    )
    decision = result.decision("checkpoint.key_map")
    assert decision.source == "checkpoint" and "read from the header" in decision.evidence


def test_the_model_s_own_names_need_no_rename(held_out):
    from autoport_cst.research import research

    key_map = research(str(held_out("granitemoe", "model"))).spec.checkpoint.key_map
    assert key_map == {"mlp": "block_sparse_moe", "mlp.gate": "block_sparse_moe.router"}


def test_a_tensor_without_a_key_refuses_the_plan(held_out, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from autoport_cst.research import research

    directory = tmp_path / "granitemoe"
    shutil.copytree(held_out("granitemoe"), directory)
    state = load_file(directory / "model.safetensors")
    state = {k: v for k, v in state.items() if "router" not in k}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError) as caught:
        research(str(directory))
    message = str(caught.value)
    assert "no tensor for mlp.gate.weight" in message
    assert "model.layers.0.block_sparse_moe.input_linear.weight (4, 256, 64)" in message
    assert caught.value.position.path.endswith("model.safetensors")
