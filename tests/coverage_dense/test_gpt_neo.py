"""GPT-Neo: research reads its local attention window from the mask buffer
its attention computes (``bias = tril(ones) ^ tril(ones, -window_size)`` on
the layers ``attention_layers`` marks "local", the plain ``tril(ones)`` on
the others), and its unscaled scores as a scale of 1 that no config field
gives. The window and the sliding layers come from ``config.window_size``
and ``config.attention_layers`` ('local'), found by changing them: the port
(smollm3 reference, sliding-window reading attention_layers, config-key-aliases
reading window_size, attention-scale writing 1.0) validates at TP=1 fp32 and
bf16 and TP=2 on a tiny checkpoint whose window (6) is shorter than the
prompts; mutants (no window, a window on every layer, a shorter window, the
default scale) fail at an attention. A window whose fields are not found is
refused as window_fields, naming them."""

from __future__ import annotations

import json
import math

import pytest

from autoport_cst.research.analysis import band_mask
from autoport_cst.research.interp.values import Node, SliceSym, TensorInit
from tests.edited_copies import edited_copy

ONES = TensorInit((32, 32), "ones")
END = Node("method", "size", (Node("input", "key"), -2))
LAST_QUERIES = (
    slice(None),
    slice(None),
    SliceSym(Node("binop", "sub", (END, Node("method", "size", (Node("input", "query"), -2)))), END, None),
    SliceSym(None, END, None),
)


def _call(name: str, *args) -> Node:
    return Node("call", f"torch.{name}", args)


def _sliced(mask: Node) -> Node:
    return Node("item", "", (mask, LAST_QUERIES))


def test_a_causal_triangle_is_read_as_no_window():
    causal = Node("method", "view", (_call("tril", ONES), 1, 1, 32, 32))
    assert band_mask.band(causal) == band_mask.Band(-math.inf, 0)
    assert band_mask.causal_window(_sliced(causal)) == (True, None)


@pytest.mark.parametrize("window", [1, 4, 16])
def test_a_triangle_less_a_lower_one_is_read_as_a_window(window):
    causal = _call("tril", ONES)
    local = _call("bitwise_xor", causal, _call("tril", causal, -window))
    assert band_mask.causal_window(_sliced(local)) == (True, window)
    # the same band by triu: keys from p - window + 1
    assert band_mask.causal_window(_sliced(_call("triu", causal, 1 - window))) == (True, window)


def test_masks_that_are_not_causal_bands_are_not_read():
    upper = _call("triu", ONES)  # keys at or after the query
    assert band_mask.causal_window(_sliced(upper)) == (False, None)
    ragged = _call("bitwise_xor", _call("tril", ONES), _call("triu", ONES, 3))  # not one inside the other
    assert band_mask.causal_window(_sliced(ragged)) == (False, None)
    assert band_mask.causal_window(_call("tril", ONES)) == (False, None)  # not sliced to the last queries
    zeros = _call("tril", TensorInit((32, 32), "zeros"))
    assert band_mask.causal_window(_sliced(zeros)) == (False, None)


@pytest.fixture(scope="module")
def researched(tmp_path_factory):
    pytest.importorskip("transformers")
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path_factory.mktemp("gpt_neo") / "gpt_neo"
    build_tiny_checkpoint("GPTNeoForCausalLM", source, seed=0, dimensions={"window_size": 12})
    return research(str(source))


@pytest.mark.slow
def test_the_local_layers_window_is_read_from_the_mask_buffer(researched):
    attention = researched.spec.attention
    assert (attention.sliding_window, attention.sliding_window_size) == ("per_layer", 12)
    found = researched.finding("attention.sliding_window", "code")
    assert "sliding window on layers 1 of 2" in found.evidence, found


@pytest.mark.slow
def test_the_fields_the_window_comes_from_are_read_by_changing_them(researched):
    """window_size moves the window, attention_layers ('local') moves the
    sliding layers: the port reads them there."""
    spec = researched.spec
    assert (spec.attention.layer_types_key, spec.attention.sliding_layer_type) == (
        "attention_layers",
        "local",
    )
    assert spec.checkpoint.config_keys["sliding_window"] == "window_size"
    assert not spec.unsupported, spec.unsupported


