"""A checkpoint with a missing tensor or a tensor of the wrong shape is bad
input with an error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model

MISSING = "model.layers.1.mlp.up_proj.weight"
RESHAPED = "model.layers.0.self_attn.o_proj.weight"


@pytest.fixture(scope="module")
def missing_tensor(tiny_llama: Path, tmp_path_factory, checkpoint_editor) -> Path:
    return checkpoint_editor(
        tiny_llama, tmp_path_factory.mktemp("missing") / "ckpt", lambda s: s.pop(MISSING)
    )


@pytest.fixture(scope="module")
def wrong_shape(tiny_llama: Path, tmp_path_factory, checkpoint_editor) -> Path:
    return checkpoint_editor(
        tiny_llama,
        tmp_path_factory.mktemp("shape") / "ckpt",
        lambda s: s.__setitem__(RESHAPED, torch.zeros(64, 32)),
    )


def test_missing_tensor_names_the_key(llama3_dir: Path, missing_tensor: Path) -> None:
    with pytest.raises(InputError) as caught:
        validate_model(llama3_dir, missing_tensor, steps=2)
    assert f"no tensor '{MISSING}'" in str(caught.value)
    assert "model.layers.1.mlp.up_proj_weight" in str(caught.value)


def test_wrong_shape_names_the_key(llama3_dir: Path, wrong_shape: Path) -> None:
    with pytest.raises(InputError) as caught:
        validate_model(llama3_dir, wrong_shape, steps=2)
    assert f"'{RESHAPED}' [64, 32]" in str(caught.value)


@pytest.mark.slow
def test_tp2_missing_tensor_names_the_key(llama3_dir: Path, missing_tensor: Path) -> None:
    with pytest.raises(InputError, match=f"no tensor '{MISSING}'"):
        validate_model(llama3_dir, missing_tensor, steps=2, tp=2)


def test_bad_paths_and_options_are_input_errors(llama3_dir: Path, tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such model package"):
        validate_model(tmp_path / "nope", tiny_llama)
    with pytest.raises(InputError, match="no such checkpoint"):
        validate_model(llama3_dir, tmp_path / "nope")
    with pytest.raises(InputError, match="--dtype"):
        validate_model(llama3_dir, tiny_llama, dtype="fp16")
    with pytest.raises(InputError, match="divisible by the TP size"):
        validate_model(llama3_dir, tiny_llama, tp=2, prompt_lengths=(8, 9))


# The port sizes its MLP twice too wide: every parameter of a valid checkpoint
# is there, but the port's up/gate/down do not fit them.
WIDE_MLP = (
    "        self.intermediate_size_per_rank = config.intermediate_size // self.mlp_tp_size\n",
    "        self.intermediate_size_per_rank = 2 * config.intermediate_size // self.mlp_tp_size\n",
)


def test_a_port_whose_parameters_do_not_fit_a_valid_checkpoint_fails_at_load(
    broken_port, tiny_llama: Path
) -> None:
    """Not bad input (exit 2): transformers loads the checkpoint, so the
    port is wrong (exit 1), and the message names the parameter and the key."""
    report = validate_model(broken_port(*WIDE_MLP), tiny_llama, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "load"
    message = report.failure.message
    assert "parameter 'model.layers.0.mlp." in message and "'model.layers.0.mlp." in message
    assert "transformers loads" in message


@pytest.mark.slow
def test_tp2_a_port_whose_parameters_do_not_fit_fails_at_load(broken_port, tiny_llama: Path) -> None:
    report = validate_model(broken_port(*WIDE_MLP), tiny_llama, steps=2, tp=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "load" and "parameter 'model.layers.0.mlp." in report.failure.message


# The port's loader looks for the up projection under a key the checkpoint
# does not use (as a port guessing GPT-NeoX's head at lm_head.weight did).
WRONG_KEY = (
    '= f"{prefix}.mlp.up_proj.weight"\n',
    '= f"{prefix}.mlp.upp_proj.weight"\n',
)


def test_a_port_that_looks_for_a_key_a_valid_checkpoint_lacks_fails_at_load(
    broken_port, tiny_llama: Path
) -> None:
    """The checkpoint is fine (transformers loads it); the port's key map is
    wrong: exit 1 at load, naming the key looked for and the parameter."""
    report = validate_model(broken_port(*WRONG_KEY), tiny_llama, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "load"
    message = report.failure.message
    assert "no tensor 'model.layers.0.mlp.upp_proj.weight'" in message
    assert "parameter 'model.layers.0.mlp.up_proj_weight'" in message


def test_the_reference_is_transformers_own_code(tiny_llama: Path) -> None:
    """transformers 5.25 turns hub kernels on by default in from_pretrained,
    which could swap another layer implementation in (fetched at run time):
    the reference validation compares against is loaded with them off."""
    from autoport_cst.validate.reference import load_reference

    model = load_reference(tiny_llama, torch.float32)
    assert getattr(model, "use_kernels", False) is False
