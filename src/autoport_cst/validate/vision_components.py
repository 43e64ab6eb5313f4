"""The components compared in a vision-language validation, by the same
names on both sides: the vision tower's blocks (``vision.blocks.N``), its
deep-stack mergers (``vision.deepstack.I``) and its final merger
(``vision.merger``), then the text decoder's components
(``components.find_components`` on the model's ``language_model``:
embedding, per layer the norms, attention, MLP and output, the final norm).

transformers nests both towers under ``model`` (``model.visual``,
``model.language_model``); a port holds them at its top (``visual``,
``language_model``), so the module paths are found from each model's own
tree, structurally.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .components import Component, find_components

TOWER_NAMES = ("visual", "vision_tower", "vision_model")
BLOCK_LIST_NAMES = ("blocks", "layers")
MERGER_NAMES = ("merger",)
DEEPSTACK_LIST_NAMES = ("deepstack_merger_list",)


def _owner(model: nn.Module, name: str) -> tuple[str, nn.Module] | None:
    """The module holding ``name`` (the model or its ``model`` child), as a path prefix."""
    for prefix, owner in (("", model), ("model.", getattr(model, "model", None))):
        if isinstance(owner, nn.Module) and isinstance(getattr(owner, name, None), nn.Module):
            return prefix, owner
    return None


def _tower_components(model: nn.Module) -> list[Component]:
    for tower_name in TOWER_NAMES:
        found = _owner(model, tower_name)
        if found is None:
            continue
        prefix, owner = found
        tower = getattr(owner, tower_name)
        base = f"{prefix}{tower_name}"
        components = []
        for list_name in BLOCK_LIST_NAMES:
            blocks = getattr(tower, list_name, None)
            if isinstance(blocks, nn.ModuleList):
                components += [
                    Component(f"vision.blocks.{i}", f"{base}.{list_name}.{i}") for i in range(len(blocks))
                ]
                break
        for list_name in DEEPSTACK_LIST_NAMES:
            mergers = getattr(tower, list_name, None)
            if isinstance(mergers, nn.ModuleList):
                components += [
                    Component(f"vision.deepstack.{i}", f"{base}.{list_name}.{i}") for i in range(len(mergers))
                ]
        for merger_name in MERGER_NAMES:
            if isinstance(getattr(tower, merger_name, None), nn.Module):
                components.append(Component("vision.merger", f"{base}.{merger_name}"))
        return components
    return []


def _text_components(model: nn.Module) -> list[Component]:
    found = _owner(model, "language_model")
    if found is None:
        return []
    prefix, owner = found
    language_model = owner.get_submodule("language_model")
    return [
        Component(c.name, f"{prefix}language_model.{c.module_path}") for c in find_components(language_model)
    ]


def vision_language_components(model: Any) -> tuple[list[Component], list[Component]]:
    """(the tower's components, the text decoder's components), data-flow order."""
    return _tower_components(model), _text_components(model)
