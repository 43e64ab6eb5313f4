"""Adding a codemod is one file: ``new_codemod/demo_marker.py``, put on the
codemod package's path as if it were added to ``codemods/``, is picked up by
the library, the composer, the README table, the example and property tests
and the plan's pitfalls, with no other file edited."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given

from autoport_cst import codemods as codemods_package
from autoport_cst.research import pitfalls as research_pitfalls
from autoport_cst.spec import ArchSpec, FieldDiff
from autoport_cst.transform import library as library_module
from autoport_cst.transform.library_table import markdown_table

from . import test_examples, test_properties
from .param_strategies import params_strategy

HERE = Path(__file__).parent / "new_codemod"
CACHES = (
    library_module._modules,
    library_module._load,
    library_module._source,
    library_module.library,
    research_pitfalls.declared_pitfalls,
)


def _forget() -> None:
    for cached in CACHES:
        cached.cache_clear()


@pytest.fixture
def added(monkeypatch):
    """The library with demo_marker.py added; afterwards as it was."""
    monkeypatch.setattr(codemods_package, "__path__", [*codemods_package.__path__, str(HERE)])
    _forget()
    yield library_module.get_codemod("demo-marker")
    monkeypatch.undo()
    sys.modules.pop("autoport_cst.codemods.demo_marker", None)
    _forget()


def test_the_library_and_the_composer_find_it(added):
    assert library_module.library()["demo-marker"] is added
    assert added in library_module.realizing("embedding.learned_positions")
    assert added.realizes(FieldDiff("embedding.learned_positions", "feature", False, True))
    assert not added.realizes(FieldDiff("embedding.learned_positions", "feature", True, False))


def test_the_readme_table_lists_it(added):
    row = "| `demo-marker` | `embedding.learned_positions` | Mark the causal-LM class as having learned "
    assert row in markdown_table(library_module.library())


@pytest.mark.parametrize("number", [0, 1])
def test_its_examples_run(added, number):
    test_examples.test_example(added, added.EXAMPLES[number])


def test_the_property_tests_take_it_with_its_parameters(added, monkeypatch):
    params = test_properties.generic_params(library_module.library())
    assert "demo-marker" in params

    @given(params_strategy(added))
    def derived(drawn):
        assert drawn["learned"] in (False, True) and drawn["source"] in ("config", "checkpoint")

    derived()
    monkeypatch.setattr(test_properties, "PARAMS", params)
    test_properties.test_idempotent_and_compiles(codemod_id="demo-marker")
    test_properties.test_untargeted_code_is_unchanged_or_refused(codemod_id="demo-marker")


def test_the_plan_lists_its_pitfall(added):
    spec = ArchSpec()
    with_feature = ArchSpec(embedding=type(spec.embedding)(learned_positions=True))
    note = "learned positions (demo-marker): the position table is a checkpoint tensor"
    assert note in research_pitfalls.pitfalls(with_feature, [], [], [], None)
    assert note not in research_pitfalls.pitfalls(spec, [], [], [], None)


def test_without_the_file_the_library_is_as_it_was():
    assert "demo-marker" not in library_module.library()
