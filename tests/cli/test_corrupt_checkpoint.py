"""A safetensors file cut short (an interrupted download) whose header is
intact is refused before use: exit 2, naming the file, the expected and the
actual size; nothing is written."""

from __future__ import annotations

import os

from click.testing import CliRunner

from autoport_cst.cli import cli

from .conftest import LLAMA3


def truncate_half(directory) -> tuple[int, int]:
    path = directory / "model.safetensors"
    size = path.stat().st_size
    os.truncate(path, size // 2)
    return size, size // 2


def test_port_refuses_a_truncated_source(fake_llama, tmp_path):
    expected, actual = truncate_half(fake_llama)
    result = CliRunner().invoke(cli, ["port", str(fake_llama), "--name", "x", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"{fake_llama / 'model.safetensors'}: corrupt safetensors file (truncated)" in result.output
    assert f"expected {expected:,}, actual {actual:,}" in result.output
    assert not (tmp_path / "out").exists()


def test_validate_and_plan_refuse_it_too(fake_llama, tmp_path):
    truncate_half(fake_llama)
    runner = CliRunner()
    validate = runner.invoke(cli, ["validate", str(LLAMA3), "--hf", str(fake_llama)])
    assert validate.exit_code == 2 and "truncated" in validate.output, validate.output
    plan = runner.invoke(cli, ["plan", str(fake_llama), "--name", "x", "-o", str(tmp_path / "plan.json")])
    assert plan.exit_code == 2 and "truncated" in plan.output, plan.output
    assert not (tmp_path / "plan.json").exists()


def test_the_validate_library_refuses_it(fake_llama):
    import pytest

    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model

    truncate_half(fake_llama)
    with pytest.raises(InputError, match="truncated"):
        validate_model(LLAMA3, fake_llama)


def test_trailing_bytes_are_refused(fake_llama):
    from autoport_cst.errors import InputError
    from autoport_cst.research.checkpoint import read_checkpoint

    with (fake_llama / "model.safetensors").open("ab") as handle:
        handle.write(b"\0" * 3)
    try:
        read_checkpoint(fake_llama)
    except InputError as error:
        assert "longer than its header describes" in str(error)
    else:
        raise AssertionError("a file longer than its header describes was read")
