"""Expert counts a default config leaves None (validate/tiny_unset.py).

Dots1Config's defaults leave the routed experts, the top-k and the shared
experts None, and Dots1's MoE cannot be built without them: ``tiny dots1``
failed ('transformers cannot build the model from its shrunk config
(TypeError: empty() takes 1 positional argument but 3 were given)'), and the
corpus researched its full-size config, which refused it for seven fields
that were only unreadable. The counts are now given their tiny values when,
and only when, the shrunk config does not build without them."""

from __future__ import annotations

import json

import pytest

from autoport_cst.validate.tiny import TINY_DIMENSIONS
from autoport_cst.validate.tiny_unset import fill_unset_counts


class _Config:
    def __init__(self, **values):
        self.__dict__.update(values)


class _NeedsCounts:
    """Builds only with both counts set (as Dots1's MoE)."""

    def __init__(self, config):
        if config.n_routed_experts is None or config.n_shared_experts is None:
            raise TypeError("empty() takes 1 positional argument but 3 were given")


class _NoneMeansNone:
    """Builds with its counts None (None meaning no experts)."""

    def __init__(self, config):
        pass


class _FailsOtherwise:
    """Does not build whatever the counts."""

    def __init__(self, config):
        raise ValueError("something else")


def test_none_counts_filled_when_the_model_needs_them():
    pytest.importorskip("torch")
    config = _Config(n_routed_experts=None, num_experts_per_tok=None, n_shared_experts=None)
    assert fill_unset_counts(_NeedsCounts, config, dict(TINY_DIMENSIONS)) == {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
    }
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (4, 2, 1)


@pytest.mark.parametrize("model_class", [_NoneMeansNone, _FailsOtherwise])
def test_none_counts_kept_when_filling_them_is_not_what_the_build_lacks(model_class):
    pytest.importorskip("torch")
    config = _Config(n_routed_experts=None, num_experts_per_tok=None, n_shared_experts=None)
    assert fill_unset_counts(model_class, config, dict(TINY_DIMENSIONS)) == {}
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (
        None,
        None,
        None,
    )


def test_dots1_default_config_builds_a_tiny_moe(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = build_tiny_checkpoint("dots1", tmp_path / "dots1", seed=0)
    config = json.loads((tiny.directory / "config.json").read_text())
    assert (config["n_routed_experts"], config["num_experts_per_tok"], config["n_shared_experts"]) == (
        4,
        2,
        1,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.directory))
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()
