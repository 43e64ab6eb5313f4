"""The sequence-parallel prefill-length check a TP > 1 validation drives.

With sequence parallelism a prefill's hidden states are split by token over
the TP ranks, and vllm_neuron's models refuse a prefill length they cannot
split before anything runs: ``if is_prefill and (T <= world_size or T %
world_size != 0): raise ValueError(...)`` at the top of the causal LM's
forward (the references, and vllm_neuron's llama3, qwen3 and qwen3_moe
packages). The validator never gives such a length (``scenario.build``
refuses it as bad input), so a port whose check is weakened (``or`` turned
into ``and``) or dropped validates, and on the device sends the length on to
its collectives.

So every TP > 1 run of a port whose reference declares the check
(``declared_rule``: read from the code of the reference the port was
applied from, its manifest's ``provenance.reference``, or of the reference
package it is by its manifest's name, else of the port itself; never from the
mutable port alone, so a port that dropped the check is still asked) and
that ran its prefill sequence-parallel (``sequence_parallel``: a component's
prefill output on a rank held ``T / tp`` rows) goes on, on each rank after
its run, to one prefill call of each length kind the check refuses
(``LengthRule.lengths``: ``tp`` tokens for ``T <= tp``, ``tp + 1`` for ``T %
tp != 0``), with the stand-in's collectives refusing to communicate
(``collectives.refusing_collectives``). It passes when the port raises, from
its own code, the exception class the reference's check raises, before any
collective; a call that reaches a collective, runs through, fails in the
stand-in or raises another class fails the run, naming the check, the length
and what happened (``apply``). The calls stop at the first collective or at
the port's check: a few milliseconds per run.
"""

from __future__ import annotations

import ast
import functools
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AT_MOST = "at most the TP size"
NOT_DIVISIBLE = "not divisible by the TP size"
CHECK = "sequence-parallel prefill-length check"
# how vllm_neuron's models name the TP size they compare the token count with
TP_SIZE_NAMES = frozenset({"world_size", "tp_size", "tp_degree", "tensor_parallel_size"})


@dataclass(frozen=True)
class LengthRule:
    """The check a reference declares: the length kinds it refuses, the
    exception class it raises, and where it was read."""

    kinds: tuple[str, ...]
    error: str
    source: str

    def lengths(self, tp: int) -> list[tuple[str, int]]:
        """One prefill length of each kind at TP ``tp`` (both above 1 token: a prefill)."""
        chosen = {AT_MOST: tp, NOT_DIVISIBLE: tp + 1}
        return [(kind, chosen[kind]) for kind in self.kinds]


def declared_rule(package_dir: str | Path) -> LengthRule | None:
    """The check the port's reference declares, or None (no such check: the
    port is not asked)."""
    from .reference_source import reference_of

    source, directory = reference_of(package_dir)
    for path in sorted(directory.glob("*.py")):
        found = _rule_in(str(path), path.stat().st_mtime_ns)
        if found is not None:
            return LengthRule(found[0], found[1], f"{source} ({path.name})")
    return None


@functools.lru_cache(maxsize=32)
def _rule_in(path: str, _mtime: int) -> tuple[tuple[str, ...], str] | None:
    """(kinds, exception class) of the first length check in a ``forward`` of
    the module at ``path``."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.name == "forward":
            tokens = _token_counts(function)
            for node in ast.walk(function):
                found = _length_check(node, tokens) if isinstance(node, ast.If) else None
                if found is not None:
                    return found
    return None


def _token_counts(function: ast.FunctionDef) -> set[str]:
    """Names the function binds to a token count (``T = input_ids.shape[0]``)."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and _is_shape0(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _is_shape0(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == 0
    )


def _length_check(node: ast.If, tokens: set[str]) -> tuple[tuple[str, ...], str] | None:
    """(kinds, exception class) when ``node`` raises a named exception under a
    test of the token count against the TP size."""
    raised = [
        s.exc.func.id
        for s in node.body
        if isinstance(s, ast.Raise) and isinstance(s.exc, ast.Call) and isinstance(s.exc.func, ast.Name)
    ]
    if not raised or not any(_atom(n, tokens) for n in ast.walk(node.test)):
        return None
    kinds = tuple(k for k in (AT_MOST, NOT_DIVISIBLE) if _holds(node.test, tokens, k))
    return (kinds, raised[0]) if kinds else None


