"""The MLP and checkpoint codemods on loaders shaped as the real vllm_neuron
code builds them, as our llama3 reference does: local variables, shared by
the gate and up weights, rebound through
``with_rank_override(loader, rank=self.mlp_tp_rank)``.

The reference here is our llama3 with that rank reversed (a text edit in a
temporary copy): rank r loads shard ``world_size - 1 - r``. The MLP still
computes the same model (every rank's shard of the intermediate dimension is
summed), but a loader that ignored the override (a bias sharded by the true
rank) would pair the bias with another rank's weights, which the TP=2
validations below catch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import ROOT, plan_dict

REFERENCE = ROOT / "reference_models" / "llama3"

RANK = "        self.mlp_tp_rank = self.mlp_tp_group.rank_in_group\n"
REVERSED_RANK = "        self.mlp_tp_rank = self.mlp_tp_size - 1 - self.mlp_tp_group.rank_in_group\n"

LLAMA_MLP_BIAS = plan_dict(
    "llama_mlp_bias", "LlamaForCausalLM", {"mlp": {"bias": True}}, prefix="LlamaMlpBias"
)


def _reference(directory: Path) -> Path:
    """Our llama3 reference with the MLP's rank override reversed."""
    reference = directory / "llama3"
    shutil.copytree(REFERENCE, reference)
    model = reference / "model.py"
    text = model.read_text()
    assert text.count(RANK) == 1
    model.write_text(text.replace(RANK, REVERSED_RANK))
    return reference


@pytest.fixture(scope="module")
def real_loaders_reference(tmp_path_factory) -> Path:
    return _reference(tmp_path_factory.mktemp("real-loaders"))


def _port(plan, reference: Path, out: Path) -> Path:
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import load_plan, parse_plan

    parsed = load_plan(ROOT / "examples" / f"{plan}.plan.json") if isinstance(plan, str) else parse_plan(plan)
    result = build_port(parsed, load_reference(str(reference)))
    assert result.ok, str(result.failure)
    write_port(out, result.files, result.package_dir, force=True)
    return out / result.package_dir


@pytest.fixture(scope="module")
def ports(real_loaders_reference, tmp_path_factory):
    cache: dict[str, Path] = {}

    def build(plan) -> Path:
        key = plan if isinstance(plan, str) else plan["name"]
        if key not in cache:
            cache[key] = _port(plan, real_loaders_reference, tmp_path_factory.mktemp(f"port-{key}"))
        return cache[key]

    return build


# -- what the codemods write ---------------------------------------------------------------


def test_mlp_bias_shards_biases_with_the_weights_rank_override(ports):
    text = (ports(LLAMA_MLP_BIAS) / "model.py").read_text()
    expected = """        set_weight_loader(
            self.up_proj_bias,
            with_rank_override(
                sharding_weight_loader(shard_dim=0, shard_size=self.intermediate_size_per_rank, num_shards=self.mlp_tp_size),
                rank=self.mlp_tp_rank,
            ),
        )
"""
    assert expected in text
    assert "set_weight_loader(self.down_proj_bias, scaled_bias_loader(scale=self.mlp_tp_size))" in text
    # the shared local is left as it is
    assert "set_weight_loader(self.up_proj_weight, gate_up_loader)" in text


def test_fused_checkpoint_splits_the_shared_local(ports):
    """gate and up change differently (part 0 and part 1 of the fused tensor):
    each gets its own loader inside the same rank override, and the local
    nothing reads any more goes."""
    text = (ports("phi3") / "model.py").read_text()
    assert "gate_up_loader" not in text
    for part, weight in ((0, "gate_proj_weight"), (1, "up_proj_weight")):
        assert (
            f"""        set_weight_loader(
            self.{weight},
            with_rank_override(
                fused_part_loader(
                    part={part},
                    num_parts=2,
                    shard_size=self.intermediate_size_per_rank,
                    num_shards=self.mlp_tp_size,
                    is_storage_transposed=True,
                ),
                rank=self.mlp_tp_rank,
            ),
        )
"""
            in text
        )
    assert "down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)" in text


