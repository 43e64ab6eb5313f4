"""Every built-in reference reads its checkpoint config the same way where
the config format varies: RoPE parameters nested in ``rope_parameters``, also
keyed by layer type (OLMo 3, Gemma 3)."""

from __future__ import annotations

import importlib

import pytest

from autoport_cst.apply.reference import builtin_names

pytest.importorskip("torch")


def config_class(reference: str):
    module = importlib.import_module(f"autoport_cst.reference_models.{reference}.config")
    classes = [v for v in vars(module).values() if isinstance(v, type) and hasattr(v, "from_configs")
               and v.__module__ == module.__name__]
    assert len(classes) == 1, classes
    return classes[0]


@pytest.fixture(scope="module", autouse=True)
def standin():
    from autoport_cst.validate.standin import standin_installed

    with standin_installed():
        yield


@pytest.mark.parametrize("reference", builtin_names())
def test_rope_parameters_keyed_by_layer_type_agreeing(reference):
    cls = config_class(reference)
    same = {"rope_type": "default", "rope_theta": 123456.0}
    config = cls.from_configs({"rope_parameters": {"full_attention": dict(same), "sliding_attention": dict(same)}})
    assert config.rope_theta == 123456.0


@pytest.mark.parametrize("reference", builtin_names())
def test_rope_parameters_that_differ_per_layer_type_are_refused(reference):
    cls = config_class(reference)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    with pytest.raises(ValueError, match="differ per layer type"):
        cls.from_configs({"rope_parameters": rope})
