"""The codemod's identity travels in the file context: a shared locator or
edit refuses in the name of the codemod at work (``FileContext.refuse``),
with no codemod ID among its arguments."""

from __future__ import annotations

import inspect
from pathlib import Path

import libcst as cst
import pytest

import autoport_cst.transform as transform
from autoport_cst.errors import PreconditionError
from autoport_cst.transform.anatomy.classes import one_class, require_method
from autoport_cst.transform.base import Codemod, FileContext, run_on_source
from autoport_cst.transform.edit.config_fields import add_config_fields

LAYERS = Path(transform.__file__).parent


def test_a_locator_refuses_in_the_name_of_the_codemod_at_work():
    module = cst.parse_module("class LlamaMLP:\n    pass\n")
    ctx = FileContext("model.py", "model", codemod="some-codemod")
    with pytest.raises(PreconditionError) as info:
        one_class(module, ctx, "decoder_layer", "<Prefix>DecoderLayer")
    assert "some-codemod: expected one <Prefix>DecoderLayer class in this file, found: none" in str(
        info.value
    )
    mlp = module.body[0]
    assert isinstance(mlp, cst.ClassDef)
    with pytest.raises(PreconditionError) as info:
        require_method(module, ctx, mlp, "forward")
    assert "some-codemod: LlamaMLP has no forward method" in str(info.value)
    assert info.value.position.line == 1


def test_run_on_source_names_the_codemod_it_runs():
    class Refusing(Codemod):
        ID = "refusing"

        def transform_module(self, module, ctx):
            return add_config_fields(module, ctx, [("x: int = 1", "")])

    with pytest.raises(PreconditionError) as info:
        run_on_source(Refusing(), "x = 1\n", "config.py", "config")
    assert "refusing: expected one config dataclass" in str(info.value)


def test_no_shared_helper_takes_a_codemod_id():
    taking = []
    for path in [*LAYERS.glob("anatomy/*.py"), *LAYERS.glob("edit/*.py")]:
        text = path.read_text()
        if "codemod_id" in text:
            taking.append(path.relative_to(LAYERS).as_posix())
    assert taking == []
    assert list(inspect.signature(one_class).parameters)[:2] == ["module", "ctx"]
