"""Expert choices of mixture-of-experts layers: recorded, and forced.

A router ends in a top-k over the experts: ``torch.topk(scores [.., E], k)``
(transformers' routers, the stand-in's ``NF.router`` and ``NF.moe_block_tkg``,
and a port's own selection code, e.g. a routing bias added before its top-k).
``RoutingMode`` is a torch function mode that sees every such call made while
a compared MoE component (``layers.N.mlp``) runs, and knows which tokens the
rows of the call are (``set_rows``, per forward). It

- records each token's choice (the indices the top-k returned) and the
  ranked scores it chose from (the top-k's input row, in float32): the last
  top-k over the experts in a component's forward is the choice the block
  uses (a routing bias's top-k comes after the router kernel's);
- with ``forced``, returns instead the expert choice recorded for that token
  and component in another run (the float32 golden run): the indices, in the
  golden order, and the scores the call was given at those indices. What the
  block computes from them (activation, renormalisation, scaling, the
  experts) is its own. A call whose ``k`` is not the golden one is not
  forced (``unforced``): the port runs its own top-k.

Nothing is keyed by model name: a component is a MoE layer when a top-k over
its expert count runs inside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .components import Component, find_components
from .reference import ReferenceOutput, run_reference

Token = tuple[int, int]  # (sequence, position)
_TOPK = (torch.topk, torch.Tensor.topk)


@dataclass
class RoutingRecord:
    """Per MoE component, per token: the experts chosen (in the order the
    top-k returned them) and the float32 scores ranked (``[E]``)."""

    choices: dict[str, dict[Token, tuple[int, ...]]] = field(default_factory=dict)
    scores: dict[str, dict[Token, torch.Tensor]] = field(default_factory=dict)

    def add(self, component: str, token: Token, experts: tuple[int, ...], scores: torch.Tensor) -> None:
        self.choices.setdefault(component, {})[token] = experts
        self.scores.setdefault(component, {})[token] = scores

    def merge(self, other: RoutingRecord) -> None:
        for component, choices in other.choices.items():
            self.choices.setdefault(component, {}).update(choices)
            self.scores.setdefault(component, {}).update(other.scores[component])

    def margin(self, component: str, token: Token) -> float:
        """The gap between the k-th and the (k+1)-th ranked score."""
        k = len(self.choices[component][token])
        ranked = self.scores[component][token].sort(descending=True).values
        return math.inf if k >= ranked.numel() else float(ranked[k - 1] - ranked[k])


@dataclass(frozen=True)
class _TopkCall:
    scores: torch.Tensor
    k: int
    last_dim: bool
    largest: bool


def _topk_call(args: tuple, kwargs: dict) -> _TopkCall | None:
    names = ("input", "k", "dim", "largest", "sorted")
    bound = dict(zip(names, args, strict=False)) | kwargs
    scores = bound.get("input")
    if not isinstance(scores, torch.Tensor) or not isinstance(bound.get("k"), int) or scores.dim() == 0:
        return None
    dim = bound.get("dim", -1)
    return _TopkCall(scores, bound["k"], dim in (-1, scores.dim() - 1), bool(bound.get("largest", True)))


@dataclass
class RoutedRun:
    """What a run with a ``RoutingMode`` saw: each token's own expert choice
    (before forcing), and the calls it could not map or force."""

    record: RoutingRecord
    unmapped: set[str] = field(default_factory=set)
    unforced: set[str] = field(default_factory=set)

    def merge(self, other: RoutedRun) -> None:
        self.record.merge(other.record)
        self.unmapped |= other.unmapped
        self.unforced |= other.unforced


class RoutingMode(TorchFunctionMode):
    """Records (and with ``forced``, forces) the expert choice of every top-k
    over ``experts`` scores inside a MoE component (see the module doc)."""

    def __init__(self, experts: int, forced: RoutingRecord | None = None, rank: int = 0, tp: int = 1):
        super().__init__()
        self.experts, self.forced, self.rank, self.tp = experts, forced, rank, tp
        self.record = RoutingRecord()
        self.rows: list[Token | None] = []
        self.unmapped: set[str] = set()  # calls whose rows are not the forward's tokens
        self.unforced: set[str] = set()  # calls with another k than the golden choice
        self._active: list[str] = []
        self._handles: list[Any] = []

    def result(self) -> RoutedRun:
        return RoutedRun(self.record, set(self.unmapped), set(self.unforced))

    # -- where the calls run ---------------------------------------------------

    def attach(self, model: nn.Module, components: list[Component]) -> None:
        """Track which compared component runs (forward hooks)."""
        for component in components:
            module = model.get_submodule(component.module_path)
            self._handles.append(module.register_forward_pre_hook(self._enter(component.name)))
            self._handles.append(module.register_forward_hook(self._leave))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, name: str) -> Callable[..., None]:
        def enter(module: nn.Module, args: Any) -> None:
            self._active.append(name)

        return enter

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._active:
            self._active.pop()

    def set_rows(self, rows: list[Token | None]) -> None:
        """The tokens of the next forward's rows (None: a padding row)."""
        self.rows = rows

    def _tokens(self, count: int) -> list[Token | None] | None:
        """The tokens of a call's ``count`` rows: the forward's rows, or this
        rank's sequence-parallel slice of them."""
        if count == len(self.rows):
            return self.rows
        if count * self.tp == len(self.rows):
            return self.rows[self.rank * count : (self.rank + 1) * count]
        return None

    # -- the top-k -------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func not in _TOPK or not self._active:
            return result
        call = _topk_call(args, kwargs)
        if call is None or not call.last_dim or not call.largest or call.scores.shape[-1] != self.experts:
            return result
        return self._route(self._active[-1], call, result)

    def _route(self, component: str, call: _TopkCall, result: Any) -> Any:
        scores = call.scores.reshape(-1, self.experts)
        indices = result.indices.reshape(scores.shape[0], call.k).clone()
        tokens = self._tokens(scores.shape[0])
        if tokens is None:
            self.unmapped.add(f"{component}: {scores.shape[0]} rows for {len(self.rows)} tokens")
            return result
        golden = self.forced.choices.get(component, {}) if self.forced is not None else {}
        for row, token in enumerate(tokens):
            if token is None:
                continue
            self.record.add(component, token, tuple(indices[row].tolist()), scores[row].float().clone())
            chosen = golden.get(token)
            if chosen is None:
                continue
            if len(chosen) != call.k:
                self.unforced.add(f"{component}: top-{call.k}, the golden choice is top-{len(chosen)}")
                continue
            indices[row] = torch.tensor(chosen, dtype=indices.dtype)
        if self.forced is None:
            return result
        values = scores.gather(1, indices.to(torch.long))
        shape = result.indices.shape
        return torch.return_types.topk((values.reshape(shape), indices.reshape(shape)))


