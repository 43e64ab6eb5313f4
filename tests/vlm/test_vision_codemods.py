"""The tower and M-RoPE codemods on the qwen3_vl reference's own files (the
files they are written for): each transforms its target, the output compiles
and is a fixed point, and the codemods that edit the same file commute, byte
for byte. Then the Qwen2-VL port, the composition of them (with add-qkv-bias
and remove-qk-norm on the text decoder), validated against transformers'
Qwen2VLForConditionalGeneration with and without an image (slow)."""

from __future__ import annotations

import functools
import itertools

import pytest

from autoport_cst.transform.base import PortContext, run_on_source
from autoport_cst.transform.cst.roles import file_role
from autoport_cst.transform.library import get_codemod

from .conftest import REFERENCE

PARAMS = {
    "vision-config-keys": {
        "keys": {
            "hidden_size": "embed_dim",
            "out_hidden_size": "hidden_size",
            "intermediate_size": "embed_dim * mlp_ratio",
        }
    },
    "vision-module-names": {"renames": {"mlp.linear_fc1": "mlp.fc1", "merger.norm": "merger.ln_q"}},
    "vision-mrope-sections": {},
    "vision-patch-bias": {},
    "vision-quick-gelu": {},
    "vision-rope-positions": {},
    "vision-rmsnorm": {},
    "vision-gated-mlp": {"gate_name": "mlp.gate_proj"},
    "vision-window-attention": {},
}
FILES = ("config.py", "model.py", "vision_encoder.py", "vision_preprocessing.py")


@functools.cache  # the pairs share their single applications
def _apply(codemod_id: str, rel: str, source: str) -> str:
    cls = get_codemod(codemod_id)
    codemod = cls(cls.parse_params(PARAMS[codemod_id]))
    return run_on_source(codemod, source, rel, file_role(rel), PortContext())[0]


def _targets(codemod_id: str) -> list[str]:
    return [rel for rel in FILES if get_codemod(codemod_id)().applies_to(file_role(rel))]


@pytest.mark.parametrize("codemod_id", sorted(PARAMS))
def test_transforms_the_reference_compiles_and_is_a_fixed_point(codemod_id):
    changed = []
    for rel in _targets(codemod_id):
        source = (REFERENCE / rel).read_text()
        once = _apply(codemod_id, rel, source)
        compile(once, rel, "exec")
        assert _apply(codemod_id, rel, once) == once, rel
        changed += [rel] if once != source else []
    assert changed, f"{codemod_id} changed none of {_targets(codemod_id)}"


# two ways of computing the tower MLP (plain with quick GELU, gated): a model has one, never both
EXCLUSIVE = {("vision-gated-mlp", "vision-quick-gelu")}
PAIRS = [pair for pair in itertools.combinations(sorted(PARAMS), 2) if pair not in EXCLUSIVE]
# The default suite checks the pairs with the most invasive codemod (window attention edits the
# tower's forward, its preprocessing and the model's merge); every pair runs with --run-slow.
DEFAULT_PAIRS = {pair for pair in PAIRS if "vision-window-attention" in pair}


@pytest.mark.parametrize(
    "pair",
    [pytest.param(pair, marks=() if pair in DEFAULT_PAIRS else pytest.mark.slow) for pair in PAIRS],
    ids="+".join,
)
def test_codemods_of_one_file_commute(pair):
    a, b = pair
    for rel in sorted(set(_targets(a)) & set(_targets(b))):
        source = (REFERENCE / rel).read_text()
        assert _apply(b, rel, _apply(a, rel, source)) == _apply(a, rel, _apply(b, rel, source)), rel


def test_the_tower_files_are_the_towers_own():
    """The decoder's codemods (and the census of their sites) leave the tower's
    files alone: its attention and MLP are another architecture's."""
    assert file_role("vision_encoder.py") == "tower" and file_role("model.py") == "model"
    assert not get_codemod("add-qkv-bias")().applies_to("tower")
    assert get_codemod("rename-classes")().applies_to("tower")


def test_contiguous_sections_deal_the_pairs_as_transformers():
    """The M-RoPE row of each frequency pair after vision-mrope-sections is
    transformers' Qwen2-VL layout (freq.split(mrope_section), section i -> row i % 3)."""
    import torch

    namespace: dict = {"torch": torch}
    source = _apply("vision-mrope-sections", "model.py", (REFERENCE / "model.py").read_text())
    start = source.index("    def _axis_of_pair")
    end = source.index("\n    def forward", start)
    exec("class Rotary:\n" + source[start:end], namespace)
    rotary = namespace["Rotary"]()
    rotary.mrope_section = [4, 2, 2]
    axis = rotary._axis_of_pair(torch.device("cpu")).tolist()
    pairs = torch.arange(8).split([4, 2, 2])
    expected = [i % 3 for i, chunk in enumerate(pairs) for _ in chunk]
    assert axis == expected == [0, 0, 0, 0, 1, 1, 2, 2]