@pytest.mark.slow
def test_unscaled_scores_are_a_scale_of_one_from_no_config_field(researched):
    attention = researched.spec.attention
    assert (attention.scale, attention.scale_key) == (1.0, None)


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """TP=1 fp32 and bf16, and TP=2, on the checkpoint's own weights (its
    window_size shrunk to 6 by the tiny builder: the prompts are longer)."""
    pytest.importorskip("transformers")
    from autoport_cst.port import port
    from autoport_cst.validate import build_tiny_checkpoint

    workdir = tmp_path_factory.mktemp("gpt_neo_port")
    source = workdir / "gpt_neo"
    build_tiny_checkpoint("GPTNeoForCausalLM", source, seed=0)
    assert json.loads((source / "config.json").read_text())["window_size"] == 6
    return workdir, port(
        str(source), "gpt_neo", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8
    )


@pytest.mark.slow
def test_gpt_neo_ports_and_validates(ported):
    _, outcome = ported
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert {"sliding-window", "attention-scale", "config-key-aliases", "learned-positions"} <= set(
        outcome.steps
    )
    model = (outcome.package_dir / "model.py").read_text()
    assert 'if config.attention_layers[layer_idx] == "local":' in model
    assert "self.scaling = 1.0" in model


MUTANTS = {
    "no layer slides": (
        'config.attention_layers[layer_idx] == "local"',
        'config.attention_layers[layer_idx] == "-"',
    ),
    "every layer slides": ('config.attention_layers[layer_idx] == "local"', "config.attention_layers"),
    # two shorter: a window the run's blocks (2 positions) still divide
    "a window two shorter": (
        "            return config.sliding_window\n        return None",
        "            return config.sliding_window - 2\n        return None",
    ),
    "scaled by head_dim ** -0.5": ("self.scaling = 1.0", "self.scaling = self.head_dim**-0.5"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_fails_validation(ported, mutant):
    from autoport_cst.validate import validate_model

    workdir, outcome = ported
    old, new = MUTANTS[mutant]
    wrong = workdir / mutant.replace(" ", "_").replace("*", "") / "gpt_neo"
    wrong = edited_copy(outcome.package_dir, wrong, [(old, new)])
    report = validate_model(wrong, outcome.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None
    assert report.first_diverging.component.endswith(".attention"), report.first_diverging


def test_the_port_slides_the_layers_attention_layers_marks_local():
    from types import SimpleNamespace

    from autoport_cst.codemods import sliding_window

    scope: dict = {}
    exec(sliding_window.layer_function("none", "attention_layers", "local"), scope)
    rule = scope["_layer_sliding_window"]
    config = SimpleNamespace(
        sliding_window=6, use_sliding_window=True, attention_layers=["global", "local"] * 2
    )
    assert [rule(config, i) for i in range(4)] == [None, 6, None, 6]
    with pytest.raises(ValueError, match="no attention_layers"):
        rule(SimpleNamespace(sliding_window=6, use_sliding_window=True, attention_layers=None), 0)


@pytest.mark.slow
def test_a_window_whose_fields_are_not_found_is_refused_naming_them(tmp_path, monkeypatch):
    """Were the list marking the sliding layers not found (here: its search
    disabled), the model is refused naming what is and is not found, not
    ported with a window on no layer."""
    pytest.importorskip("transformers")
    from autoport_cst.research import research
    from autoport_cst.research.analysis import window_source
    from autoport_cst.validate import build_tiny_checkpoint

    monkeypatch.setattr(window_source, "_layers_field", lambda st, sliding: None)
    build_tiny_checkpoint("GPTNeoForCausalLM", tmp_path / "gpt_neo", seed=0, dimensions={"window_size": 12})
    spec = research(str(tmp_path / "gpt_neo")).spec
    assert [e.split(":")[0] for e in spec.unsupported or ()] == ["window_fields"], spec.unsupported
    for words in (
        "the window (12 tokens) comes from config.window_size",
        "the layers that slide from no config field found",
        "a port reads config.sliding_window and config.layer_types",
    ):
        assert words in spec.unsupported[0], spec.unsupported[0]
    assert spec.attention.layer_types_key == "layer_types"