class ForcedTeacher(list):
    """Teacher tokens that carry the golden expert choices a port run must
    take (``PortSession.run`` forces them; pickled whole to the TP ranks)."""

    def __init__(self, tokens: list[list[int]], golden: RoutingRecord, experts: int) -> None:
        super().__init__(tokens)
        self.golden, self.experts = golden, experts


@contextmanager
def routing_mode(
    model: nn.Module,
    components: list[Component],
    experts: int,
    forced: RoutingRecord | None = None,
    **kw: Any,
) -> Iterator[RoutingMode]:
    """``RoutingMode`` on ``model``'s components for the duration."""
    mode = RoutingMode(experts, forced, **kw)
    mode.attach(model, components)
    try:
        with mode:
            yield mode
    finally:
        mode.detach()


def run_reference_routed(
    model: nn.Module,
    prompts: tuple[tuple[int, ...], ...],
    teacher: list[list[int]],
    experts: int,
    forced: RoutingRecord | None = None,
) -> tuple[ReferenceOutput, RoutedRun]:
    """``run_reference`` recording each MoE layer's expert choice (and with
    ``forced``, taking those choices instead): forward ``b`` is sequence
    ``b``, its rows the positions."""
    components = find_components(model)
    lengths = iter([len(p) + len(t) for p, t in zip(prompts, teacher, strict=False)])
    sequence = iter(range(len(prompts)))
    with routing_mode(model, components, experts, forced) as mode:

        def rows(module: nn.Module, args: Any) -> None:
            b = next(sequence)
            mode.set_rows([(b, p) for p in range(next(lengths))])

        handle = model.register_forward_pre_hook(rows)
        try:
            output = run_reference(model, prompts, teacher)
        finally:
            handle.remove()
    return output, mode.result()
