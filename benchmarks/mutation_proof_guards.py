"""A refusal narrowed: ``narrowed_refusal`` (benchmarks/mutation.py).

``narrowed_refusal(original, mutated)``: the two modules differ only in the
test of one ``if T: raise ...`` of the port (a body of ``raise`` statements
only, no ``else``), whose last conjunct ``A or B or ...`` the mutant turned
into ``A and B and ...`` (the operands and every other conjunct unchanged).
On every input the port accepts (``T`` false, the ``if`` passed without
raising) the mutant takes the same path and computes the same values:

- a conjunct before the last one is false: the mutant evaluates the same
  conjuncts to the same values and stops there;
- the last conjunct is false: every operand was evaluated and is false, so
  the mutant's first operand is false and its test stops there, false.

The mutant can only refuse fewer inputs (those where some but not all
operands hold), never refuse one the port accepts or compute anything else
on it: on the port's domain it is the same function. It evaluates no operand
the port did not evaluate on that domain, only fewer of them, which changes
nothing when evaluating them has no effect: operands with no call, ``await``,
``yield`` or assignment expression (the premise: attribute reads,
subscripts and operators of the port's values have no side effects). Any
other change of a refusal's test (an operand negated, an order reversed,
``and`` turned into ``or``) can refuse an input the port accepts, and is
validated like any other mutant.
"""

from __future__ import annotations

import ast

_EFFECTS = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda)


def narrowed_refusal(original: str, mutated: str) -> str | None:
    """Why the mutated module is the original on every input it accepts, or None."""
    try:
        before, after = ast.parse(original), ast.parse(mutated)
    except SyntaxError:
        return None
    pair = _only_changed_test(before, after)
    if pair is None:
        return None
    guard, test = pair
    if guard.orelse or not all(isinstance(s, ast.Raise) for s in guard.body):
        return None
    old = _conjuncts(guard.test)
    new = _conjuncts(test) if len(old) > 1 else [test]
    if len(old) != len(new) or any(
        ast.dump(a) != ast.dump(b) for a, b in zip(old[:-1], new[:-1], strict=True)
    ):
        return None
    last, narrowed = old[-1], new[-1]
    if not (isinstance(last, ast.BoolOp) and isinstance(last.op, ast.Or)):
        return None
    if not (isinstance(narrowed, ast.BoolOp) and isinstance(narrowed.op, ast.And)):
        return None
    if [ast.dump(v) for v in last.values] != [ast.dump(v) for v in narrowed.values]:
        return None
    if any(isinstance(n, _EFFECTS) for v in last.values for n in ast.walk(v)):
        return None
    return (
        f"narrows the refusal `if {ast.unparse(guard.test)}: raise`: on every input the port "
        "accepts the mutant takes the same path"
    )


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return list(test.values)
    return [test]


def _only_changed_test(before: ast.Module, after: ast.Module) -> tuple[ast.If, ast.expr] | None:
    """The one ``if`` whose test differs (and the mutant's test), when nothing
    else differs between the modules."""
    found: list[tuple[ast.If, ast.expr]] = []

    def walk(a: ast.AST, b: ast.AST) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, ast.If) and isinstance(b, ast.If) and ast.dump(a.test) != ast.dump(b.test):
            found.append((a, b.test))
            mine, theirs = a.body + a.orelse, b.body + b.orelse
            return len(mine) == len(theirs) and all(walk(x, y) for x, y in zip(mine, theirs, strict=True))
        for name, value in ast.iter_fields(a):
            other = getattr(b, name)
            if isinstance(value, list):
                if len(value) != len(other) or not all(
                    _same(x, y, walk) for x, y in zip(value, other, strict=True)
                ):
                    return False
            elif not _same(value, other, walk):
                return False
        return True

    if not walk(before, after) or len(found) != 1:
        return None
    return found[0]


def _same(x: object, y: object, walk) -> bool:
    if isinstance(x, ast.AST) and isinstance(y, ast.AST):
        return walk(x, y)
    if isinstance(x, ast.AST) or isinstance(y, ast.AST):
        return False
    return x == y
