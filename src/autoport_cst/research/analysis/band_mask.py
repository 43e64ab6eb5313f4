"""A boolean attention mask a module computes itself from tensor factories
(GPT-Neo's ``bias`` buffer), read as the band of diagonals it keeps.

``torch.tril(x, d)`` keeps the entries ``[i, j]`` with ``j - i <= d``,
``torch.triu(x, d)`` those with ``j - i >= d``; a mask of ones cut by them
keeps a band ``lo <= j - i <= hi``. The exclusive or of two bands that share
an edge, one inside the other, is the band between them (GPT-Neo's local
layers: ``tril(ones) ^ tril(ones, -window)`` keeps ``-window < j - i <= 0``);
their ``and`` is the intersection. Rows are query positions, columns key
positions (the forward takes the mask's rows ``K - Q .. K`` and columns
``0 .. K``: the last ``Q`` queries of ``K`` keys), so a band with ``hi = 0``
is causal, and ``lo = 1 - w`` a sliding window of ``w`` tokens (a query at
``p`` sees ``p - w + 1 .. p``, as transformers' sliding-window mask keeps
``kv > q - w``). Anything else is not read (None)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoport_cst.research.interp.values import Node, SliceSym, TensorInit

# methods and calls that change a mask's shape or dtype, not which entries hold
_SAME = ("view", "reshape", "bool", "to", "contiguous")
_XOR = ("bitwise_xor", "logical_xor", "xor")
_AND = ("bitwise_and", "logical_and", "and")


@dataclass(frozen=True)
class Band:
    """The entries ``[i, j]`` with ``lo <= j - i <= hi`` (infinite: unbounded)."""

    lo: float
    hi: float


def band(value: Any, depth: int = 0) -> Band | None:
    """The band ``value`` keeps, None where it is not such a mask."""
    if depth > 32:
        return None
    if isinstance(value, TensorInit):
        return Band(-math.inf, math.inf) if value.fill == "ones" else None
    if not isinstance(value, Node) or value.kind not in ("call", "method", "binop") or not value.args:
        return None
    short = value.name.rsplit(".", 1)[-1]
    if value.kind == "method" and short in _SAME:
        return band(value.args[0], depth + 1)
    if short in ("tril", "triu"):
        return _triangle(value, short, depth)
    if short in _XOR + _AND and len(value.args) == 2:
        first, second = (band(a, depth + 1) for a in value.args)
        if first is None or second is None:
            return None
        return _xor(first, second) if short in _XOR else _intersection(first, second)
    return None


def _triangle(value: Node, short: str, depth: int) -> Band | None:
    inner = band(value.args[0], depth + 1)
    diagonal = value.args[1] if len(value.args) > 1 else value.kwarg("diagonal", 0)
    if inner is None or not isinstance(diagonal, int) or isinstance(diagonal, bool):
        return None
    if short == "tril":
        return Band(inner.lo, min(inner.hi, diagonal))
    return Band(max(inner.lo, diagonal), inner.hi)


def _xor(a: Band, b: Band) -> Band | None:
    """The entries in one band and not the other, when one holds the other
    and they share an edge (else not a band)."""
    outer, inner = (a, b) if a.lo <= b.lo and b.hi <= a.hi else (b, a)
    if not (outer.lo <= inner.lo and inner.hi <= outer.hi):
        return None
    if outer.lo == inner.lo and inner.hi < outer.hi:
        return Band(inner.hi + 1, outer.hi)
    if outer.hi == inner.hi and outer.lo < inner.lo:
        return Band(outer.lo, inner.lo - 1)
    return None


def _intersection(a: Band, b: Band) -> Band:
    return Band(max(a.lo, b.lo), min(a.hi, b.hi))


def causal_window(value: Any) -> tuple[bool, int | None]:
    """(read, window) of a mask the scores are selected by: ``value`` the
    mask's last ``Q`` rows and first ``K`` columns of a computed band
    (``mask[..., K - Q:K, :K]``); window None for the plain causal mask, the
    window length for a causal band of finite width; (False, None) when not
    such a mask."""
    if not (isinstance(value, Node) and value.kind == "item" and len(value.args) == 2):
        return False, None
    base, index = value.args
    if not _last_queries(index):
        return False, None
    kept = band(base)
    if kept is None or kept.hi != 0:
        return False, None
    if kept.lo == -math.inf:
        return True, None
    window = 1 - int(kept.lo)
    return (True, window) if window >= 1 else (False, None)


def _last_queries(index: Any) -> bool:
    """``index`` takes rows ``K - Q .. K`` and columns ``0 .. K`` of the
    last two dimensions (the same ``K``)."""
    if not isinstance(index, tuple) or len(index) < 2:
        return False
    rows, columns = index[-2], index[-1]
    if not all(isinstance(s, (slice, SliceSym)) for s in (rows, columns)):
        return False
    if columns.lower not in (None, 0) or columns.step is not None or rows.step is not None:
        return False
    end = columns.upper
    if rows.upper is not end and not (isinstance(end, int) and rows.upper == end):
        return False
    start = rows.lower
    return start in (None, 0) or (
        isinstance(start, Node) and start.kind == "binop" and start.name == "sub" and start.args[0] is end
    )
