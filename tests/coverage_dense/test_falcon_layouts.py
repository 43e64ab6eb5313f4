"""The Falcon layouts beside the default (Falcon-7B: multi-query, parallel
attention and MLP from one LayerNorm), each its own tiny checkpoint built
from a copy of the default config with the fields real checkpoints set:

- ``parallel_attn=False``: sequential pre-norm blocks whose residual adds
  are inside ``dropout_add(x, residual, ...)``, a function of the modeling
  file (research ran it to see the add; before, norm.placement and
  residual.parallel were unclassified);
- ``multi_query=False``: a KV head per query head, the fused projection
  stored head by head ([q, k, v] per head);
- ``new_decoder_architecture=True`` (Falcon-40B/180B): the fused
  projection stored as a group per KV head (its query heads, a key and a
  value head), loaded by fused-checkpoint's kv_groups loader, with two
  LayerNorms (``ln_attn``, ``ln_mlp``: num_ln_in_parallel_attn unset, as
  in Falcon-40B's config.json; the model sets it to 2 when built, and the
  tiny checkpoint's config.json holds that 2) or one (``groups_one_norm``:
  num_ln_in_parallel_attn = 1).

The port made on the default checkpoint refuses each other layout by its
config field (config-guards), naming the field and both values; so does
the two-norm port for the one-norm config and the default one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint

LAYOUTS = {
    "sequential": {"parallel_attn": False},
    "multi_head": {"multi_query": False},
    "groups": {
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
        "num_attention_heads": 128,
        "hidden_size": 8192,
    },
    "groups_one_norm": {
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
        "num_attention_heads": 128,
        "hidden_size": 8192,
        "num_ln_in_parallel_attn": 1,
    },
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("falcon_layouts")


def _checkpoint(workdir: Path, name: str) -> Path:
    """The tiny checkpoint of the default FalconConfig with ``LAYOUTS[name]``
    written into its config.json before shrinking."""
    from transformers import FalconConfig

    target = workdir / name
    if not (target / "config.json").exists():
        fields = {**FalconConfig().to_dict(), "architectures": ["FalconForCausalLM"], **LAYOUTS.get(name, {})}
        config = workdir / f"{name}.json"
        config.write_text(json.dumps(fields))
        build_tiny_checkpoint(str(config), target, seed=0)
    return target


def test_research_reads_the_sequential_blocks_through_dropout_add(workdir):
    found = research(str(_checkpoint(workdir, "sequential")))
    assert not found.spec.unsupported and not found.unknown
    assert (found.spec.residual.parallel, found.spec.norm.placement) == ("none", "pre")
    assert found.spec.attention.num_kv_heads == 1 and found.spec.checkpoint.qkv == "fused"


def test_research_reads_the_per_head_fused_projection(workdir):
    found = research(str(_checkpoint(workdir, "multi_head")))
    assert not found.spec.unsupported and not found.unknown
    assert (found.spec.attention.num_kv_heads, found.spec.checkpoint.qkv) == (4, "fused_per_head")
    assert found.spec.residual.parallel == "shared_norm"


def test_the_default_port_guards_the_layout_fields(workdir):
    """The fields that choose the layout are fixed in the default port's code."""
    from autoport_cst.plan.plan_file import assumptions_of

    guards = assumptions_of(research(str(_checkpoint(workdir, "default"))), "llama3").step()
    assumed = {entry["field"]: entry["value"] for entry in guards["params"]["assumed"]}
    assert {k: assumed.get(k) for k in ("multi_query", "parallel_attn", "new_decoder_architecture")} == {
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
    }