def _holds(test: ast.AST, tokens: set[str], kind: str) -> bool:
    """Whether ``test`` is true for a prefill length of ``kind`` (a length of one
    kind is not of the other: ``tp`` divides ``tp``; ``tp + 1`` exceeds it); a
    condition on anything but the length (``is_prefill``) is taken to hold."""
    if isinstance(test, ast.BoolOp):
        values = [_holds(value, tokens, kind) for value in test.values]
        return all(values) if isinstance(test.op, ast.And) else any(values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not _holds(test.operand, tokens, kind)
    atom = _atom(test, tokens)
    return True if atom is None else atom == kind


def _atom(test: ast.AST, tokens: set[str]) -> str | None:
    """The length kind a comparison refuses: ``T <= tp`` or ``T % tp != 0``."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.LtE) and _is_tokens(left, tokens) and _is_tp_size(right):
        return AT_MOST
    zero = isinstance(right, ast.Constant) and right.value == 0
    if isinstance(op, ast.NotEq) and zero and isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod):
        if _is_tokens(left.left, tokens) and _is_tp_size(left.right):
            return NOT_DIVISIBLE
    return None


def _is_tokens(node: ast.AST, tokens: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in tokens) or _is_shape0(node)


def _is_tp_size(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in TP_SIZE_NAMES


# -- in the rank ---------------------------------------------------------------


def sequence_parallel(output: Any, tp: int) -> bool:
    """Whether the run's first prefill call (a whole prompt) left a component
    output split by token over the ranks (``T / tp`` rows on this rank)."""
    if tp <= 1 or not output.prefill_calls:
        return False
    tokens = output.prefill_calls[0].tokens
    return any(records and records[0].shape[0] * tp == tokens for records in output.prefill_records.values())


def probe(session: Any, rule: LengthRule, tp: int) -> list[dict[str, Any]]:
    """Each of the rule's lengths as a prefill of the session's first prompt,
    the collectives refusing: one entry per length (``passed``, ``message``)."""
    from .driver import PortFailure
    from .scenario import PrefillCall
    from .standin.collectives import refusing_collectives

    entries = []
    for kind, length in rule.lengths(tp):
        if length <= session.scenario.decode_tokens:  # not a prefill in this run
            continue
        error: BaseException | None = None
        with refusing_collectives():
            try:
                session.prefill_call(PrefillCall(0, 0, length, last_only=True))
            except PortFailure as failure:
                error = failure.__cause__ or failure
        entries.append(_verdict(error, kind, length, tp, rule))
    return entries


def _verdict(
    error: BaseException | None, kind: str, length: int, tp: int, rule: LengthRule
) -> dict[str, Any]:
    from .port_failure import is_port_code
    from .standin.collectives import CollectiveReached

    asked = f"a prefill of {length} tokens at TP={tp} ({kind})"
    reached = _in_chain(error, CollectiveReached)
    if error is None:
        return _entry(kind, length, False, f"{asked} ran without the port refusing it")
    if reached is not None:
        return _entry(kind, length, False, f"{asked} reached the {reached} before the port refused it")
    described = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or not is_port_code(frames[-1].filename):
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "the validator"
        return _entry(
            kind, length, False, f"{asked} failed in {where} ({described}), not in the port's own check"
        )
    if rule.error not in {cls.__name__ for cls in type(error).__mro__}:
        return _entry(
            kind,
            length,
            False,
            f"{asked} was refused with {described}; the check of {rule.source} raises {rule.error}",
        )
    return _entry(kind, length, True, f"{asked} refused ({described})")


def _entry(kind: str, length: int, passed: bool, message: str) -> dict[str, Any]:
    return {"kind": kind, "length": length, "passed": passed, "message": message}


def _in_chain(error: BaseException | None, cls: type) -> BaseException | None:
    """``error`` or an exception it was raised from or during, of class ``cls``."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, cls):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


# -- in the parent -------------------------------------------------------------


def merged(per_rank: list[list[dict[str, Any]] | None]) -> list[dict[str, Any]] | None:
    """The ranks' entries as one: the first failing entry of any rank (rank
    order, named), else rank 0's entries; None when no rank was asked."""
    for rank, entries in enumerate(per_rank):
        for entry in entries or []:
            if not entry["passed"]:
                return [{**entry, "message": f"rank {rank}: {entry['message']}"}]
    return per_rank[0] if per_rank and per_rank[0] is not None else None


def apply(report: Any, entries: list[dict[str, Any]] | None) -> None:
    """The check's outcome into ``report``: its settings say what was asked;
    a failing entry fails the report, named after the check."""
    from .report import record_check

    record_check(report, CHECK, "prefill_length_check", entries)
