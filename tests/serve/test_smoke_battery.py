"""Real vLLM serves ports on CPU (``autoport-cst smoke``, serve/).

These tests need the serve environment (README: serving: ``.venv-serve``,
or ``AUTOPORT_SERVE_PYTHON``); without it they are skipped, saying so. The
default suite runs one battery: the OpenAI server with prefix caching on a
tiny Llama port (one engine start, a few minutes on a loaded 2-core
machine). ``--run-slow`` runs the whole smoke test (offline, server, server
with prefix caching) on a port of each reference and at TP=2, and shows
that the checks fail: a port whose decode path is wrong fails the greedy
comparison, and a stand-in whose segmented prefill ignores block tables
fails on the prompts that hit the prefix cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.errors import InputError
from autoport_cst.serve.smoke import run_smoke, serve_python

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ("llama3", "qwen3", "qwen3_moe", "gpt_oss", "smollm3", "starcoder2")

try:
    serve_python()
    NO_SERVE = ""
except InputError as error:
    NO_SERVE = str(error)

pytestmark = pytest.mark.skipif(bool(NO_SERVE), reason=NO_SERVE)


def _identity_plan(reference: str, directory: Path) -> Path:
    """A plan that ports a reference to its own architecture."""
    manifest = json.loads((ROOT / "reference_models" / reference / "reference.json").read_text())
    plan = {
        "version": 1,
        "name": reference,
        "class_prefix": manifest["class_prefix"],
        "architecture": manifest["architecture"],
        "reference": reference,
        "spec": manifest["spec"],
    }
    path = directory / f"{reference}.plan.json"
    path.write_text(json.dumps(plan))
    return path


def _port(reference: str, tmp: Path) -> tuple[Path, Path]:
    """(port tree, tiny checkpoint of the reference's architecture)."""
    from autoport_cst.validate import build_tiny_checkpoint

    out = tmp / "out"
    plan = _identity_plan(reference, tmp)
    result = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((ROOT / "reference_models" / reference / "reference.json").read_text())
    checkpoint = tmp / "tiny"
    build_tiny_checkpoint(manifest["architecture"], checkpoint, seed=0)
    return out, checkpoint


def _failed(outcome) -> list[str]:
    return [check["name"] for check in outcome.checks if not check["passed"]]


def test_server_battery_with_prefix_caching_on_a_tiny_llama_port(tmp_path):
    out, checkpoint = _port("llama3", tmp_path)
    outcome = run_smoke(out, checkpoint, runs=["server-prefix-caching"], workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)
    figures = outcome.figures["server-prefix-caching"]
    assert figures["prefix_cache_hits"] > 0
    results = Path(outcome.results_file)
    assert results == out / "examples" / "vllm_neuron" / "models" / "llama3" / "results" / "results.md"
    assert "PASSED" in results.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("reference", REFERENCES)
def test_smoke_on_a_port_of_each_reference(reference, tmp_path):
    out, checkpoint = _port(reference, tmp_path)
    outcome = run_smoke(out, checkpoint, workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)


@pytest.mark.slow
def test_smoke_at_tp_2(tmp_path):
    out, checkpoint = _port("llama3", tmp_path)
    outcome = run_smoke(
        out, checkpoint, tp=2, runs=["offline", "server-prefix-caching"], workdir=tmp_path / "logs"
    )
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)


@pytest.mark.slow
def test_a_wrong_decode_path_fails_the_greedy_comparison(tmp_path):
    out, checkpoint = _port("llama3", tmp_path)
    model = out / "vllm_neuron" / "model" / "llama3" / "model.py"
    text = model.read_text()
    right = "softmax_scale=self.scaling / self.k_scale_float,"
    assert text.count(right) == 1  # the decode kernel's call only
    model.write_text(text.replace(right, "softmax_scale=0.5 * self.scaling / self.k_scale_float,"))
    outcome = run_smoke(out, checkpoint, runs=["offline"], workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    assert not outcome.passed
    assert all("equals transformers greedy" in name for name in _failed(outcome))


IGNORING_BLOCK_TABLES = """
import torch
from autoport_cst.validate.standin import prefill_attention

_gather = prefill_attention.gather_sequence


def _in_order(cache, table, block_size):
    # the sequence's blocks read as if they were 1, 2, 3, ...: the table ignored
    return _gather(cache, torch.arange(1, table.numel() + 1, dtype=table.dtype), block_size)


prefill_attention.gather_sequence = _in_order
"""


@pytest.mark.slow
def test_a_stand_in_ignoring_block_tables_fails_on_prefix_cache_hits(tmp_path, monkeypatch):
    out, checkpoint = _port("llama3", tmp_path)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(IGNORING_BLOCK_TABLES)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    outcome = run_smoke(out, checkpoint, runs=["server-prefix-caching"], workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    failed = _failed(outcome)
    assert any("prefix[1]" in name or "prefix[2]" in name for name in failed), failed
