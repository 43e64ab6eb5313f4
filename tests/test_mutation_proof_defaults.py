"""benchmarks/mutation_proof_defaults.py: a changed default proved never used,
and each near miss (a default some run can take) not proved."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutation_operators import parse_mutants  # noqa: E402
from mutation_proof_defaults import required_key, transformers_requires, unused_default  # noqa: E402

LOADERS = '''
def loader(shard, size=1, *, flag=False):
    """A loader factory."""
    return shard * size if flag else shard


def build(x):
    a = loader(x, 2, flag=True)
    b = loader(x, size=3, flag=False)
    return a + b
'''


def _mutant(code: str, text: str, operator: str = "const"):
    """The mutant of ``operator`` on the first line holding ``text``."""
    line = next(i for i, source in enumerate(code.splitlines(), 1) if text in source)
    return next(m for m in parse_mutants(code).mutants if m.line == line and m.operator == operator)


def test_a_default_every_call_passes_is_proved_unused():
    assert unused_default(LOADERS, _mutant(LOADERS, "size=1"), [])
    assert unused_default(LOADERS, _mutant(LOADERS, "flag=False):", "bool"), [])


@pytest.mark.parametrize(
    "edit",
    [
        ("loader(x, 2, flag=True)", "loader(x, flag=True)"),  # a call without it
        ("loader(x, 2, flag=True)", "loader(x, *x, flag=True)"),  # a starred argument before it
        ("loader(x, 2, flag=True)", "loader(x, 2, **x)"),  # keywords of unknown names
        ("    return a + b", "    f = functools.partial(loader, x)\n    return a + b"),  # not called
        ("    return a + b", "    print(loader.__defaults__)\n    return a + b"),  # read reflectively
        ("def build(x):", "loader = staticmethod(loader)\n\n\ndef build(x):"),  # bound again
    ],
)
def test_a_default_some_run_can_take_is_not_proved(edit):
    code = LOADERS.replace(*edit)
    mutant = _mutant(code, "size=1")
    assert not unused_default(code, mutant, []), edit


def test_a_function_another_file_names_is_not_proved():
    assert not unused_default(LOADERS, _mutant(LOADERS, "size=1"), ["from .model import loader"])
    assert unused_default(LOADERS, _mutant(LOADERS, "size=1"), ["loaders = {}"])


def test_a_change_outside_the_default_is_not_proved():
    assert not unused_default(LOADERS, _mutant(LOADERS, "loader(x, 2, flag=True)"), [])


GUARDED = """
class Rotary:
    def __init__(self, config):
        self.rope_parameters = dict(config.rope_parameters)
        rope_type = self.rope_parameters.get("rope_type")
        if rope_type == "llama3":
            self.high = float(self.rope_parameters.get("high_freq_factor", 1.0))
        elif rope_type in ("yarn", "linear"):
            self.factor = float(self.rope_parameters.get("factor", 1.0))
        else:
            self.other = float(self.rope_parameters.get("factor", 1.0))

    def forward(self, x):
        return x * self.high * self.factor
"""

STORED = """
class Rotary:
    def __init__(self, config):
        scaling = dict(config.rope_scaling or {})
        self.rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
        self.factor = float(scaling.get("factor", 1.0))
        if self.rope_type == "yarn":
            self._setup_yarn(config, scaling)

    def _setup_yarn(self, config, scaling):
        self.beta = scaling.get("beta_fast") or 32
        self.factor = scaling["factor"]

    def inv_freq(self, x):
        if self.rope_type == "llama3":
            x = self._llama3(x)
        if self.rope_type == "yarn":
            x = x / self.factor
        return x

    def _llama3(self, x):
        return x / self.factor
"""


@pytest.fixture(scope="module")
def requires():
    """What transformers' own validation requires of Qwen3's RoPE parameters."""
    from transformers import Qwen3Config

    return transformers_requires(Qwen3Config)


def test_the_required_keys_are_read_from_transformers(requires):
    assert requires("llama3", "factor") and requires("llama3", "high_freq_factor")
    assert requires("yarn", "factor") and requires("linear", "factor")
    assert not requires("default", "factor")  # only rope_type (and rope_theta) for default RoPE
    assert not requires("yarn", "beta_fast")  # optional
    assert not requires("no_such_type", "factor")


def test_a_config_class_with_its_own_rope_validation_proves_nothing():
    """Phi-3 overrides validate_rope: what it requires is not read off transformers' own."""
    from transformers import Phi3Config

    assert not transformers_requires(Phi3Config)("llama3", "factor")


def test_a_default_read_only_where_the_rope_type_requires_the_key_is_proved(requires):
    assert required_key(GUARDED, _mutant(GUARDED, '"high_freq_factor", 1.0'), requires, [])
    assert required_key(GUARDED, _mutant(GUARDED, "self.factor = float"), requires, [])
    assert required_key(STORED, _mutant(STORED, '"factor", 1.0'), requires, [])


def test_a_default_in_the_branch_of_no_required_type_is_not_proved(requires):
    """Never read, the value of the ``else`` branch changes nothing; read, it does."""
    assert required_key(GUARDED, _mutant(GUARDED, "self.other = "), requires, [])
    code = GUARDED.replace("self.high * self.factor", "self.high * self.factor * self.other")
    assert not required_key(code, _mutant(code, "self.other = "), requires, [])


@pytest.mark.parametrize(
    "edit",
    [
        ('if rope_type == "llama3"', 'if rope_type != "llama3"'),  # the other types
        ('if rope_type == "llama3"', 'if rope_type in ("llama3", "default")'),  # a type without the key
        ('.get("rope_type")', '.get("rope_type", "llama3")'),  # an empty dict taken for llama3
        ("dict(config.rope_parameters)", "dict(config.other_parameters)"),  # not the validated dict
        (
            "        rope_type = self",
            '        self.rope_parameters["x"] = 1\n        rope_type = self',
        ),  # edited
        (
            "        rope_type = self",
            "        edit(self.rope_parameters)\n        rope_type = self",
        ),  # handed on
        (
            '        if rope_type == "llama3":',
            '        rope_type = "llama3"\n        if rope_type == "llama3":',
        ),
    ],
)
def test_a_guard_that_does_not_imply_the_key_is_not_proved(requires, edit):
    code = GUARDED.replace(*edit)
    assert edit[0] in GUARDED
    assert not required_key(code, _mutant(code, '"high_freq_factor", 1.0'), requires, []), edit


@pytest.mark.parametrize(
    "edit",
    [
        ("        return x\n", "        return x * self.factor\n"),  # a read for every type
        (
            "    def _llama3(self, x):",
            "    def forward(self, x):\n        return self._llama3\n\n    def _llama3(self, x):",
        ),
        ("        return x\n", "        return x * getattr(self, name)\n"),  # a computed name
        ('self.factor = float(scaling.get("factor", 1.0))', 'self.factor = 1 / scaling.get("factor", 1.0)'),
        ('if self.rope_type == "yarn":\n            x', 'if self.rope_type == "default":\n            x'),
        ('scaling.get("beta_fast")', 'scaling.pop("beta_fast")'),  # the dict edited by a method
    ],
)
def test_a_stored_default_some_run_reads_is_not_proved(requires, edit):
    assert edit[0] in STORED
    code = STORED.replace(*edit)
    assert not required_key(code, _mutant(code, '"factor", 1.0'), requires, []), edit


def test_a_stored_attribute_another_file_names_is_not_proved(requires):
    assert not required_key(STORED, _mutant(STORED, '"factor", 1.0'), requires, ["rotary.factor"])
