"""Ports from the real vllm_neuron llama3 and qwen3 packages (third-party:
never shipped; README, "The real vllm_neuron packages"). They run only where
a local rebuild is present: ``AUTOPORT_REAL_VLLM_NEURON`` names the directory
holding ``llama3/`` and ``qwen3/`` (each with its hand-written
``reference.json``), by default ``/work/real/vllm_neuron/model``; skipped
otherwise.

config-key-aliases reads the real ``from_configs``' ``config_dict`` (bound in
an ``if``/``elif``/``else`` on the config's type), as config-guards does; it
refused the real llama3 at ``config.py:15`` for a missing local ``values``.
learned-positions maps the position table after the real ``mappings = {}``
(the real ``load_weights`` loads the token embedding under its own name, with
no entry to follow). MPT and BLOOM (ALiBi, BLOOM's embedding norm) and GPT-2
(learned positions) from the real llama3 then validate at TP=1 fp32 and bf16
and at TP=2 (vocabulary 512); from the real qwen3, which has no tied LM head,
they are refused for ``embedding.tied``; rope-scaling's 'none' variant takes
the real qwen3's rotary class, and their untied variants port from it
(tests/port/test_real_qwen3_untied.py; README)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import libcst as cst
import pytest

from autoport_cst.transform import PortContext

REAL = Path(os.environ.get("AUTOPORT_REAL_VLLM_NEURON", "/work/real/vllm_neuron/model"))
pytestmark = pytest.mark.skipif(
    not all((REAL / name / "reference.json").is_file() for name in ("llama3", "qwen3")),
    reason=f"no local rebuild of the real vllm_neuron llama3 and qwen3 under {REAL} (AUTOPORT_REAL_VLLM_NEURON)",
)

GPT_J_KEYS = {"hidden_size": "n_embd", "intermediate_size": "n_inner or 4 * n_embd"}


def _run(codemod: str, params: dict, path: Path, role: str) -> str:
    from autoport_cst.transform.base import run_on_source
    from autoport_cst.transform.library import get_codemod

    cls = get_codemod(codemod)
    return run_on_source(cls(cls.parse_params(params)), path.read_text(), path.name, role, PortContext())[0]


def _method_body(source: str, cls_name: str, name: str) -> list[cst.BaseStatement]:
    module = cst.parse_module(source)
    cls = next(n for n in module.body if isinstance(n, cst.ClassDef) and n.name.value == cls_name)
    method = next(s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name)
    return list(method.body.body)


@pytest.mark.parametrize("package, cls_name", [("llama3", "LlamaConfig"), ("qwen3", "Qwen3Config")])
def test_config_key_aliases_read_the_real_config_dict(package, cls_name):
    out = _run("config-key-aliases", {"keys": GPT_J_KEYS}, REAL / package / "config.py", "config")
    body = _method_body(out, cls_name, "from_configs")
    code = [cst.Module([]).code_for_node(s).strip() for s in body]
    # right after the if/elif/else that binds config_dict on every path, before its first read
    at = code.index(
        "# <-- MODEL-SPECIFIC: config.json names these fields otherwise\n_read_config_keys(config_dict)"
    )
    assert isinstance(body[at - 1], cst.If) and code[at - 1].startswith(
        "if isinstance(hf_config, (str, bytes))"
    )
    assert code[at + 1].startswith("field_names = ")
    namespace: dict = {}
    functions = cst.Module([s for s in cst.parse_module(out).body if isinstance(s, cst.FunctionDef)])
    exec(functions.code, namespace)
    values = {"n_embd": 64, "n_inner": None}
    namespace["_read_config_keys"](values)
    assert values["hidden_size"] == 64 and values["intermediate_size"] == 256


def test_learned_positions_map_the_table_after_the_real_mappings():
    out = _run("learned-positions", {"size_key": "n_positions"}, REAL / "llama3" / "model.py", "model")
    body = _method_body(out, "LlamaForCausalLM", "load_weights")
    code = [cst.Module([]).code_for_node(s).strip() for s in body]
    at = next(i for i, line in enumerate(code) if line.startswith("mappings: dict"))
    assert code[at + 1].endswith('mappings["model.embed_positions.weight"] = "model.embed_positions.weight"')
    assert "self.embed_positions = nn.Embedding(" in out and "LlamaRotaryEmbedding" not in out


def test_rope_scaling_none_zeroes_the_frequencies_the_real_qwen3_returns():
    """The real qwen3's _compute_inv_freq returns its expression (no `return inv_freq`), where
    rope-scaling 'none' (MPT, BLOOM, GPT-2 plans) refused at model.py:71:5."""
    out = _run("rope-scaling", {"variant": "none"}, REAL / "qwen3" / "model.py", "model")
    body = _method_body(out, "Qwen3RotaryEmbedding", "_compute_inv_freq")
    code = [cst.Module([]).code_for_node(s).strip() for s in body]
    assert code[0].startswith("inv_freq = 1.0 / (")
    assert code[1].endswith("inv_freq = torch.zeros_like(inv_freq)") and code[2] == "return inv_freq"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("real-vllm-neuron")


def _plan(architecture: str, workdir: Path, reference: str):
    """The plan of a tiny checkpoint of ``architecture`` (vocabulary 512, which TP 2 divides: the
    real LM heads do not pad) with the real ``reference`` as --ref, and the checkpoint."""
    from autoport_cst.plan import from_research
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate import build_tiny_checkpoint

    checkpoint = workdir / architecture
    if not checkpoint.is_dir():
        build_tiny_checkpoint(architecture, checkpoint, seed=0, dimensions={"vocab_size": 512})
    found = research(str(checkpoint))
    ref = str(REAL / reference)
    choice = choose_reference(found.spec, "port", found.architecture, [ref], found)
    return found, choice, from_research(found, "port", choice.chosen, "real-code test"), checkpoint


@pytest.mark.slow
@pytest.mark.parametrize(
    "architecture, steps",
    [
        ("MptForCausalLM", {"config-key-aliases", "alibi-positions"}),
        ("BloomForCausalLM", {"config-key-aliases", "alibi-positions", "embedding-norm"}),
        ("GPT2LMHeadModel", {"config-key-aliases", "learned-positions"}),
    ],
)
def test_ports_from_the_real_llama3_validate(architecture, steps, workdir):
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.validate import validate_model

    _, choice, plan, checkpoint = _plan(architecture, workdir, "llama3")
    assert choice.realizable, choice.reason
    result = build_port(plan, load_reference(str(REAL / "llama3")))
    assert result.ok, str(result.failure)
    assert steps <= {step.codemod for step in result.steps}
    write_port(workdir / "ports" / architecture, result.files, result.package_dir, force=True)
    package = workdir / "ports" / architecture / result.package_dir
    for tp, dtype in ((1, "fp32"), (1, "bf16"), (2, "fp32")):
        report = validate_model(package, checkpoint, tp=tp, dtype=dtype, steps=8, parallel_layouts=False)
        assert report.equivalent, (tp, dtype, report.summary())


@pytest.mark.slow
def test_tied_ports_from_the_real_qwen3_take_tie_embeddings(workdir):
    """The real qwen3 has no tied LM head: a tied MPT is planned with tie-embeddings
    (ead62fa; it validates: tests/port/test_real_qwen3_tied.py)."""
    from autoport_cst.apply import build_port, load_reference

    _, choice, plan, _ = _plan("MptForCausalLM", workdir, "qwen3")
    assert choice.realizable, choice.reason
    result = build_port(plan, load_reference(str(REAL / "qwen3")))
    assert result.ok, str(result.failure)
    assert "tie-embeddings" in {step.codemod for step in result.steps}


def test_a_tp_size_the_real_vocabulary_sites_cannot_take_is_refused(workdir):
    """The real llama3 loads its embedding with no pad_shard and builds its LM head (both branches
    of tie_word_embeddings) over config.vocab_size: TP 2 over 511 ids is refused naming the three
    sites, before any rank runs; the real qwen3 (its embedding pads) names its LM head alone."""
    from autoport_cst.errors import InputError
    from autoport_cst.validate import build_tiny_checkpoint, validate_model

    checkpoint = workdir / "llama-511"
    build_tiny_checkpoint("LlamaForCausalLM", checkpoint, seed=0)
    with pytest.raises(InputError) as refused:
        validate_model(REAL / "llama3", checkpoint, tp=2)
    message = str(refused.value)
    sites = re.findall(r"its (embedding loader|LM head) \(model\.py:(\d+):\d+: ", message)
    text = (REAL / "llama3" / "model.py").read_text().splitlines()
    assert [kind for kind, _ in sites] == ["embedding loader", "LM head", "LM head"]
    assert "sharding_weight_loader(" in text[int(sites[0][1]) - 1]
    assert all("self.lm_head = neuron_nn.ColumnParallelLinear(" in text[int(n) - 1] for _, n in sites[1:])
    with pytest.raises(InputError) as refused:
        validate_model(REAL / "qwen3", checkpoint, tp=2, lint=False)
    assert re.findall(r"its (embedding loader|LM head) \(", str(refused.value)) == ["LM head"]


@pytest.mark.slow
def test_port_refuses_a_tp_the_models_own_vocabulary_does_not_take(workdir, tmp_path):
    """Persimmon (the tiny default's 511 ids as its own vocabulary) at --tp 2 from the real llama3:
    refused (exit 2), whatever the tiny checkpoint's vocabulary; nothing is kept."""
    from autoport_cst.errors import InputError
    from autoport_cst.port import port
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "persimmon"
    build_tiny_checkpoint("PersimmonForCausalLM", source, seed=0)
    with pytest.raises(
        InputError, match=r"--tp 2: the port shards the vocabulary of 511 unpadded"
    ) as refused:
        port(str(source), "persimmon", tmp_path / "out", tp=2, ref=str(REAL / "llama3"), steps=4)
    assert "port at a --tp that divides 511" in str(refused.value)
    assert not (tmp_path / "out" / "vllm_neuron" / "model" / "persimmon").exists()


@pytest.mark.slow
def test_persimmon_from_the_real_llama3_validates_at_tp2(tmp_path):
    """Its own vocabulary 512: the tiny checkpoint takes 512 ids too (the port shards the vocabulary
    unpadded), TP=2 and bf16 validate, and so does the TP=1 run with its layouts: the real llama3's
    own fault, on-device sampling of logits cut to the LM-head-DP rows (NRN010, README), failed the
    LM-head-DP sampling layout; the port now refuses that pair (the lm-head-dp-sampling-guard
    repair), and the layout is reported as refused."""
    from autoport_cst.port import port
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "persimmon"
    build_tiny_checkpoint("PersimmonForCausalLM", source, seed=0, dimensions={"vocab_size": 512})
    outcome = port(str(source), "persimmon", tmp_path / "out", tp=2, ref=str(REAL / "llama3"), steps=4)
    runs = {(r.tp, r.dtype): r for r in outcome.runs}
    assert runs[(2, "fp32")].equivalent and runs[(1, "bf16")].equivalent
    assert runs[(1, "fp32")].equivalent, runs[(1, "fp32")].summary
    model = (tmp_path / "out" / "vllm_neuron" / "model" / "persimmon" / "model.py").read_text()
    assert (
        'raise NotImplementedError(\n                "on-device sampling with LM-head data parallelism'
        in model
    )


@pytest.mark.slow
def test_plan_takes_only_a_tp_the_real_llama3_can_shard_the_vocabulary_over(workdir, tmp_path):
    """The tiny GPT-2's 511 ids with the real llama3 as --ref: no TP >= 2 divides them, and the
    plan's recommendation says so, naming the reference's sites (the plan is still written)."""
    from click.testing import CliRunner

    from autoport_cst.cli import cli
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "gpt2"
    build_tiny_checkpoint("GPT2LMHeadModel", source, seed=0)
    out = tmp_path / "gpt2.plan.json"
    result = CliRunner().invoke(cli, ["plan", str(source), "--ref", str(REAL / "llama3"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    found = re.search(
        r"recommendation: no TP >= 2 is valid: the reference llama3 \(its embedding loader \(model\.py:(\d+):22\)",
        text,
    )
    assert found is not None, text
    lines = (REAL / "llama3" / "model.py").read_text().splitlines()
    assert (
        "sharding_weight_loader(" in lines[int(found.group(1)) - 1]
    )  # the site, wherever the rebuild has it
    assert out.is_file()
