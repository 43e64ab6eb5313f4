"""checkpoint-keys carries its renames to the FP8 KV-cache scale keys the
references read outside load_weights (``_load_kv_cache_scales``), or refuses
the site: a port never reads its scales under the reference's key."""

from __future__ import annotations

import textwrap

import pytest

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import Example, run_example
from autoport_cst.transform.library import get_codemod

LOAD = """
    HF_TEXT_PREFIX = "model.language_model"


    class LlamaForCausalLM(nn.Module):
        def load_weights(self, path):
            mappings = {}
            for layer_id in range(n):
                prefix = f"{HF_TEXT_PREFIX}.layers.{layer_id}"
                mappings[f"{prefix}.self_attn.qkv_proj_weight"] = f"{prefix}.self_attn.qkv_proj.weight"
                mappings[f"{prefix}.mlp.gate_weight"] = f"{prefix}.mlp.gate.weight"

        def _load_kv_cache_scales(self, checkpoint):
            for layer_id, layer in enumerate(self.model.layers):
                for scale_name in ("k_scale", "v_scale"):
                    key = SCALE_KEY
"""


def _run(renames: dict[str, str], scale_key: str) -> str:
    source = textwrap.dedent(LOAD).replace("SCALE_KEY", scale_key)
    output, _ = run_example(
        get_codemod("checkpoint-keys"), Example(before=source, params={"renames": renames})
    )
    return output


def test_a_module_prefix_constant_is_carried_through_the_attention_rename():
    output = _run(
        {"self_attn.qkv_proj": "attention.query_key_value"},
        'f"{HF_TEXT_PREFIX}.layers.{layer_id}.self_attn.{scale_name}"',
    )
    assert 'key = f"{HF_TEXT_PREFIX}.layers.{layer_id}.attention.{scale_name}"' in output


def test_renames_that_leave_the_attention_alone_leave_the_scale_key():
    scale_key = 'f"{HF_TEXT_PREFIX}.layers.{layer_id}.self_attn.{scale_name}"'
    assert f"key = {scale_key}" in _run({"mlp.gate": "mlp.router"}, scale_key)


def test_literal_scale_keys_are_renamed_too():
    output = _run(
        {"self_attn.qkv_proj": "attn.c_attn"}, 'f"{HF_TEXT_PREFIX}.layers.{layer_id}.self_attn.k_scale"'
    )
    assert 'key = f"{HF_TEXT_PREFIX}.layers.{layer_id}.attn.k_scale"' in output


def test_a_scale_key_built_from_what_the_codemod_cannot_read_is_refused_at_its_site():
    with pytest.raises(PreconditionError) as info:
        _run({"self_attn.qkv_proj": "attention.query_key_value"}, 'f"{layer.prefix}.{scale_name}"')
    assert "no weight key of load_weights under {layer.prefix}" in str(info.value)
    assert info.value.position is not None and info.value.position.line == 15


def test_a_scale_key_in_a_file_without_the_mappings_is_refused():
    source = textwrap.dedent(
        """
        class LlamaAttention(nn.Module):
            def load_scales(self, checkpoint, layer_id):
                for scale_name in ("k_scale", "v_scale"):
                    key = f"model.layers.{layer_id}.self_attn.{scale_name}"
        """
    )
    example = Example(
        before=source,
        params={"renames": {"self_attn.o_proj": "attention.dense"}},
        package_classes=("LlamaForCausalLM",),
    )
    with pytest.raises(PreconditionError, match="in a file without load_weights' mappings"):
        run_example(get_codemod("checkpoint-keys"), example)
