"""A function the modeling code imports from transformers outside the models
(transformers 5.25 moved DeepSeek V3's and MiniCPM3's ``yarn_apply_mscale``
from their modeling files into ``modeling_rope_utils``) is read from its
source and computed when its arguments are concrete, as a function of the
modeling file is; on tensors it stays the external call it was."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from autoport_cst.research.interp.interpreter import Interpreter
from autoport_cst.research.interp.values import Node, SourceClass
from autoport_cst.research.sources import SourceLibrary

HELPERS = """
import math


def get_mscale(scale=1, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def apply_mscale(rope_parameters, scaling):
    if rope_parameters.get("rope_type", "default") != "default":
        mscale_all_dim = rope_parameters.get("mscale_all_dim", 0)
        if mscale_all_dim:
            mscale = get_mscale(rope_parameters["factor"], mscale_all_dim)
            scaling = scaling * mscale * mscale
    return scaling


def rescale(x, factor):
    return x * factor
"""

MODELING = """
from torch import nn

from ...rope_helpers import apply_mscale, rescale


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.scaling = apply_mscale(config.rope_parameters, self.head_dim ** (-0.5))

    def forward(self, hidden_states):
        return rescale(hidden_states, self.scaling)
"""


def _attention(tmp_path: Path, rope_parameters: dict):
    root = tmp_path / "transformers"
    (root / "models" / "tiny").mkdir(parents=True)
    (root / "rope_helpers.py").write_text(textwrap.dedent(HELPERS))
    (root / "models" / "tiny" / "modeling_tiny.py").write_text(textwrap.dedent(MODELING))
    library = SourceLibrary(root)
    module = library.module("transformers.models.tiny.modeling_tiny")
    interp = Interpreter(library, {"head_dim": 16, "rope_parameters": rope_parameters})
    cls = SourceClass(module, module.classes["TinyAttention"])
    return interp, interp.instantiate(cls, [interp.config], {}, {})


def test_an_imported_helper_on_the_config_is_computed_from_its_source(tmp_path):
    rope = {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0}
    _, attention = _attention(tmp_path, rope)
    mscale = 0.1 * math.log(40.0) + 1.0
    assert math.isclose(attention.attrs["scaling"], 16**-0.5 * mscale * mscale, rel_tol=1e-12)


def test_without_mscale_all_dim_the_helper_returns_the_default_scale(tmp_path):
    _, attention = _attention(tmp_path, {"rope_type": "default"})
    assert attention.attrs["scaling"] == 16**-0.5


def test_an_imported_helper_on_tensors_stays_the_external_call(tmp_path):
    interp, attention = _attention(tmp_path, {"rope_type": "default"})
    (state,) = interp.run_method(attention, "forward", [])
    returned = state.value
    assert isinstance(returned, Node) and returned.kind == "call"
    assert returned.name == "transformers.rope_helpers.rescale"
