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

from autoport_cst.transform.anatomy.sites import FAMILIES, ModuleIndex, Site, find_sites

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


def take_census(module: cst.Module, label: str, families: tuple[str, ...]) -> FileCensus:
    census = FileCensus(label)
    index = ModuleIndex(module)
    for family in families:
        for site in find_sites(module, family, index):
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
