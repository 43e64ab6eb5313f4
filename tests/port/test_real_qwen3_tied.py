"""Tied models (GPT-2, MPT, BLOOM: no lm_head.weight in their checkpoints) ported from the
real vllm_neuron qwen3 (third-party: never shipped; README, "The real
vllm_neuron packages"), whose LM head is untied: tie-embeddings maps the head
to the embedding's checkpoint key. Run only where a local rebuild is present
(``AUTOPORT_REAL_VLLM_NEURON``). The real qwen3 breaks NRN009 itself (README);
its ports get the guard from apply's repair step (fp8-segmented-guard) and are
validated with the lint gate, as tests/port/test_real_qwen3_untied.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REAL = Path(os.environ.get("AUTOPORT_REAL_VLLM_NEURON", "/work/real/vllm_neuron/model"))
pytestmark = pytest.mark.skipif(
    not (REAL / "qwen3" / "reference.json").is_file(),
    reason=f"no local rebuild of the real vllm_neuron qwen3 under {REAL} (AUTOPORT_REAL_VLLM_NEURON)",
)

HEAD = 'mappings["lm_head.weight"] = "transformer.wte.weight"'


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("real-qwen3-tied")


def _port(model_type: str, workdir: Path) -> tuple[Path, Path]:
    """A tiny tied checkpoint of ``model_type`` (vocabulary 512; GPT-2's
    positions are 512 too: wte and wpe have one shape) and its port from the
    real qwen3."""
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import from_research
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate import build_tiny_checkpoint

    checkpoint = workdir / model_type
    build_tiny_checkpoint(model_type, checkpoint, seed=0, dimensions={"vocab_size": 512})
    found = research(str(checkpoint))
    assert found.spec.embedding.tied is True and found.spec.checkpoint.lm_head_stored is False
    choice = choose_reference(found.spec, "port", found.architecture, [str(REAL / "qwen3")], found)
    assert choice.realizable, choice.reason
    plan = from_research(found, "port", choice.chosen, "real-code test")
    result = build_port(plan, load_reference(str(REAL / "qwen3")))
    assert result.ok, str(result.failure)
    steps = [s.codemod for s in result.steps]
    assert steps.index("tie-embeddings") < steps.index("checkpoint-keys")
    assert "fp8-segmented-guard" in steps  # the repair of the real qwen3's NRN009
    write_port(workdir / "ports" / model_type, result.files, result.package_dir, force=True)
    return workdir / "ports" / model_type / result.package_dir, checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gpt2", "mpt", "bloom"])
def test_tied_ports_from_the_real_qwen3_validate(model_type, workdir):
    from autoport_cst.validate import validate_model

    package, checkpoint = _port(model_type, workdir)
    source = (package / "model.py").read_text()
    assert 'mappings["lm_head.weight"] = "lm_head.weight"' not in source
    if model_type == "gpt2":
        assert source.count(HEAD) == 1
    for tp, dtype in ((1, "fp32"), (1, "bf16"), (2, "fp32")):
        report = validate_model(package, checkpoint, tp=tp, dtype=dtype, steps=8, parallel_layouts=False)
        assert report.equivalent, (tp, dtype, report.summary())


@pytest.mark.slow
def test_the_head_loaded_from_a_wrong_key_fails(workdir, tmp_path):
    """The position embedding has the token embedding's shape here: it loads,
    and the logits are wrong."""
    from autoport_cst.validate import validate_model

    package, checkpoint = _port("gpt2", workdir)
    mutant = tmp_path / package.name
    shutil.copytree(package, mutant)
    source = (mutant / "model.py").read_text()
    (mutant / "model.py").write_text(
        source.replace(HEAD, 'mappings["lm_head.weight"] = "transformer.wpe.weight"')
    )
    report = validate_model(
        mutant, checkpoint, tp=1, dtype="fp32", steps=8, parallel_layouts=False, lint=False
    )
    assert not report.equivalent
    assert "logits" in report.summary()
