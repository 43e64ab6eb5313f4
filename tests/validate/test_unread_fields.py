"""validate.unread_fields: the config fields transformers never reads, found
from its own run and varied far from their value for the port (the BioGPT
port that reads config.json's epsilon: tests/coverage_dense/test_biogpt.py)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
import torch

from autoport_cst.validate.unread_fields import (
    far_value,
    port_float_values,
    recording_config_reads,
    unread_fields,
    varied_checkpoint,
)


def test_reads_are_the_model_s_not_the_config_validation_s():
    from transformers import BioGptConfig, BioGptForCausalLM, PretrainedConfig

    before = PretrainedConfig.__getattribute__
    with recording_config_reads() as reads:
        config = BioGptConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=64
        )
        model = BioGptForCausalLM(config).eval()
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))
    assert PretrainedConfig.__getattribute__ is before  # put back
    # the config's validation reads every field while it is built; the model never reads the epsilon
    assert "hidden_size" in reads and "num_attention_heads" in reads
    assert "layer_norm_eps" not in reads


@dataclass
class _PortConfig:
    hidden_size: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    softcap: float = 0.0


def test_unread_fields_the_port_holds_by_name_or_value():
    port = port_float_values(_PortConfig(rms_norm_eps=1e-12))
    assert port == {"rms_norm_eps": 1e-12, "rope_theta": 10000.0, "softcap": 0.0}
    config = {"layer_norm_eps": 1e-12, "rope_theta": 10000.0, "initializer_range": 0.02, "dropout": 0.0}
    # the epsilon under another name (by its value), the RoPE base by name; never a zero by value alone
    assert unread_fields(config, {"hidden_size"}, port) == {"layer_norm_eps": 1e-12, "rope_theta": 10000.0}
    # a value the port read from a field of the same name that transformers reads is explained
    explained = {**config, "rms_norm_eps": 1e-12}
    assert unread_fields(explained, {"rms_norm_eps"}, port) == {"rope_theta": 10000.0}
    assert unread_fields(config, {"rope_theta", "layer_norm_eps"}, port) == {}
    assert unread_fields(config, None, port) == {}  # not recorded: nothing claimed
    assert port_float_values({"rms_norm_eps": 1e-6}) == {}  # a config that is no dataclass


@pytest.mark.parametrize("value, far", [(1e-12, 0.5), (0.0, 0.5), (10000.0, 20000.5), (-1.0, -2.5)])
def test_far_value(value, far):
    assert far_value(value) == pytest.approx(far)


def test_varied_checkpoint_changes_the_config_alone(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text(
        json.dumps({"layer_norm_eps": 1e-12, "max": {"__float__": "Infinity"}})
    )
    (source / "model.safetensors").write_bytes(b"weights")
    changed = varied_checkpoint(source, {"layer_norm_eps": 1e-12}, tmp_path / "varied")
    assert changed == {"layer_norm_eps": [1e-12, 0.5]}
    written = json.loads((tmp_path / "varied" / "config.json").read_text())
    assert written == {
        "layer_norm_eps": 0.5,
        "max": {"__float__": "Infinity"},
    }  # the rest as transformers wrote it
    linked = tmp_path / "varied" / "model.safetensors"
    assert linked.is_symlink() and linked.read_bytes() == b"weights"


def test_a_port_reading_a_field_transformers_ignores_fails(tmp_path, tiny_llama, llama3_dir):
    """The llama3 reference made to read its final norm's epsilon from a field
    config.json carries and LlamaForCausalLM never reads: equal to
    ``rms_norm_eps`` here, so the plain run passes; the follow-up sets it far
    from its value, and the port alone changes."""
    from autoport_cst.validate import validate_model
    from tests.edited_copies import edited_copy

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_llama, checkpoint)
    values = json.loads((checkpoint / "config.json").read_text())
    values["norm_epsilon"] = values["rms_norm_eps"]
    (checkpoint / "config.json").write_text(json.dumps(values))
    port = edited_copy(
        llama3_dir,
        tmp_path / "port",
        [
            (
                "    rms_norm_eps: float = 1e-5\n",
                "    rms_norm_eps: float = 1e-5\n    norm_epsilon: float = 1e-5\n",
            )
        ],
        file="config.py",
    )
    model = port / "model.py"
    text = model.read_text()
    final = "self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)"
    assert text.count(final) == 1
    model.write_text(text.replace(final, final.replace("rms_norm_eps", "norm_epsilon")))

    report = validate_model(port, checkpoint, steps=2, parallel_layouts=False)
    assert report.unread_config_fields == {"norm_epsilon": values["rms_norm_eps"]}
    assert not report.equivalent
    label = f"config fields transformers never reads: norm_epsilon {values['rms_norm_eps']!r} -> "
    assert report.first_diverging is not None and report.first_diverging.message.startswith(label)
    entries = [entry for entry in report.config_variants if entry["label"].startswith(label)]
    assert [entry["equivalent"] for entry in entries] == [False]
    # the reference holds the same value in rms_norm_eps, read from the checkpoint's own
    # rms_norm_eps, which transformers reads too: that explains it, nothing is varied
    right = validate_model(llama3_dir, checkpoint, steps=2, parallel_layouts=False)
    assert right.equivalent and right.unread_config_fields == {}


def test_a_varied_config_transformers_refuses_is_not_run(tmp_path):
    """The field varied far from its value may be one the config class
    checks (transformers never reads it in the model, its validation may
    still refuse it): the run is listed not run, and the report keeps its verdict."""
    from autoport_cst.errors import InputError
    from autoport_cst.validate.report import ValidationReport
    from autoport_cst.validate.unread_fields import check_unread_fields

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"embedding_fraction": 1.0}))
    report = ValidationReport("port", str(checkpoint), None, None, {}, True)
    report.unread_config_fields = {"embedding_fraction": 1.0}

    def refused(directory):
        assert json.loads((directory / "config.json").read_text()) == {"embedding_fraction": 2.5}
        raise InputError(f"{directory}: transformers cannot load the checkpoint: out of range")

    check_unread_fields(report, checkpoint, refused)
    assert report.equivalent
    [entry] = report.config_variants
    assert entry["equivalent"] is None and entry["summary"].startswith("not run: transformers cannot run it")
