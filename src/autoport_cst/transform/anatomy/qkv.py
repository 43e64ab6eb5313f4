"""The query/key/value projection of an attention class: its calls, the
loaders of the tensors laid out like it, and where new per-layer settings
may go.

The real vllm_neuron attention classes project q, k and v in several places:
``NF.qkv_proj`` in prefill (a plain call, and in chunked prefill a call with
``use_block_kv=True`` that also writes the paged cache), sometimes with RoPE
fused into it (``cos_cache``/``sin_cache``), and the decode kernel
``NF.attention_decode`` (or its op-by-op substitute). A codemod that changes
the projection (a bias, q/k norms) changes each of them: :func:`projections`
lists them, and :func:`stray_reads` names any other read of the projection's
weights, which the codemod then refuses.

Tensors laid out like the fused ``[q | k | v]`` projection (its bias, the
weights of a norm over all query heads) are sharded exactly as its weight
loader shards the weight, attention data parallelism included: their loaders
take the same arguments (:func:`qkv_loader_arguments`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.anatomy.sites import is_forward_method
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    keyword_arg,
    self_assignment,
    self_attr,
    statements,
    walk,
)

DECODE_KERNELS = ("NF.attention_decode", "_attention_decode_unfused")


QKV_PROJ_UNFUSED = "_qkv_proj_unfused"

# -- the projection calls ----------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """One place an attention class projects q, k and v: ``kind`` is
    ``prefill`` (``NF.qkv_proj`` or its substitute) or ``decode`` (the decode
    kernel or its substitute)."""

    call: cst.Call
    kind: str
    method: cst.FunctionDef

    @property
    def fused_rope(self) -> bool:
        """A prefill projection that also rotates q and k (``cos_cache`` and
        ``sin_cache`` given)."""
        return self.kind == "prefill" and all(
            (arg := keyword_arg(self.call, name)) is not None and dotted(arg.value) != "None"
            for name in ("cos_cache", "sin_cache")
        )


def _last(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


def projection_kind(call: cst.Call) -> str | None:
    name = dotted(call.func)
    if name is None or name.startswith("self."):
        return None
    if _last(name) in ("qkv_proj", QKV_PROJ_UNFUSED):
        return "prefill"
    if _last(name) in [_last(k) for k in DECODE_KERNELS]:
        return "decode"
    return None


def forward_methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef) and is_forward_method(s)]


def projections(cls: cst.ClassDef) -> list[Projection]:
    """Every projection call in the forward methods of ``cls``."""
    found = []
    for func in forward_methods(cls):
        for node in walk(func):
            if isinstance(node, cst.Call) and (kind := projection_kind(node)) is not None:
                found.append(Projection(node, kind, func))
    return found


def stray_reads(cls: cst.ClassDef, attr: str, handled: list[cst.Call]) -> cst.CSTNode | None:
    """The first read of ``self.<attr>`` in a forward method of ``cls`` that
    is not inside one of the ``handled`` calls (a computation with the
    tensor that a codemod changing it would leave as it is)."""
    inside = {id(n) for call in handled for n in walk(call)}
    for func in forward_methods(cls):
        for node in walk(func):
            if id(node) not in inside and self_attr(node) == attr:
                return node
    return None


# -- loaders of tensors laid out like the projection ------------------------------------------

# fused_qkv_weight_loader's parameters, in order
QKV_LOADER_PARAMETERS = (
    "q_size",
    "kv_size",
    "shard_dim",
    "num_shards",
    "is_storage_transposed",
    "num_kv_replicas",
    "padded_hidden_size",
    "unpadded_hidden_size",
    "attention_dp_rank",
    "attention_dp_size",
    "kv_sharded_across_attention_dp",
)


# those that say which rows of q, k and v a rank holds (the others lay out
# the weight's hidden dimension, which a bias or a norm weight does not have)
QKV_SHARDING = (
    "q_size",
    "kv_size",
    "num_shards",
    "num_kv_replicas",
    "attention_dp_rank",
    "attention_dp_size",
    "kv_sharded_across_attention_dp",
)


ATTENTION_DP = ("attention_dp_rank", "attention_dp_size", "kv_sharded_across_attention_dp")


def qkv_loader_arguments(call: cst.Call) -> tuple[dict[str, str], list[cst.Arg]]:
    """``(sharding arguments, unknown arguments)`` of a
    ``fused_qkv_weight_loader(...)`` call: the code of each argument in
    ``QKV_SHARDING``, by name (positional ones by the signature), and the
    arguments that are not its parameters (``*args``, ``**kwargs``, other names)."""
    found: dict[str, str] = {}
    unknown: list[cst.Arg] = []
    position = 0
    for arg in call.args:
        if arg.star:
            unknown.append(arg)
            continue
        if arg.keyword is None:
            name = QKV_LOADER_PARAMETERS[position] if position < len(QKV_LOADER_PARAMETERS) else None
            position += 1
        else:
            name = arg.keyword.value
        if name is None or name not in QKV_LOADER_PARAMETERS:
            unknown.append(arg)
        elif name in QKV_SHARDING:
            found[name] = code_of(arg.value).strip()
    return found, unknown


def function_parameters(module: cst.Module, name: str) -> list[str] | None:
    """The parameter names of the module-level function ``name`` (None when
    the module defines no such function)."""
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return [
                p.name.value
                for p in (*stmt.params.posonly_params, *stmt.params.params, *stmt.params.kwonly_params)
            ]
    return None


def unsupported_arguments(call: cst.Call, parameters: tuple[str, ...]) -> list[str]:
    """Arguments of ``call`` a substitute with ``parameters`` cannot take:
    positional ones, ``*args``/``**kwargs`` and unknown keywords."""
    out = []
    for arg in call.args:
        if arg.star:
            out.append(f"{arg.star}{code_of(arg.value)}")
        elif arg.keyword is None:
            out.append(f"positional {code_of(arg.value)}")
        elif arg.keyword.value not in parameters:
            out.append(arg.keyword.value)
    return out


# -- where new per-layer settings go in __init__ ----------------------------------------------


def assigned_attrs(stmt: cst.CSTNode) -> set[str]:
    """``self`` attributes assigned anywhere in a top-level statement."""
    found = set()
    for node in walk(stmt):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None:
                found.add(pair[0])
    return found


def after_attrs(
    init: cst.FunctionDef, attrs: set[str], default: cst.BaseStatement | None
) -> tuple[cst.BaseStatement | None, set[str]]:
    """The top-level statement of ``init`` after which statements reading
    ``self.<attr>`` for every attr of ``attrs`` may go: ``default`` when all
    are assigned by then, else the statement assigning the last of them.
    Returns ``(anchor, attrs never assigned in init)``."""
    body = list(statements(init))
    first: dict[str, int] = {}
    for index, stmt in enumerate(body):
        for attr in assigned_attrs(stmt):
            first.setdefault(attr, index)
    missing = {a for a in attrs if a not in first}
    needed = max((first[a] for a in attrs if a in first), default=-1)
    start = body.index(default) if default is not None and default in body else -1
    if start >= needed:
        return default, missing
    return (body[needed] if needed >= 0 else default), missing


def self_attribute_behind(loader, code: str) -> str | None:
    """The ``self`` attribute an argument of ``loader``'s call holds: ``x``
    for ``self.x``, or for a local bound to ``self.x`` (``ddp =
    self.attention_dp_size``) before the loader's statement in its function."""
    from autoport_cst.transform.anatomy.loaders import placed_statements, plain_binding
    from autoport_cst.transform.cst.snippets import parse_expr

    expr = parse_expr(code)
    for _ in range(10):
        attr = self_attr(expr)
        if attr is not None:
            return attr
        if not isinstance(expr, cst.Name):
            return None
        placed = placed_statements(loader.function)
        at = next((p.index for p in placed if p.stmt is loader.placed.stmt), len(placed))
        values = [v for p in placed[:at] if (v := plain_binding(p.stmt, expr.value)) is not None]
        if not values:
            return None
        expr = values[-1]
    return None


