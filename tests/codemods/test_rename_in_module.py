"""rename_in_module renames what a transformer over the whole module would,
and reports the renamed strings and comments in the order it meets them (the
order the rename's notes are positioned in), rebuilding only what it edits;
the renamed statements' code is spliced from the old code, not printed."""

from __future__ import annotations

import sys

import libcst as cst
import pytest

from autoport_cst.transform.base import defined_classes
from autoport_cst.transform.cst import printed
from autoport_cst.transform.cst.printed import module_code
from autoport_cst.transform.cst.vocabulary import walk
from autoport_cst.transform.edit.scope_rename import (
    _BindingSurvey,
    attribute_references,
    rename_in_module,
    rename_targets,
    string_references,
)
from autoport_cst.transform.edit.words import prose_token_positions, rename_words


class _Transformer(cst.CSTTransformer):
    """What rename-classes did with a pass over the whole module: the oracle."""

    def __init__(self, targets, table, words, names_in_strings) -> None:
        self.targets, self.table, self.words, self.names_in_strings = targets, table, words, names_in_strings
        self.text_edits: list = []

    def _text(self, raw: str) -> str:
        new, edits = rename_words(raw, self.words)
        if edits:
            self.text_edits.append((raw, edits))
        return new

    def leave_Name(self, original, updated):
        if id(original) in self.targets:
            return updated.with_changes(value=self.table[original.value])
        return updated

    def leave_SimpleString(self, original, updated):
        if id(original) in self.names_in_strings:
            return updated.with_changes(value=self.names_in_strings[id(original)])
        if not self.words or "b" in updated.prefix.lower():
            return updated
        new = self._text(updated.value)
        return updated if new == updated.value else updated.with_changes(value=new)

    def leave_FormattedStringText(self, original, updated):
        if not self.words:
            return updated
        new = self._text(updated.value)
        return updated if new == updated.value else updated.with_changes(value=new)

    def leave_Comment(self, original, updated):
        if not self.words:
            return updated
        new = self._text(updated.value)
        return updated if new == updated.value else updated.with_changes(value=new)


REFERENCES = ("gpt_oss", "llama3", "qwen3", "qwen3_moe", "smollm3", "starcoder2")


@pytest.mark.parametrize("rename_text", [True, False])
@pytest.mark.parametrize("reference", REFERENCES)
def test_the_rename_of_every_reference_file_is_the_transformers(repo_root, reference, rename_text):
    files = sorted((repo_root / "reference_models" / reference).rglob("*.py"))
    modules = {path: cst.parse_module(path.read_text()) for path in files}
    classes = {name for module in modules.values() for name in defined_classes(module)}
    prefix = next(name[: -len("ForCausalLM")] for name in classes if name.endswith("ForCausalLM"))
    table = {name: "Renamed" + name[len(prefix) :] for name in classes if name.startswith(prefix)}
    words = {**table, prefix: "Renamed"} if rename_text else {}
    for path, module in modules.items():
        targets = rename_targets(module, table, reference) | attribute_references(module, table, reference)[0]
        strings = string_references(module, table, reference)
        oracle = _Transformer(targets, table, words, strings)
        expected = module.visit(oracle)
        renamed = rename_in_module(module, targets, table, words, strings)
        assert renamed.module.code == expected.code, path
        assert renamed.text_edits == oracle.text_edits, path
        if renamed.text_edits:
            assert renamed.code == module.code, path
            # the renamed statements' code, spliced from the old code's tokens, is kept as printed
            for statement in renamed.module.body:
                kept = printed._CODES[(id(statement), module.default_indent, module.default_newline)]
                assert kept[1] == renamed.module.code_for_node(statement), path
        assert module_code(renamed.module) == expected.code, path
        for old, new, done in zip(module.body, renamed.module.body, expected.body, strict=True):
            if module.code_for_node(old) == expected.code_for_node(done):
                assert new is old, path  # a statement with nothing to rename is not rebuilt


def _survey(module, names, by_visits):
    survey = _BindingSurvey(set(names), "llama3")
    if by_visits:
        survey.survey_by_visits(module)
    else:
        survey.survey(module)
    return (
        {id(n) for n in survey.definitions},
        {name: {id(n) for n in nodes} for name, nodes in survey.own_bindings.items()},
        survey.counts,
        {name: [id(n) for n in nodes] for name, nodes in survey.references.items()},
    )


