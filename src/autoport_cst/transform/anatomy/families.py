"""The families of sites: which calls belong to each family of computation.

A family is what a codemod changes. Each one names the calls that compute
it, found structurally: kernel calls by their name (``NF.flash_attention``,
``NF.segmented_attention_cp``, an op-by-op substitute such as
``_attention_decode_unfused``), module calls by the role of the class the
attribute holds (``self.self_attn(...)`` of an ``<Prefix>Attention``), and
norm weights handed to fused kernels (``ln_w=self.input_layernorm.weight``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from autoport_cst.transform.anatomy.moe_families import experts_kind, router_kind
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    IS_ATTRIBUTE,
    call_name,
    dotted,
    nodes_of,
    self_assignment,
    self_attr,
    walk,
)


def _callee(call: cst.Call) -> str | None:
    """Dotted name of a call that can be a kernel: a function, not a module
    called through ``self``, a class, or a getter of groups and classes."""
    name = call_name(call)
    if name is None or name.startswith("self."):
        return None
    last = _last(name)
    if last[:1].isupper() or last.startswith(("get_", "resolve_")):
        return None
    return name


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_decode_kernel(name: str) -> bool:
    last = _last(name)
    return "attention_decode" in last and "mask" not in last


def is_attention_kernel(name: str) -> bool:
    last = _last(name).lower()
    return "attention" in last and "mask" not in last and "merge" not in last


def _kernel_kind(predicate: Callable[[cst.Call], bool]):
    def kind(call: cst.Call, _owner: Owner) -> str | None:
        name = _callee(call)
        return name if name is not None and predicate(call) else None

    return kind


def _attention_kernel(call: cst.Call) -> bool:
    return is_attention_kernel(_callee(call) or "")


def _output(call: cst.Call) -> bool:
    name = _callee(call) or ""
    return _last(name) == "o_proj" or is_decode_kernel(name)


def _mlp_kernel(call: cst.Call) -> bool:
    name = _callee(call) or ""
    return "mlp" in _last(name).lower()


class Owner:
    """A class and what its ``__init__`` (and other methods) assign to ``self``
    (read on first use: a family that asks only of kernel calls never does)."""

    def __init__(self, cls: cst.ClassDef, role: str | None) -> None:
        self.cls = cls
        self.role = role

    @cached_property
    def attr_classes(self) -> dict[str, str]:
        """self attribute -> the class it is built from (the first call assigned to it)."""
        attrs: dict[str, str] = {}
        for node in nodes_of(self.cls, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and isinstance(pair[1], cst.Call) and pair[0] not in attrs:
                attrs[pair[0]] = dotted(pair[1].func) or ""
        return attrs


SUBLAYER_NAMES = ("self_attn", "attn", "attention", "mlp", "feed_forward", "block_sparse_moe", "moe")


def _module_call_kind(roles: tuple[str, ...], names: tuple[str, ...] = ()):
    """``self.<attr>(...)`` where ``attr`` is built from a class of one of
    ``roles`` (or, when built dynamically, is named one of ``names``)."""

    def kind(call: cst.Call, owner: Owner) -> str | None:
        attr = self_attr(call.func)
        if attr is None:
            return None
        built = owner.attr_classes.get(attr)
        if built is not None and class_role(built) in roles:
            return f"self.{attr}"
        if (built is None or class_role(built) is None) and attr in names:
            return f"self.{attr}"
        return None

    return kind


def _norm_kind(call: cst.Call, owner: Owner) -> str | None:
    """A norm module called, or a norm's weight handed to a fused kernel."""
    direct = _module_call_kind(("norm",))(call, owner)
    if direct is not None:
        return direct
    for arg in call.args:
        for node in walk(arg.value):
            if IS_ATTRIBUTE[type(node)] and node.attr.value in ("weight", "bias"):  # type: ignore[attr-defined]
                attr = self_attr(node.value)  # type: ignore[attr-defined]
                if attr is not None and class_role(owner.attr_classes.get(attr, "")) == "norm":
                    return f"{dotted(call.func) or 'call'}({dotted(node)})"
    return None


def _named_attr_kind(names: tuple[str, ...], ctors: tuple[str, ...]):
    def kind(call: cst.Call, owner: Owner) -> str | None:
        attr = self_attr(call.func)
        if attr is None:
            return None
        built = owner.attr_classes.get(attr, "")
        if attr in names or _last(built) in ctors:
            return f"self.{attr}"
        return None

    return kind


@dataclass(frozen=True)
class Family:
    name: str
    doc: str
    kind: Callable[[cst.Call, Owner], str | None]
    roles: tuple[str, ...] | None = None  # class roles searched (None: every class)
    # kinds whose footprint is the call alone: a fused kernel that is handed a
    # module's weight computes with it itself, so a change to the module
    # (its class, its forward) does not reach the kernel
    narrow: Callable[[str], bool] = lambda kind: False


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "attention.kernel",
            "attention kernels: flash, segmented (and with context parallelism), "
            "fused decode and their op-by-op substitutes",
            _kernel_kind(_attention_kernel),
        ),
        Family(
            "attention.qkv",
            "the queries, keys and values each attention kernel consumes (projection, "
            "q/k norms, RoPE, biases: all in the kernel call's footprint)",
            _kernel_kind(_attention_kernel),
        ),
        Family(
            "attention.output", "output projection: NF.o_proj and the decode kernel", _kernel_kind(_output)
        ),
        Family(
            "rope.application",
            "where rotated queries and keys are consumed: each attention kernel",
            _kernel_kind(_attention_kernel),
        ),
        Family(
            "decoder.sublayer",
            "each call of the attention or MLP/MoE module in a decoder layer's forwards",
            _module_call_kind(("attention", "mlp", "moe", "experts"), SUBLAYER_NAMES),
            roles=("decoder_layer",),
        ),
        Family("mlp.kernel", "dense MLP kernels (NF.mlp and substitutes)", _kernel_kind(_mlp_kernel)),
        Family(
            "norm.application",
            "norm modules called, and norm weights fused into kernels",
            _norm_kind,
            narrow=lambda kind: "(" in kind,
        ),
        Family(
            "embedding.lookup",
            "token embedding lookups",
            _named_attr_kind(("embed_tokens",), ("VocabDimShardedEmbedding",)),
        ),
        Family(
            "lm_head.logits",
            "LM-head projections",
            _named_attr_kind(("lm_head",), ("ColumnParallelLinear",)),
            roles=("causal_lm",),
        ),
        Family("rope.frequencies", "rotary-embedding modules called", _module_call_kind(("rotary",))),
        Family(
            "moe.router",
            "MoE routing: NF.router, the router fused in NF.moe_block_tkg, fused router kernels, "
            "router modules and explicit matmuls with the router weight",
            router_kind,
        ),
        Family(
            "moe.experts",
            "MoE expert computation: NF.moe_cte, NF.moe_block_tkg, NF.moe_tkg and substitutes, "
            "expert modules called in loops, shared experts",
            experts_kind,
        ),
    )
}
