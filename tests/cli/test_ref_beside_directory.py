"""`--ref NAME` beside a directory of that name (issue 18, item 4): a
built-in name is the built-in; a bare word that is a directory without a
reference.json is refused with the built-in it was likely meant as."""

from __future__ import annotations

import pytest
from autoport_cst.reference_models import builtin_references

from autoport_cst.apply.reference import resolve_reference
from autoport_cst.errors import InputError


def test_a_directory_named_like_a_builtin_misspelt_names_the_builtin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama").mkdir()
    with pytest.raises(InputError, match=r"llama is not a reference package: .* \(did you mean 'llama3'\?\)"):
        resolve_reference("llama")
    with pytest.raises(InputError) as raised:
        resolve_reference("./llama")  # a path: no guess at a built-in
    assert "did you mean" not in str(raised.value)


def test_a_builtin_name_is_the_builtin_beside_a_directory_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3").mkdir()
    assert resolve_reference("llama3") == builtin_references()["llama3"]
