"""safetensors headers (no tensor loaded), sharded checkpoints, and the
cross-check of config, code and checkpoint."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import (
    layer_count,
    pattern,
    read_checkpoint,
    read_safetensors_header,
)


def write_header(path: Path, header: dict, payload: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)


def test_header_only(tmp_path):
    write_header(
        tmp_path / "model.safetensors",
        {
            "__metadata__": {"format": "pt"},
            "a.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]},
            "b.bias": {"dtype": "F32", "shape": [3], "data_offsets": [16, 28]},
        },
        payload=b"\0" * 28,
    )
    tensors, metadata = read_safetensors_header(tmp_path / "model.safetensors")
    assert metadata == {"format": "pt"}
    assert tensors["a.weight"].shape == (4, 2) and tensors["a.weight"].dtype == "BF16"
    header = read_checkpoint(tmp_path)
    assert header.parameter_count == 11
    assert header.dtypes == {"BF16": 1, "F32": 1}


def test_header_does_not_read_tensors(tmp_path):
    # the declared data is a hole in a sparse file: only the header is read
    path = tmp_path / "model.safetensors"
    write_header(path, {"w": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4_000_000]}})
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size + 4_000_000)
    assert read_checkpoint(tmp_path).parameter_count == 1_000_000


def test_sharded_index(tmp_path):
    write_header(
        tmp_path / "model-00001-of-00002.safetensors",
        {"model.layers.0.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
        payload=b"\0" * 8,
    )
    write_header(
        tmp_path / "model-00002-of-00002.safetensors",
        {"model.layers.1.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
        payload=b"\0" * 8,
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "model.layers.0.w": "model-00001-of-00002.safetensors",
                    "model.layers.1.w": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    header = read_checkpoint(tmp_path)
    assert set(header.tensors) == {"model.layers.0.w", "model.layers.1.w"}
    assert layer_count(header) == 2
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InputError, match="missing"):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"abc", "8-byte header length is missing"),
        (b"\xff" * 16, "declared length"),
        (struct.pack("<Q", 5) + b"{nope", "JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 25) + b'{"t": {"dtype": "F32"}}  ', "bad entry"),
        (struct.pack("<Q", 36) + b'{"t": {"dtype": "F32", "shape": []}}', "bad entry"),
    ],
)
def test_unreadable_headers(tmp_path, content, message):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as error:
        read_safetensors_header(path)
    assert str(path) in str(error.value)


def test_no_safetensors_is_config_only(tmp_path):
    assert read_checkpoint(tmp_path) is None


def test_key_patterns():
    assert (
        pattern("model.layers.3.mlp.experts.7.up_proj.weight")
        == "model.layers.*.mlp.experts.*.up_proj.weight"
    )


# ---- cross-checks ------------------------------------------------------------------


def copy_checkpoint(tiny, name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(tiny.directory(name), target)
    return target


def rewrite(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(directory / "model.safetensors"))
    edit(state)
    save_file(state, str(directory / "model.safetensors"))


def test_config_says_no_bias_but_checkpoint_has_q_proj_bias(tiny, tmp_path):
    import torch

    from autoport_cst.research import research

    directory = copy_checkpoint(tiny, "llama", tmp_path)
    rewrite(
        directory,
        lambda s: s.update(
            {
                f"model.layers.{i}.self_attn.{p}.bias": torch.zeros(w)
                for i in range(2)
                for p, w in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32))
            }
        ),
    )
    result = research(str(directory))
    conflict = next(c for c in result.conflicts if c.field == "attention.qkv_bias")
    sources = {c.source: c.value for c in conflict.claims}
    assert sources == {"code": False, "checkpoint": True}
    assert (
        "attention_bias" in result.decision("attention.qkv_bias").evidence
        or "bias=False" in result.decision("attention.qkv_bias").evidence
    )
    assert result.spec.attention.qkv_bias is False  # the spec follows what transformers computes
    assert any(
        "q_proj.bias" in str(f.value) for f in result.findings if f.field == "checkpoint.unexpected_keys"
    )


def test_checkpoint_without_the_code_s_bias(tiny, tmp_path):
    from autoport_cst.research import research

    # the code creates q_proj.bias, the checkpoint has none: a port cannot
    # load it, so the plan is refused naming the tensor and what is stored
    directory = copy_checkpoint(tiny, "qwen2", tmp_path)
    rewrite(directory, lambda s: [s.pop(k) for k in list(s) if k.endswith("q_proj.bias")])
    with pytest.raises(InputError) as caught:
        research(str(directory))
    message = str(caught.value)
    assert "self_attn.q_proj.bias" in message and "model.layers.0.self_attn.k_proj.bias (32,)" in message
    assert caught.value.position.path.endswith("model.safetensors")


def test_untied_config_without_stored_head(tiny, tmp_path):
    from autoport_cst.research import research

    # an untied model without its head: refused, the head named
    directory = copy_checkpoint(tiny, "llama", tmp_path)
    rewrite(directory, lambda s: s.pop("lm_head.weight"))
    with pytest.raises(
        InputError, match=r"no tensor for lm_head\.weight .*keys present: model\.embed_tokens"
    ):
        research(str(directory))


def test_tied_config_with_stored_head_is_a_warning(tiny, tmp_path):
    import torch

    from autoport_cst.research import research

    directory = copy_checkpoint(tiny, "gemma_tied", tmp_path)
    rewrite(directory, lambda s: s.update({"lm_head.weight": torch.zeros(320, 64)}))
    result = research(str(directory))
    conflict = next(c for c in result.conflicts if c.field == "embedding.tied")
    assert conflict.severity == "warning"
    assert result.spec.embedding.tied is True


def test_layer_count_conflict(tiny, tmp_path):
    from autoport_cst.research import research

    directory = copy_checkpoint(tiny, "llama", tmp_path)
    rewrite(directory, lambda s: [s.pop(k) for k in list(s) if k.startswith("model.layers.1.")])
    result = research(str(directory))
    conflict = next(c for c in result.conflicts if c.field == "num_layers")
    assert {c.source: c.value for c in conflict.claims} == {"config": 2, "code": 2, "checkpoint": 1}


def test_per_expert_checkpoint_layout(tiny, tmp_path):
    """A hub-style MoE checkpoint (one key per expert, separate gate and
    up) against code that stacks experts: the layout is read from the
    checkpoint, and the key mismatch is a note, not a conflict."""
    import torch

    from autoport_cst.research import research

    directory = copy_checkpoint(tiny, "qwen3_moe", tmp_path)

    def split(state):
        for layer in range(2):
            prefix = f"model.layers.{layer}.mlp.experts"
            gate_up = state.pop(f"{prefix}.gate_up_proj")
            down = state.pop(f"{prefix}.down_proj")
            for e in range(gate_up.shape[0]):
                gate, up = gate_up[e].chunk(2, dim=0)
                state[f"{prefix}.{e}.gate_proj.weight"] = gate.contiguous()
                state[f"{prefix}.{e}.up_proj.weight"] = up.contiguous()
                state[f"{prefix}.{e}.down_proj.weight"] = down[e].contiguous()

    rewrite(directory, split)
    result = research(str(directory))
    assert result.finding("checkpoint.expert_layout").value == "per_expert"
    assert result.spec.checkpoint.gate_up == "separate"
    assert not [c for c in result.conflicts if c.severity == "error"]
    assert result.finding("checkpoint.unexpected_keys") is not None
    assert result.parameters.experts == 2 * 4 * 3 * 64 * 48
    assert torch is not None
