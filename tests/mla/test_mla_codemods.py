"""The codemods that port the DeepSeek family from the deepseek_v3 reference,
run on its model file: the group-limited top-k they write chooses the
experts transformers' DeepSeek-V2 router chooses (group_limited_greedy: a
group scored by its best expert; greedy: a plain top-k), the selection bias
goes from the choice, the module and the checkpoint keys, the
renormalization is fixed in the code, and the written-out router takes a
softmax."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autoport_cst.transform.base import PortContext, run_on_source  # noqa: E402
from autoport_cst.transform.library import get_codemod  # noqa: E402

MODEL = Path(__file__).resolve().parents[2] / "reference_models" / "deepseek_v3" / "model.py"


def _run(codemod_id: str, source: str, **params) -> str:
    cls = get_codemod(codemod_id)
    out = run_on_source(cls(cls.parse_params(params)), source, "model.py", "model", PortContext())[0]
    again = run_on_source(cls(cls.parse_params(params)), out, "model.py", "model", PortContext())[0]
    assert again == out, f"{codemod_id} is not idempotent"
    compile(out, "model.py", "exec")
    return out


def _function(source: str, name: str):
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "model.py", "exec"), namespace)
    return namespace[name]


def _v2_group_limited_greedy(scores, top_k, n_group, topk_group):
    """transformers' DeepseekV2TopkRouter, topk_method group_limited_greedy (its selection)."""
    experts = scores.shape[-1]
    group_scores = scores.view(-1, n_group, experts // n_group).max(dim=-1).values
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, experts // n_group).reshape(-1, experts)
    masked = scores.masked_fill(~score_mask.bool(), 0.0)
    return torch.topk(masked, k=top_k, dim=-1, sorted=False)[1]


@pytest.mark.parametrize("seed", range(5))
def test_groups_scored_by_their_best_expert_choose_as_deepseek_v2(seed):
    topk = _function(_run("group-limit", MODEL.read_text(), form="max"), "group_limited_topk")
    generator = torch.Generator().manual_seed(seed)
    scores = torch.softmax(torch.randn(16, 32, generator=generator), dim=-1)
    chosen = topk(scores, torch.zeros(32), 6, 8, 3)
    expected = _v2_group_limited_greedy(scores, 6, 8, 3)
    assert torch.equal(chosen.sort(dim=-1).values, expected.sort(dim=-1).values)


def test_the_sum_of_two_best_and_the_best_alone_differ_somewhere():
    source = MODEL.read_text()
    by_max = _function(_run("group-limit", source, form="max"), "group_limited_topk")
    by_sum = _function(source, "group_limited_topk")
    scores = torch.softmax(torch.randn(256, 32, generator=torch.Generator().manual_seed(0)), dim=-1)
    bias = torch.zeros(32)
    assert not torch.equal(
        by_max(scores, bias, 6, 8, 3).sort(dim=-1).values, by_sum(scores, bias, 6, 8, 3).sort(dim=-1).values
    )


def test_no_group_limit_is_a_plain_top_k_whatever_n_group_says():
    topk = _function(_run("group-limit", MODEL.read_text(), form="none"), "group_limited_topk")
    scores = torch.rand(8, 16, generator=torch.Generator().manual_seed(1))
    chosen = topk(scores, torch.zeros(16), 4, 4, 1)
    assert torch.equal(chosen.sort(dim=-1).values, scores.topk(4, dim=-1).indices.sort(dim=-1).values)


def test_the_selection_bias_leaves_the_choice_the_module_and_the_checkpoint_keys():
    out = _run("no-routing-bias", MODEL.read_text())
    code = [line for line in out.splitlines() if not line.lstrip().startswith("#")]
    assert not any("self.e_score_correction_bias" in line for line in code)
    assert not any('.e_score_correction_bias"' in line for line in code)
    assert "scores.new_zeros(scores.shape[-1])" in out


def test_the_renormalization_is_fixed_in_the_code():
    out = _run("norm-topk-prob", MODEL.read_text(), renormalize=False)
    assert "self.norm_topk_prob = False" in out
    assert "config.norm_topk_prob" not in out


def test_the_written_out_router_takes_a_softmax():
    out = _run("router-activation", MODEL.read_text(), activation="softmax")
    assert "scores = torch.softmax(logits, dim=-1)" in out
    assert "torch.sigmoid(logits)" not in out
