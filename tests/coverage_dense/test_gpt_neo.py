"""GPT-Neo: research reads its local attention window from the mask buffer
its attention computes (``bias = tril(ones) ^ tril(ones, -window_size)`` on
the layers ``attention_layers`` marks "local", the plain ``tril(ones)`` on
the others), and its unscaled scores as a scale of 1 that no config field
gives. It is refused, naming what no port realizes: the window and the
sliding layers come from ``config.window_size`` and
``config.attention_layers``, where a port reads ``sliding_window`` and
``layer_types`` (a port built from the plan as it was would apply no window:
its config has neither field)."""

from __future__ import annotations

import math

import pytest

from autoport_cst.research.analysis import band_mask
from autoport_cst.research.interp.values import Node, SliceSym, TensorInit

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
def test_unscaled_scores_are_a_scale_of_one_from_no_config_field(researched):
    attention = researched.spec.attention
    assert (attention.scale, attention.scale_key) == (1.0, None)
    assert "attention.scale_key" not in " ".join(researched.spec.unsupported or ())


@pytest.mark.slow
def test_the_refusal_names_the_config_fields_no_port_reads(researched):
    unsupported = researched.spec.unsupported or ()
    assert [e.split(":")[0] for e in unsupported] == ["window_fields"], unsupported
    for words in (
        "the window (12 tokens) comes from config.window_size",
        "the layers that slide from config.attention_layers ('local' on the sliding layers)",
        "a port reads config.sliding_window and config.layer_types",
    ):
        assert words in unsupported[0], unsupported[0]
