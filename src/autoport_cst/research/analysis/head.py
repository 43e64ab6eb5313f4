"""The embedding and LM head section: the token embedding and its scale
(sqrt(hidden_size) or a constant multiplier between it and the first
layer), learned position embeddings added to it, the final norm, and the
head: its bias, tying declared by the class, tanh softcapping and a
logits divisor or multiplier with the config field it comes from."""

from __future__ import annotations

import ast
import math
from typing import Any

from autoport_cst.research.analysis.config_expressions import add_config_key
from autoport_cst.research.analysis.graph import (
    computes_sin_cos,
    number,
    scalar_path,
    sin_cos_table,
    strip_casts,
    unique,
)
from autoport_cst.research.analysis.multiplier_keys import (
    derived_property,
    embedding_multiplier_key,
    head_input_divisor,
)
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import UNKNOWN, Instance, Node, ScalarTensor
from autoport_cst.research.interp.walk import walk


def analyze_backbone(st: AnalyzerState, path: str, backbone: Instance) -> None:
    """The backbone: its token embedding, final norm, extra embeddings and
    the embedding scale."""
    where = st.where(backbone)
    embeds = [(n, c) for n, c in backbone.children() if st.role(c) == "embedding"]
    if len(embeds) < 1:
        st.add(unknown("embedding.scale", CODE, f"{where}: no token embedding found"))
        return
    embed_name, embed = embeds[0]
    st.result.embed_key = f"{path}.{embed_name}.weight" if path else f"{embed_name}.weight"
    st.result.module_names["model.embed_tokens"] = st.result.embed_key[: -len(".weight")]
    _final_norm(st, path, backbone)
    if len(embeds) > 1:
        _extra_embeddings(st, path, backbone, embeds, where)
    _embedding_scale(st, backbone, embed_name, embed, where)


def _extra_embeddings(
    st: AnalyzerState, path: str, backbone: Instance, embeds: list[tuple[str, Instance]], where: str
) -> None:
    """Embeddings beyond the token embedding; learned positions when one is
    added to the first layer's input (its module path the canonical
    ``model.embed_positions`` when it is the only one)."""
    st.add(
        known(
            [n for n, _ in embeds[1:]],
            "code.extra_embeddings",
            CODE,
            f"{where}: more embeddings than the token embedding (absolute positions?)",
        )
    )
    extra = {id(c): n for n, c in embeds[1:]}
    added = sorted(
        {
            extra[id(n.ref)]
            for state in st.forward(backbone)
            for call in walk(state.value)
            if call.kind == "module" and call.ref is st.layers[0]
            for n in walk(call.args[0] if call.args else call.kwarg("hidden_states"))
            if n.kind == "module" and id(n.ref) in extra
        }
    )
    if len(added) == 1:
        st.result.module_names["model.embed_positions"] = f"{path}.{added[0]}" if path else added[0]
    if added:
        st.add(
            known(
                True,
                "embedding.learned_positions",
                CODE,
                f"{where}: the first layer's input adds {', '.join(added)} to the token embedding",
            )
        )


