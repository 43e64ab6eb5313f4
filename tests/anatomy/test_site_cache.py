"""The census across steps (``SiteCache``): a step that edits one class of a
file finds the sites of the file's other classes again only when something
they were computed from changed, and finds what a fresh census finds."""

from __future__ import annotations

import libcst as cst
import pytest

from autoport_cst.transform.anatomy.census import SiteCache
from autoport_cst.transform.anatomy.families import FAMILIES
from autoport_cst.transform.anatomy.sites import find_sites
from autoport_cst.transform.cst.vocabulary import walk
from autoport_cst.transform.edit.tree import rewrite


def _described(sites) -> list[tuple]:
    return [(s.key, s.path, s.footprint, id(s.node)) for s in sites]


def _renamed(module: cst.Module, node: cst.Name, new: str) -> cst.Module:
    return rewrite(module, {id(node): lambda updated: updated.with_changes(value=new)})


def _attribute_named(module: cst.Module, cls: str, attr: str) -> cst.Name:
    owner = next(s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == cls)
    return next(n.attr for n in walk(owner) if isinstance(n, cst.Attribute) and n.attr.value == attr)


@pytest.mark.parametrize("reference", ["llama3", "qwen3_moe"])
def test_a_step_that_edits_one_class_reuses_the_sites_of_the_others(repo_root, reference):
    module = cst.parse_module((repo_root / "reference_models" / reference / "model.py").read_text())
    classes = [s.name.value for s in module.body if isinstance(s, cst.ClassDef)]
    attention = next(c for c in classes if c.endswith("Attention"))
    cache = SiteCache()
    before = {family: cache.sites(module, family) for family in FAMILIES}
    # the attention class scales its scores by another attribute
    edited = _renamed(module, _attribute_named(module, attention, "scaling"), "scaling2")
    for family in FAMILIES:
        found = cache.sites(edited, family)
        assert _described(found) == _described(find_sites(edited, family)), family
        kept = {id(s) for s in before[family]}
        for site in found:
            # sites of classes the step did not touch (nor anything they read) are the same objects
            if (
                site.cls != attention
                and site.cls in classes
                and not site.cls.endswith(("DecoderLayer", "Model"))
            ):
                assert id(site) in kept, (family, site.describe())


def test_a_class_whose_held_module_changed_is_found_again():
    """A decoder layer's sublayer site reads the class of the module it calls
    (whole): an edit of that class changes the site, though the layer's own
    class is the same object."""
    source = (
        "class LlamaMLP(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return NF.mlp(x, self.w)\n"
        "\n"
        "\n"
        "class LlamaDecoderLayer(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.mlp = LlamaMLP(config)\n"
        "\n"
        "    def forward(self, x):\n"
        "        return self.mlp(x)\n"
    )
    module = cst.parse_module(source)
    cache = SiteCache()
    (site,) = cache.sites(module, "decoder.sublayer")
    edited = _renamed(module, _attribute_named(module, "LlamaMLP", "w"), "w2")
    assert edited.body[1] is module.body[1]  # the layer's class is the same object
    (again,) = cache.sites(edited, "decoder.sublayer")
    assert again.footprint != site.footprint
    assert _described([again]) == _described(find_sites(edited, "decoder.sublayer"))
