"""The norm class of a model file, its epsilon attribute, and whether an
attention class's q/k norm spans the whole projection."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    method,
    self_assignment,
    statements,
    walk,
)


def norm_class(module: cst.Module) -> cst.ClassDef | None:
    norms = [c for c in classes_with_role(module, "norm")]
    return norms[0] if len(norms) == 1 else None


def eps_attribute(norm: cst.ClassDef) -> str | None:
    """The epsilon attribute a norm class stores (``variance_epsilon``)."""
    init = method(norm, "__init__")
    if init is None:
        return None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and "eps" in pair[0]:
                return pair[0]
    return None


def norm_is_full_width(cls: cst.ClassDef, norm: str) -> bool:
    """Whether ``self.<norm>`` is built over all heads (``self.q_size`` /
    ``self.kv_size`` wide) rather than one head."""
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == norm and isinstance(pair[1], cst.Call) and pair[1].args:
                return dotted(pair[1].args[0].value) in ("self.q_size", "self.kv_size")
    return False


def norm_has_bias(module: cst.Module) -> bool:
    """Whether the module's norm class builds ``self.bias`` (LayerNorm with bias)."""
    norm = norm_class(module)
    init = method(norm, "__init__") if norm is not None else None
    return init is not None and any(
        (pair := self_assignment(s)) is not None and pair[0] == "bias" for s in statements(init)
    )