# -- RoPE parameters in the config ------------------------------------------------------------

ROPE_DICTS = ("rope_parameters", "rope_scaling")


def rope_dict_attribute(module: cst.Module) -> str | None:
    """The config attribute holding the RoPE parameters that ``module``
    reads (``config.rope_parameters[...]``, transformers v5's name, or
    ``config.rope_scaling``); None when it reads neither."""
    read = {n.attr.value for n in walk(module) if isinstance(n, cst.Attribute) and n.attr.value in ROPE_DICTS}
    return next((name for name in ROPE_DICTS if name in read), None)


def mentions(module: cst.Module, name: str) -> bool:
    """Whether ``name`` occurs in ``module`` as a name, an attribute or a string."""
    for node in walk(module):
        if isinstance(node, cst.Name) and node.value == name:
            return True
        if isinstance(node, cst.SimpleString) and name in node.value:
            return True
    return False


# -- RoPE pairs of the checkpoint moved to the kernel's pairs (partial-rotary, interleaved-rope) ---

# per-head gammas held as bare parameters (qwen3_moe): (parameter, width)
BARE_NORM_GAMMAS = (("q_norm_weight", "self.head_dim"), ("k_norm_weight", "self.head_dim"))


QK_CHECKPOINT_PARTS = (".q_proj.", ".k_proj.", ".q_norm.", ".k_norm.", "qkv_proj")


