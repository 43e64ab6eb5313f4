"""GraniteSWA and GraniteMoE-SWA rotate each layer by its entry of
``layer_rope_theta`` (transformers fills it with the global ``rope_theta`` and
writes it to config.json; 0: no RoPE on that layer), not by ``rope_theta``.

The research reads that list as the RoPE base the code uses
(``code.rope_base_field``); a port reads ``rope_parameters.rope_theta`` for
every layer, so it refuses, naming the field and both values, a config whose
per-layer bases differ from it (``config-guards``' ``same_as``), and the
config variant of ``port`` varies the list with the base it follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate import build_tiny_checkpoint

pytest.importorskip("transformers")

ARCHITECTURES = ("GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("granite-swa-bases")


def _source(workdir: Path, architecture: str) -> Path:
    source = workdir / f"{architecture}-src"
    if not (source / "config.json").is_file():
        build_tiny_checkpoint(architecture, source, seed=0)
    return source


def test_research_guards_the_per_layer_rope_bases(workdir):
    from autoport_cst.plan.plan_file import assumptions_of
    from autoport_cst.research import research

    found = research(str(_source(workdir, "GraniteSWAForCausalLM")))
    assert found.finding("code.rope_base_field").value == "layer_rope_theta"
    (guard,) = [g for g in assumptions_of(found, "smollm3").guards if g.field == "layer_rope_theta"]
    assert guard.same_as == "rope_parameters.rope_theta"
    assert guard.value == [10000.0, 10000.0] and guard.refused_entry() == 20000.0


def test_the_variant_varies_the_per_layer_bases_with_the_base():
    from autoport_cst.validate.variants import variant_values

    base = {"rope_parameters": {"rope_theta": 10.0}, "layer_rope_theta": [10.0, 0, 10.0]}
    tied = [("layer_rope_theta", "rope_parameters.rope_theta")]
    values, changed = variant_values(base, ["rope_parameters.rope_theta"], tied)
    assert values["layer_rope_theta"] == [20.0, 0, 20.0]
    assert changed["layer_rope_theta"] == ([10.0, 0, 10.0], [20.0, 0, 20.0])
    assert variant_values(base, [], tied)[0] == base


@pytest.fixture(scope="module")
def ported(workdir):
    from autoport_cst.port import port

    found = {}

    def run(architecture: str):
        if architecture not in found:
            source = _source(workdir, architecture)
            name = "port_" + architecture.removesuffix("ForCausalLM").lower()
            found[architecture] = port(str(source), name, workdir / "out", force=True, steps=8)
        return found[architecture]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_port_validates_on_the_config_variant(ported, architecture):
    outcome = ported(architecture)
    assert outcome.validated, [r.summary for r in (*outcome.runs, *outcome.variant_runs) if not r.equivalent]
    assert outcome.variant["layer_rope_theta"] == [[10000.0, 10000.0], [20000.0, 20000.0]]
    assert outcome.variant["rope_parameters.rope_theta"] == [10000.0, 20000.0]
    (check,) = [c for c in outcome.guards if c.field == "layer_rope_theta"]
    assert check.refused, check.message


def _from_configs(package_dir: Path, checkpoint_dir: Path, values: dict):
    import torch

    from autoport_cst.config_json import config_object
    from autoport_cst.validate.package import imported_package
    from autoport_cst.validate.standin import standin_installed

    with standin_installed(model=str(checkpoint_dir)), imported_package(package_dir) as package:
        with torch.device("meta"):
            return package.factory.from_configs(config_object(values), None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("thetas", "rope_theta", "refused"),
    [
        ([10000.0, 20000.0], 10000.0, 20000.0),  # a base per layer
        ([10000.0, 0.0], 10000.0, 0.0),  # a layer without RoPE
        ([10000.0, 10000.0], 20000.0, 10000.0),  # the global base is not the layers'
    ],
)
def test_a_per_layer_base_other_than_the_ports_is_refused_by_name(ported, thetas, rope_theta, refused):
    outcome = ported("GraniteSWAForCausalLM")
    values = json.loads((outcome.checkpoint_dir / "config.json").read_text(encoding="utf-8"))
    values.pop("transformers_version", None)
    _from_configs(outcome.package_dir, outcome.checkpoint_dir, values)  # the planned config builds
    values["layer_rope_theta"] = thetas
    values["rope_parameters"] = {**values["rope_parameters"], "rope_theta": rope_theta}
    with pytest.raises(ValueError) as error:
        _from_configs(outcome.package_dir, outcome.checkpoint_dir, values)
    message = str(error.value)
    assert "layer_rope_theta" in message and repr(refused) in message
    assert f"rope_parameters.rope_theta = {rope_theta!r}" in message
