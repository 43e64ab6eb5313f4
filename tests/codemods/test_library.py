"""Conventions of the codemod library: one codemod per file, named after its
file, documented, with examples, declaring valid spec fields and orderings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.spec import leaf_fields
from autoport_cst.transform.base import FILE_ROLES
from autoport_cst.transform.library import get_codemod, library

SPEC_FIELDS = {path for path, _, _ in leaf_fields()}
CODEMODS = list(library().values())
CODEMOD_DIR = Path(__file__).resolve().parents[2] / "codemods"


def test_library_has_the_foundation_codemods():
    assert {
        "rename-classes",
        "swap-norm",
        "add-qkv-bias",
        "lazy-rope",
        "unsqueeze-decode-biases",
        "float32-router",
    } <= set(library())


def test_one_codemod_per_file_named_after_the_file():
    files = sorted(p.stem for p in CODEMOD_DIR.glob("*.py") if not p.stem.startswith("_"))
    assert sorted(cls.__module__.rsplit(".", 1)[-1] for cls in CODEMODS) == files
    for cls in CODEMODS:
        assert cls.__module__.rsplit(".", 1)[-1] == cls.ID.replace("-", "_")


@pytest.mark.parametrize("cls", CODEMODS, ids=lambda c: c.ID)
def test_declarations(cls):
    assert cls.summary(), "the class docstring documents the codemod"
    assert len(cls.documentation().splitlines()) >= 3
    assert cls.EXAMPLES, "at least one inline example"
    assert any(e.raises is None for e in cls.EXAMPLES)
    assert set(cls.REALIZES) <= SPEC_FIELDS
    assert cls.REALIZES or cls.PURPOSE, "a codemod that realizes no spec field says what it is for"
    assert set(cls.AFTER) <= set(library())
    assert set(cls.FILES) <= set(FILE_ROLES) | {"module"}
    assert dataclasses.is_dataclass(cls.Params)
    assert cls.Params.__dataclass_params__.frozen
    for field in dataclasses.fields(cls.Params):
        assert field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def test_unknown_codemod_is_a_clear_error():
    from autoport_cst.errors import InputError

    with pytest.raises(InputError, match="unknown codemod 'no-such'.*known codemods: add-qkv-bias"):
        get_codemod("no-such")


def test_bad_parameters_name_their_json_path():
    from autoport_cst.errors import MultiInputError

    with pytest.raises(MultiInputError) as info:
        get_codemod("swap-norm").parse_params({"kind": "groupnorm", "colour": 1}, "$.steps[0].params")
    paths = {e.position.json_path for e in info.value.errors}
    assert paths == {"$.steps[0].params.kind", "$.steps[0].params.colour"}


def test_cli_lists_every_codemod():
    result = CliRunner().invoke(cli, ["codemods", "--output-format", "json"])
    assert result.exit_code == 0
    listed = json.loads(result.output)
    assert [c["id"] for c in listed] == list(library())
    swap = next(c for c in listed if c["id"] == "swap-norm")
    assert swap["realizes"] == ["norm.kind", "norm.bias", "norm.eps_key", "norm.fixed_eps"]
    assert [p["name"] for p in swap["params"]] == ["kind", "bias", "eps_key", "fixed_eps"]


@pytest.mark.parametrize("cls", CODEMODS, ids=lambda c: c.ID)
def test_cli_show_prints_docs_and_examples(cls):
    result = CliRunner().invoke(cli, ["codemods", "show", cls.ID])
    assert result.exit_code == 0, result.output
    assert cls.ID in result.output
    assert "example 1" in result.output
    first_line = cls.EXAMPLES[0].source.splitlines()[0]
    assert first_line.strip() in result.output


def test_cli_show_unknown_codemod_exits_2():
    result = CliRunner().invoke(cli, ["codemods", "show", "nope"])
    assert result.exit_code == 2
    assert "unknown codemod" in result.output