def _embedding_scale(
    st: AnalyzerState, backbone: Instance, embed_name: str, embed: Instance, where: str
) -> None:
    """Scalars between the token embedding (including its own forward) and
    the first layer: sqrt(hidden_size) or another constant."""
    factors, untraced, evidence = _embedding_factors(st, backbone, embed)
    if not factors and not untraced:
        st.add(
            unknown(
                "embedding.scale", CODE, f"{where}: the first layer's input is not traced to {embed_name}"
            )
        )
        return
    if len(factors) > 1 or untraced:
        st.add(unknown("embedding.scale", CODE, f"{where}: embedding scaling differs between paths"))
        return
    factor = factors.pop()
    hidden = st.dims.get("hidden_size")
    shown = " ".join(evidence) or "none"
    if math.isclose(factor, 1.0):
        st.add(known("none", "embedding.scale", CODE, f"{where}: embeddings enter the first layer unscaled"))
        st.add(known(None, "embedding.multiplier", CODE, f"{where}: no constant multiplier"))
    elif isinstance(hidden, int) and math.isclose(factor, math.sqrt(hidden), rel_tol=1e-6):
        st.add(
            known(
                "sqrt_hidden",
                "embedding.scale",
                CODE,
                f"{where}: embeddings multiplied by {factor:g} = sqrt(hidden_size) ({shown})",
            )
        )
        _scale_dtype(st, backbone, embed, where)
        st.add(known(None, "embedding.multiplier", CODE, f"{where}: the scale is sqrt(hidden_size)"))
    else:
        inner, _ = _embedding_factor(st, embed)
        inside = inner is not None and math.isclose(inner, factor, rel_tol=1e-9)
        why = "the embedding module multiplies its own output" if inside else "not sqrt(hidden_size)"
        st.add(
            known(
                "multiplier" if inside else "none",
                "embedding.scale",
                CODE,
                f"{where}: a constant scale, {why}",
            )
        )
        st.add(
            known(
                factor,
                "embedding.multiplier",
                CODE,
                f"{where}: embeddings multiplied by {factor:g} ({shown})",
            )
        )
        embedding_multiplier_key(st, [backbone, embed], factor, where)


def _scale_dtype(st: AnalyzerState, backbone: Instance, embed: Instance, where: str) -> None:
    """How the scale is multiplied in: a 0-dim tensor made in (or cast to)
    the activations' dtype (Gemma: rounded to bfloat16 in a bfloat16 model),
    or a Python float (XGLM, BioGPT: unrounded)."""
    first_layer = st.layers[0]
    values = [] if embed.is_external else list(st.outputs(embed))
    for state in st.forward(backbone):
        for call in walk(state.value):
            if call.kind == "module" and call.ref is first_layer:
                values.append(call.args[0] if call.args else call.kwarg("hidden_states"))
    rounded = [
        a
        for value in values
        for n in walk(value)
        if n.kind == "binop" and n.name == "mul"
        for a in n.args
        if isinstance(a, ScalarTensor) and a.rounded
    ]
    if rounded:
        why = f"{rounded[0]:g} made a tensor in the activations' dtype before the multiply (rounded)"
    else:
        why = "a Python float (or float32 scalar) multiplied into the embeddings (unrounded)"
    st.add(
        known("model" if rounded else "float", "embedding.scale_dtype", CODE, f"{where}: the scale is {why}")
    )


def _embedding_factors(
    st: AnalyzerState, backbone: Instance, embed: Instance
) -> tuple[set[float], bool, list[str]]:
    """The constant factors between the embedding and the first layer, one
    per path of the backbone's forward; whether a path's factor is not a
    constant; the operations of the last path traced."""
    first_layer = st.layers[0]
    factors: set[float] = set()
    untraced = False  # a path whose embedding factor is not a constant
    evidence = []
    for state in st.forward(backbone):
        calls = [n for n in walk(state.value) if n.kind == "module" and n.ref is first_layer]
        for call in calls:
            arg = _through_embedding_norm(st, call.args[0] if call.args else call.kwarg("hidden_states"))
            f, ops, reached = scalar_path(
                arg,
                lambda v: isinstance(v, Node) and v.kind == "module" and v.ref is embed,
                transparent=lambda n: st.role(n.ref) == "dropout",
            )
            if not reached and (token_side := _without_positions(st, arg, embed)) is not None:
                f, ops, reached = scalar_path(
                    token_side,
                    lambda v: isinstance(v, Node) and v.kind == "module" and v.ref is embed,
                    transparent=lambda n: st.role(n.ref) == "dropout",
                )
            if reached:
                inner, inner_ops = _embedding_factor(st, embed)
                if inner is None:
                    untraced = True
                else:
                    factors.add(round(f * inner, 9))
                    evidence = ops + inner_ops
    return factors, untraced, evidence