def rope_targets(cls: cst.ClassDef, norm_bias: bool = False) -> list[tuple[str, str]]:
    """``(parameter path after self., width of its query/key part)`` of every
    tensor of ``cls`` laid out in query/key head columns: the fused QKV weight
    and bias, and the query/key norm gammas (per head, or over all heads) and,
    with ``norm_bias`` (the model's norm class has one: LayerNorm), their biases."""
    from autoport_cst.transform.anatomy.attention import find_self_assignment_deep, self_parameters
    from autoport_cst.transform.anatomy.norm import norm_is_full_width

    params = self_parameters(cls)
    targets = [(p, width) for p, width in ROPE_REORDERED if p in params]
    init = next(
        (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
    )
    for norm in ("q_norm", "k_norm"):
        if init is not None and find_self_assignment_deep(init, norm) is not None:
            width = "self.head_dim"
            if norm_is_full_width(cls, norm):
                width = "self.q_size" if norm == "q_norm" else "self.kv_size"
            targets += [(f"{norm}.{t}", width) for t in ("weight", "bias") if t == "weight" or norm_bias]
    targets += [(p, width) for p, width in BARE_NORM_GAMMAS if p in params]
    return targets


def unknown_qk_tensors(cls: cst.ClassDef, module: cst.Module, known: set[str]) -> list[tuple[str, str]]:
    """``(parameter, checkpoint keys)`` of the parameters of ``cls`` that this
    file's ``load_weights`` maps from query/key checkpoint tensors but whose
    layout ``rope_targets`` does not know."""
    from autoport_cst.transform.anatomy.attention import self_parameters
    from autoport_cst.transform.anatomy.mappings import mapping_entries

    entries = mapping_entries(module)
    found = []
    for param in self_parameters(cls):
        if param in known or param.startswith("o_proj"):
            continue
        for entry in entries:
            if not entry.key.endswith(f".{param}"):
                continue
            text = code_of(entry.value)
            if any(part in text for part in QK_CHECKPOINT_PARTS):
                found.append((param, " ".join(text.split())))
    return found


# (parameter, width of its query/key part)
ROPE_REORDERED = (
    ("qkv_proj_weight", "self.q_size + self.kv_size"),
    ("qkv_proj_bias", "self.q_size + self.kv_size"),
)
