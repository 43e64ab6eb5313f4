"""benchmarks/mutation_proof_paths.py: a removed store no path reads is proved
equivalent, and each near miss (a path that can read it) is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutation_proof_paths import dead_store  # noqa: E402

ATTENTION = """
class Attention:
    def __init__(self, size):
        self.size = size

    def forward(self, x, segment):
        chunk = segment.get("chunk")
        if chunk and self.size <= 1:
            q = x + 1
            k = v = None
        else:
            q, k, v = x, x + 2, x + 3
        if self.size > 1:
            out = q + k + v
        elif chunk:
            out = q * 2
        else:
            out = q + k * v
        return out
"""


def _line(code: str, text: str) -> int:
    return next(i for i, source in enumerate(code.splitlines(), 1) if text in source)


def _proof(code: str, elsewhere: list[str] | None = None) -> str | None:
    return dead_store(code, _line(code, "k = v = None"), elsewhere or [])


def test_a_store_every_later_read_is_ruled_out_for_is_proved():
    assert _proof(ATTENTION)
    # the same, with the later tests as `not` and `is` forms of the conjuncts
    code = ATTENTION.replace("if chunk and self.size <= 1:", "if chunk is not None and not self.size:")
    code = code.replace("if self.size > 1:", "if self.size:").replace("elif chunk:", "elif chunk is None:")
    code = code.replace(
        "        elif chunk is None:\n            out = q * 2\n        else:\n", "        else:\n"
    )
    code = code.replace(
        "        else:\n            out = q + k * v",
        "        elif chunk is None:\n            out = q + k * v",
    )
    assert _proof(code), code


@pytest.mark.parametrize(
    "edit",
    [
        ("            out = q * 2", "            out = q * k"),  # a read on the path
        ("        return out", "        return out + k"),  # a read after every branch
        ("if self.size > 1:", "if self.size > 2:"),  # a test the facts do not rule out
        ("if self.size > 1:", "if x > 1:"),  # a test of something else
        ("        elif chunk:", "        elif self.size:"),  # an else the facts do not rule out
        ("            k = v = None", "            k = v = None\n            out = k"),  # read in its branch
        ("        if self.size > 1:", "        self.size = 2\n        if self.size > 1:"),  # stored again
        ("        if self.size > 1:", "        chunk = None\n        if self.size > 1:"),  # rebound
        ("        return out", "        return locals()"),  # read reflectively
        ("        return out", "        return (lambda: k)()"),  # read by a nested function
        ("        return out", "        k += 1\n        return out"),  # read by an augmented store
        ("if chunk and self.size <= 1:", "if chunk or self.size <= 1:"),  # not a conjunct
        ('        chunk = segment.get("chunk")\n', ""),  # a global: any call could store it
        ("        if self.size > 1:", "        self = segment\n        if self.size > 1:"),  # self rebound
        (  # a nested function that rebinds a conjunct's local when called later
            "        if self.size > 1:",
            "        def reset():\n            nonlocal chunk\n            chunk = None\n\n"
            "        reset()\n        if self.size > 1:",
        ),
    ],
)
def test_a_store_some_path_reads_is_not_proved(edit):
    code = ATTENTION.replace(*edit)
    assert code != ATTENTION
    assert not _proof(code), edit


def test_a_store_in_a_loop_or_with_effects_is_not_proved():
    looped = ATTENTION.replace(
        "        chunk = segment.get",
        "        for _ in range(2):\n            pass\n        chunk = segment.get",
    )
    assert _proof(looped)  # a loop elsewhere is no barrier
    wrapped = "\n".join(
        ("    " + line if line.startswith("        ") and i > 6 else line)
        for i, line in enumerate(ATTENTION.splitlines())
    ).replace("        chunk = segment.get", "        for _ in range(2):\n            chunk = segment.get")
    assert not _proof(wrapped), wrapped  # the store repeats with the loop
    called = ATTENTION.replace("k = v = None", "k = v = x.pop()")
    assert dead_store(called, _line(called, "k = v = x.pop()"), []) is None


def test_an_attribute_stored_elsewhere_is_no_fact():
    assert not _proof(ATTENTION, ["layer.size = 3"])
    assert not _proof(ATTENTION, ["setattr(layer, 'size', 3)"])
    assert _proof(ATTENTION, ["layer.size == 3", "resize(layer)"])
    outside_init = ATTENTION.replace(
        "    def forward", "    def grow(self):\n        self.size += 1\n\n    def forward"
    )
    assert not _proof(outside_init)


def test_the_benchmark_counts_a_dead_store_as_equivalent(tmp_path):
    """PortRun.proof calls dead_store for a removed statement, on the port's
    package and the stand-in as the other texts that could store an attribute."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mutation_benchmark_paths", ROOT / "benchmarks" / "mutation.py"
    )
    mutation = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutation
    try:
        spec.loader.exec_module(mutation)
        from mutation_setup import Port

        (tmp_path / "model.py").write_text(ATTENTION, encoding="utf-8")
        (tmp_path / "config.json").write_text('{"model_type": "qwen3"}', encoding="utf-8")
        run = mutation.PortRun.of(Port("p", tmp_path, "A", tmp_path), {})
        line = _line(ATTENTION, "k = v = None")
        removed = next(m for m in run.parsed.mutants if m.line == line and m.operator == "stmt")
        assert "no read of it can run" in run.proof(removed, run.parsed.mutated(removed))
        (tmp_path / "other.py").write_text("def grow(layer):\n    layer.size = 2\n", encoding="utf-8")
        run = mutation.PortRun.of(Port("p", tmp_path, "A", tmp_path), {})
        assert run.proof(removed, run.parsed.mutated(removed)) is None
    finally:
        del sys.modules[spec.name]
