"""benchmarks/mutation_proof_guards.py: a refusal whose last conjunct's ``or``
becomes ``and`` is proved equivalent on the inputs the port accepts, and each
near miss (a refusal widened or changed otherwise, a body that does more than
raise, an operand with an effect, another change beside it) is not."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutation_proof_guards import narrowed_refusal  # noqa: E402

PORT = """
class Model:
    def forward(self, input_ids, is_prefill):
        tokens = input_ids.shape[0]
        if is_prefill and (tokens <= self.world_size or tokens % self.world_size != 0):
            raise ValueError(f"prefill length {tokens}")
        return self.model(input_ids)
"""
GUARD = "if is_prefill and (tokens <= self.world_size or tokens % self.world_size != 0):"


def _mutant(test: str, code: str = PORT) -> str:
    assert GUARD in code
    return code.replace(GUARD, f"if {test}:")


def test_the_last_conjunct_narrowed_from_or_to_and_is_proved():
    mutant = _mutant("is_prefill and (tokens <= self.world_size and tokens % self.world_size != 0)")
    assert "narrows the refusal" in narrowed_refusal(PORT, mutant)
    # a whole test that is one disjunction, three operands
    port = PORT.replace(GUARD, "if tokens <= 0 or tokens > 9 or tokens % 2:")
    narrowed = port.replace(
        "if tokens <= 0 or tokens > 9 or tokens % 2:", "if tokens <= 0 and tokens > 9 and tokens % 2:"
    )
    assert narrowed_refusal(port, narrowed)


def test_the_inputs_where_the_mutant_differs_are_refused_by_the_port():
    """The premise, exhaustively on small values: where the port does not
    refuse, the mutant does not either."""
    port = lambda p, t, w: p and (t <= w or t % w != 0)  # noqa: E731
    mutant = lambda p, t, w: p and (t <= w and t % w != 0)  # noqa: E731
    for p in (False, True):
        for t in range(0, 40):
            for w in range(1, 9):
                if not port(p, t, w):
                    assert not mutant(p, t, w)


def test_a_refusal_widened_or_changed_otherwise_is_not_proved():
    for test in (
        "is_prefill or (tokens <= self.world_size or tokens % self.world_size != 0)",  # widened
        "is_prefill and (tokens > self.world_size or tokens % self.world_size != 0)",  # order reversed
        "is_prefill and (tokens <= self.world_size or tokens % self.world_size == 0)",
        "is_prefill and (tokens <= self.world_size or tokens // self.world_size != 0)",
    ):
        assert narrowed_refusal(PORT, _mutant(test)) is None, test


def test_a_disjunction_that_is_not_the_last_conjunct_is_not_proved():
    """With a conjunct after it, the mutant evaluates the disjunction's later
    operands where the port stopped at a true first one."""
    port = PORT.replace(
        GUARD, "if (tokens <= self.world_size or tokens % self.world_size != 0) and is_prefill:"
    )
    mutant = port.replace(" or tokens % ", " and tokens % ")
    assert narrowed_refusal(port, mutant) is None


def test_a_body_that_does_more_than_raise_is_not_proved():
    port = PORT.replace('            raise ValueError(f"prefill length {tokens}")', "            tokens = 0")
    mutant = port.replace(" or tokens % ", " and tokens % ")
    assert narrowed_refusal(port, mutant) is None
    port = PORT.replace(
        "        return self.model", "        else:\n            tokens = 1\n        return self.model"
    )
    mutant = port.replace(" or tokens % ", " and tokens % ")
    assert narrowed_refusal(port, mutant) is None


def test_an_operand_with_an_effect_is_not_proved():
    port = PORT.replace("tokens % self.world_size != 0", "self.count(tokens) != 0")
    mutant = port.replace(" or self.count", " and self.count")
    assert narrowed_refusal(port, mutant) is None


def test_another_change_beside_the_narrowed_test_is_not_proved():
    mutant = _mutant("is_prefill and (tokens <= self.world_size and tokens % self.world_size != 0)")
    assert (
        narrowed_refusal(PORT, mutant.replace("self.model(input_ids)", "self.model(input_ids + 1)")) is None
    )
    assert narrowed_refusal(PORT, PORT) is None
