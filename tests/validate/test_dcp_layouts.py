"""A default validation of a port whose reference takes decode context
parallelism goes on to DCP layouts (validate.dcp_layouts): the DCP code of
the port (the ranks' shares of the KV cache, the decode mask's filled slots
and active-token owner, the context-parallel prefill) runs nowhere else."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.dcp_layouts import DCP_LAYOUTS, DECODE, PREFILL, dcp_runs, declared_dcp
from autoport_cst.validate.parallel_checks import LAYOUTS, REPLICATED_KV, check_parallel_layouts
from tests.edited_copies import edited_copy

from .conftest import LLAMA3, ROOT

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

RUN = dict(steps=3, prompt_lengths=(8, 12, 20), config_variants=False, parallel_layouts=False)


def test_the_references_that_take_dcp_declare_it() -> None:
    llama3 = declared_dcp(LLAMA3)
    assert llama3 is not None and llama3[0].startswith("reference llama3") and llama3[1]
    assert declared_dcp(ROOT / "reference_models" / "qwen3") is None
    assert declared_dcp(ROOT / "reference_models" / "qwen3_moe") is None
    assert dcp_runs(ROOT / "reference_models" / "qwen3", lambda *_a, **_k: pytest.fail("run"), ".") == []


def test_a_port_that_dropped_its_dcp_code_is_still_asked(tmp_path: Path) -> None:
    # read from the reference the manifest names, never from the port alone
    port = tmp_path / "port"
    port.mkdir()
    (port / "model.py").write_text("class Attention:\n    pass\n", encoding="utf-8")
    (port / "reference.json").write_text(
        json.dumps({"name": "mine", "provenance": {"reference": "llama3"}}), encoding="utf-8"
    )
    assert [label for label, _ in dcp_runs(port, lambda *_a, **_k: None, ".")] == [
        label for label, _, _ in DCP_LAYOUTS
    ]


def test_the_dcp_layouts_come_after_the_replicated_kv_run_and_a_refusal_is_not_run() -> None:
    report = SimpleNamespace(parallel_layouts=[], equivalent=True)
    passing = SimpleNamespace(equivalent=True, failure=None, summary=lambda: "equivalent within tolerances")
    refused = SimpleNamespace(
        equivalent=False,
        failure=SimpleNamespace(refusal=True, stage="decode", message="NotImplementedError: no window"),
        summary=lambda: "refused",
    )
    runs = [(DECODE[0], lambda: refused), (PREFILL[0], lambda: passing)]
    check_parallel_layouts(report, lambda **_o: passing, replicated_kv=lambda: passing, dcp=runs)
    assert [e["label"] for e in report.parallel_layouts] == [
        *(label for label, _ in LAYOUTS),
        REPLICATED_KV[0],
        DECODE[0],
        PREFILL[0],
    ]
    assert report.parallel_layouts[-2]["summary"].startswith("not run: the port refuses it (decode")
    assert report.parallel_layouts[-1]["equivalent"] is True


def test_a_checkpoint_that_cannot_take_dcp_is_stood_in_for(tiny_llama: Path, tmp_path: Path) -> None:
    """The tiny checkpoint (4 heads, 2 KV heads) takes neither layout: one of
    8 / 2 heads stands in at TP=4, one of 4 / 1 at TP=2; a checkpoint that
    takes the layout is run itself."""
    seen: list[tuple[dict, dict]] = []

    def validate_on(checkpoint: Path, **options):
        config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
        seen.append((options, {k: config[k] for k in ("num_attention_heads", "num_key_value_heads")}))

    for _label, run in dcp_runs(LLAMA3, validate_on, tiny_llama):
        run()
    assert seen == [(options, heads) for _label, options, heads in DCP_LAYOUTS]
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({**DECODE[2], "vocab_size": 512}), encoding="utf-8")
    seen.clear()
    dict(dcp_runs(LLAMA3, lambda checkpoint, **options: seen.append(checkpoint), wide))[DECODE[0]]()
    assert seen == [wide]


@pytest.mark.parametrize(
    "old, new, layout",
    [
        pytest.param(
            "dcp_active_mask = (owner == rank).to(torch.float32)",
            "dcp_active_mask = (owner == 0).to(torch.float32)",
            DECODE[0],
            id="active-token-owner",
        ),
        pytest.param(
            "local_prior = None if cached_seq_len is None else cached_seq_len // self.dcp_size",
            "local_prior = cached_seq_len",
            PREFILL[0],
            id="context-parallel-prefill",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_port_with_wrong_dcp_code_fails_its_dcp_layout(
    old: str, new: str, layout: str, tmp_path: Path, tiny_llama: Path
) -> None:
    port = edited_copy(LLAMA3, tmp_path / "llama3", [(old, new)])
    assert validate_model(port, tiny_llama, **RUN).equivalent  # no other run sees it
    runs = dict(dcp_runs(port, functools.partial(validate_model, port, **RUN), tiny_llama))
    report = runs[layout]()
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "layers.0.attention"


def test_the_replicated_kv_and_dcp_runs_share_their_stand_in(tiny_llama: Path) -> None:
    from autoport_cst.validate.parallel_checks import StandIns, replicated_kv_run

    seen: list[Path] = []

    def validate_on(checkpoint: Path, **_options):
        assert Path(checkpoint).exists()
        seen.append(Path(checkpoint))

    with StandIns() as stand_ins:
        replicated_kv_run(validate_on, tiny_llama, stand_ins)
        for _label, run in dcp_runs(LLAMA3, validate_on, tiny_llama, stand_ins):
            run()
    replicated, decode, prefill = seen
    assert replicated == decode != prefill  # 8 / 2 heads twice, then 4 / 1
    assert not any(path.exists() for path in seen)  # removed on exit


def test_a_config_whose_head_counts_are_unknown_is_not_taken_as_fitting(tmp_path: Path) -> None:
    # no head count under a name the layout checks know: the stand-in is asked for, never the checkpoint
    (tmp_path / "config.json").write_text(json.dumps({"heads_of_some_kind": 4}), encoding="utf-8")
    from autoport_cst.errors import InputError

    with pytest.raises(InputError):
        dict(dcp_runs(LLAMA3, lambda *_a, **_k: pytest.fail("run on the checkpoint"), tmp_path))[DECODE[0]]()
