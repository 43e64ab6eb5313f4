"""Tiny random checkpoints of transformers architectures, built locally.

Each entry is a model_type and the configuration values that select the
feature under test; the sizes are small and chosen so that no two weight
widths coincide (hidden 64, 4 heads of 16, 2 KV heads, intermediate 96,
vocabulary 320), which keeps shape-based checks unambiguous. The config is
the transformers class defaults plus these values, saved with
``save_pretrained``; the weights are the random initialisation of the
transformers model, saved with safetensors (tied tensors once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 320,
    "max_position_embeddings": 256,
}
MOE_SMALL: dict[str, Any] = {
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 48,
}

# name -> (model_type, config overrides)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama_mha": ("llama", {"num_key_value_heads": 4}),  # a KV head per query head
    "mistral": ("mistral", {"sliding_window": 32}),
    "qwen2": ("qwen2", {}),
    "qwen2_sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gemma": ("gemma", {"head_dim": 16, "hidden_act": "gelu_pytorch_tanh"}),
    "gemma2": (
        "gemma2",
        {
            "head_dim": 16,
            "sliding_window": 32,
            "query_pre_attn_scalar": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("phi3", {}),
    "stablelm": ("stablelm", {"partial_rotary_factor": 0.25}),
    "gpt_neox": ("gpt_neox", {"rotary_pct": 0.25, "use_parallel_residual": True}),
    "starcoder2": ("starcoder2", {}),
    "olmo2": ("olmo2", {}),
    "granite": (
        "granite",
        {
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.0078125,
            "logits_scaling": 8.0,
        },
    ),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "norm_topk_prob": True, **MOE_SMALL}),
    "qwen2_moe": ("qwen2_moe", {"num_experts": 4, "shared_expert_intermediate_size": 80, **MOE_SMALL}),
    "gpt_oss": (
        "gpt_oss",
        {
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 32,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi": ("phi", {"partial_rotary_factor": 0.5}),
    "cohere": ("cohere", {"logit_scale": 0.125}),
    "olmo": ("olmo", {}),
    "gemma_tied": ("gemma", {"head_dim": 16, "tie_word_embeddings": True}),
    # no_rope_layers[i] == 0: layer i applies no rotary embedding
    "smollm3": ("smollm3", {"no_rope_layers": [1, 0]}),
    # queries scaled by 1 + beta * log(1 + floor(position / n)) after RoPE (attention temperature)
    "ministral3": ("ministral3", {"head_dim": 16}),
    # layer_rope_theta[i] == 0: the backbone passes layer i no position embeddings (NoPE)
    "granite_swa_nope": (
        "granite_swa",
        {
            "num_hidden_layers": 4,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "layer_rope_theta": [0, 10000, 0, 10000],
        },
    ),
    # a RoPE base per layer: a rotary module per distinct theta
    "granite_swa_thetas": (
        "granite_swa",
        {"sliding_window": 16, "layer_rope_theta": [10000, 500000], "rope_theta": 10000},
    ),
    "granite_swa": ("granite_swa", {"sliding_window": 16}),
    "granitemoe_swa_nope": (
        "granitemoe_swa",
        {
            "num_hidden_layers": 4,
            "sliding_window": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "layer_rope_theta": [10000, 0, 10000, 0],
        },
    ),
    # Cohere 2 rotates only its sliding-window layers (NoPE decided by layer_types)
    "cohere2": (
        "cohere2",
        {
            "num_hidden_layers": 4,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        },
    ),
    # blocks under other names than model.layers[i].self_attn / .mlp (tests/research/test_block_layers.py)
    "gpt2": ("gpt2", {}),  # transformer.h[i].attn.c_attn (Conv1D), learned positions wpe
    "opt": ("opt", {"ffn_dim": 96}),  # model.decoder.layers[i], fc1/fc2 in the layer itself
    "falcon": ("falcon", {}),  # transformer.h[i].self_attention.query_key_value, multi-query
    "bloom": ("bloom", {}),  # transformer.h[i].self_attention, ALiBi, embedding LayerNorm
    "nanochat": ("nanochat", {}),  # one weightless RMSNorm on the embeddings and after the last layer
    "mpt": ("mpt", {"d_model": 64, "n_heads": 4, "n_layers": 2}),  # transformer.blocks[i].attn.Wqkv, ALiBi
    "gptj": ("gptj", {"rotary_dim": 8}),  # transformer.h[i].attn.q_proj, parallel attention and MLP
    # BART-style attention (keys and values from a cross-attention cache on one path), fc1/fc2 in the layer
    "biogpt": ("biogpt", {}),
    # transformer.h[i].attn.attention: the attention one module down
    "gpt_neo": ("gpt_neo", {"attention_types": [[["global", "local"], 1]], "window_size": 16}),
}


def build(name: str, directory: Path, seed: int = 0) -> Path:
    """Write config.json and model.safetensors for ARCHITECTURES[name]."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides = ARCHITECTURES[name]
    defaults = AutoConfig.for_model(model_type)
    # the small sizes only for attributes this config class has (no stray keys)
    values = {k: v for k, v in SMALL.items() if hasattr(defaults, k)}
    values.update(overrides)
    config = AutoConfig.for_model(model_type, **values)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # keep token ids inside the vocabulary
        token = getattr(config, key, None)
        if isinstance(token, int) and token >= config.vocab_size:
            setattr(config, key, config.vocab_size - 1)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue  # a tied tensor is stored once, under its first name
        seen.add(tensor.data_ptr())
        state[key] = tensor.detach().contiguous()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    return directory
