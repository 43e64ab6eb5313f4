"""A `port` stopped before its verdict (Ctrl-C, an error) removes the tiny
checkpoints it made under OUT/checkpoints, and only those (issue 18): what
was there before the run stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("source-llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=1)
    return directory


def _stop_at(label: str, error: BaseException):
    def on_stage(stage: str) -> None:
        if stage == label:
            raise error

    return on_stage


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("failed while validating")])
def test_the_run_s_checkpoints_go_what_was_there_stays(source, tmp_path, error):
    out = tmp_path / "out"
    kept = out / "checkpoints" / "other-tiny"
    kept.mkdir(parents=True)
    (kept / "config.json").write_text("{}")
    seen = []

    def on_stage(stage: str) -> None:
        seen.append(stage)
        if stage == "validate tp=1 fp32":
            assert (out / "checkpoints" / "x-tiny" / "model.safetensors").is_file()  # made by this run
            raise error

    with pytest.raises(type(error)):
        port(str(source), "x", out, steps=1, on_stage=on_stage)
    assert "validate tp=1 fp32" in seen
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["other-tiny"]
    assert (kept / "config.json").read_text() == "{}"
    assert not (out / "vllm_neuron").exists()


def test_a_checkpoints_directory_the_run_made_goes_too(source, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        port(str(source), "x", out, steps=1, on_stage=_stop_at("validate tp=1 fp32", KeyboardInterrupt()))
    assert not (out / "checkpoints").exists()


def test_a_checkpoint_directory_of_an_earlier_run_stays(source, tmp_path):
    out = tmp_path / "out"
    earlier = out / "checkpoints" / "x-tiny"
    earlier.mkdir(parents=True)
    (earlier / "notes.txt").write_text("earlier")
    with pytest.raises(KeyboardInterrupt):
        port(str(source), "x", out, steps=1, on_stage=_stop_at("validate tp=1 fp32", KeyboardInterrupt()))
    assert (earlier / "notes.txt").read_text() == "earlier"


def test_the_checkpoints_a_port_makes_are_recorded_before_they_are_made(source, tmp_path):
    """What a SIGKILL'd port leaves is removed from this record (apply.leftovers;
    the killed run itself: tests/port/test_killed_port.py, --run-slow)."""
    import json

    out = tmp_path / "out"
    (out / "checkpoints" / "x-tiny-saved").mkdir(parents=True)  # not this run's
    recorded = []

    def on_stage(stage: str) -> None:
        if stage == "checkpoint":
            (backup,) = out.glob(".autoport-backup-*")
            recorded.append(json.loads((backup / ".autoport-write.json").read_text()))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        port(str(source), "x", out, steps=1, on_stage=on_stage)
    (record,) = recorded
    assert record["created_trees"] == [
        "checkpoints/x-tiny",
        "checkpoints/x-tiny-variant",
        "checkpoints/x-tiny-saved-variant",
    ]
    assert "checkpoints" not in record["created_dirs"]  # it was there


def test_a_failure_recording_the_checkpoints_rolls_the_port_back(source, tmp_path, monkeypatch):
    """Between the apply and the checkpoint stage nothing escapes the rollback."""
    from autoport_cst.apply.writer import PendingWrite

    def full_disk(self, out, directories):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PendingWrite, "will_create", full_disk)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left"):
        port(str(source), "x", out, steps=1)
    assert not (out / "vllm_neuron").exists() and not (out / "plans").exists()
    assert not list(out.glob(".autoport-*"))
