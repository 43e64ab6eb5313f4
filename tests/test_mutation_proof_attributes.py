"""benchmarks/mutation_proof_attributes.py: a removed group attribute that no
instance of its class reads is proved equivalent, and each near miss (a read
by the class, a base or a derived class, through another object, by name, by
another file; a value that is no parallel-state getter's) is not."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutation_proof_attributes import unread_group  # noqa: E402

GETTERS = {"get_neuron_mlp_dp_group", "get_tp_group"}
PORT = """
from torch import nn
from vllm_neuron.distributed import get_neuron_mlp_dp_group, get_tp_group


class MLP(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.tp_group = get_tp_group()
        self.mlp_dp_group = get_neuron_mlp_dp_group()
        self.size = size

    def forward(self, x):
        return x * self.size


class Layer(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.mlp = MLP(size)
        self.mlp_dp_group = get_neuron_mlp_dp_group()

    def forward(self, x):
        return self.mlp(x) + self.mlp_dp_group.world_size
"""
STORE = "        self.mlp_dp_group = get_neuron_mlp_dp_group()\n        self.size = size"


def _line(code: str, text: str) -> int:
    return next(i for i, source in enumerate(code.splitlines(), 1) if text in source)


def _proof(code: str, elsewhere: list[str] | None = None, getters=GETTERS) -> str | None:
    return unread_group(
        code, _line(code, "self.mlp_dp_group = get_neuron_mlp_dp_group()"), elsewhere or [], getters
    )


def test_a_group_no_instance_of_the_class_reads_is_proved():
    assert "no instance of MLP reads mlp_dp_group" in _proof(PORT)


def test_the_class_reading_it_is_not_proved():
    code = PORT.replace("return x * self.size", "return x * self.size * self.mlp_dp_group.world_size")
    assert _proof(code) is None


def test_a_read_by_a_base_or_a_derived_class_is_not_proved():
    derived = PORT + "\n\nclass GatedMLP(MLP):\n    def forward(self, x):\n        return self.mlp_dp_group\n"
    assert _proof(derived) is None
    base = PORT.replace("class MLP(nn.Module):", "class MLP(Base):")
    base = base.replace(
        "\n\nclass MLP(",
        "\n\nclass Base(nn.Module):\n    def size_of(self):\n        return self.mlp_dp_group\n\n\nclass MLP(",
    )
    assert _proof(base) is None


def test_a_read_through_another_object_or_by_name_is_not_proved():
    assert _proof(PORT.replace("self.mlp_dp_group.world_size", "self.mlp.mlp_dp_group.world_size")) is None
    assert (
        _proof(PORT.replace("self.mlp_dp_group.world_size", 'getattr(self.mlp, "mlp_dp_group").world_size'))
        is None
    )
    assert _proof(PORT.replace("return self.mlp(x)", "return vars(self.mlp) and self.mlp(x)")) is None
    nested = PORT.replace("return x * self.size", "return (lambda: self.mlp_dp_group)() and x")
    assert _proof(nested) is None


def test_a_read_by_another_file_is_not_proved():
    assert (
        _proof(PORT, elsewhere=["def size(model):\n    return model.mlp.mlp_dp_group.world_size\n"]) is None
    )
    # a name that merely contains it is not a read
    assert _proof(PORT, elsewhere=["from x import get_neuron_mlp_dp_group\n"])


def test_a_value_other_than_a_getter_is_not_proved():
    assert _proof(PORT, getters={"get_tp_group"}) is None
    rebound = PORT + "\n\ndef get_neuron_mlp_dp_group():\n    return None\n"
    assert _proof(rebound) is None
    with_argument = PORT.replace(
        STORE, "        self.mlp_dp_group = get_neuron_mlp_dp_group(1)\n        self.size = size"
    )
    assert (
        unread_group(with_argument, _line(with_argument, "get_neuron_mlp_dp_group(1)"), [], GETTERS) is None
    )


def test_a_store_outside_init_or_of_another_target_is_not_proved():
    moved = PORT.replace(
        "    def forward(self, x):\n        return x * self.size",
        "    def forward(self, x):\n        self.mlp_dp_group = get_neuron_mlp_dp_group()\n        return x * self.size",
    )
    line = [i for i, s in enumerate(moved.splitlines(), 1) if "self.mlp_dp_group = get_neuron" in s][1]
    assert unread_group(moved, line, [], GETTERS) is None
    other = PORT.replace(STORE, "        group = get_neuron_mlp_dp_group()\n        self.size = size")
    assert unread_group(other, _line(other, "group = get_neuron_mlp_dp_group()"), [], GETTERS) is None
