"""checkpoint-keys on the MoE references' load-time key lookups: the port
keeps every expert layout the reference loads (fused ``experts.gate_up_proj``
and one tensor per expert), both renamed by the same rule; when the renames
name an expert tensor of one layout itself, the other layout's keys cannot be
derived, and the port loads that layout only, refuses any other at load naming
the key layout, and declares only it (``checkpoint.gate_up``)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoport_cst.transform.base import FileContext, PortContext
from codemods.checkpoint_keys import CheckpointKeys

EXPERTS = 2
LAYERS = 2

# the qwen3_moe reference's load_weights, reduced to its MoE lookups (and a
# shared expert as the shared-experts codemod adds it)
SOURCE = textwrap.dedent(
    """
    class Qwen3MoeForCausalLM(nn.Module):
        def load_weights(self, names):
            mappings = {}
            for layer_id in range(LAYERS):
                prefix = f"model.layers.{layer_id}"
                moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
                mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = moe.gate_up
                mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
                mappings[f"{prefix}.mlp.experts.shared_up_proj_weight"] = _shared_expert_key(
                    names, moe.module, "up_proj.weight"
                )
            return mappings
    """
)


def _keys(block: str, router: str, shared: str, fused: bool, roles=("gate_proj", "up_proj", "down_proj")):
    """A checkpoint's tensor names: Qwen2-MoE's own in either expert layout."""
    names = set()
    for layer in range(LAYERS):
        at = f"model.layers.{layer}.{block}"
        names |= {f"{at}.{router}.weight", f"{at}.{shared}.up_proj.weight"}
        if fused:
            names |= {f"{at}.experts.gate_up_proj", f"{at}.experts.down_proj"}
        else:
            names |= {f"{at}.experts.{j}.{role}.weight" for j in range(EXPERTS) for role in roles}
    return names


def _ported(params: dict):
    """The transformed source's ``load_weights`` (run on a config of
    ``EXPERTS`` experts) and the file context it was transformed in."""
    import libcst as cst

    codemod = CheckpointKeys(CheckpointKeys.parse_params(params))
    ctx = FileContext(path="model.py", role="model", port=PortContext(), codemod=CheckpointKeys.ID)
    code = codemod.transform_module(cst.parse_module(SOURCE), ctx).code
    scope: dict = {"nn": SimpleNamespace(Module=object), "LAYERS": LAYERS}
    exec(compile(code, "model.py", "exec"), scope)
    model = scope["Qwen3MoeForCausalLM"]()
    model.config = SimpleNamespace(num_experts=EXPERTS)
    return model.load_weights, ctx


def _loaded(mappings: dict) -> set[str]:
    return {key for value in mappings.values() for key in ([value] if isinstance(value, str) else value)}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per_expert"])
@pytest.mark.parametrize("planned", ["fused", "per_expert"])
def test_both_expert_layouts_load_with_the_renamed_keys(planned, fused):
    """Qwen2-MoE's shared expert (``shared_expert``): a port planned on either
    layout loads a checkpoint in each, every key it asks for present."""
    load, ctx = _ported({"renames": {"mlp.shared_experts": "mlp.shared_expert"}, "experts": planned})
    names = _keys("mlp", "gate", "shared_expert", fused)
    mappings = load(names)
    assert _loaded(mappings) <= names
    gate_up = mappings["model.layers.1.mlp.experts.gate_up_proj_weight"]
    if fused:
        assert gate_up == ["model.layers.1.mlp.experts.gate_up_proj"]
    else:  # gate of every expert, then up
        assert gate_up == [
            f"model.layers.1.mlp.experts.{j}.{r}.weight" for r in ("gate_proj", "up_proj") for j in (0, 1)
        ]
    assert ctx.narrowed == {}


def test_a_renamed_block_moves_both_layouts():
    """GraniteMoE's state-dict names: the block and the router renamed, the
    experts' own names kept: both layouts load under the renamed block."""
    renames = {"mlp": "block_sparse_moe", "mlp.gate": "block_sparse_moe.router"}
    load, ctx = _ported({"renames": renames, "experts": "fused"})
    for fused in (True, False):
        names = _keys("block_sparse_moe", "router", "shared_experts", fused)
        assert _loaded(load(names)) <= names
    assert ctx.narrowed == {}


def test_an_expert_tensor_renamed_keeps_its_layout_only_and_refuses_the_other():
    """GraniteMoE's hub names rename the fused tensors themselves
    (``input_linear.weight``): no per-expert keys derive from that, so the
    port loads the fused layout, refuses a per-expert checkpoint naming the
    key layout, and narrows its declared ``checkpoint.gate_up``."""
    renames = {
        "mlp": "block_sparse_moe",
        "mlp.gate": "block_sparse_moe.router.layer",
        "mlp.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
        "mlp.experts.down_proj": "block_sparse_moe.output_linear.weight",
    }
    load, ctx = _ported({"renames": renames, "experts": "fused"})
    names = set()
    for layer in range(LAYERS):
        at = f"model.layers.{layer}.block_sparse_moe"
        names |= {f"{at}.router.layer.weight", f"{at}.shared_experts.up_proj.weight"}
        names |= {f"{at}.input_linear.weight", f"{at}.output_linear.weight"}
    assert _loaded(load(names)) <= names
    per_expert = _keys("block_sparse_moe", "router.layer", "shared_experts", fused=False)
    with pytest.raises(
        KeyError, match=r"checkpoint.gate_up = 'fused' \(model.layers.0.block_sparse_moe.input"
    ):
        load(per_expert)
    assert ctx.narrowed == {"checkpoint.gate_up": ["fused"]}


def test_the_port_manifest_declares_only_the_layout_it_loads():
    """The narrowing reaches the port's reference.json, which the validator
    reads for the config variants to run."""
    from autoport_cst.apply import build_port, load_reference
    from autoport_cst.plan import parse_plan

    data = json.loads((Path(__file__).parents[2] / "examples" / "qwen2_moe.plan.json").read_text())
    data["spec"]["checkpoint"] = {
        "key_map": {
            "mlp.experts.gate_up_proj": "mlp.experts.input_linear.weight",
            "mlp.experts.down_proj": "mlp.experts.output_linear.weight",
        },
        "gate_up": "fused",
    }
    plan = parse_plan(data)
    result = build_port(plan, load_reference(plan.reference))
    assert result.ok, result.failure
    manifest = json.loads(result.files[f"{result.package_dir}/reference.json"])
    assert manifest["config_driven"]["checkpoint.gate_up"] == ["fused"]
    model = result.files[f"{result.package_dir}/model.py"]
    assert "_require_expert_layout(names, mappings, [" in model


def test_a_lookup_used_outside_the_mapping_values_is_refused_naming_the_use():
    """The lookup statement goes once its uses become static keys: a use the
    codemod does not turn into one stops it, positioned at that use."""
    import libcst as cst

    from autoport_cst.errors import PreconditionError

    lookup = "            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)\n"
    source = SOURCE.replace(lookup, lookup + "            self.blocks.append(moe.module)\n")
    codemod = CheckpointKeys(
        CheckpointKeys.parse_params({"renames": {"mlp.gate": "mlp.router"}, "experts": "fused"})
    )
    ctx = FileContext(path="model.py", role="model", port=PortContext(), codemod=CheckpointKeys.ID)
    with pytest.raises(PreconditionError, match=r"moe = moe_checkpoint_keys\(...\) is also used") as refused:
        codemod.transform_module(cst.parse_module(source), ctx)
    assert (
        refused.value.position.line
        == source.splitlines().index("            self.blocks.append(moe.module)") + 1
    )