# the codemods each port composes beyond rename-classes and the decoder's add-qkv-bias and remove-qk-norm
PORTS = {
    "Qwen2VLForConditionalGeneration": (
        "qwen2_vl",
        {
            "vision-config-keys",
            "vision-module-names",
            "vision-mrope-sections",
            "vision-patch-bias",
            "vision-quick-gelu",
            "vision-rope-positions",
        },
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        "qwen2_5_vl",
        {
            "vision-gated-mlp",
            "vision-module-names",
            "vision-mrope-sections",
            "vision-patch-bias",
            "vision-rmsnorm",
            "vision-rope-positions",
            "vision-window-attention",
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(PORTS))
def qwen_vl_port(request, tmp_path_factory):
    """A tiny checkpoint of a Qwen2-family VLM, its plan (research) and the applied port."""
    from click.testing import CliRunner

    from autoport_cst.cli import cli
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    architecture = request.param
    root = tmp_path_factory.mktemp(architecture)
    checkpoint = build_tiny_vlm_checkpoint(root / "ckpt", seed=0, architecture=architecture)
    planned = CliRunner().invoke(cli, ["plan", str(checkpoint), "-o", str(root / "plan.json")])
    assert planned.exit_code == 0, planned.output
    applied = CliRunner().invoke(
        cli, ["apply", "--plan", str(root / "plan.json"), "--out", str(root / "out")]
    )
    assert applied.exit_code == 0, applied.output
    name, codemods = PORTS[architecture]
    return checkpoint, applied.output, root / "out" / "vllm_neuron" / "model" / name, codemods


@pytest.mark.slow
def test_the_plan_takes_qwen3_vl_with_the_tower_codemods(qwen_vl_port):
    """apply composes the plan's steps from the diff against qwen3_vl: exactly
    the tower codemods of the architecture's features."""
    _, applied, _, codemods = qwen_vl_port
    for codemod_id in [*codemods, "add-qkv-bias", "remove-qk-norm"]:
        assert f" {codemod_id} " in applied, codemod_id
    assert not [c for c in set(PARAMS) - codemods if f" {c} " in applied]
    assert "vision.deepstack" in applied.split("read from the config at run time:")[1].splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tp", [("fp32", 1), ("bf16", 1), ("fp32", 2), ("bf16", 2)])
def test_the_port_validates(qwen_vl_port, dtype, tp):
    """Tower, M-RoPE positions (against get_rope_index), every decoder layer and
    the logits of an image prompt and a text-only prompt."""
    from autoport_cst.validate.vision_validate import validate_vlm

    checkpoint, _, port_dir, _ = qwen_vl_port
    report = validate_vlm(port_dir, checkpoint, dtype=dtype, steps=2, tp=tp)
    assert report.equivalent, report.summary()
    names = {(c["prompt"], c["name"]) for c in report.checks}
    assert {("image", "mrope_positions"), ("text", "mrope_positions"), ("image", "logits")} <= names
    assert any(prompt == "image" and name.startswith("vision.") for prompt, name in names)


@pytest.mark.slow
def test_a_wrong_output_projection_fails_against_the_rank_sums_too(qwen_vl_port, tmp_path):
    """The TP=2 bf16 baseline that sums the row-parallel projections as the
    ranks do (``partial_sums``) still sees a port whose attention output is
    1 % off: it fails against both baselines."""
    import shutil

    from autoport_cst.validate.vision_validate import validate_vlm

    checkpoint, _, port_dir, _ = qwen_vl_port
    mutant = tmp_path / port_dir.name
    shutil.copytree(port_dir, mutant)
    model = mutant / "model.py"
    text = model.read_text()
    for site in ("NF.o_proj(attn_output.unsqueeze(0), self.o_proj_weight,", "W_out=self.o_proj_weight "):
        assert site in text, site
        text = text.replace(site, site.replace("self.o_proj_weight", "(self.o_proj_weight * 1.01)"))
    model.write_text(text)
    report = validate_vlm(mutant, checkpoint, dtype="bf16", steps=2, tp=2)
    assert not report.equivalent
    assert report.first_diverging == "image:layers.0.attention"
    assert report.bf16_baseline["used"] == "eager"
    assert "image:layers.0.attention" in report.bf16_baseline["rank_partial_sums"]["failed_checks"]


@pytest.mark.slow
def test_the_windows_are_what_the_validation_sees(qwen_vl_port, tmp_path):
    """Every block given the frame spans (window attention undone) fails the
    tower's first block: the tiny images have more than one window."""
    import shutil

    from autoport_cst.validate.vision_validate import validate_vlm

    checkpoint, _, port_dir, codemods = qwen_vl_port
    if "vision-window-attention" not in codemods:
        pytest.skip("full attention in every block")
    mutant = tmp_path / port_dir.name
    shutil.copytree(port_dir, mutant)
    tower = mutant / "vision_encoder.py"
    choice = "frame_spans if window_spans is None or index in self.full_attention_blocks else window_spans"
    assert choice in tower.read_text()
    tower.write_text(tower.read_text().replace(choice, "frame_spans"))
    report = validate_vlm(mutant, checkpoint, steps=1)
    assert not report.equivalent
    assert report.first_diverging == "image:vision.blocks.0"


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(PORTS))
def test_port_of_a_tiny_qwen2_family_vlm_validates_and_its_logit_test_passes(architecture, tmp_path):
    """``port`` end to end: research, apply, every run through validate_vlm, and
    the port's generated logit test rerunning them."""
    import subprocess
    import sys

    from autoport_cst.cli.validate_vlm_cmd import tiny_vision_language
    from autoport_cst.port import port

    name = PORTS[architecture][0]
    source = tmp_path / "source"
    assert tiny_vision_language(architecture, source, 0, {})
    outcome = port(str(source), name, tmp_path / "out", steps=2)
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    assert all(r.equivalent for r in outcome.runs), [r.summary for r in outcome.runs]
    test_dir = tmp_path / "out" / "test" / "vllm_neuron" / "model" / name
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_dir)],
        capture_output=True,
        text=True,
        cwd=tmp_path / "out",
    )
    assert result.returncode == 0, result.stdout[-2000:]
