"""The smoke test's results file and settings (serve/results.py,
serve/smoke_child.py), without vLLM."""

from __future__ import annotations

from autoport_cst.serve.results import results_path, write_results
from autoport_cst.serve.smoke import SmokeOutcome
from autoport_cst.serve.smoke_child import SmokeSettings, block_size_for, engine_options, server_flags


def _outcome(passed: bool) -> SmokeOutcome:
    checks = [
        {"name": "server: basic equals transformers greedy", "passed": True, "detail": ""},
        {
            "name": "server: counting equals transformers greedy",
            "passed": passed,
            "detail": "token 3: served 7, expected 9",
        },
    ]
    return SmokeOutcome("qwen2", "Qwen2ForCausalLM", 1, ["server"], checks, {"server": {"startup_s": 61.5}})


def test_results_file_is_the_workflows(tmp_path):
    path = write_results(tmp_path, _outcome(False), tmp_path / "logs")
    assert path == results_path(tmp_path, "qwen2")
    assert path == tmp_path / "examples" / "vllm_neuron" / "models" / "qwen2" / "results" / "results.md"
    text = path.read_text()
    assert text.startswith("# qwen2: vLLM smoke test and server battery on CPU")
    assert "FAILED" in text and "## Checks (1 of 2 passed)" in text
    assert "| server: counting equals transformers greedy | FAIL | token 3: served 7, expected 9 |" in text
    assert "| engine start-up, vLLM's imports included (s) | 61.500 |" in text


def test_a_passing_outcome_needs_checks_and_no_failure():
    assert _outcome(True).passed
    assert not _outcome(False).passed
    assert not SmokeOutcome("x", "X", 1, ["server"]).passed  # nothing checked
    failed = _outcome(True)
    failed.failure = {"stage": "server", "message": "did not come up"}
    assert not failed.passed


def test_block_size_divides_the_sliding_window():
    assert block_size_for({"sliding_window": 6}, 32) == 2
    assert block_size_for({"sliding_window": 4096}, 32) == 32
    assert block_size_for({"sliding_window": 6, "use_sliding_window": False}, 32) == 32
    assert block_size_for({}, 32) == 32


def test_server_flags_mirror_the_offline_engine():
    settings = SmokeSettings(out_dir="o", checkpoint="c", result="r", workdir="w", tp=2)
    options = engine_options(settings, 512)
    flags = server_flags(options, prefix_caching=True)
    assert flags[flags.index("--tensor-parallel-size") + 1] == "2"
    assert flags[flags.index("--dtype") + 1] == "float32"
    assert flags[flags.index("--max-num-batched-tokens") + 1] == "64"
    assert flags[-1] == "--enable-prefix-caching"
    assert server_flags(options, prefix_caching=False)[-1] == "--no-enable-prefix-caching"
