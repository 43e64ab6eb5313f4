"""benchmarks/mutation_proof_alternatives.py: the ``else`` constant of an
``__init__``'s ``self.A = X if C else K`` that every read of ``A`` guards with
``C`` is proved equivalent, and each near miss (a read outside the guard or in
its ``else``, in a lambda, by another class or object, by name, by another
file, by a computed name; ``C`` of an attribute stored again or after; another change
beside it)
is not."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutation_proof_alternatives import unread_alternative  # noqa: E402

PORT = """
from torch import nn


class Attention(nn.Module):
    def __init__(self, group, parallel):
        super().__init__()
        self.dcp_size = group.world_size
        self.parallel = parallel
        self.chunk = group.rank // 2 if self.dcp_size > 1 else 0

    def forward(self, x):
        if self.parallel and self.dcp_size > 1:
            x = x * self.chunk
        return x

    def prefill(self, x):
        if self.dcp_size > 1:
            return x + self.chunk
        return x
"""
STORE = "self.chunk = group.rank // 2 if self.dcp_size > 1 else 0"


def _proof(code: str, elsewhere: list[str] | None = None, new: str = "else 1") -> str | None:
    line = next(i for i, text in enumerate(code.splitlines(), 1) if "self.chunk = group.rank" in text)
    mutated = code.replace("if self.dcp_size > 1 else 0", f"if self.dcp_size > 1 {new}")
    return unread_alternative(code, mutated, line, elsewhere or [])


def test_an_alternative_every_read_guards_against_is_proved():
    assert "every read of it runs under `if self.dcp_size > 1`" in _proof(PORT)


def test_a_read_outside_the_guard_or_in_its_else_is_not_proved():
    assert (
        _proof(
            PORT.replace(
                "        return x\n\n    def prefill", "        return x + self.chunk\n\n    def prefill"
            )
        )
        is None
    )
    in_else = PORT.replace(
        "            return x + self.chunk\n        return x",
        "            return x\n        else:\n            return x + self.chunk",
    )
    assert _proof(in_else) is None
    other_test = PORT.replace(
        "if self.dcp_size > 1:\n            return x + self.chunk",
        "if self.parallel:\n            return x + self.chunk",
    )
    assert _proof(other_test) is None


def test_a_read_in_a_lambda_by_another_class_or_object_or_by_name_is_not_proved():
    assert _proof(PORT.replace("return x + self.chunk", "return (lambda: x + self.chunk)()")) is None
    other = PORT + "\n\nclass Layer(nn.Module):\n    def forward(self, x):\n        return self.attn.chunk\n"
    assert _proof(other) is None
    derived = PORT + "\n\nclass Sliding(Attention):\n    def forward(self, x):\n        return x\n"
    assert _proof(derived) is None
    assert _proof(PORT.replace("return x + self.chunk", 'return x + getattr(self, "chunk")')) is None
    assert _proof(PORT, elsewhere=["def rank_of(attn):\n    return attn.chunk\n"]) is None


def test_a_condition_that_can_change_is_not_proved():
    again = PORT.replace(
        "    def prefill(self, x):\n", "    def prefill(self, x):\n        self.dcp_size = 1\n"
    )
    assert _proof(again) is None
    after = PORT.replace("        self.dcp_size = group.world_size\n", "").replace(
        STORE, STORE + "\n        self.dcp_size = group.world_size"
    )
    assert _proof(after) is None
    called = PORT.replace("if self.dcp_size > 1 else 0", "if self.size() > 1 else 0").replace(
        "if self.dcp_size > 1:", "if self.size() > 1:"
    )
    line = next(i for i, text in enumerate(called.splitlines(), 1) if "self.chunk = group.rank" in text)
    assert unread_alternative(called, called.replace("else 0", "else 1"), line, []) is None


def test_another_change_or_a_non_constant_is_not_proved():
    assert _proof(PORT, new="else x") is None
    line = next(i for i, text in enumerate(PORT.splitlines(), 1) if "self.chunk = group.rank" in text)
    both = PORT.replace("else 0", "else 1").replace("return x + self.chunk", "return x - self.chunk")
    assert unread_alternative(PORT, both, line, []) is None
    then_changed = PORT.replace("group.rank // 2 if", "group.rank // 3 if")
    assert unread_alternative(PORT, then_changed, line, []) is None


def test_attributes_named_by_literals_only_are_proved_and_computed_names_are_not():
    loader = (
        '\n\ndef load(model, value):\n    for name in ("k_scale", "v_scale"):\n'
        "        setattr(model.attn, name, value)\n"
    )
    assert _proof(PORT + loader) is not None
    computed = '\n\ndef read(model, prefix):\n    return getattr(model.attn, prefix + "_idx")\n'
    assert _proof(PORT + computed) is None
    rebound = loader.replace("        setattr", "        name = name.upper()\n        setattr")
    assert _proof(PORT + rebound) is None
    assert _proof(PORT + "\n\ndef state(model):\n    return vars(model.attn)\n") is None
