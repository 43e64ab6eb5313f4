"""The runner's cache paths in the driver: a chunked prefill (two segmented
calls, the second from ``cached_seq_len`` 32) and a prefix-cache hit (a
prompt whose first block is the chunked prompt's, prefilled from
``cached_seq_len`` 32), on the llama3 reference and a copy of it without
segmented prefill."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

# The reference prefills a chunk through segmented attention when the runner
# sets ``kv_segment_size``; this edit gives a copy that never reads it (flash
# attention over the chunk's own tokens only, as a port without the cache
# paths would).
SEGMENT_READ = '        kv_segment_size = meta.get("kv_segment_size")\n'
NO_SEGMENT = "        kv_segment_size = 0  # this copy has no segmented prefill\n"


def _calls(report) -> list[tuple[str, int, int, int]]:
    return [
        (call["kind"], call["positions"][0], call["cached_seq_len"], call["kv_segment_size"])
        for call in report.settings["prefill_calls"]
    ]


def test_segmented_port_validates_through_chunked_prefill_and_prefix_hit(
    llama3_dir: Path, tiny_llama: Path
) -> None:
    # the follow-ups of llama3 on this checkpoint: test_validate_llama3's fp32_report
    report = validate_model(
        llama3_dir, tiny_llama, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
    )
    assert report.equivalent, report.summary()
    assert _calls(report)[3:] == [
        ("chunked", 0, 0, 512),
        ("chunked", 32, 32, 512),
        ("prefix_cache_hit", 32, 32, 512),
    ]
    output = report.port_output
    assert output.sequences == [0, 1, 2, 3, 4] and output.prefill_spans[3:] == [(0, 40), (32, 48)]
    # every prompt position the calls computed is compared, prefix-hit rows included; the
    # logits of the positions sampled: all of the first prompt's, the last of each other call
    rows = {c["name"]: c["rows"] for c in report.components if c["phase"] == "prefill"}
    assert rows["layers.0.output"] == 8 + 12 + 20 + 40 + 16
    assert rows["logits"] == 8 + 5


def test_port_ignoring_cached_tokens_fails_at_the_first_attention(broken_port, tiny_llama: Path) -> None:
    """Forced through the cache paths, a port without segmented prefill (flash
    attention over the chunk only) misses the cached tokens."""
    port = broken_port(SEGMENT_READ, NO_SEGMENT, name="flash-only")
    report = validate_model(port, tiny_llama, dtype="fp32", steps=4, prefill="segmented")
    assert not report.equivalent
    assert (report.first_diverging.component, report.first_diverging.phase) == (
        "layers.0.attention",
        "prefill",
    )


def test_auto_leaves_the_cache_paths_out_of_a_port_without_segmented_prefill(
    broken_port, tiny_llama: Path
) -> None:
    port = broken_port(SEGMENT_READ, NO_SEGMENT, name="flash-only")
    report = validate_model(port, tiny_llama, dtype="fp32", steps=2)
    assert report.equivalent, report.summary()
    assert [call["kind"] for call in report.settings["prefill_calls"]] == ["whole"] * 3
    assert report.port_output.sequences == [0, 1, 2]


def test_scenario_plans_the_cache_paths() -> None:
    from autoport_cst.validate.scenario import Scenario

    scenario = Scenario.build(512, 1, steps=2, block_size=8, cache_paths=True)
    chunked, hit = scenario.chunked, scenario.prefix_hit
    assert scenario.prompts[hit][:32] == scenario.prompts[chunked][:32]
    assert scenario.block_table(hit)[:4] == scenario.layout.block_tables[chunked][:4]
    assert scenario.block_table(hit)[4:] == scenario.layout.block_tables[hit][4:]
    plan = scenario.prefill_plan(cache_paths=True)
    assert [(c.sequence, c.start, c.end, c.rows) for c in plan[3:]] == [
        (chunked, 0, 32, 512),
        (chunked, 32, 40, 512),
        (hit, 32, 48, 512),
    ]
    assert [c.sequence for c in scenario.prefill_plan(cache_paths=False)] == [0, 1, 2]
    handed_out = {block for table in scenario.layout.block_tables for block in table}
    assert 0 not in handed_out and scenario.layout.num_blocks - 1 not in handed_out
