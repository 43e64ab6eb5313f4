"""The mixture-of-experts families: which calls route tokens and which
compute experts.

The real vllm_neuron MoE packages route in several places: the prefill
router (``NF.router``), the router fused into the decode kernel
(``NF.moe_block_tkg``, which normalizes, routes and runs the experts in one
call), a fused norm-router-top-k kernel for all-to-all decode
(``NF.rmsnorm_router_topk_tkg``), and, in hand-written or Hugging Face-style
code, an explicit matmul with the router weight or a router module called
through ``self``. The experts run in the blockwise prefill kernel
(``NF.moe_cte``), the fused decode kernels (``NF.moe_block_tkg``,
``NF.moe_tkg``), op-by-op substitutes of them (module functions named
``_moe_...``), loops over expert modules, and shared experts (an ``NF.mlp``
of an experts or MoE class, or a shared-expert module it calls).

This module only classifies calls; ``families.FAMILIES`` registers the
families and ``sites.find_sites`` finds them in every forward method.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import call_name, dotted, self_attr

if TYPE_CHECKING:  # pragma: no cover
    from autoport_cst.transform.anatomy.families import Owner

# ``router_weight``, ``gate_weight``, ``routing_gate_weight``, ``router_bias``-free names
# of a router's weight held by the class (an MLP's ``gate_proj_weight`` is not one)
ROUTER_WEIGHT = re.compile(r"^(router|gate|routing)(_gate)?_weight$|^router\w*_weight$")
# modules that hold a router's weight (``self.gate.weight`` in Hugging Face-style code)
ROUTER_MODULES = ("gate", "router")
MOE_ROLES = ("experts", "moe")


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _kernel(call: cst.Call) -> str | None:
    """Dotted name of a function call that can be a kernel (not a module called
    through ``self``, not a class, not a getter)."""
    name = call_name(call)
    if name is None or name.startswith("self."):
        return None
    last = _last(name)
    if last[:1].isupper() or last.startswith(("get_", "resolve_", "set_")):
        return None
    return name


def is_router_kernel(name: str) -> bool:
    """``NF.router``, ``NF.rmsnorm_router_topk_tkg``, and the decode kernels
    that route inside (``NF.moe_block_tkg`` and its substitutes)."""
    last = _last(name).lstrip("_")
    return "router" in last or "moe_block" in last


EXPERT_KERNELS = ("moe_cte", "moe_tkg", "moe_block_tkg")


def is_expert_kernel(name: str) -> bool:
    """``NF.moe_cte``, ``NF.moe_tkg``, ``NF.moe_block_tkg`` and module
    functions named ``_moe_...`` (op-by-op substitutes). A bare local name
    (``moe_func = ...; moe_func(x)``) is not a kernel: what it runs is."""
    if "router" in _last(name):
        return False  # a router substitute (``_moe_router``) routes, the experts run after it
    if "." in name:
        return _last(name).startswith("moe_")
    return name in EXPERT_KERNELS or name.startswith("_moe_")


def is_router_weight(node: cst.CSTNode, owner: Owner) -> bool:
    """``self.router_weight`` (a router parameter), or ``self.gate.weight`` of
    a router module held by an MoE class."""
    attr = self_attr(node)
    if attr is not None:
        return bool(ROUTER_WEIGHT.search(attr)) and "proj" not in attr
    if isinstance(node, cst.Attribute) and node.attr.value == "weight":
        held = self_attr(node.value)
        return held in ROUTER_MODULES and (owner.role in MOE_ROLES or owner.role == "router")
    return False


def reads_router_weight(node: cst.CSTNode, owner: Owner) -> bool:
    """Whether ``node`` reads a router weight itself: the weight, or an
    expression of it (``.T``, ``.to(...)``, ``x @ w``), but not through the
    arguments of a nested call (that call is the site)."""
    if is_router_weight(node, owner):
        return True
    if isinstance(node, cst.Call):
        return reads_router_weight(node.func, owner)
    for name in getattr(node, "__dataclass_fields__", ()):
        value = getattr(node, name)
        children = value if isinstance(value, (list, tuple)) else (value,)
        for child in children:
            if isinstance(child, cst.CSTNode) and reads_router_weight(child, owner):
                return True
    return False


def _module_kind(call: cst.Call, owner: Owner, roles: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """``self.<attr>(...)`` built from a class of one of ``roles``, or an
    attribute named one of ``names`` (or containing one of them)."""
    attr = self_attr(call.func)
    if attr is None:
        return None
    built = owner.attr_classes.get(attr, "")
    if built and class_role(_last(built)) in roles:
        return f"self.{attr}"
    if any(name == attr or name in attr for name in names):
        return f"self.{attr}"
    return None


def router_kind(call: cst.Call, owner: Owner) -> str | None:
    """A router computation: a router kernel, a router module called by an MoE
    class, or a call that takes the router weight (an explicit matmul)."""
    name = _kernel(call)
    if name is not None and is_router_kernel(name):
        return name
    if owner.role in MOE_ROLES:
        attr = self_attr(call.func)
        built = owner.attr_classes.get(attr or "", "")
        if attr in ROUTER_MODULES or class_role(_last(built)) == "router":
            return f"self.{attr}"
    if self_attr(call.func) is None and any(reads_router_weight(arg.value, owner) for arg in call.args):
        return call_name(call) or "router matmul"
    return None


def experts_kind(call: cst.Call, owner: Owner) -> str | None:
    """An expert computation: an MoE kernel, a shared expert (``NF.mlp`` in an
    experts or MoE class, or a shared-expert module), or an expert module
    called in a loop (``self.experts[i](x)``, ``expert_layer(x)``)."""
    name = _kernel(call)
    if name is not None and is_expert_kernel(name):
        return name
    if owner.role in MOE_ROLES:
        if name is not None and "mlp" in _last(name).lower():
            return name
        kind = _module_kind(call, owner, ("mlp", "experts"), ("shared_expert",))
        if kind is not None:
            return kind
    func = call.func
    if isinstance(func, cst.Subscript) and "expert" in (dotted(func.value) or ""):
        return f"{dotted(func.value)}[...]"
    if isinstance(func, cst.Name) and "expert" in func.value and not func.value[:1].isupper():
        return func.value
    return None
