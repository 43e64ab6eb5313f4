"""The lint rules: one rule class per module, found by scanning this package
(adding a rule means adding one file; there is no list to edit)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from autoport_cst.lint.rule import Rule


@cache
def registry() -> dict[str, type[Rule]]:
    """Code -> rule class, sorted by code."""
    found: dict[str, type[Rule]] = {}
    names: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        rules = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Rule)
            and obj is not Rule
            and obj.__module__ == module.__name__
            and obj.CODE
        ]
        if len(rules) != 1:
            raise RuntimeError(f"{module.__name__} must define exactly one rule, found {len(rules)}")
        rule = rules[0]
        if rule.CODE in found:
            raise RuntimeError(f"rule code {rule.CODE} defined twice")
        if rule.NAME in names:
            raise RuntimeError(f"rule name {rule.NAME} defined twice")
        found[rule.CODE] = rule
        names[rule.NAME] = rule.CODE
    return dict(sorted(found.items()))


def aliases() -> dict[str, str]:
    """Every code and rule name -> code."""
    out: dict[str, str] = {}
    for code, rule in registry().items():
        out[code] = code
        out[rule.NAME] = code
    return out
