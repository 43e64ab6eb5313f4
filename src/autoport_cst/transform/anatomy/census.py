"""The census of the "exhaustive or refuse" invariant.

Before a step runs, the engine records every site of the families the step
changes (``sites.find_sites``), in every file of the package; after the step
it records them again. A site is *handled* when the step changed it: its
footprint differs on some path, or the site is gone (replaced by another
kernel). A site the step neither changed nor declared unaffected
(``FileContext.unaffected``) is *unhandled*, and the port stops naming each
such site with its position in the reference file.

A path that a step adds (a new ``if`` around new code) does not hide an
unhandled site: an old path is matched with every new path that agrees with
it on the old branches, and counts as handled if any of them changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.anatomy.families import FAMILIES
from autoport_cst.transform.anatomy.index import ModuleIndex, NodeMemo
from autoport_cst.transform.anatomy.sites import Site, class_sites

# Spec sections -> the families a change to them touches, for codemods that
# do not declare ``TOUCHES`` themselves.
FAMILIES_OF_FIELD: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention.qkv_bias", ("attention.qkv",)),
    ("attention.o_bias", ("attention.output",)),
    ("attention.qk_norm", ("attention.qkv",)),
    ("attention.qk_norm_position", ("attention.qkv",)),
    ("attention.", ("attention.kernel",)),
    ("rope.type", ("rope.frequencies",)),
    ("rope.layer_parameters", ("rope.frequencies", "rope.application")),
    ("rope.", ("rope.application",)),
    ("norm.", ("norm.application",)),
    ("residual.", ("decoder.sublayer",)),
    ("mlp.", ("mlp.kernel",)),
    ("embedding.", ("embedding.lookup",)),
    ("lm_head.", ("lm_head.logits",)),
    ("moe.shared_experts", ("moe.experts",)),
    ("moe.shared_expert_gate", ("moe.experts",)),
    ("moe.dense_layers", ("decoder.sublayer",)),
    ("moe.", ("moe.router",)),
)


def families_of(fields: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The families that changing ``fields`` (dotted spec paths) touches."""
    found: list[str] = []
    for path in fields:
        for prefix, families in FAMILIES_OF_FIELD:
            if path == prefix or (prefix.endswith(".") and path.startswith(prefix)):
                found += [f for f in families if f not in found]
                break
    return tuple(found)


@dataclass
class FileCensus:
    label: str
    sites: dict[tuple, list[Site]] = field(default_factory=dict)

    def add(self, site: Site) -> None:
        self.sites.setdefault(site.key, []).append(site)


class SiteCache:
    """Sites per (module, family), kept across the steps of one port. A file
    a step did not change keeps its module object, so its sites are not found
    again; in a file it changed, a class it did not change keeps its object,
    and its sites are reused when everything they were computed from is the
    same: the class, and each class and function of the module their
    footprints looked up by name. Holds the nodes it has seen (their ids stay
    theirs)."""

    def __init__(self) -> None:
        self._modules: dict[int, tuple[cst.Module, ModuleIndex]] = {}
        self._sites: dict[tuple[int, str], list[Site]] = {}
        self._classes: dict[tuple[int, str], _ClassSites] = {}
        self._memo = NodeMemo()

    def sites(self, module: cst.Module, family: str) -> list[Site]:
        key = (id(module), family)
        if key not in self._sites:
            if id(module) not in self._modules:
                self._modules[id(module)] = (module, ModuleIndex(module, self._memo))
            index = self._modules[id(module)][1]
            self._sites[key] = [
                s for cls in index.classes.values() for s in self._class_sites(index, cls, family)
            ]
        return self._sites[key]

    def _class_sites(self, index: ModuleIndex, cls: cst.ClassDef, family: str) -> list[Site]:
        layout = (index.module.default_indent, index.module.default_newline)
        kept = self._classes.get((id(cls), family))
        if kept is not None and kept.cls is cls and kept.layout == layout and index.finds(kept.lookups):
            return kept.sites
        index.lookups = {}
        try:
            sites = class_sites(index, cls, family)
            self._classes[(id(cls), family)] = _ClassSites(cls, layout, index.lookups, sites)
        finally:
            index.lookups = None
        return sites


@dataclass
class _ClassSites:
    """The sites of one family in one class, and what they were computed from."""

    cls: cst.ClassDef
    layout: tuple[str, str]  # the module's indentation and newline (the footprints hold code)
    lookups: dict[tuple[str, str], cst.CSTNode | None]
    sites: list[Site]


def take_census(
    module: cst.Module, label: str, families: tuple[str, ...], cache: SiteCache | None = None
) -> FileCensus:
    census = FileCensus(label)
    cache = cache or SiteCache()
    for family in families:
        for site in cache.sites(module, family):
            census.add(site)
    return census


def _agrees(old: tuple, new: tuple) -> bool:
    new_branches = dict(new)
    return all(new_branches.get(key, taken) == taken for key, taken in old)


def unhandled_sites(before: FileCensus, after: FileCensus, unaffected: set[int]) -> list[Site]:
    """Sites of ``before`` that the step left unchanged on some path and did
    not declare unaffected."""
    left: list[Site] = []
    for key, variants in before.sites.items():
        successors = after.sites.get(key)
        if successors is None:
            continue  # the site is gone: replaced or removed by the step
        for variant in variants:
            if id(variant.node) in unaffected:
                continue
            matching = [s for s in successors if _agrees(variant.path, s.path)]
            if matching and all(s.footprint == variant.footprint for s in matching):
                left.append(variant)
    return left


def known_families() -> tuple[str, ...]:
    return tuple(FAMILIES)
