"""A serving run's TP size and context length fit the checkpoint
(serve/limits.py): defaults taken from it, anything more refused with the
reason (exit 2), before any engine process starts."""

from __future__ import annotations

import pytest

from autoport_cst.errors import InputError
from autoport_cst.serve.limits import accepted_tp, checkpoint_positions, serving_limits

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def test_defaults_come_from_the_checkpoint():
    # run.py's Trainium defaults (TP 2, 2048 positions) on a tiny checkpoint
    limits = serving_limits(TINY, "tiny/config.json", preferred_tp=2, preferred_len=2048)
    assert (limits.tp, limits.max_model_len) == (2, 512)
    one_kv_head_pair = {**TINY, "num_attention_heads": 2, "num_key_value_heads": 1}
    assert accepted_tp(one_kv_head_pair, 2) == 1  # rule 2: one head per rank is odd
    limits = serving_limits(one_kv_head_pair, "c", preferred_tp=2, preferred_len=2048)
    assert (limits.tp, limits.max_model_len) == (1, 512)
    assert serving_limits({**TINY, "max_position_embeddings": 4096}, "c").max_model_len == 2048


def test_positions_as_vllm_reads_them():
    assert checkpoint_positions({"n_positions": 256}) == 256
    assert checkpoint_positions({"text_config": {"max_position_embeddings": 128}}) == 128
    assert checkpoint_positions({"max_position_embeddings": 512, "seq_length": 300}) == 300
    assert checkpoint_positions({"hidden_size": 8}) is None


def test_more_than_the_checkpoint_allows_is_refused_with_the_limit():
    with pytest.raises(InputError, match="--max-model-len 2048 exceeds the checkpoint's 512 positions"):
        serving_limits(TINY, "tiny/config.json", max_model_len=2048)
    with pytest.raises(InputError, match="--tp 4: .*rule 2.*the rules accept TP 1, 2"):
        serving_limits(TINY, "tiny/config.json", tp=4)
    with pytest.raises(InputError, match="--tp 3"):
        serving_limits(TINY, "tiny/config.json", tp=3)


PROBE = """
import sys
from vllm.engine.arg_utils import EngineArgs

if __name__ == "__main__":
    tp, length = int(sys.argv[2]), int(sys.argv[3])
    EngineArgs(model=sys.argv[1], tensor_parallel_size=tp, max_model_len=length).create_engine_config()
"""


def _engine_config(tmp_path, tp: int, max_model_len: int, **env: str):
    """vLLM's engine configuration under the stand-in (no engine starts)."""
    import json
    import os
    import subprocess

    from autoport_cst.serve.smoke import serve_python

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = {**TINY, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512}
    (checkpoint / "config.json").write_text(json.dumps(config))
    tree = tmp_path / "out" / "vllm_neuron" / "model"
    tree.mkdir(parents=True)
    (tree / "registry.py").write_text('def get_models():\n    return [("LlamaForCausalLM", object)]\n')
    (tmp_path / "probe.py").write_text(PROBE)
    variables = {"AUTOPORT_STANDIN": "1", "AUTOPORT_PORT_DIR": str(tmp_path / "out"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [str(serve_python()), str(tmp_path / "probe.py"), str(checkpoint), str(tp), str(max_model_len)],
        capture_output=True,
        text=True,
        env={**os.environ, **variables, **env},
        timeout=600,
    )


def _no_serve() -> str:
    from autoport_cst.serve.smoke import serve_python

    try:
        serve_python()
    except InputError as error:
        return str(error)
    return ""


@pytest.mark.skipif(bool(_no_serve()), reason=_no_serve())
def test_the_platform_refuses_a_tp_the_port_cannot_shard_before_the_engine(tmp_path):
    # vLLM itself accepts TP 4 over 4 heads and 2 KV heads (it replicates the KV heads)
    result = _engine_config(tmp_path, tp=4, max_model_len=512)
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "the stand-in cannot serve this run: --tp 4: TP 4 breaks the tensor-parallel rules" in result.stderr
    )
    assert "EngineCore" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(bool(_no_serve()), reason=_no_serve())
def test_the_platform_refuses_a_context_past_the_positions_vllm_was_told_to_allow(tmp_path):
    result = _engine_config(tmp_path, tp=1, max_model_len=2048, VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--max-model-len 2048 exceeds the checkpoint's 512 positions" in result.stderr


def test_an_fp8_cache_needs_whole_prompts_and_no_prefix_caching():
    from autoport_cst.serve.limits import check_cache_dtype

    check_cache_dtype("auto", True, 64, 512)
    check_cache_dtype("fp8", False, 512, 512)
    with pytest.raises(
        InputError, match="prefix-cache hit is a segmented prefill.*--no-enable-prefix-caching"
    ):
        check_cache_dtype("fp8", True, 512, 512)
    with pytest.raises(InputError, match="--max-num-batched-tokens 64 < --max-model-len 512"):
        check_cache_dtype("fp8_e4m3", False, 64, 512)
    with pytest.raises(
        InputError, match="--kv-cache-dtype fp8_e5m2: the stand-in serves auto, fp8, fp8_e4m3"
    ):
        check_cache_dtype("fp8_e5m2", False, 512, 512)


def test_a_checkpoint_too_short_for_the_battery_is_refused_before_serving(tmp_path):
    from autoport_cst.serve.smoke_child import SmokeSettings, check_battery_fits
    from autoport_cst.validate.tiny_tokenizer import write_tiny_tokenizer

    config = {**TINY, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}
    write_tiny_tokenizer(tmp_path / "tiny", config)
    settings = SmokeSettings(str(tmp_path), str(tmp_path / "tiny"), "", str(tmp_path), runs=["offline"])
    check_battery_fits(settings, 512)
    with pytest.raises(InputError, match="the smoke battery needs .* positions .* the checkpoint allows 24"):
        check_battery_fits(settings, 24)
    settings.runs = ["server"]  # the shared-prefix prompts are longer
    with pytest.raises(InputError, match="'A serving engine schedules"):
        check_battery_fits(settings, 80)
