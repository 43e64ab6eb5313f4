"""rename_in_module renames what a transformer over the whole module would,
and reports the renamed strings and comments in the order it meets them (the
order the rename's notes are positioned in), rebuilding only what it edits;
the renamed statements' code is spliced from the old code, not printed."""

from __future__ import annotations

import libcst as cst
import pytest

from autoport_cst.transform.base import defined_classes
from autoport_cst.transform.cst import printed
from autoport_cst.transform.cst.printed import module_code
from autoport_cst.transform.edit.scope_rename import (
    attribute_references,
    rename_in_module,
    rename_targets,
    string_references,
)
from autoport_cst.transform.edit.words import rename_words


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