def test_a_shared_local_is_split_when_only_one_parameter_changes(real_loaders_reference):
    """checkpoint-keys stops transposing the up weight only: the gate keeps
    the shared local, the up weight gets its own loader."""
    from autoport_cst.transform.base import run_on_source
    from autoport_cst.transform.library import get_codemod

    source = (real_loaders_reference / "model.py").read_text()
    cls = get_codemod("checkpoint-keys")
    codemod = cls(cls.parse_params({"in_out_params": ["up_proj_weight"]}))
    text, _ = run_on_source(codemod, source)
    assert "set_weight_loader(self.gate_proj_weight, gate_up_loader)" in text
    assert "gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)" in text
    assert (
        """        set_weight_loader(
            self.up_proj_weight,
            with_rank_override(
                sharding_weight_loader(
                    shard_dim=1,
                    shard_size=self.intermediate_size_per_rank,
                    num_shards=self.mlp_tp_size,
                    is_storage_transposed=False,
                ),
                rank=self.mlp_tp_rank,
            ),
        )
"""
        in text
    )
    # the gate's loader (the local) still transposes; the copy for the up weight does not
    assert text.count("is_storage_transposed=True") == source.count("is_storage_transposed=True")
    assert text.count("is_storage_transposed=False") == source.count("is_storage_transposed=False") + 1


def test_mlp_kind_keeps_the_local_the_up_weight_still_reads(ports):
    text = (ports("starcoder2") / "model.py").read_text()
    assert "gate_proj_weight" not in text
    assert "set_weight_loader(self.up_proj_weight, gate_up_loader)" in text
    assert "gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)" in text


# -- and what the ports compute --------------------------------------------------------------

pytest.importorskip("torch")
pytest.importorskip("transformers")

CASES = {
    "mlp_bias": (LLAMA_MLP_BIAS, ("LlamaForCausalLM", {"mlp_bias": True})),
    "phi3": ("phi3", ("Phi3ForCausalLM", {})),
    "starcoder2": ("starcoder2", ("Starcoder2ForCausalLM", {})),
}


@pytest.mark.parametrize(
    "case, tp, dtype",
    [
        ("mlp_bias", 1, "fp32"),
        ("mlp_bias", 1, "bf16"),
        # slow: mlp_bias at TP=1 in fp32 runs the TP=2 layout among the validation's follow-ups
        pytest.param("mlp_bias", 2, "fp32", marks=pytest.mark.slow),
        ("phi3", 2, "bf16"),
        pytest.param("starcoder2", 2, "bf16", marks=pytest.mark.slow),
    ],
)
def test_port_from_real_loaders_validates(case, tp, dtype, ports, checkpoints):
    from autoport_cst.validate import validate_model

    plan, (architecture, overrides) = CASES[case]
    report = validate_model(ports(plan), checkpoints.get(architecture, **overrides), tp=tp, dtype=dtype)
    assert report.equivalent, report.summary()


def test_a_bias_loader_without_the_rank_override_fails(ports, checkpoints, tmp_path):
    """The check above can tell: the same port with the up and gate biases
    sharded by the true rank does not validate at TP=2."""
    from autoport_cst.validate import validate_model

    package = tmp_path / "llama_mlp_bias"
    shutil.copytree(ports(LLAMA_MLP_BIAS), package)
    model = package / "model.py"
    text = model.read_text()
    wrapped = """with_rank_override(
                sharding_weight_loader(shard_dim=0, shard_size=self.intermediate_size_per_rank, num_shards=self.mlp_tp_size),
                rank=self.mlp_tp_rank,
            )"""
    assert text.count(wrapped) == 2
    model.write_text(
        text.replace(
            wrapped,
            "sharding_weight_loader(shard_dim=0, shard_size=self.intermediate_size_per_rank, num_shards=self.mlp_tp_size)",
        )
    )
    report = validate_model(package, checkpoints.get("LlamaForCausalLM", mlp_bias=True), tp=2, dtype="fp32")
    assert not report.equivalent
    assert "layers.0.mlp" in str(report.first_diverging)
