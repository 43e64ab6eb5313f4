"""Every built-in reference reads its checkpoint config the same way where
the config format varies: RoPE parameters nested in ``rope_parameters``, also
keyed by layer type (OLMo 3, Gemma 3)."""

from __future__ import annotations

import importlib

import pytest

from autoport_cst.apply.reference import builtin_names, load_reference

pytest.importorskip("torch")

# a vision-language reference reads its text config nested under text_config (tests/vlm)
TEXT_REFERENCES = [name for name in builtin_names() if load_reference(name).spec.vision is None]


def config_class(reference: str):
    module = importlib.import_module(f"autoport_cst.reference_models.{reference}.config")
    classes = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and hasattr(v, "from_configs") and v.__module__ == module.__name__
    ]
    assert len(classes) == 1, classes
    return classes[0]


def _theta(config) -> float:
    """The RoPE base a reference's config holds (a field, or in ``rope_parameters``)."""
    theta = getattr(config, "rope_theta", None)
    return theta if theta is not None else config.rope_parameters["rope_theta"]


def _rope(config) -> dict:
    """RoPE base, type and scaling of a config, whether it keeps them as
    ``rope_parameters`` (transformers 5) or as ``rope_theta`` + ``rope_scaling``."""
    if getattr(config, "rope_theta", None) is None:
        return dict(config.rope_parameters)
    return {"rope_theta": config.rope_theta, **config.rope_scaling}


@pytest.fixture(scope="module", autouse=True)
def standin():
    from autoport_cst.validate.standin import standin_installed

    with standin_installed():
        yield


@pytest.mark.parametrize("reference", TEXT_REFERENCES)
def test_rope_parameters_keyed_by_layer_type_agreeing(reference):
    cls = config_class(reference)
    same = {"rope_type": "default", "rope_theta": 123456.0}
    config = cls.from_configs(
        {"rope_parameters": {"full_attention": dict(same), "sliding_attention": dict(same)}}
    )
    assert _theta(config) == 123456.0


@pytest.mark.parametrize("reference", TEXT_REFERENCES)
def test_rope_parameters_that_differ_per_layer_type_are_refused(reference):
    cls = config_class(reference)
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    with pytest.raises(ValueError, match="differ per layer type"):
        cls.from_configs({"rope_parameters": rope})


@pytest.mark.parametrize("reference", TEXT_REFERENCES)
def test_rope_layer_parameters_keeps_each_layer_types_rope(reference, tmp_path):
    """With the rope-layer-parameters codemod the config keeps every type's
    RoPE, and ``rope_config(type)`` is what that type's rotary embedding reads."""
    import sys
    import types
    from pathlib import Path

    from autoport_cst.transform.base import PortContext, run_on_source
    from autoport_cst.transform.library import get_codemod

    module = importlib.import_module(f"autoport_cst.reference_models.{reference}.config")
    codemod = get_codemod("rope-layer-parameters")()
    source, _ = run_on_source(
        codemod, Path(module.__file__).read_text(encoding="utf-8"), "config.py", "config", PortContext()
    )
    name = f"_ported_{reference}_config"
    ported = types.ModuleType(name)
    ported.__package__ = module.__package__  # the reference's relative imports resolve
    sys.modules[name] = ported
    try:
        exec(compile(source, f"<{reference} config.py>", "exec"), ported.__dict__)
        cls = next(v for v in vars(ported).values() if isinstance(v, type) and hasattr(v, "rope_config"))
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
        config = cls.from_configs(
            {"rope_parameters": rope, "layer_types": ["sliding_attention", "full_attention"]}
        )
        assert config.rope_layer_parameters == rope
        assert config.layer_types == ["sliding_attention", "full_attention"]
        sliding, full = config.rope_config("sliding_attention"), config.rope_config("full_attention")
        assert _rope(sliding) == rope["sliding_attention"]
        assert _rope(full) == rope["full_attention"]
        assert full.rope_layer_parameters is None and config.rope_config(None) is config
        assert rope["full_attention"]["rope_theta"] == 1e6  # the checkpoint's dict is not mutated
    finally:
        del sys.modules[name]