TRICKY = """
from . import model as m
from .model import LlamaMLP, LlamaNorm as Norm
import vllm_neuron.model.llama3.model as own, LlamaMLP as other


class LlamaMLP:
    LlamaNorm = 1

    def forward(self, LlamaNorm, *LlamaMLP, LlamaAttention=LlamaMLP, **kw):
        global LlamaAttention
        for LlamaMLP, (a, *LlamaNorm) in kw:
            with open(x) as LlamaMLP:
                pass
        [LlamaMLP for LlamaMLP in range(3)]
        (LlamaNorm := 2)
        LlamaMLP += 1
        x: LlamaMLP = m.LlamaMLP(LlamaNorm=LlamaNorm)
        try:
            pass
        except LlamaMLP as LlamaNorm:
            pass
        match x:
            case {"a": 1, **LlamaMLP}:
                pass
            case [LlamaNorm, *LlamaMLP] if LlamaMLP:
                pass
        return LlamaAttention, self.LlamaMLP, f"{LlamaMLP!r}"
"""


@pytest.mark.parametrize("reference", [*REFERENCES, "tricky"])
def test_the_survey_read_by_kind_records_what_visiting_every_node_does(repo_root, reference):
    """Bindings, definitions, counts and references (in walk order), as the
    visit of every node in walk order that the survey was."""
    names = ["LlamaMLP", "LlamaNorm", "LlamaAttention"]
    if reference == "tricky":
        modules = [cst.parse_module(TRICKY)]
    else:
        files = sorted((repo_root / "reference_models" / reference).rglob("*.py"))
        modules = [cst.parse_module(path.read_text()) for path in files]
        names += sorted({name for module in modules for name in defined_classes(module)})
    for module in modules:
        assert _survey(module, names, by_visits=False) == _survey(module, names, by_visits=True)


PROSE = '''# Llama header: "Llama" in a comment
import os

NAMES = ["LlamaMLP", b"Llama bytes", rb"Llama", u"Llama", "Llama" "Llama", ("Llama")]


def build(x):
    """Build a Llama.

    Llama again."""
    message = f"Llama {x!r:>{10}} and {'Llama'} and {f'Llama {x}'} Llama"  # a Llama comment
    other = F"""Llama
    {x}Llama""" + f"{x}" + f"{{Llama}}"
    return LlamaMLP(message, other)  # Llama


class LlamaMLP:
    pass
# Llama footer
'''


@pytest.mark.parametrize("reference", [*REFERENCES, "prose"])
def test_the_prose_tokens_read_off_the_printing_are_those_of_pythons_tokenizer(repo_root, reference):
    """The string and comment tokens (f-strings as Python's tokenizer splits
    them) and their positions, as ``prose_token_positions`` finds them in the
    old code: the rename's notes are placed by them."""
    if reference == "prose":
        modules = [cst.parse_module(PROSE)]
        prefix = "Llama"
    else:
        files = sorted((repo_root / "reference_models" / reference).rglob("*.py"))
        modules = [cst.parse_module(path.read_text()) for path in files]
    classes = {name for module in modules for name in defined_classes(module)}
    if reference != "prose":
        prefix = next(name[: -len("ForCausalLM")] for name in classes if name.endswith("ForCausalLM"))
    table = {name: "Renamed" + name[len(prefix) :] for name in classes if name.startswith(prefix)}
    words = {**table, prefix: "Renamed"}
    read_off = 0
    for module in modules:
        targets = rename_targets(module, table, reference)
        renamed = rename_in_module(module, targets, table, words, string_references(module, table, reference))
        if renamed.prose_tokens is not None:
            read_off += 1
            assert renamed.prose_tokens == prose_token_positions(module.code)
    if sys.version_info < (3, 12):  # later, the tokens of an f-string are the tokenizer's to read
        assert read_off == sum(1 for module in modules if _has_prose(module, words))


def _has_prose(module, words) -> bool:
    kinds = (cst.SimpleString, cst.FormattedStringText, cst.Comment)
    return any(rename_words(n.value, words)[1] for n in walk(module) if isinstance(n, kinds))