def _through_embedding_norm(st: AnalyzerState, value: Any) -> Any:
    """The input of the embedding norm (research's ``embedding.norm``:
    ``block_features.embedding_norm_like_layers``) when ``value`` is its output through
    casts and dropout only (nothing scales it after the norm: a port norms
    the embedding module's output, scaled there); else ``value``."""
    found = st.result.get("embedding.norm")
    if found is None or found.value is not True:
        return value
    current = value
    for _ in range(8):
        current = strip_casts(current)
        if not (isinstance(current, Node) and current.kind == "module" and current.args):
            return value
        if st.role(current.ref) == "norm":
            return current.args[0]
        if st.role(current.ref) != "dropout":
            return value
        current = current.args[0]
    return value


def _without_positions(st: AnalyzerState, value: Any, embed: Instance) -> Any:
    """The token-embedding operand of the sum of ``embed``'s output and
    another embedding's (learned positions, GPT-2's ``wte + wpe``), through
    casts and dropout; None when ``value`` is not such a sum."""
    for _ in range(8):
        value = strip_casts(value)
        if (
            isinstance(value, Node)
            and value.kind == "module"
            and st.role(value.ref) == "dropout"
            and value.args
        ):
            value = value.args[0]
            continue
        break
    value = _without_token_types(value, embed)
    if not (isinstance(value, Node) and value.kind == "binop" and value.name == "add"):
        return None
    sides = [  # through casts: OPT's pos_embeds.to(inputs_embeds.device) reads only the device
        {id(m.ref) for m in walk(strip_casts(arg)) if m.kind == "module" and st.role(m.ref) == "embedding"}
        for arg in value.args
    ]
    for index, side in enumerate(sides):
        other = sides[1 - index]
        # sinusoidal positions (CTRL's function, XGLM's module: block_features reads or names them)
        table = sin_cos_table(value.args[1 - index]) or _sin_cos_module(value.args[1 - index])
        if side == {id(embed)} and (other or table is not None) and id(embed) not in other:
            return value.args[index]
    return None


def _without_token_types(value: Any, embed: Instance) -> Any:
    """``value`` without a second call of the token embedding added to it
    (GPT-Neo's ``hidden_states + wte(token_type_ids)``, on a path given
    token types: a port is given none), when the rest calls it on other
    ids (not the same call read through: XGLM's positions from the embedding's shape)."""
    if not (isinstance(value, Node) and value.kind == "binop" and value.name == "add"):
        return value
    for index, arg in enumerate(value.args):
        arg, rest = strip_casts(arg), value.args[1 - index]
        if (
            isinstance(arg, Node)
            and arg.kind == "module"
            and arg.ref is embed
            and arg.args
            and any(
                n.kind == "module" and n.ref is embed and n.args and n.args[0] is not arg.args[0]
                for n in walk(rest)
            )
        ):
            return rest
    return value


def _sin_cos_module(value: Any) -> Instance | None:
    """The module computing sines and cosines whose output ``value`` is,
    through casts (XGLM's ``embed_positions(...).to(device)``), or None."""
    value = strip_casts(value)
    if isinstance(value, Node) and value.kind == "module" and computes_sin_cos(value.ref):
        return value.ref
    return None


def _final_norm(st: AnalyzerState, path: str, backbone: Instance) -> None:
    """The norm the backbone applies to the last layer's output."""
    layer_ids = {id(layer) for layer in st.layers}  # a loop over the layers may be summarised as one call
    found = []
    for state in st.forward(backbone):
        for n in walk(state.value):
            if (
                n.kind == "module"
                and n.ref is not None
                and st.role(n.ref) == "norm"
                and n.args
                and any(m.kind == "module" and id(m.ref) in layer_ids for m in walk(n.args[0]))
            ):
                found.append(n.ref)
    found = unique(found)
    names = {name: child for name, child in backbone.children()}
    owned = [name for name, child in names.items() if any(child is f for f in found)]
    if len(owned) == 1:
        full = f"{path}.{owned[0]}" if path else owned[0]
        st.result.final_norm_key = full
        st.result.module_names["model.norm"] = full


