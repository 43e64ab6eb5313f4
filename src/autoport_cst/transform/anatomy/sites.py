"""Sites: every place in a model file where one family of computation happens.

A *family* is what a codemod changes: the attention kernels, the Q/K/V
projection, the output projection, RoPE application, each sublayer call of a
decoder layer, the dense MLP kernel, the norms, the embedding lookup, the LM
head, the MoE router and experts. The real vllm_neuron code has several
sites per family (flash and segmented prefill, segmented with context
parallelism, fused and bounded-gather decode, a decode ``forward`` and a
``_forward_prefill``, FP8 branches), and a codemod that changes a family
must account for each of them (see ``census.py``).

A site is found structurally (by what is called, in which class role), and
is described by its *footprint*: the code the call's computation depends
on along one path through its method (``flow.py``), plus the attributes,
methods and module functions that code reads. A site whose footprint did not
change was not edited.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.anatomy import flow
from autoport_cst.transform.anatomy.families import FAMILIES
from autoport_cst.transform.anatomy.footprint import Footprint
from autoport_cst.transform.anatomy.index import ModuleIndex, methods

Branch = flow.Branch


@dataclass(frozen=True)
class Site:
    """One variant (path) of one site of a family."""

    family: str
    cls: str  # enclosing class ("" at module level)
    function: str  # enclosing method
    kind: str  # what is called: ``NF.flash_attention``, ``self.self_attn``, ...
    ordinal: int  # rank among the calls of that kind in the method
    path: tuple[Branch, ...]  # the branches this variant takes (relevant ones only)
    footprint: str  # digest of the code the site depends on on that path
    node: cst.CSTNode = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.family, self.cls, self.function, self.kind, self.ordinal)

    def describe(self) -> str:
        where = f"{self.cls}.{self.function}" if self.cls else self.function
        text = f"{where}: {self.kind}"
        if self.ordinal:
            text += f" (#{self.ordinal + 1})"
        if self.path:
            text += " on the path " + ", ".join(
                f"{key}" if taken else f"not ({key})" for key, taken in self.path
            )
        return text


# -- finding sites -------------------------------------------------------------------------


def _variants(
    index: ModuleIndex, cls: cst.ClassDef | None, func: cst.FunctionDef, call: cst.Call
) -> list[tuple[tuple[Branch, ...], str]]:
    """(path, footprint) of each distinct path to ``call`` in ``func``."""
    flat = index.flat(func)
    start = flat.item_of(call)
    if start is None:  # pragma: no cover - every call sits in some item
        return [((), index.code(call))]
    names = {n for n in start.uses if n != "self"}
    found: dict[frozenset[int], tuple[tuple[Branch, ...], str]] = {}
    for path in flow.paths(flat, start, names):
        line = flow.on_path(flat, path)
        items = [start, *flow.backward(line, start, names, path), *flow.consumers(line, start, path)]
        chosen = frozenset(item.index for item in items)
        if chosen in found:
            continue
        footprint = Footprint(index, cls)
        footprint.seen.add(id(func))  # the site's own method is read by its slice, not whole
        footprint.add_items(flat, items)
        fixed = {key for key, _ in start.conditions}
        signature = tuple((key, taken) for key, taken in path.items() if key not in fixed)
        found[chosen] = (signature, footprint.digest())
    return list(found.values())


# Methods that build, load or describe the model: no computation of a family runs there.
NOT_FORWARD = ("__init__", "from_configs", "get_kv_spec", "bind_kv_cache")
NOT_FORWARD_PREFIXES = ("load_weights", "_load", "_setup")


def is_forward_method(func: cst.FunctionDef) -> bool:
    name = func.name.value
    return name not in NOT_FORWARD and not name.startswith(NOT_FORWARD_PREFIXES)


def find_sites(module: cst.Module, family: str, index: ModuleIndex | None = None) -> list[Site]:
    """Every site of ``family`` in the methods of ``module``'s classes, one
    entry per distinct path."""
    index = index or ModuleIndex(module)
    return [site for cls in index.classes.values() for site in class_sites(index, cls, family)]


def class_sites(index: ModuleIndex, cls: cst.ClassDef, family: str) -> list[Site]:
    """The sites of ``family`` in the methods of one class of ``index``'s module."""
    spec = FAMILIES[family]
    owner = index.owner(cls)
    if spec.roles is not None and owner.role not in spec.roles:
        return []
    sites: list[Site] = []
    for func in filter(is_forward_method, methods(cls)):
        ordinals: dict[str, int] = {}
        for call in index.calls(func):
            kind = spec.kind(call, owner)
            if kind is None:
                continue
            ordinal = ordinals.get(kind, 0)
            ordinals[kind] = ordinal + 1
            if spec.narrow(kind):
                digest = hashlib.sha1(index.code(call).encode()).hexdigest()
                sites.append(Site(family, cls.name.value, func.name.value, kind, ordinal, (), digest, call))
                continue
            for path, footprint in _variants(index, cls, func, call):
                sites.append(
                    Site(family, cls.name.value, func.name.value, kind, ordinal, path, footprint, call)
                )
    return sites