def test_the_kv_group_loader_gives_each_rank_its_heads_and_their_kv_head():
    """fused_qkv_split_loader with kv_groups (the code fused-checkpoint writes
    for Falcon-40B) gives each rank the rows the separate q, k, v loaders give
    it, weights and biases, KV heads sharded or replicated across ranks; the
    rows read as [q k v] per head in turn (no kv_groups) fail to load or are
    other rows, and read as [q | k | v] blocks (per_head=False) other rows."""
    import torch

    from autoport_cst.transform.edit.fused_loaders import QKV_SPLIT_CODE
    from autoport_cst.validate.standin import weight_loader as wl

    namespace = {"torch": torch, "SafetensorsWeightLoader": wl.SafetensorsWeightLoader}
    exec(QKV_SPLIT_CODE, namespace)  # noqa: S102 - the generated loader code itself is under test
    split = namespace["fused_qkv_split_loader"]
    hidden, head_dim, generator = 8, 4, torch.Generator().manual_seed(0)
    for heads, kv_heads, shards in [
        (4, 2, 1),
        (4, 2, 2),
        (4, 2, 4),
        (8, 2, 2),
        (6, 2, 2),
        (4, 1, 2),
        (4, 4, 2),
    ]:
        q, k, v = (
            torch.randn(n * head_dim, hidden, generator=generator) for n in (heads, kv_heads, kv_heads)
        )
        per_kv = heads // kv_heads
        grouped = torch.cat(
            [
                torch.cat(
                    [
                        q.view(kv_heads, per_kv * head_dim, hidden)[j],
                        k.view(kv_heads, head_dim, hidden)[j],
                        v.view(kv_heads, head_dim, hidden)[j],
                    ]
                )
                for j in range(kv_heads)
            ]
        )
        q_size = heads // shards * head_dim
        replicas = max(1, shards // kv_heads)
        kv_size = max(1, kv_heads // shards) * head_dim
        separate = wl.fused_qkv_weight_loader(q_size, kv_size, 1, shards, True, replicas)
        sizes = {"q_size": q_size, "kv_size": kv_size, "num_shards": shards, "num_kv_replicas": replicas}
        loader = split(**sizes, is_storage_transposed=True, per_head=True, head_dim=head_dim, kv_groups=True)
        bias = split(**sizes, per_head=True, head_dim=head_dim, kv_groups=True)
        blocks = split(**sizes, is_storage_transposed=True)
        for rank in range(shards):
            expected = separate.load([wl.TensorSlice(t) for t in (q, k, v)], rank)
            assert torch.equal(loader.load([wl.TensorSlice(grouped)], rank), expected)
            assert torch.equal(bias.load([wl.TensorSlice(grouped[:, 0].contiguous())], rank), expected[0])
            if per_kv > 1 and kv_heads > 1:  # one group is [q | k | v] (Falcon-7B's multi-query)
                assert not torch.equal(blocks.load([wl.TensorSlice(grouped)], rank), expected)
            if per_kv > 1:
                assert _in_turn(split, sizes, head_dim, grouped, rank) != "equal"


def _in_turn(split, sizes: dict, head_dim: int, grouped, rank: int) -> str:
    """The rows read as [q k v] per head (the loader without kv_groups):
    ``failed`` (the loader raises: the rows are no multiple of three heads,
    or it reads past them) or ``other``/``equal`` compared with the
    kv_groups loader's."""
    import torch

    from autoport_cst.validate.standin import weight_loader as wl

    in_turn = split(**sizes, is_storage_transposed=True, per_head=True, head_dim=head_dim)
    right = split(**sizes, is_storage_transposed=True, per_head=True, head_dim=head_dim, kv_groups=True)
    try:
        got = in_turn.load([wl.TensorSlice(grouped)], rank)
    except (ValueError, IndexError):  # no multiple of 3 heads; rows past the tensor
        return "failed"
    return "equal" if torch.equal(got, right.load([wl.TensorSlice(grouped)], rank)) else "other"


def _validate(package: Path, checkpoint: Path):
    from autoport_cst.validate import validate_model

    return validate_model(package, checkpoint, steps=4, config_variants=False, parallel_layouts=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "mutation", "diverging"),
    [
        ("sequential", None, None),
        ("multi_head", ("per_head=True,", "per_head=False,"), "layers.0.attention"),
        ("groups", ("per_head=True,", "per_head=False,"), "layers.0.attention"),
        ("groups_one_norm", ("per_head=True,", "per_head=False,"), "layers.0.attention"),
    ],
)
def test_the_layout_ports_and_validates_and_a_mutant_fails(workdir, layout, mutation, diverging):
    """TP=1 fp32 (with its config variants and layouts), bf16 and TP=2 on the
    checkpoint's own weights (the KV-group ports: 4 query heads, 2 KV heads,
    one per rank at TP=2); the multi-head and KV-group ports loading the
    fused rows as [q | k | v] blocks (per_head=False) fail at the attention."""
    from autoport_cst.port import port

    outcome = port(
        str(_checkpoint(workdir, layout)),
        f"falcon_{layout}",
        workdir / f"out_{layout}",
        tp=2,
        force=True,
        checkpoint="source",
        steps=8,
    )
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    if mutation is None:
        return
    package = workdir / f"out_{layout}" / "vllm_neuron" / "model" / f"falcon_{layout}"
    mutant = workdir / f"mutant_{layout}"
    shutil.copytree(package, mutant, dirs_exist_ok=True)
    code = (mutant / "model.py").read_text()
    assert mutation[0] in code
    (mutant / "model.py").write_text(code.replace(*mutation))
    report = _validate(mutant, _checkpoint(workdir, layout))
    assert not report.equivalent and report.first_diverging is not None
    assert report.first_diverging.component.startswith(diverging), report.first_diverging


def _ported(workdir: Path, layout: str) -> Path:
    """The package of ``layout``'s port (made by the port test when it ran
    first, else here, at TP=1)."""
    from autoport_cst.port import port

    package = workdir / f"out_{layout}" / "vllm_neuron" / "model" / f"falcon_{layout}"
    if not (package / "model.py").exists():
        outcome = port(
            str(_checkpoint(workdir, layout)),
            f"falcon_{layout}",
            workdir / f"out_{layout}",
            checkpoint="source",
        )
        assert outcome.validated
    return package


def _wide(workdir: Path) -> Path:
    """The tiny groups checkpoint with 8 query heads (2 KV heads) and its
    width doubled, random weights; its config.json holds the fields as given
    (num_ln_in_parallel_attn unset, as the port was planned on: the decoder
    layer sets it to 2 on the config object, which save_pretrained writes)."""
    import torch
    from transformers import FalconConfig, FalconForCausalLM

    wide = workdir / "groups_wide"
    if (wide / "config.json").exists():
        return wide
    fields = json.loads((_checkpoint(workdir, "groups") / "config.json").read_text())
    fields.pop("num_key_value_heads", None)  # derived again by 5.25's FalconConfig
    config = FalconConfig(**{**fields, "num_attention_heads": 8, "hidden_size": 2 * fields["hidden_size"]})
    torch.manual_seed(0)
    FalconForCausalLM(config).save_pretrained(wide)
    saved = json.loads((wide / "config.json").read_text())
    saved["num_ln_in_parallel_attn"] = fields.get("num_ln_in_parallel_attn")
    (wide / "config.json").write_text(json.dumps(saved, indent=2))
    return wide


@pytest.mark.slow
def test_the_kv_group_port_replicates_kv_heads_across_ranks(workdir):
    """The KV-group port on a checkpoint of 8 query heads and 2 KV heads
    (the tiny groups config with its head count and width doubled, random
    weights): at TP=4 each KV head is held by two ranks, each taking its own
    two query heads from the group; at TP=2 with attention data parallelism 2
    the query heads shard over 4 ranks."""
    from autoport_cst.validate import validate_model

    wide = _wide(workdir)
    package = _ported(workdir, "groups")
    for tp, attention_dp in ((4, 1), (2, 2)):
        report = validate_model(
            package,
            wide,
            tp=tp,
            attention_dp=attention_dp,
            steps=4,
            config_variants=False,
            parallel_layouts=False,
        )
        assert report.equivalent, (tp, attention_dp, report.failure, report.first_diverging)


@pytest.mark.slow
def test_the_default_port_refuses_the_other_layouts(workdir):
    """The port of the default checkpoint fails at build on each other layout,
    naming the field and both values, and so does the KV-group port (two
    LayerNorms) on the one-norm and the default checkpoints; without its parallel_attn guard, it
    computes the sequential checkpoint's MLP wrong (layers.0.mlp), where the
    sequential port validates."""
    from autoport_cst.port import port

    outcome = port(
        str(_checkpoint(workdir, "default")), "falcon", workdir / "out_default", checkpoint="source", steps=8
    )
    assert outcome.validated
    package = workdir / "out_default" / "vllm_neuron" / "model" / "falcon"
    refusals = {
        "sequential": "config field parallel_attn is False, but this port was made for parallel_attn = True",
        "multi_head": "config field multi_query is False, but this port was made for multi_query = True",
        "groups": "config field new_decoder_architecture is True, but this port was made for "
        "new_decoder_architecture = False",
    }
    for layout, message in refusals.items():
        report = _validate(package, _checkpoint(workdir, layout))
        assert not report.equivalent and report.failure is not None
        assert (report.failure.stage, message in report.failure.message) == ("build", True), report.failure
    groups = _ported(workdir, "groups")
    refusals = {
        # planned on the field None, which the layers set to 2 (accepted too): 1 is another model
        "groups_one_norm": "config field num_ln_in_parallel_attn is 1, but this port was made for "
        "num_ln_in_parallel_attn = None",
        "default": "config field new_decoder_architecture is False, but this port was made for "
        "new_decoder_architecture = True",
    }
    for layout, message in refusals.items():
        report = _validate(groups, _checkpoint(workdir, layout))
        assert not report.equivalent and report.failure is not None
        assert (report.failure.stage, message in report.failure.message) == ("build", True), report.failure
    unguarded = workdir / "unguarded"
    shutil.copytree(package, unguarded, dirs_exist_ok=True)
    config = (unguarded / "config.py").read_text()
    guard = '("parallel_attn", True, True, None,'
    assert guard in config
    (unguarded / "config.py").write_text("\n".join(l for l in config.splitlines() if guard not in l) + "\n")
    report = _validate(unguarded, _checkpoint(workdir, "sequential"))
    assert not report.equivalent and report.first_diverging is not None
    assert report.first_diverging.component == "layers.0.mlp", report.first_diverging


_SWAPPED_SCALES = (
    ("k_scale=self.k_scale if cache_is_fp8 else None,", "k_scale=self.v_scale if cache_is_fp8 else None,"),
    ("v_scale=self.v_scale if cache_is_fp8 else None,", "v_scale=self.k_scale if cache_is_fp8 else None,"),
)


@pytest.mark.slow
def test_the_kv_group_port_validates_with_an_fp8_kv_cache_and_swapped_scales_fail(workdir):
    """The KV-group port on the 8-query-head, 2-KV-head checkpoint with an FP8
    KV cache at TP=1, seed 0: transformers 5.24's Falcon hands its cache every
    query head's copy of its group's K/V, which did not map onto the port's KV
    heads, so the cache was not teacher-forced and one value at an FP8 rounding
    boundary failed the correct port at layers.1.attention (decode, 9.0e-04;
    the scaled-cache variant 7.8e-05). Forced through the groups, every value
    the port stored is transformers' rounding but that one; the port with its
    K and V scales swapped still fails at layers.0.attention (decode, 0.54)."""
    from autoport_cst.validate import kv_scale_variant, validate_model

    package = _ported(workdir, "groups")
    report = validate_model(
        package, _wide(workdir), kv_cache_dtype="fp8", config_variants=False, parallel_layouts=False
    )
    assert report.equivalent, (report.failure, report.first_diverging)
    assert report.kv_cache["teacher_forced"] and report.kv_cache["differing"] == 0, report.kv_cache
    mutant = workdir / "mutant_groups_scales"
    shutil.copytree(package, mutant, dirs_exist_ok=True)
    code = (mutant / "model.py").read_text()
    for old, new in _SWAPPED_SCALES:
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    (mutant / "model.py").write_text(code)
    runs = []

    def validate(scaled: Path, seed: int):
        runs.append(validate_model(mutant, scaled, kv_cache_dtype="fp8", seed=seed))
        return runs[-1]

    class Report:
        def __init__(self) -> None:
            self.equivalent, self.config_variants = True, []

        def fail_as(self, named, found):
            self.equivalent = False

    verdict = Report()
    kv_scale_variant.check_kv_scale_variant(verdict, mutant, _wide(workdir), validate, 0)
    assert not verdict.equivalent and len(runs) == 1
    first = runs[0].first_diverging
    assert first is not None and (first.component, first.phase) == ("layers.0.attention", "decode"), first
