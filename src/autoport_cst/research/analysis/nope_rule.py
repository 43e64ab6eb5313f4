"""Which rule tells the layers without RoPE apart, read from the code that
guards the rotation in the attention's ``forward`` (never from the model's
name).

Cohere 2 and Flint rotate only when the layer has a sliding window
(``if self.sliding_window is not None:``, the window set on sliding layers);
EXAONE 4 and EXAONE-MoE rotate when the layer slides or the config sets no
sliding window at all (``if self.sliding_window is None or
self.is_sliding:``). On a config with a window both rotate the sliding
layers only; they differ on a config without one (EXAONE 4's 1.2B
checkpoint: every layer full attention, every layer rotated). AfMoE rotates
the sliding layers whether or not a window is set (``if
self.is_local_attention:``, from ``config.layer_types`` alone): rule
``layer_type``.

The guard is the ``if`` around the rotation call. Its attributes must be
computed in ``__init__`` from ``config.layer_types`` and
``config.sliding_window`` only (followed through the locals they are built
from); it is evaluated on every layer's attention as traced (it must give
the rotation the trace found), rebuilt with another window (the same), and
rebuilt with ``sliding_window=None`` (every layer rotates, or none, or the
same layers as with a window).
"""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research import config_analysis as config_keys
from autoport_cst.research.analysis import layer_inputs
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import FuncRef, Instance, SourceClass
from autoport_cst.research.interp.walk import walk

# the config fields a guard realized by the nope-layers codemod may depend on
RULE_FIELDS = frozenset({"layer_types", "sliding_window"})
ROTATING, NOPE = "sliding_attention", "full_attention"
# config fields a port reads as sizes at run time: the config guards never hold them (a clause
# reading one may turn true on a real config the guards let through), so no clause reading one is
# left out of a guard
SIZE_FIELDS = frozenset(
    (*config_keys.LAYER_KEYS, *config_keys.HIDDEN_KEYS, *config_keys.HEAD_KEYS, *config_keys.KV_KEYS)
    + (*config_keys.INTERMEDIATE_KEYS, *config_keys.POSITION_KEYS, *config_keys.EXPERT_KEYS)
    + (*config_keys.TOPK_KEYS, *config_keys.MOE_INTERMEDIATE_KEYS, "head_dim", "vocab_size", "layer_types")
)
# what a layer does on a config without a sliding window -> the rule's name (spec rope.nope_rule)
RULES = {True: "sliding_or_no_window", False: "sliding"}
# the sliding layers rotate, the others not, whatever the window (AfMoE: ``if self.is_local_attention:``)
LAYER_TYPE = "layer_type"


def recognize(st: AnalyzerState, rotary: list[bool], kept: list[int]) -> tuple[str | None, str]:
    """The rule (``sliding``, ``sliding_or_no_window`` or ``layer_type``) that tells the
    rotating layers among ``kept`` apart, or None with why not."""
    kinds = st.interp.config.read("layer_types", None)
    if not isinstance(kinds, (list, tuple)) or len(kinds) < len(rotary):
        return None, "config.layer_types does not list every layer"
    if any((kinds[i] == ROTATING) != rotary[i] or kinds[i] not in (ROTATING, NOPE) for i in kept):
        return None, f"the rotating layers are not exactly the {ROTATING} ones"
    attns: list[Instance] = [dict(st.layers[i].children())[st.attn_name] for i in kept]
    cls = attns[0].cls
    if not isinstance(cls, SourceClass) or any(a.cls != cls for a in attns):
        return None, "the layers' attention classes differ"
    found = _guard(st, cls, _rotation_names(st, [i for i in kept if rotary[i]]))
    if found is None:
        return None, "no `if` around the rotation call in the attention's forward"
    module, test = found
    fields = _guard_fields(st, cls, test)
    dropped = ""
    if fields is not None and not fields <= RULE_FIELDS:
        test, dropped = _without_false_clauses(st, cls, module, test, attns)
        fields = _guard_fields(st, cls, test)
    if fields is None or not fields <= RULE_FIELDS:
        told = ", ".join(f"config.{f}" for f in sorted(fields or ())) or "values the analysis cannot follow"
        return None, f"the rotation's guard `{ast.unparse(test)}` reads {told}"
    planned = [_evaluate(st, module, test, a) for a in attns]
    if planned != [rotary[i] for i in kept]:
        return None, f"the rotation's guard `{ast.unparse(test)}` does not give the traced rotation"
    window = st.interp.config.read("sliding_window", None)
    if isinstance(window, int) and [_rebuilt(st, module, test, a, window * 2) for a in attns] != planned:
        return None, f"the rotation's guard `{ast.unparse(test)}` depends on the window's length"
    without = [_rebuilt(st, module, test, a, None) for a in attns]
    if without == planned and len(set(planned)) > 1:
        rule: str | None = LAYER_TYPE  # the same layers rotate whether or not a window is set
    elif len(set(without)) == 1:
        rule = RULES.get(without[0])
    else:
        rule = None
    if not isinstance(rule, str):
        return None, f"without a sliding window, `{ast.unparse(test)}` rotates other layers than with one"
    return rule, f"{st.where(attns[0])}: no RoPE where `{ast.unparse(test)}` is false{dropped}"


