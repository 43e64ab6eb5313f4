"""``port`` runs transformers once on its validation checkpoint for the
fp32 and bf16 runs (and the TP run), and the command asks for the heavy
imports as settled blocks (one process, one port)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.port import PortOutcome, port
from autoport_cst.validate import api, build_tiny_checkpoint
from tests.validation_depth import feature_depth, port_at_depth


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=1)
    return directory


def test_the_validation_runs_share_one_transformers_run(
    tiny_llama: Path, tmp_path: Path, monkeypatch, request
):
    loaded: list[tuple[str, str]] = []
    original = api.load_reference

    def counted(checkpoint, dtype, *args, **kwargs):
        loaded.append((Path(checkpoint).name, str(dtype)))
        return original(checkpoint, dtype, *args, **kwargs)

    monkeypatch.setattr(api, "load_reference", counted)
    # the follow-ups on the planned config (and, with --run-slow, the varied one) share it too
    outcome = port_at_depth(
        feature_depth(request.config), str(tiny_llama), "my_llama", tmp_path / "out", steps=4
    )
    assert outcome.validated
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    planned = [dtype for name, dtype in loaded if name == "my_llama-tiny"]
    assert planned == ["torch.float32", "torch.bfloat16"]  # once for both runs (was twice each)
    assert [dtype for name, dtype in loaded if name == "my_llama-tiny-variant"] == planned


def test_the_command_settles_its_imports(tiny_llama: Path, tmp_path: Path, monkeypatch):
    asked: dict = {}

    def fake_port(source, name, out, **options):
        asked.update(options)
        return PortOutcome(name, "LlamaForCausalLM")

    monkeypatch.setattr("autoport_cst.port.port", fake_port)
    result = CliRunner().invoke(cli, ["port", str(tiny_llama), "--name", "x", "--out", str(tmp_path / "o")])
    assert asked["settle_imports"] is True, result.output


@pytest.mark.slow  # a whole port at TP=2 (test_port_cli's test_port_at_tp2 checks its verdict by default)
def test_port_at_tp2_runs_tp2_once(tiny_llama: Path, tmp_path: Path, monkeypatch):
    """The TP=1 fp32 run's TP=2 layout is the ``--tp 2`` run: one run of the ranks at TP=2."""
    from autoport_cst.validate import distributed

    worlds: list[tuple[int, bool]] = []
    original = distributed.run_port_ranks

    def counted(model_dir, checkpoint_dir, dtype_name, scenario, world_size, *args, **kwargs):
        if Path(checkpoint_dir).name == "my_llama-tiny":
            # plain: no data-parallel layout, no prompt embeddings, no on-device sampling
            # (the follow-ups run TP=2 with each of those too)
            plain = scenario.prompt_embeds is None and not scenario.on_device_sampling
            worlds.append((world_size, kwargs.get("layout") is None and plain))
        return original(model_dir, checkpoint_dir, dtype_name, scenario, world_size, *args, **kwargs)

    monkeypatch.setattr(distributed, "run_port_ranks", counted)
    outcome = port(str(tiny_llama), "my_llama", tmp_path / "out", tp=2, steps=4)
    assert outcome.validated
    assert [(r.tp, r.dtype, r.equivalent) for r in outcome.runs][-1] == (2, "fp32", True)
    assert worlds.count((2, True)) == 1  # plain TP=2 (the other runs on 2 ranks are DP layouts)
