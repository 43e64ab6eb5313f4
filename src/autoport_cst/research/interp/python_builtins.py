"""The builtins modeling code calls: computed on concrete arguments,
``getattr``/``hasattr`` through the interpreter (config reads logged),
``len``/``enumerate`` on module lists; and the methods of Python's own
values the interpreter runs (``dict.get``, ``str.startswith``...)."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.core import Core
from autoport_cst.research.interp.values import MODULE_LIST, UNKNOWN, FirstOnly, Instance, is_concrete

# methods of Python values run on concrete receivers
SAFE_METHODS = {
    dict: {"get", "keys", "values", "items", "copy"},
    str: {"startswith", "endswith", "lower", "upper", "replace", "split", "format", "strip"},
    list: {"index", "count", "copy"},
    tuple: {"index", "count"},
}


def _b_getattr(interp: Core, args, kwargs):
    if len(args) >= 2 and isinstance(args[1], str):
        default = args[2] if len(args) > 2 else UNKNOWN
        return interp.getattr(args[0], args[1], default)
    return UNKNOWN


def _b_hasattr(interp: Core, args, kwargs):
    if len(args) == 2 and isinstance(args[1], str):
        if isinstance(args[0], ConfigProxy):
            interp.note_read(args[1])
            return args[0].has(args[1])
        if isinstance(args[0], Instance):
            return args[1] in args[0].attrs or UNKNOWN
    return UNKNOWN


def _concrete_builtin(fn):
    def run(interp, args, kwargs):
        if not all(is_concrete(a) for a in [*args, *kwargs.values()]):
            return UNKNOWN
        try:
            return fn(*args, **kwargs)
        except Exception:
            return UNKNOWN

    return run


def _b_enumerate(interp: Core, args):
    if len(args) == 1 and isinstance(args[0], Instance) and args[0].cls == MODULE_LIST:
        items = args[0].attrs.get("items", [])
        if interp.every_layer:
            return list(enumerate(items))
        return FirstOnly((0, items[0])) if items else UNKNOWN
    if len(args) == 1 and is_concrete(args[0]):
        return list(enumerate(args[0]))
    return UNKNOWN


def _b_len(interp, args, kwargs):
    if args and isinstance(args[0], Instance) and args[0].cls == MODULE_LIST:
        return len(args[0].attrs.get("items", []))
    return _concrete_builtin(len)(interp, args, kwargs)


def _b_isinstance(interp, args, kwargs):
    if len(args) == 2 and is_concrete(args[0]) and args[1] in (int, float, str, bool, list, tuple, dict):
        return isinstance(args[0], args[1])
    return UNKNOWN


# the builtin names modeling code reads, and what calling each one computes
BUILTINS: dict[str, Any] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "len": len,
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "sum": sum,
    "range": range,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "getattr": getattr,
    "hasattr": hasattr,
    "isinstance": isinstance,
    "super": super,
    "enumerate": enumerate,
    "zip": zip,
    "sorted": sorted,
    "any": any,
    "all": all,
    "True": True,
    "False": False,
    "None": None,
}
BUILTIN_FUNCS = {
    int: _concrete_builtin(int),
    float: _concrete_builtin(float),
    bool: _concrete_builtin(bool),
    str: _concrete_builtin(str),
    len: _b_len,
    min: _concrete_builtin(min),
    max: _concrete_builtin(max),
    abs: _concrete_builtin(abs),
    round: _concrete_builtin(round),
    sum: _concrete_builtin(sum),
    range: _concrete_builtin(range),
    list: _concrete_builtin(list),
    tuple: _concrete_builtin(tuple),
    dict: _concrete_builtin(dict),
    getattr: _b_getattr,
    hasattr: _b_hasattr,
    isinstance: _b_isinstance,
    enumerate: lambda interp, args, kwargs: _b_enumerate(interp, args),
    zip: _concrete_builtin(lambda *x: list(zip(*x, strict=False))),
    sorted: _concrete_builtin(sorted),
    any: _concrete_builtin(any),
    all: _concrete_builtin(all),
}