def _without_false_clauses(
    st: AnalyzerState, cls: SourceClass, module: Any, test: ast.expr, attns: list[Instance]
) -> tuple[ast.expr, str]:
    """``a or b``, whose clause ``b`` reads config fields other than the
    rule's and is false on every layer of this config (Cohere 2 MoE's
    ``self.force_rope``: its dense prefix layers, none here), as ``a``, and
    the evidence saying so; ``test`` as it is otherwise. Other configs are
    the config guards' business: the research varies those fields, and a
    config that makes ``b`` true somewhere plans another rotation, so that
    the port refuses it (Cohere 2 MoE: ``mlp_layer_types`` entries in
    ``["sparse"]``). A clause reading a size (``SIZE_FIELDS``), which no guard
    holds, stays."""
    if not isinstance(test, ast.BoolOp) or not isinstance(test.op, ast.Or):
        return test, ""
    kept, dropped = [], []
    for clause in test.values:
        reads = _guard_fields(st, cls, clause)
        if (
            reads is not None
            and not reads <= RULE_FIELDS
            and not reads & SIZE_FIELDS
            and not any(_evaluate(st, module, clause, a) for a in attns)
        ):
            dropped.append((clause, reads))
        else:
            kept.append(clause)
    if not dropped or not kept:
        return test, ""
    rest = kept[0] if len(kept) == 1 else ast.BoolOp(op=ast.Or(), values=kept)
    said = "; ".join(
        f"`{ast.unparse(c)}` (config.{', config.'.join(sorted(r))}) is false on every layer"
        for c, r in dropped
    )
    return rest, f" ({said})"


def _rotation_names(st: AnalyzerState, rotating: list[int]) -> set[str]:
    """The names of the rotation functions the rotating layers call."""
    names: set[str] = set()
    for index in rotating[:1]:
        for value in layer_inputs.attention_outputs(st, index)[:1]:
            names |= {n.ref.name for n in walk(value) if st.is_rotation(n) and isinstance(n.ref, FuncRef)}
    return names


def _guard(st: AnalyzerState, cls: SourceClass, names: set[str]) -> tuple[Any, ast.expr] | None:
    """The module and test of the one ``if`` of ``cls.forward`` whose body
    calls a function of ``names`` (and whose ``else`` does not)."""
    found = st.interp.find_method(cls, "forward")
    if found is None or not names:
        return None
    klass, fn = found
    tests = [
        node.test
        for node in ast.walk(fn)
        if isinstance(node, ast.If) and _calls(node.body, names) and not _calls(node.orelse, names)
    ]
    return (klass.module, tests[0]) if len(tests) == 1 else None


def _calls(body: list[ast.stmt], names: set[str]) -> bool:
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in names:
                    return True
    return False


def _guard_fields(st: AnalyzerState, cls: SourceClass, test: ast.expr) -> set[str] | None:
    """The config fields the guard's ``self.<attr>`` values are computed
    from in ``cls.__init__`` (locals followed); None when the guard reads
    other names or an attribute not assigned there."""
    found = st.interp.find_method(cls, "__init__")
    if found is None or found[0] != cls:
        return None
    init = found[1]
    params = [a.arg for a in init.args.posonlyargs + init.args.args]
    if len(params) < 2:
        return None
    config = params[1]
    assigned = _assignments(init)
    fields: set[str] = set()
    for chain in _self_chains(test, params[0]):
        value = assigned.get(f"self.{chain[0]}")
        if len(chain) == 2 and isinstance(value, ast.Name) and value.id == config:
            fields.add(chain[1])  # self.config.<field>
            continue
        reads = _reads(value, assigned, config, set(params), set()) if len(chain) == 1 else None
        if reads is None:
            return None
        fields |= reads
    return fields


def _self_chains(test: ast.expr, self_name: str) -> list[list[str]]:
    """The attribute chains of ``test`` rooted at ``self`` (``self.a.b`` ->
    ``["a", "b"]``); a name other than ``self`` gives ``[""]`` (not followed)."""
    inner = {id(n.value) for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    chains = []
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and node.id != self_name:
            chains.append([""])
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        chains.append(chain if isinstance(base, ast.Name) and base.id == self_name else [""])
    return chains


def _assignments(init: ast.FunctionDef) -> dict[str, ast.expr]:
    """``name`` / ``self.attr`` -> the value last assigned to it in ``init``'s top-level statements."""
    out: dict[str, ast.expr] = {}
    for stmt in init.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                out[target.id] = stmt.value
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                out[f"{target.value.id}.{target.attr}"] = stmt.value
    return out


def _reads(
    expr: ast.expr | None, assigned: dict[str, ast.expr], config: str, params: set[str], seen: set[str]
) -> set[str] | None:
    """The config fields ``expr`` reads (``config.x``, ``getattr`` /
    ``hasattr(config, "x")``), through the locals it uses; None for a name
    that is neither a parameter, a builtin nor a local assigned before."""
    if expr is None:
        return None
    fields: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == config:
            fields.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            first, second = node.args[0], node.args[1]
            if isinstance(first, ast.Name) and first.id == config and isinstance(second, ast.Constant):
                fields.add(str(second.value))
        elif isinstance(node, ast.Name) and node.id not in params and node.id not in ("hasattr", "getattr"):
            if node.id in seen or node.id not in assigned:
                return None
            inner = _reads(assigned[node.id], assigned, config, params, seen | {node.id})
            if inner is None:
                return None
            fields |= inner
    return fields


def _evaluate(st: AnalyzerState, module: Any, test: ast.expr, attn: Instance) -> Any:
    """The guard's truth on ``attn`` (its value when not a plain bool / number / None)."""
    value = st.interp.eval(test, {"self": attn}, module, None)
    return bool(value) if value is None or isinstance(value, (bool, int, float)) else value


def _rebuilt(st: AnalyzerState, module: Any, test: ast.expr, attn: Instance, window: Any) -> Any:
    """The guard on ``attn``'s class built again with ``sliding_window=window``."""
    config = st.interp.config.copy()
    config.overrides = {**(config.overrides or {}), "sliding_window": window}
    kwargs = {k: config if isinstance(v, ConfigProxy) else v for k, v in attn.args.items()}
    return _evaluate(st, module, test, st.interp.instantiate(attn.cls, [], kwargs, {}))
