"""Fixtures of the mixture-of-experts tests: tiny checkpoints of the MoE
architectures (built once per session), the same checkpoints rewritten in the
per-expert layouts the Hugging Face hub releases use, and ports applied from
the example plans."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QWEN3_MOE = ROOT / "reference_models" / "qwen3_moe"
EXAMPLES = ROOT / "examples"

# dots.llm1's config class has no expert counts by default; these are the
# release's routing settings shrunk to the tiny sizes (build_tiny_checkpoint
# sets the dimensions). routed_scaling_factor stays 1.0 and no layer is dense:
# the example plan (examples/dots1.plan.json) predates the spec fields for
# them. The research's own plan for the release's settings (a dense first
# layer, factor 2.5) is validated in tests/coverage_moe.
DOTS1_CONFIG = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "first_k_dense_replace": 0,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
}


def tiny(tmp_path_factory, source: str, name: str, overrides: dict | None = None, seed: int = 0) -> Path:
    """A tiny checkpoint of ``source`` (an architecture), with config
    ``overrides`` applied to the architecture's default config first. Its
    dense / MoE layer steps stay the default config's (every Qwen-MoE layer
    MoE): the qwen3_moe reference and the example plans are written for
    those; ports with dense layers are validated in tests/validate and
    tests/coverage_moe."""
    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp(name)
    if overrides:
        import transformers

        model_class = getattr(transformers, source)
        config = model_class.config_class(**overrides).to_dict()
        config["architectures"] = [source]
        config_dir = tmp_path_factory.mktemp(f"{name}-config")
        (config_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
        build_tiny_checkpoint(config_dir / "config.json", directory, seed=seed, keep_layer_kinds=True)
    else:
        build_tiny_checkpoint(source, directory, seed=seed, keep_layer_kinds=True)
    return directory


def hub_layout(source: Path, target: Path, style: str) -> Path:
    """Rewrite a checkpoint whose experts are stored fused (transformers >= 5:
    ``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``)
    with one tensor per expert, as released checkpoints store them:
    ``qwen`` -> ``mlp.experts.J.{gate,up,down}_proj.weight``; ``mixtral`` ->
    ``block_sparse_moe.experts.J.{w1,w3,w2}.weight`` and
    ``block_sparse_moe.gate.weight``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    path = target / "model.safetensors"
    state = load_file(str(path))
    out = {}
    names = {"qwen": ("gate_proj", "up_proj", "down_proj"), "mixtral": ("w1", "w3", "w2")}[style]
    for key, tensor in state.items():
        block = key
        if style == "mixtral":
            block = key.replace(".mlp.", ".block_sparse_moe.")
        if key.endswith(".experts.gate_up_proj"):
            base = block[: -len("gate_up_proj")]
            half = tensor.shape[1] // 2
            for j in range(tensor.shape[0]):
                out[f"{base}{j}.{names[0]}.weight"] = tensor[j, :half].contiguous()
                out[f"{base}{j}.{names[1]}.weight"] = tensor[j, half:].contiguous()
        elif key.endswith(".experts.down_proj"):
            base = block[: -len("down_proj")]
            for j in range(tensor.shape[0]):
                out[f"{base}{j}.{names[2]}.weight"] = tensor[j].contiguous()
        elif key.endswith(".mlp.gate.weight"):
            out[block] = tensor
        else:
            out[key] = tensor
    save_file(out, str(path), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory, "Qwen3MoeForCausalLM", "tiny-qwen3-moe")


@pytest.fixture(scope="session")
def tiny_mixtral(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory, "MixtralForCausalLM", "tiny-mixtral")


@pytest.fixture(scope="session")
def tiny_qwen2_moe(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory, "Qwen2MoeForCausalLM", "tiny-qwen2-moe")


@pytest.fixture(scope="session")
def tiny_dots1(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory, "Dots1ForCausalLM", "tiny-dots1", DOTS1_CONFIG)


@pytest.fixture(scope="session")
def port_of(tmp_path_factory):
    """``port_of(plan_name)`` -> the package directory `apply` writes for
    ``examples/<plan_name>.plan.json`` (built once per session)."""
    from autoport_cst.apply.engine import build_port
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.apply.writer import write_port
    from autoport_cst.plan import load_plan

    built: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in built:
            plan = load_plan(EXAMPLES / f"{name}.plan.json")
            result = build_port(plan, load_reference(plan.reference))
            assert result.ok, result.failure
            out = tmp_path_factory.mktemp(f"port-{name}")
            write_port(out, result.files, result.package_dir, force=True)
            built[name] = out / result.package_dir
        return built[name]

    return make
