"""The checkpoint keys of the FP8 KV-cache scales (``k_scale`` / ``v_scale``)
under checkpoint key renames.

A checkpoint stores an attention's scales beside its projections
(``gpt_neox.layers.<i>.attention.k_scale`` next to
``gpt_neox.layers.<i>.attention.dense.weight``), and the references read them
outside ``load_weights``, in a loop that builds the key from the layer's
prefix (``f"model.layers.{layer_id}.self_attn.{scale_name}"`` for
``scale_name in ("k_scale", "v_scale")``). The renames of a checkpoint's keys
often name the attention module only through its projections
(``self_attn.o_proj -> attention.dense``), so the module's own name in the
checkpoint is read off the renamed keys of the weights ``load_weights`` maps
under it: the same segments of every one of them, or the site is refused.
"""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import string_text, walk
from autoport_cst.transform.edit.key_renames import (
    FIELD,
    KeyRenamer,
    expand,
    key_literal,
    key_strings,
    string_variables,
)

SCALE_NAMES = ("k_scale", "v_scale")


class ScaleKeyError(ValueError):
    """A scale key the renames cannot be carried to; ``node`` is its site."""

    def __init__(self, message: str, node: cst.CSTNode) -> None:
        super().__init__(message)
        self.node = node


def scale_key_sites(fn: cst.FunctionDef) -> list[tuple[cst.BaseExpression, str]]:
    """The string keys of KV-cache scales in a function, with their text: a
    dotted key whose last segment is ``k_scale`` / ``v_scale``, or a field of
    a loop variable running over them (``for scale_name in ("k_scale", ...)``)."""
    scale_loops = {
        node.target.value
        for node in walk(fn)
        if isinstance(node, cst.For)
        and isinstance(node.target, cst.Name)
        and isinstance(node.iter, (cst.Tuple, cst.List))
        and any(string_text(e.value) in SCALE_NAMES for e in node.iter.elements)
    }
    leaves = set(SCALE_NAMES) | {"{" + name + "}" for name in scale_loops}
    sites: list[tuple[cst.BaseExpression, str]] = []
    for node in walk(fn):
        if not isinstance(node, (cst.SimpleString, cst.FormattedString)):
            continue
        text = string_text(node)
        if text is not None and "." in text and text.rpartition(".")[2] in leaves:
            sites.append((node, text))
    return sites


def scale_sites_in(module: cst.Module) -> list[tuple[cst.BaseExpression, str]]:
    """Every scale key site of a module's functions."""
    return [site for fn in walk(module) if isinstance(fn, cst.FunctionDef) for site in scale_key_sites(fn)]


def loop_names(fn: cst.FunctionDef) -> set[str]:
    """The names a function's loops bind (``for layer_id, layer in ...``):
    the fields of a key that stand for a layer's index."""
    targets: list[cst.BaseExpression] = [
        node.target for node in walk(fn) if isinstance(node, (cst.For, cst.CompFor))
    ]
    names = set()
    while targets:
        target = targets.pop()
        if isinstance(target, cst.Name):
            names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            targets += [element.value for element in target.elements]
    return names


def _indices(text: str, names: set[str]) -> str:
    """``text`` with its fields of loop names written ``{i}``; other fields kept."""
    return FIELD.sub(lambda field: "{i}" if field[0][1:-1] in names else field[0], text)


def _weight_keys(loads: list[cst.FunctionDef], renamer: KeyRenamer) -> list[tuple[str, str]]:
    """(reference key, renamed key) of every key ``load_weights`` maps, their
    fields of loop names written ``{i}``."""
    pairs = []
    for fn in loads:
        variables, _ = string_variables(fn)
        names = loop_names(fn)
        for entry in mapping_entries(fn):
            for node in key_strings(entry.value):
                text = string_text(node)
                if text is not None:
                    full = expand(text, variables)
                    pairs.append((_indices(full, names), _indices(renamer.apply(full), names)))
    return pairs


def checkpoint_module(
    path: str, names: set[str], weights: list[tuple[str, str]], renamer: KeyRenamer, node: cst.CSTNode
) -> str:
    """The checkpoint's name of the module at ``path`` (a reference key, with
    the site's own fields; ``names``: its function's loop names): the leading
    segments, as many as the renamed ``path`` has, of the renamed keys of the
    weights under it."""
    under = _indices(path, names) + "."
    depth = len(renamer.apply(path).split("."))
    found = {".".join(new.split(".")[:depth]) for old, new in weights if old.startswith(under)}
    if not found:
        raise ScaleKeyError(
            f"the KV-cache scale key {path}.<scale> has no weight key of load_weights under {path}, so "
            "the checkpoint key renames give no name of that module in the checkpoint",
            node,
        )
    if len(found) > 1:
        raise ScaleKeyError(
            f"the weight keys under {path} go to {', '.join(sorted(found))} in the checkpoint: the "
            "KV-cache scale key beside them has no one name there",
            node,
        )
    new = found.pop()
    indices = [field for field in FIELD.findall(path) if field[1:-1] in names]
    if new.count("{i}") != len(indices):
        raise ScaleKeyError(
            f"the KV-cache scale key under {path} becomes {new}: its fields do not carry", node
        )
    parts = new.split("{i}")
    return parts[0] + "".join(field + part for field, part in zip(indices, parts[1:], strict=True))


def scale_key_edits(module: cst.Module, loads: list[cst.FunctionDef], renamer: KeyRenamer) -> dict:
    """Edits (by node id) giving every KV-cache scale key of ``module`` the
    checkpoint's name of its module; raises ``ScaleKeyError`` at a site whose
    module the renamed weight keys do not name."""
    weights = _weight_keys(loads, renamer)
    edits: dict = {}
    for fn in walk(module):
        if not isinstance(fn, cst.FunctionDef):
            continue
        variables, _ = string_variables(fn)
        names = loop_names(fn)
        for node, text in scale_key_sites(fn):
            path, _, leaf = expand(text, variables).rpartition(".")
            new_path = checkpoint_module(path, names, weights, renamer, node)
            if new_path == path:
                continue
            new_node = parse_expr(key_literal(f"{new_path}.{leaf}"), module)
            edits[id(node)] = lambda updated, new_node=new_node: new_node.with_changes(
                lpar=updated.lpar, rpar=updated.rpar
            )
    return edits
