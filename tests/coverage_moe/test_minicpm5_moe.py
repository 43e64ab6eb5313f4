"""MiniCPM5-MoE (transformers 5.25), read by what its attention computes:
one ``q_gate_proj`` (hidden -> 2 x heads x head_dim) viewed per head as
``[query | gate]`` (``view(..., -1, 2 * head_dim).chunk(2, dim=-1)``), the
attention output times ``gate.sigmoid()`` before ``o_proj``. Its width once
read as twice the query heads, which refused the model as a KV-head repeat
(``kv_repeat``, ``attention.num_kv_heads``). Research runs the split on the
projection's row numbers (``analysis/query_gate``, the probe of
``analysis/qkv_rows``): spec ``attention.output_gate = "sigmoid"``, the
config's 4 heads and 2 KV heads, checkpoint ``output_gate =
"fused_query_per_head"``, and ``q_proj`` and ``gate_proj`` both named by
``q_gate_proj``. The port (qwen3_moe, ``attention-output-gate`` and
``fused-query-gate``, its MoE from the reference's codemods) validates at
TP=1 in fp32 and bf16 and at TP=2; a copy whose loader takes the rows as
[all queries | all gates] instead of per head fails validation at the
attention. Skipped where the installed transformers has no minicpm5_moe
(5.24 and earlier)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "MiniCPM5MoeForCausalLM"):
    pytest.skip(
        f"transformers {transformers.__version__} has no minicpm5_moe (added in 5.25)",
        allow_module_level=True,
    )

PER_HEAD = "rows = fused.reshape(-1, 2, head_dim, *rest)[:, part].reshape(-1, *rest)\n"
CONCATENATED = "rows = fused.reshape(2, -1, *rest)[part]\n"  # [all queries | all gates]: the wrong split


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("minicpm5_moe") / "src"
    build_tiny_checkpoint("MiniCPM5MoeForCausalLM", directory, seed=0)
    return directory


@pytest.fixture(scope="module")
def ported(source, tmp_path_factory):
    from autoport_cst.port import port

    out = tmp_path_factory.mktemp("out-minicpm5_moe")
    return port(str(source), "cov_minicpm5_moe", out, tp=1, steps=8, force=True, checkpoint="source")


def test_the_fused_query_gate_is_read_by_its_rows(source):
    from autoport_cst.research import research

    found = research(str(source))
    spec = found.spec
    assert spec.attention.output_gate == "sigmoid"
    assert (spec.attention.num_heads, spec.attention.num_kv_heads, spec.attention.head_dim) == (4, 2, 16)
    assert spec.checkpoint.output_gate == "fused_query_per_head"
    key_map = spec.checkpoint.key_map or {}
    assert key_map.get("self_attn.q_proj") == "self_attn.q_gate_proj"
    assert key_map.get("self_attn.gate_proj") == "self_attn.q_gate_proj"
    assert "self_attn.k_proj" not in key_map and "self_attn.v_proj" not in key_map
    assert not spec.unsupported
    assert not [c for c in found.conflicts if "num_kv_heads" in str(c)], found.conflicts


def test_the_port_validates_at_tp1(ported):
    assert ported.reference == "qwen3_moe"
    assert {"attention-output-gate", "fused-query-gate", "dense-layers", "shared-experts"} <= set(
        ported.steps
    )
    runs = {run.dtype: run for run in ported.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


def test_the_port_validates_at_tp2(ported):
    from autoport_cst.validate.api import validate_model

    report = validate_model(
        Path(ported.package_dir), Path(ported.checkpoint_dir), dtype="fp32", steps=4, tp=2
    )
    assert report.equivalent, report.summary()


def test_a_split_of_the_rows_not_per_head_fails_validation(ported, tmp_path):
    from autoport_cst.validate.api import validate_model

    package = tmp_path / Path(ported.package_dir).name
    shutil.copytree(ported.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(PER_HEAD) == 1
    model.write_text(text.replace(PER_HEAD, CONCATENATED), encoding="utf-8")
    report = validate_model(
        package,
        Path(ported.checkpoint_dir),
        dtype="fp32",
        steps=4,
        config_variants=False,
        parallel_layouts=False,
    )
    assert not report.equivalent
    assert report.first_diverging is not None and "attention" in report.first_diverging.component