def _embedding_factor(st: AnalyzerState, embed: Instance) -> tuple[float | None, list[str]]:
    if embed.is_external or st.interp.find_method(embed.cls, "forward") is None:
        return 1.0, []
    factors = set()
    ops_seen: list[str] = []
    for value in st.outputs(embed):
        f, ops, reached = scalar_path(
            value, lambda v: isinstance(v, Node) and v.kind == "call" and v.name.startswith("super.")
        )
        if not reached:
            return None, []
        factors.add(round(f, 9))
        ops_seen = ops
    if len(factors) != 1:
        return None, []
    return factors.pop(), ops_seen


def analyze_head(st: AnalyzerState) -> None:
    """The LM head (the projection to the vocabulary): bias, tying declared
    by the class, softcap and logit rescaling with its config field."""
    where = st.where(st.top)
    vocab = st.dims.get("vocab_size")
    heads = [
        (n, c)
        for n, c in st.top.children()
        if st.base_module(c) == "Linear" and c.args.get("out_features") == vocab
    ]
    if len(heads) != 1:
        st.add(unknown("lm_head.bias", CODE, f"{where}: {len(heads)} projections to the vocabulary"))
        return
    name, head = heads[0]
    st.result.head_key = f"{name}.weight"
    st.result.module_names["lm_head"] = name
    st.add(
        known(
            bool(head.args.get("bias")),
            "lm_head.bias",
            CODE,
            f"{where}: {name}(bias={head.args.get('bias')})",
        )
    )
    tied = st.interp.class_attribute(st.cls, "_tied_weights_keys")
    st.result.tied_keys_declared = bool(tied) if tied is not UNKNOWN else False
    # what decides the tying where config.json says nothing of it (Inkling's text config)
    if tied is not UNKNOWN and not tied:
        st.add(known(False, "embedding.tied", CODE, f"{where}: {st.cls.name} declares no _tied_weights_keys"))
    verdicts = set()
    for state in st.forward(st.top):
        logits = _logits_of(state.value, head)
        if logits is None:
            continue
        verdict = _head_ops(logits, head)
        if verdict is not None:
            verdicts.add(verdict)
    if len(verdicts) != 1:
        st.add(unknown("lm_head.softcap", CODE, f"{where}: logits not traced to {name}"))
        st.add(unknown("lm_head.logits_divisor", CODE, f"{where}: logits not traced to {name}"))
        return
    softcap, divisor = verdicts.pop()
    st.add(
        known(
            softcap,
            "lm_head.softcap",
            CODE,
            f"{where}: "
            + (f"logits = tanh(logits / {softcap:g}) * {softcap:g}" if softcap else "no tanh softcap"),
        )
    )
    st.add(
        known(
            divisor,
            "lm_head.logits_divisor",
            CODE,
            f"{where}: " + (f"logits divided by {divisor:g}" if divisor else "logits not rescaled"),
        )
    )
    if divisor is not None:
        _logits_source(st, divisor, where)


def _logits_source(st: AnalyzerState, divisor: float, where: str) -> None:
    """The config field the logits are rescaled by: divided by it
    (Granite's logits_scaling) or multiplied by it (Cohere's logit_scale)."""
    found = _logits_fields_set(st, divisor)
    forward = st.interp.find_method(st.cls, "forward")
    if not found and forward is not None:  # read in forward: logits / self.config.<key>
        found = _logits_fields_read(st, forward[1], divisor)
    if len({(k, f) for k, f, _ in found}) == 1:
        key, form, evidence = found.pop()
        st.add(known(key, "lm_head.logits_key", CODE, f"{where}: {evidence}"))
        st.add(known(form, "lm_head.logits_form", CODE, f"{where}: {evidence}"))
        field_value = divisor if form == "divisor" else 1.0 / divisor
        if (text := derived_property(st.interp.config, key, field_value)) is not None:
            add_config_key(st, key, text, f"{where}: {key} is a config property computing {text}")
    else:
        st.add(
            unknown(
                "lm_head.logits_key",
                CODE,
                f"{where}: no single config field gives the logits factor ({len(found)} candidates)",
            )
        )


