"""apply refuses a port that loads a key the checkpoint the plan was made
on does not store (``plan.checkpoint_keys``): exit 2 before anything is
written, at the mapping entry, naming the tensor and the keys present,
instead of a port that fails at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.apply.checkpoint_keys import check_checkpoint_keys
from autoport_cst.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

LOAD_WEIGHTS = """
class M:
    def load_weights(self, path):
        names = set(checkpoint.get_tensor_names())
        mappings = {}
        for layer_id in range(n):
            prefix = f"model.layers.{layer_id}"
            moe = moe_checkpoint_keys(names, prefix, 4)
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = [
                f"{prefix}.mlp.experts.{j}.gate_proj.weight" for j in range(4)
            ] + [f"{prefix}.mlp.experts.{j}.up_proj.weight" for j in range(4)]
            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
            if self.quantized:
                mappings[f"{prefix}.self_attn.o_proj_scale"] = f"{prefix}.self_attn.o_proj.weight_scale"
        mappings["model.norm.weight"] = "model.norm.weight"
        if self.config.tie_word_embeddings:
            mappings["lm_head.weight"] = "model.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"
"""
STORED = (
    "lm_head.weight",
    "model.embed_tokens.weight",
    "model.norm.weight",
    "model.layers.*.self_attn.o_proj.weight",
    "model.layers.*.mlp.experts.*.gate_proj.weight",
    "model.layers.*.mlp.experts.*.up_proj.weight",
    "model.layers.*.mlp.experts.*.down_proj.weight",
)


def test_every_key_the_port_loads_is_stored():
    # the quantized scale is optional (an if without else), moe.down is looked up at load time
    check_checkpoint_keys(STORED, {"pkg/model.py": LOAD_WEIGHTS}, tied=False)


def test_a_key_formatted_from_a_load_time_lookup_is_not_checked():
    # f"{moe.router}.weight" is a lookup among the names at load time, of any number of segments;
    # read as "*.weight" it fitted only a two-segment key (lm_head.weight), absent when the head is tied
    text = LOAD_WEIGHTS.replace(
        '            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down\n',
        '            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down\n'
        '            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"\n',
    )
    assert "moe.router" in text
    stored = tuple(k for k in STORED if k != "lm_head.weight") + ("model.embed_tokens.weight",)
    check_checkpoint_keys(stored, {"pkg/model.py": text}, tied=True)


def test_a_key_the_checkpoint_lacks_is_refused_at_its_entry():
    stored = tuple(k for k in STORED if "up_proj" not in k)
    with pytest.raises(InputError) as caught:
        check_checkpoint_keys(stored, {"pkg/model.py": LOAD_WEIGHTS}, tied=False)
    message = str(caught.value)
    assert "model.layers.*.mlp.experts.*.up_proj.weight" in message
    assert (
        "mlp.experts.gate_up_proj_weight" in message
        and "model.layers.*.mlp.experts.*.gate_proj.weight" in message
    )
    assert caught.value.position.path == "pkg/model.py" and caught.value.position.line == 10


def test_the_tied_branch_is_the_plan_s():
    untied_head_missing = tuple(k for k in STORED if k != "lm_head.weight")
    check_checkpoint_keys(untied_head_missing, {"pkg/model.py": LOAD_WEIGHTS}, tied=True)
    with pytest.raises(InputError, match="the port loads lm_head.weight for parameter lm_head.weight"):
        check_checkpoint_keys(untied_head_missing, {"pkg/model.py": LOAD_WEIGHTS}, tied=False)


def test_a_plan_without_checkpoint_keys_is_not_checked():
    check_checkpoint_keys(None, {"pkg/model.py": LOAD_WEIGHTS}, tied=False)


GPT_NEOX_SAVED = [
    "embed_out.weight",
    "gpt_neox.embed_in.weight",
    "gpt_neox.final_layer_norm.bias",
    "gpt_neox.final_layer_norm.weight",
    *(
        f"gpt_neox.layers.*.{m}.{p}"
        for m in (
            "attention.dense",
            "attention.query_key_value",
            "input_layernorm",
            "post_attention_layernorm",
            "mlp.dense_h_to_4h",
            "mlp.dense_4h_to_h",
        )
        for p in ("weight", "bias")
    ),
]


def _apply(tmp_path, plan: dict):
    from click.testing import CliRunner

    from autoport_cst.cli import cli

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    out = tmp_path / "out"
    return CliRunner().invoke(cli, ["apply", "--plan", str(path), "--out", str(out)]), out


def test_apply_refuses_a_port_whose_head_key_the_checkpoint_names_otherwise(tmp_path):
    # GPT-NeoX as save_pretrained writes it: the head is embed_out
    plan = json.loads((ROOT / "examples" / "gpt_neox.plan.json").read_text())
    plan["checkpoint_keys"] = GPT_NEOX_SAVED
    result, out = _apply(tmp_path, plan)
    assert result.exit_code == 2, result.output
    assert "model.py:" in result.output and "the port loads lm_head.weight" in result.output
    assert "embed_out.weight" in result.output
    assert not out.exists()


@pytest.mark.slow
def test_apply_writes_the_port_once_the_key_map_names_the_head(tmp_path):
    plan = json.loads((ROOT / "examples" / "gpt_neox.plan.json").read_text())
    plan["checkpoint_keys"] = GPT_NEOX_SAVED
    plan["spec"]["checkpoint"]["key_map"]["lm_head"] = "embed_out"
    result, out = _apply(tmp_path, plan)
    assert result.exit_code == 0, result.output
