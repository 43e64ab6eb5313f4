"""Layers without RoPE chosen by layer type (Cohere 2, Flint, EXAONE 4,
EXAONE-MoE): the research reads the rule from the ``if`` that guards the
rotation in the attention's forward, and the nope-layers codemod realizes
it; the tiny checkpoints hold sliding and full-attention layers, so the
validation runs both kinds (a port that rotates the full-attention layers
fails at the first of them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.validation_depth import FULL, feature_depth, port_at_depth

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nope-layer-types")


def _code_findings(architecture: str, model_type: str, workdir: Path, **config) -> dict:
    """The code analysis' findings on the tiny checkpoint of ``architecture``
    (its config.json updated with ``config``), by field."""
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import locate_modeling_source
    from autoport_cst.validate import build_tiny_checkpoint

    directory = workdir / f"{architecture}-{len(config)}"
    build_tiny_checkpoint(architecture, directory, seed=0)
    path = directory / "config.json"
    if config:
        raw = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**raw, **config}), encoding="utf-8")
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(locate_modeling_source(model_type, str(path)), resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


@pytest.mark.parametrize(
    ("architecture", "model_type", "rule", "nope"),
    [
        ("Cohere2ForCausalLM", "cohere2", "sliding", (3,)),
        ("FlintForCausalLM", "flint", "sliding", (0, 1, 5)),
        ("Exaone4ForCausalLM", "exaone4", "sliding_or_no_window", (3,)),
        ("ExaoneMoeForCausalLM", "exaone_moe", "sliding_or_no_window", (3,)),
    ],
)
def test_the_rule_is_read_from_the_rotation_guard(architecture, model_type, rule, nope, workdir):
    found = _code_findings(architecture, model_type, workdir)
    assert found["rope.nope_layers"].value == nope
    assert found["rope.nope_rule"].value == rule
    assert "is false" in found["rope.nope_rule"].evidence  # the guard's source, quoted
    assert "unsupported.nope_layers" not in found


def test_a_clause_reading_other_config_fields_is_left_out_when_false(workdir):
    """Cohere 2 MoE also rotates the dense layers of its prefix
    (``self.force_rope``, from mlp_layer_types and
    prefix_dense_sliding_window_pattern); on a config without dense layers
    that clause is false on every layer: the rule is read from the rest of
    the guard, and the evidence names the clause and its fields."""
    found = _code_findings("Cohere2MoeForCausalLM", "cohere2_moe", workdir)
    assert "unsupported.nope_layers" not in found
    assert found["rope.nope_rule"].value == "sliding"
    evidence = found["rope.nope_rule"].evidence
    assert "`self.force_rope`" in evidence and "is false on every layer" in evidence, evidence
    assert "config.mlp_layer_types" in evidence and "config.prefix_dense_sliding_window_pattern" in evidence


def _edited_cohere2(workdir: Path, guard: str) -> dict:
    """The code analysis of the tiny Cohere 2 with its modeling source's
    rotation guard replaced by ``guard`` (the rest of the source as installed)."""
    import ast

    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import ModelingSource, SourceModule, locate_modeling_source
    from autoport_cst.validate import build_tiny_checkpoint

    directory = workdir / "cohere2-edited"
    build_tiny_checkpoint("Cohere2ForCausalLM", directory, seed=0)
    path = directory / "config.json"
    source = locate_modeling_source("cohere2", str(path))
    text = source.module.path.read_text(encoding="utf-8")
    original = (
        "        if self.sliding_window is not None:\n            query_states, key_states = apply_rotary"
    )
    assert text.count(original) == 1
    edited = text.replace(original, original.replace("self.sliding_window is not None", guard))
    edited_path = workdir / source.module.path.name
    edited_path.write_text(edited, encoding="utf-8")
    module = SourceModule(source.module.dotted, edited_path, ast.parse(edited), source.library)
    source.library._modules[source.module.dotted] = module
    source = ModelingSource(source.library, module, source.model_type)
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(source, resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


def test_the_rule_does_not_come_from_the_name(workdir):
    """Cohere 2's source with a guard that also rotates on a config without
    sliding window: EXAONE 4's rule, not Cohere 2's."""
    found = _edited_cohere2(workdir, "self.sliding_window is not None or self.config.sliding_window is None")
    assert found["rope.nope_rule"].value == "sliding_or_no_window"


def test_a_guard_reading_another_field_through_the_config_is_refused(workdir):
    found = _edited_cohere2(workdir, "self.sliding_window is not None or self.config.num_hidden_layers > 99")
    assert "rope.nope_rule" not in found
    assert "config.num_hidden_layers" in found["unsupported.nope_layers"].evidence


def _port(workdir: Path, architecture: str, tp: int = 1, seed: int = 0, depth: str = FULL):
    from autoport_cst.validate import build_tiny_checkpoint

    source = workdir / f"{architecture}-port-src{seed}"
    build_tiny_checkpoint(architecture, source, seed=seed)
    name = "port_" + "".join(c for c in architecture.removesuffix("ForCausalLM").lower() if c.isalnum())
    outcome = port_at_depth(depth, str(source), f"{name}_tp{tp}", workdir / "out", tp=tp, force=True, steps=8)
    failures = [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs if not r.equivalent]
    assert outcome.validated, failures
    assert "nope-layers" in outcome.steps
    return outcome


@pytest.fixture(scope="module")
def exaone4(workdir, request):
    return _port(workdir, "Exaone4ForCausalLM", depth=feature_depth(request.config))


def test_exaone4_ports_and_validates(exaone4):
    """Sliding layers 0-2 rotate, full-attention layer 3 does not."""
    assert [(r.tp, r.dtype) for r in exaone4.runs] == [(1, "fp32"), (1, "bf16")]
    plan = json.loads(exaone4.plan_path.read_text(encoding="utf-8"))
    assert plan["spec"]["rope"]["nope_rule"] == "sliding_or_no_window"
    assert plan["spec"]["rope"]["nope_layers"] == [3]


def test_a_port_that_rotates_the_full_attention_layers_fails_there(exaone4, workdir):
    """The tiny checkpoint has both layer types: rotating every layer (as the
    earlier Exaone 4 and Cohere 2 ports did) fails at layer 3's attention."""
    from autoport_cst.validate import validate_model

    wrong = workdir / "exaone4-rotates-every-layer"
    shutil.copytree(exaone4.package_dir, wrong, dirs_exist_ok=True)
    model = wrong / "model.py"
    text = model.read_text(encoding="utf-8")
    rule = "    if config.sliding_window is None:\n        return True\n"
    assert text.count(rule) == 1
    model.write_text(text.replace(rule, "    return True\n"), encoding="utf-8")
    report = validate_model(wrong, exaone4.checkpoint_dir, tp=1, dtype="fp32", steps=2, config_variants=False)
    assert not report.equivalent
    assert "layers.3.attention" in report.summary()


@pytest.mark.slow
def test_exaone4_without_sliding_window_rotates_every_layer(exaone4, workdir):
    """EXAONE 4's 1.2B checkpoint: no sliding window, every layer full
    attention and rotated; the port planned on the tiny config reads it so."""
    from autoport_cst.validate import build_tiny_checkpoint, validate_model

    source = workdir / "exaone4-no-window"
    build_tiny_checkpoint("Exaone4ForCausalLM", source, seed=1)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config.update(sliding_window=None, sliding_window_pattern=None)
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    (source / "config.json").write_text(json.dumps(config), encoding="utf-8")
    report = validate_model(exaone4.package_dir, source, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert report.equivalent, report.summary()


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["Cohere2ForCausalLM", "FlintForCausalLM", "ExaoneMoeForCausalLM"])
def test_ports_validate(architecture, workdir):
    _port(workdir, architecture)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["Exaone4ForCausalLM", "Cohere2ForCausalLM"])
def test_ports_validate_on_two_ranks(architecture, workdir):
    _port(workdir, architecture, tp=2, seed=1)
