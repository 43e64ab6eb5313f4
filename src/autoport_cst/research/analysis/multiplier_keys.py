"""The config fields a port reads a constant multiplier from, when the model
names them otherwise than the port's field (``checkpoint.config_keys``).

MiniCPM3 multiplies its input embeddings by ``config.scale_emb`` (a port
reads ``embedding_multiplier``) and divides the LM head's input by its
config's ``logits_scaling`` property, ``hidden_size / dim_model_base``, which
config.json does not hold: the port computes it from those two fields.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from typing import Any

from autoport_cst.research.analysis.config_expressions import (
    add_config_key,
    config_expression,
    config_values,
    matching,
)
from autoport_cst.research.analysis.graph import number, strip_casts
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.values import Instance, Node


def embedding_multiplier_key(st: AnalyzerState, instances: list[Instance], factor: float, where: str) -> None:
    """The one config field the backbone or its embedding read at build time
    whose value is ``factor``; the port's ``embedding_multiplier`` is read
    from it when it has another name."""
    config = st.interp.config
    read = sorted({key for instance in instances for keys in instance.attr_reads.values() for key in keys})
    found = [key for key in read if config.has(key) and _equal(config.read(key, None), factor)]
    if len(found) == 1 and found[0] != "embedding_multiplier":
        evidence = f"{where}: embeddings multiplied by config.{found[0]} = {factor:g}"
        add_config_key(st, "embedding_multiplier", found[0], evidence)


def derived_property(config: Any, key: str, value: float) -> str | None:
    """``key`` as arithmetic of other config fields when the config class
    (``config``: the interpreter's view) computes it in a property (``return
    self.hidden_size / self.dim_model_base``) that gives ``value``; None
    otherwise."""
    prop = getattr(config.config_class, key, None)
    if not isinstance(prop, property) or prop.fget is None:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(prop.fget)))
    except (OSError, TypeError, SyntaxError):
        return None
    returns = [n.value for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    text = config_expression(returns[0], frozenset({"self"})) if len(returns) == 1 else None
    return text if text is not None and matching(text, config_values(config, text), value) else None


def head_input_divisor(call: Node) -> float:
    """What an LM head's input is divided by (MiniCPM3's ``hidden_states /
    logits_scaling``), through the rows it keeps (``slice_logits_to_keep``,
    a subscript) and dtype casts: for a head without a bias the logits are
    divided by the same."""
    value = call.args[0] if call.args else call.kwarg("input")
    divisor = 1.0
    for _ in range(16):
        value = strip_casts(value)
        if not isinstance(value, Node):
            break
        if value.kind == "binop" and value.name in ("mul", "div") and number(value.args[1]) and value.args[1]:
            divisor *= value.args[1] if value.name == "div" else 1.0 / value.args[1]
            value = value.args[0]
        elif value.kind == "binop" and value.name == "mul" and number(value.args[0]) and value.args[0]:
            divisor /= value.args[0]
            value = value.args[1]
        elif value.args and (value.kind == "item" or value.name.rsplit(".", 1)[-1] == "slice_logits_to_keep"):
            value = value.args[0]
        else:
            break
    return divisor


def _equal(held: Any, factor: float) -> bool:
    return (
        isinstance(held, (int, float))
        and not isinstance(held, bool)
        and math.isclose(held, factor, rel_tol=1e-9)
    )
