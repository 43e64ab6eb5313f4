"""What a codemod realizes is declared (``REALIZES``), not computed: the
composer's question "can this codemod make this change?" is answered by the
declaration, which says it in words too."""

from __future__ import annotations

import pickle

import pytest

from autoport_cst.spec import FieldDiff
from autoport_cst.transform.base import Codemod
from autoport_cst.transform.library import get_codemod, library
from autoport_cst.transform.realizes import ANY, Change, Realizes, from_to, not_to, to


def diff(path: str, reference, target) -> FieldDiff:
    return FieldDiff(path, "feature", reference, target)


def test_no_codemod_computes_what_it_realizes():
    for codemod_id, cls in library().items():
        assert cls.realizes.__func__ is Codemod.realizes.__func__, f"{codemod_id} overrides realizes()"


@pytest.mark.parametrize(
    "codemod_id, path, reference, target, realized",
    [
        ("add-qkv-bias", "attention.qkv_bias", False, True, True),
        ("add-qkv-bias", "attention.qkv_bias", True, False, False),
        ("qk-norm", "attention.qk_norm", "none", "per_head", True),
        ("qk-norm", "attention.qk_norm", "per_head", "full_width", True),
        ("qk-norm", "attention.qk_norm", "full_width", "per_head", False),
        ("remove-qk-norm", "attention.qk_norm", "per_head", "none", True),
        ("remove-qk-norm", "attention.qk_norm", "full_width", "none", False),
        ("shared-experts", "moe.shared_experts", 0, 2, True),
        ("shared-experts", "moe.shared_experts", 1, 0, False),
        ("partial-rotary", "rope.partial_rotary_factor", 0.5, 1.0, False),
        ("partial-rotary", "rope.partial_rotary_factor", 1.0, 0.5, True),
        ("checkpoint-keys", "checkpoint.key_map", None, {"model": "transformer"}, True),
        ("checkpoint-keys", "checkpoint.linear_layout", "in_out", "out_in", False),
        ("swap-norm", "norm.kind", "layernorm", "rmsnorm", True),
        ("swap-norm", "norm.unit_offset", False, True, False),
    ],
)
def test_the_declaration_answers_the_composer(codemod_id, path, reference, target, realized):
    assert get_codemod(codemod_id).realizes(diff(path, reference, target)) is realized


def test_true_is_not_one():
    assert not to(True).accepts(diff("a.b", False, 1))
    assert to(1.0).accepts(diff("a.b", 0.5, 1))
    assert not not_to(None).accepts(diff("a.b", 1, None))
    assert not Change(count=True).accepts(diff("a.b", 1, 0))


def test_declared_changes_read_as_words_and_survive_copies():
    declared = Realizes({"a.b": to(True), "a.c": (from_to("x", "y"), not_to(None)), "a.d": ANY})
    assert tuple(declared) == ("a.b", "a.c", "a.d")
    assert declared.described() == {
        "a.b": "to true",
        "a.c": "from x to y; to anything but null",
        "a.d": "any change",
    }
    copy = pickle.loads(pickle.dumps(declared))
    assert copy == declared and copy.described() == declared.described()


def test_codemods_show_says_which_changes():
    from click.testing import CliRunner

    from autoport_cst.cli import cli

    def realizes_line(codemod_id: str) -> str:
        output = CliRunner().invoke(cli, ["codemods", "show", codemod_id]).output
        return next(line for line in output.splitlines() if line.startswith("realizes:"))

    assert realizes_line("remove-qk-norm") == "realizes: attention.qk_norm (from per_head to none)"
    assert realizes_line("swap-norm") == "realizes: norm.kind, norm.bias, norm.eps_key, norm.fixed_eps"
    assert realizes_line("lazy-rope") == "realizes: (hardware rule)"