def _logits_fields_set(st: AnalyzerState, divisor: float) -> set[tuple[str, str, str]]:
    """(key, form, evidence) of the config fields ``__init__`` stored in an
    attribute whose value is the logits' divisor or its inverse."""
    config = st.interp.config
    found = set()
    for attr, value in st.top.attrs.items():
        if (
            not number(value)
            or value == 0
            or not (
                math.isclose(value, divisor, rel_tol=1e-9) or math.isclose(1.0 / value, divisor, rel_tol=1e-9)
            )
        ):
            continue
        for key in sorted(st.top.attr_reads.get(attr, frozenset())):
            field_value = config.read(key, None) if config.has(key) else None
            if not number(field_value) or field_value == 0:
                continue
            if math.isclose(field_value, divisor, rel_tol=1e-9):
                found.add((key, "divisor", f"self.{attr} = config.{key}; logits / {field_value:g}"))
            elif math.isclose(1.0 / field_value, divisor, rel_tol=1e-9):
                found.add((key, "multiplier", f"self.{attr} = config.{key}; logits * {field_value:g}"))
    return found


def _logits_fields_read(
    st: AnalyzerState, forward: ast.FunctionDef | ast.AsyncFunctionDef, divisor: float
) -> set[tuple[str, str, str]]:
    """(key, form, evidence) of the ``self.config.<key>`` fields ``forward``
    reads whose value is the logits' divisor or its inverse."""
    config = st.interp.config
    found = set()
    read = sorted(
        {
            node.attr
            for node in ast.walk(forward)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "config"
        }
    )
    for key in read:
        field_value = config.read(key, None) if config.has(key) else None
        if not number(field_value) or field_value == 0:
            continue
        if math.isclose(field_value, divisor, rel_tol=1e-9):
            found.add((key, "divisor", f"forward divides the logits by self.config.{key} = {field_value:g}"))
        elif math.isclose(1.0 / field_value, divisor, rel_tol=1e-9):
            found.add(
                (key, "multiplier", f"forward multiplies the logits by self.config.{key} = {field_value:g}")
            )
    return found


def _logits_of(value: Any, head: Instance) -> Any:
    if isinstance(value, Node) and value.kind == "call":
        logits = value.kwarg("logits")
        if logits is not None:
            return logits
    if isinstance(value, (tuple, list)):
        for item in value:
            if any(n.kind == "module" and n.ref is head for n in walk(item)):
                return item
    if isinstance(value, Node) and any(n.kind == "module" and n.ref is head for n in walk(value)):
        return value
    return None


def _head_ops(value: Any, head: Instance) -> tuple[float | None, float | None] | None:
    softcap = None
    divisor = 1.0
    for _ in range(16):
        value = strip_casts(value)
        if isinstance(value, Node) and value.kind == "module" and value.ref is head:
            if not head.args.get("bias"):
                divisor *= head_input_divisor(value)
            return softcap, (None if math.isclose(divisor, 1.0) else divisor)
        if not isinstance(value, Node):
            return None
        if value.kind == "binop" and value.name == "mul":
            x, c = value.args
            if number(x):
                x, c = c, x
            inner = strip_casts(x)
            if number(c) and isinstance(inner, Node) and inner.kind == "call" and inner.name.endswith("tanh"):
                arg = strip_casts(inner.args[0]) if inner.args else None
                if (
                    isinstance(arg, Node)
                    and arg.kind == "binop"
                    and arg.name == "div"
                    and number(arg.args[1])
                    and math.isclose(arg.args[1], c)
                ):
                    softcap = float(c)
                    value = arg.args[0]
                    continue
            if number(c) and c != 0:
                divisor /= c
                value = x
                continue
            return None
        if value.kind == "binop" and value.name == "div" and number(value.args[1]):
            divisor *= value.args[1]
            value = value.args[0]
            continue
        if value.kind in ("item", "func", "call") and value.args:
            # slicing helpers (logits_to_keep) before the head
            if any(n.kind == "module" and n.ref is head for n in walk(value.args[0])):
                if value.kind == "item":
                    value = value.args[0]
                    continue
        return None
    return None
