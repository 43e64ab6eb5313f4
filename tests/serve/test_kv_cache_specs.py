"""What the plugin tells vLLM's KV-cache manager (serve/runner.py): a layer
the port declares with a sliding window as a sliding-window spec, every
other as full attention, in the FP8 cache's dtype with ``kv_cache_dtype``
fp8; and the checks that read it back from a served run (serve/checks.py)."""

from __future__ import annotations

import subprocess

import pytest

from autoport_cst.errors import InputError
from autoport_cst.serve.checks import kv_cache_dtype_check, kv_cache_kind_check

SPECS = """
from types import SimpleNamespace

import torch

from autoport_cst.serve.runner import StandinModelRunner
from autoport_cst.validate.standin.kv_cache import KVSpec, LayerSpec

for cache_dtype in ("auto", "fp8"):
    runner = SimpleNamespace(block_size=2, vllm_config=SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype)))
    runner._cache_dtype = lambda layer: StandinModelRunner._cache_dtype(runner, layer)
    runner._layer_spec = lambda layer: StandinModelRunner._layer_spec(runner, layer)
    runner.kv_spec = KVSpec([
        LayerSpec("layers.0.self_attn", 2, 16, torch.float32, sliding_window_size=6),
        LayerSpec("layers.1.self_attn", 2, 16, torch.float32),
    ])
    for name, spec in StandinModelRunner.get_kv_cache_spec(runner).items():
        print(cache_dtype, name, type(spec).__name__, getattr(spec, "sliding_window", None), spec.dtype)
"""


def _serve_python() -> str:
    from autoport_cst.serve.smoke import serve_python

    try:
        return str(serve_python())
    except InputError:
        return ""


@pytest.mark.skipif(not _serve_python(), reason="no serve environment (docs/serving.md)")
def test_sliding_window_layers_are_sliding_window_specs():
    output = subprocess.run(
        [_serve_python(), "-c", SPECS], capture_output=True, text=True, check=True, timeout=300
    ).stdout.splitlines()
    assert output == [
        "auto layers.0.self_attn SlidingWindowSpec 6 torch.float32",
        "auto layers.1.self_attn FullAttentionSpec None torch.float32",
        "fp8 layers.0.self_attn SlidingWindowSpec 6 torch.float8_e4m3fn",
        "fp8 layers.1.self_attn FullAttentionSpec None torch.float8_e4m3fn",
    ]


def _entry(layer, port_window, spec, vllm_window, dtype="torch.float32"):
    return {
        "layer": layer,
        "port_window": port_window,
        "vllm_spec": spec,
        "vllm_window": vllm_window,
        "vllm_dtype": dtype,
        "bound_dtype": dtype,
    }


def test_the_kind_check_fails_a_sliding_layer_held_as_full_attention():
    right = [_entry("l0", 6, "SlidingWindowSpec", 6), _entry("l1", None, "FullAttentionSpec", None)]
    check = kv_cache_kind_check(right)
    assert check.passed and "1 sliding-window layer(s) (window [6]), 1 full-attention" in check.detail
    wrong = [_entry("l0", 6, "FullAttentionSpec", None), _entry("l1", None, "FullAttentionSpec", None)]
    check = kv_cache_kind_check(wrong)
    assert not check.passed and check.detail == "l0: port window 6, vLLM FullAttentionSpec (window None)"
    assert not kv_cache_kind_check([_entry("l0", 6, "SlidingWindowSpec", 4)]).passed


def test_the_dtype_check_names_a_layer_not_in_fp8():
    fp8 = "torch.float8_e4m3fn"
    assert kv_cache_dtype_check([_entry("l0", None, "FullAttentionSpec", None, fp8)], fp8).passed
    check = kv_cache_dtype_check([_entry("l0", None, "FullAttentionSpec", None)], fp8)
    assert not check.passed and "l0: vLLM torch.float32" in check.detail
