"""Every text reference over a vocabulary the TP size does not divide (the
tiny checkpoints' 511 ids, padded to 512 in the LM head at TP=2): the
reference validates at TP=1, TP=2 and with on-device sampling at TP=2,
LM-head DP 2 (``parallel_checks``' default layouts), and three copies of its
own LM-head code fail, each at the run that takes that code:

- ``mask dropped``: the padded columns reach the sampler unmasked, so a
  padded id could be sampled (the sampling layout names the padding's id);
- ``gathered logits uncut``: the logits returned beside the sampled tokens
  keep the padding (the sampling layout names their 512 ids);
- ``returned logits uncut``: the logits of the forward without a sampler
  keep the padding (the plain TP=2 run);
- the embedding's or the LM head's loader without ``pad_shard``: the last
  shard's checkpoint rows are not zero-padded to the shard (the plain TP=2
  run cannot load them).

tests/validate/test_on_device_sampling.py does the same, with the LM-head
rank mutants, for llama3; tests/vlm/test_vocabulary_padding_vlm.py for
qwen3_vl. qwen3, whose LM head has no LM-head DP (unlike llama3's), runs in
the default suite (4 tests, 23 s of CPU in this process, 83 s of wall at load
23), the others with ``--run-slow``: deepseek_v3 (no
LM-head DP either) and the four with llama3's LM-head code, each with its own
anchors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate.api import _validate
from autoport_cst.validate.follow_ups import FollowUps
from autoport_cst.validate.parallel_checks import LAYOUTS
from autoport_cst.validate.tiny import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = dict(LAYOUTS)["on-device sampling at TP=2, LM-head DP 2"]

# reference -> (the architecture of its tiny checkpoint, keep_layer_kinds)
REFERENCES = {
    "qwen3": ("Qwen3ForCausalLM", False),
    "deepseek_v3": ("DeepseekV3ForCausalLM", False),
    "smollm3": ("SmolLM3ForCausalLM", False),
    "starcoder2": ("Starcoder2ForCausalLM", False),
    "gpt_oss": ("GptOssForCausalLM", False),
    # every layer MoE, as the reference builds them (a dense layer is a codemod's)
    "qwen3_moe": ("Qwen3MoeForCausalLM", True),
}
FAST = ("qwen3",)

# mutant -> (the statement in the reference's model.py, its replacement), and what the failure says
MASK = re.compile(r"^( +)logits = _mask_padded_vocabulary\(.*?\)\n", re.M | re.S)
GATHERED_CUT = re.compile(r"^ +gathered_logits = .*\[:, : self\.vocab_size\]\n", re.M)
RETURNED_CUT = re.compile(
    r"^ +(return logits\[:, : self\.vocab_size\]|logits = logits\[own_rows, : self\.vocab_size\])\n", re.M
)
FAILURES = {
    "mask dropped": "handed the sampler the padded vocabulary's id(s) [511] unmasked",
    "gathered logits uncut": "returned logits of 512 ids for a vocabulary of 511",
}

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


def _marked(names):
    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in names]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    built: dict[str, Path] = {}

    def get(reference: str) -> Path:
        if reference not in built:
            architecture, keep = REFERENCES[reference]
            directory = tmp_path_factory.mktemp(f"tiny-{reference}")
            build_tiny_checkpoint(architecture, directory, seed=0, keep_layer_kinds=keep)
            built[reference] = directory
        return built[reference]

    return get


def _one(pattern: re.Pattern[str], text: str, reference: str) -> re.Match[str]:
    found = list(pattern.finditer(text))
    assert len(found) == 1, f"{reference}: {pattern.pattern!r} matched {len(found)} times"
    return found[0]


def _mutant(tmp_path: Path, reference: str, mutant: str) -> Path:
    """A copy of the reference with one piece of its LM-head code undone."""
    target = tmp_path / f"{reference}-{mutant.replace(' ', '-')}"
    shutil.copytree(
        ROOT / "reference_models" / reference, target, ignore=shutil.ignore_patterns("__pycache__")
    )
    model = target / "model.py"
    text = model.read_text(encoding="utf-8")
    if mutant == "mask dropped":
        found = _one(MASK, text, reference)
        new = f"{found.group(1)}pass\n"
    elif mutant == "gathered logits uncut":
        found = _one(GATHERED_CUT, text, reference)
        new = found.group(0).replace("[:, : self.vocab_size]", "")
    else:
        found = _one(RETURNED_CUT, text, reference)
        new = (
            found.group(0)
            .replace("[:, : self.vocab_size]", "")
            .replace("[own_rows, : self.vocab_size]", "[own_rows]")
        )
    model.write_text(text[: found.start()] + new + text[found.end() :], encoding="utf-8")
    return target


def _run(package: Path, checkpoint: Path, **layout):
    follow_ups = FollowUps(package, steps=4, prompt_lengths=None, seed=0, prefill="auto", validate=_validate)
    return follow_ups.run(checkpoint, **layout)


@pytest.mark.parametrize("reference", _marked(REFERENCES))
def test_the_reference_validates_over_an_odd_vocabulary(checkpoints, reference: str) -> None:
    checkpoint = checkpoints(reference)
    for layout in ({"tp": 1}, {"tp": 2}, SAMPLING):
        report = _run(ROOT / "reference_models" / reference, checkpoint, **layout)
        assert report.equivalent, (reference, layout, report.summary())


@pytest.mark.parametrize("mutant", sorted(FAILURES))
@pytest.mark.parametrize("reference", _marked(REFERENCES))
def test_padding_reaching_the_sampler_or_the_logits_fails(
    tmp_path: Path, checkpoints, reference: str, mutant: str
) -> None:
    checkpoint = checkpoints(reference)
    package = _mutant(tmp_path, reference, mutant)
    plain = _run(package, checkpoint, tp=2)
    assert plain.equivalent, plain.summary()  # a run without a sampler never takes that code
    report = _run(package, checkpoint, **SAMPLING)
    assert not report.equivalent and report.exit_code == 1
    assert FAILURES[mutant] in report.failure.message, report.summary()


@pytest.mark.parametrize(
    "anchor", ["self.embed_tokens.vocab_size_per_rank", "self.lm_head.out_features_per_rank"]
)
@pytest.mark.parametrize("reference", _marked(REFERENCES))
def test_a_loader_that_does_not_pad_fails_at_tp2(
    tmp_path: Path, checkpoints, reference: str, anchor: str
) -> None:
    target = tmp_path / reference
    shutil.copytree(
        ROOT / "reference_models" / reference, target, ignore=shutil.ignore_patterns("__pycache__")
    )
    model = target / "model.py"
    text = model.read_text(encoding="utf-8")
    at = text.index(anchor)
    flag = text.index("pad_shard=True", at)
    assert text.count(anchor) == 1 and flag - at < 200, "the pad_shard=True of that loader"
    model.write_text(text[:flag] + "pad_shard=False" + text[flag + len("pad_shard=True") :], encoding="utf-8")
    report = _run(target, checkpoints(reference), tp=2)
    assert not report.equivalent and report.exit_code == 1, report.summary()
    assert report.failure.stage == "load", report.summary()


@pytest.mark.parametrize("reference", _marked(REFERENCES))
def test_logits_returned_uncut_without_a_sampler_fail_at_tp2(
    tmp_path: Path, checkpoints, reference: str
) -> None:
    checkpoint = checkpoints(reference)
    package = _mutant(tmp_path, reference, "returned logits uncut")
    assert _run(package, checkpoint, tp=1).equivalent  # one shard: nothing padded
    report = _run(package, checkpoint, tp=2)
    assert not report.equivalent and report.exit_code == 1, report.summary()
    assert FAILURES["gathered logits uncut"] in report.failure.message, report.summary()
