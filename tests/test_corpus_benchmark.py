"""benchmarks/corpus.py: the README's table read back and merged with
re-measured rows (``--only ... --readme``), and the worker processes that
run the model types (a worker that dies is a crash of its model type, the
others go on)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus():
    """benchmarks/corpus.py, which puts benchmarks/ on sys.path for its own
    modules (corpus_table, corpus_runs, corpus_workers)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("corpus")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def row(model_type: str, verdict: str = "ported", detail: str = "", blocked=(), seconds: float = 1.0) -> dict:
    return {
        "model_type": model_type,
        "architecture": model_type.capitalize() + "ForCausalLM",
        "reference": "llama3" if verdict == "ported" else None,
        "steps": ["rename-classes", "mlp-kind"] if verdict == "ported" else [],
        "verdict": verdict,
        "detail": detail,
        "max_error": 1e-6 if verdict == "ported" else None,
        "seconds": seconds,
        "blocked": list(blocked),
    }


REFUSED = row(
    "bloom",
    "refused",
    "no codemod realizes alibi_positions, mlp.activation",
    ["alibi_positions", "mlp.activation"],
)
FULL_SIZE = row("blt", "refused", "no codemod realizes rope.style (full-size config)", ["rope.style"])
FAILING = row("glm4_moe", "does not validate", "tp1 fp32: layers.1.attention (decode)")


def test_a_written_table_reads_back_as_it_was_written(corpus):
    from corpus_table import parse_table

    table = corpus.markdown([REFUSED, FULL_SIZE, FAILING, row("llama")], 600.0)
    rows, total = parse_table(table)
    assert total == "10.0 min"
    assert [r["verdict"] for r in rows] == ["refused", "refused", "does not validate", "ported"]
    assert rows[0]["blocked"] == ["alibi_positions", "mlp.activation"]
    assert rows[1]["blocked"] == ["rope.style"]
    assert corpus.table_markdown(rows, total) == table


def test_the_readme_table_reads_back_as_it_is(corpus):
    from corpus_table import parse_table, readme_table

    text = readme_table(ROOT / "README.md").lstrip("\n")
    rows, total = parse_table(text)
    assert len(rows) > 100 and total is not None
    assert corpus.table_markdown(rows, total) == text


def test_only_rows_replace_theirs_and_the_totals_count_every_row(corpus, tmp_path):
    from corpus_table import README_END, README_START, parse_table, readme_table

    readme = tmp_path / "README.md"
    table = corpus.markdown([REFUSED, FAILING, row("llama")], 1800.0)
    readme.write_text(f"intro\n{README_START}\n{table}{README_END}\nafter\n", encoding="utf-8")
    fixed = row("glm4_moe", seconds=2.0)
    corpus.update_readme(
        readme,
        corpus.merged_table(
            readme, [fixed, row("afmoe", "refused", "no codemod realizes nope_layers", ["nope_layers"])]
        ),
    )
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith(f"{README_END}\nafter\n")
    rows, total = parse_table(readme_table(readme))
    assert [r["model_type"] for r in rows] == ["afmoe", "bloom", "glm4_moe", "llama"]
    assert rows[2]["verdict"] == "ported"
    assert total == "30.0 min (the last full run)"
    assert "4 model types: 2 refused, 2 ported; 2 distinct architectures ported" in text
    assert "- `nope_layers`: 1" in text and "- `alibi_positions`: 1" in text
    corpus.update_readme(readme, corpus.merged_table(readme, [REFUSED]))
    assert parse_table(readme_table(readme))[1] == "30.0 min (the last full run)"  # said once


def test_the_model_types_start_longest_first_by_the_readme(corpus, tmp_path):
    from corpus_table import README_END, README_START

    readme = tmp_path / "README.md"
    table = corpus.markdown([row("a", seconds=1.0), row("b", seconds=30.0)], 60.0)
    readme.write_text(f"{README_START}\n{table}{README_END}\n", encoding="utf-8")
    pairs = [("a", "A"), ("b", "B"), ("new", "New")]
    assert corpus.longest_first(pairs, readme) == [("new", "New"), ("b", "B"), ("a", "A")]
    assert corpus.longest_first(pairs, None) == pairs


def _fake_run_one(model_type, architecture, work, tp2, runs):
    if model_type == "dies":
        os._exit(3)
    return row(model_type) | {"detail": f"pid {os.getpid()} {runs} tp2={tp2}"}


def test_a_worker_that_dies_is_a_crash_of_its_model_type_and_the_rest_go_on(corpus, monkeypatch, tmp_path):
    import corpus_workers

    monkeypatch.setattr(corpus_workers, "run_one", _fake_run_one)
    rows: list[dict] = []
    pairs = [("a", "A"), ("dies", "Dies"), ("b", "B"), ("c", "C")]
    corpus_workers.run_forked(pairs, tmp_path, True, "table", 2, rows.append)
    by_type = {r["model_type"]: r for r in rows}
    assert sorted(by_type) == ["a", "b", "c", "dies"]
    assert by_type["dies"]["verdict"] == "crash"
    assert "exited with code 3" in by_type["dies"]["detail"]
    assert all(by_type[t]["detail"].endswith("table tp2=True") for t in "abc")
    assert all(by_type[t]["detail"].split()[1] != str(os.getpid()) for t in "abc")  # in workers


@pytest.mark.slow
def test_the_table_runs_give_port_s_reference_codemods_and_verdict(corpus, tmp_path):
    """The default runs research, choose and apply as ``port`` does, and on a
    port that passes every check the verdict is the same (``--full``)."""
    from corpus_runs import run_one

    table = run_one("llama", "LlamaForCausalLM", tmp_path / "table", True, "table")
    full = run_one("llama", "LlamaForCausalLM", tmp_path / "full", True, "full")
    for key in ("reference", "steps", "verdict", "detail", "max_error"):
        assert table[key] == full[key], key
    assert table["verdict"] == "ported"


def test_only_builds_the_configs_of_the_model_types_it_names(corpus):
    """``--only`` selects before any config is built (by model type or by
    architecture), with the same pairs as the whole list gives them."""
    pairs = corpus.causal_lm_architectures("llama, MistralForCausalLM")
    assert pairs == [("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM")]
    assert corpus.selected(pairs, "llama, MistralForCausalLM", 0) == pairs


def test_a_row_has_its_cpu_seconds(corpus, tmp_path, monkeypatch):
    """A row's CPU time is its process's and its waited-for children's."""
    import corpus_runs

    def spin(architecture, source, seed):
        end = corpus_runs.cpu_seconds() + 0.2
        while corpus_runs.cpu_seconds() < end:
            pass
        raise ValueError("no tiny checkpoint here")

    monkeypatch.setattr("autoport_cst.validate.build_tiny_checkpoint", spin)
    monkeypatch.setattr(corpus_runs, "full_size_refusal", lambda architecture, directory: [])
    found = corpus_runs.run_one("llama", "LlamaForCausalLM", tmp_path, True)
    assert found["verdict"] == "no tiny checkpoint"
    assert found["cpu_seconds"] >= 0.2
