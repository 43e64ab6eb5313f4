"""Decoder-layer structure: every forward of a decoder layer and the sublayer
calls in each (shared by the norm, residual and embedding codemods), and the logits
site of the LM head.

The bundled references compute a decoder layer in one ``forward`` with one
top-level ``h = self.<attention>(...)`` and one ``h = self.<mlp>(...)``. The
real vllm_neuron llama3 computes it in two methods: a decode ``forward``
(which moves the hidden states between data-parallel layouts with
``_dp_transition`` calls, and hands prefill to the other method) and a
``_forward_prefill``. In both, a sublayer may run inside an ``if``/``else``
whose FP8 branch hands a norm's weight to the sublayer
(``ln_w=self.input_layernorm.weight``) for a fused RMSNorm kernel, while the
other branch calls the norm module first. A codemod that changes the layer
changes every forward and every branch the same way, or guards a branch that
cannot express its change (``guard_edit``: the branch raises
``NotImplementedError`` naming the feature).

Words used here:

- a *forward* is a method of the layer that calls a sublayer;
- a *slot* is the top-level statement of a forward in which one sublayer
  runs: the call statement itself, or an ``if`` with one call statement (or
  a guard) per branch;
- a *call* is one ``v = self.<sublayer>(...)`` statement, with the norm
  statement right before it (``v = self.<norm>(v)``), the one right after it,
  and the norm whose weight it is handed (*fused*), if any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.classes import (
    LOAD_TIME,
    assigned_call,
    assigned_name,
    assigned_value,
    class_here,
    require_method,
    self_assignments,
)
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    nodes_of,
    self_attr,
    walk,
)

KINDS = ("attention", "mlp")


# class roles of each sublayer, and the attribute names of a sublayer whose
# class is picked at run time (``self.self_attn = attn_cls(config, ...)``)
ROLES = {"attention": ("attention",), "mlp": ("mlp", "moe")}


NAMES = {
    "attention": ("self_attn", "attn", "attention"),
    "mlp": ("mlp", "feed_forward", "block_sparse_moe", "moe"),
}


@dataclass
class SublayerCall:
    """One ``v = self.<sublayer>(...)`` statement of a forward."""

    kind: str  # "attention" or "mlp"
    stmt: cst.SimpleStatementLine
    call: cst.Call
    variable: str
    block: cst.IndentedBlock | None  # the branch holding it; None at the forward's top level
    pre_norm: cst.SimpleStatementLine | None  # ``v = self.<norm>(v)`` right before, same block
    post_norm: cst.SimpleStatementLine | None  # the same right after
    fused: str | None  # the norm whose weight the call is handed (``ln_w=self.<norm>.weight``)

    @property
    def pre_norm_attr(self) -> str | None:
        return _called_attr(self.pre_norm)

    @property
    def post_norm_attr(self) -> str | None:
        return _called_attr(self.post_norm)


@dataclass
class Slot:
    """The top-level statement of a forward in which one sublayer runs."""

    kind: str
    stmt: cst.BaseStatement
    calls: list[SublayerCall]  # one per live branch
    guarded: list[cst.IndentedBlock] = field(default_factory=list)  # branches that raise


@dataclass
class DecoderForward:
    func: cst.FunctionDef
    slots: dict[str, Slot]

    @property
    def body(self) -> list[cst.BaseStatement]:
        return list(self.func.body.body) if isinstance(self.func.body, cst.IndentedBlock) else []

    def calls(self) -> list[SublayerCall]:
        return [c for kind in KINDS for c in self.slots[kind].calls]


@dataclass
class DecoderLayer:
    cls: cst.ClassDef
    init: cst.FunctionDef
    forwards: list[DecoderForward]
    norms: list[str]  # attributes holding a norm module
    sublayers: dict[str, str]  # attribute -> kind

    @property
    def name(self) -> str:
        return self.cls.name.value

    def calls(self, kind: str | None = None) -> list[SublayerCall]:
        return [c for f in self.forwards for c in f.calls() if kind is None or c.kind == kind]

    def unfused(self, kind: str | None = None) -> list[SublayerCall]:
        return [c for c in self.calls(kind) if c.fused is None]

    @property
    def placement(self) -> str | None:
        """``pre``, ``post`` or ``sandwich`` when every call that is not
        fused agrees (a norm statement right before, right after, or both),
        else None."""
        shapes = {(c.pre_norm is not None, c.post_norm is not None) for c in self.unfused()}
        if len(shapes) != 1:
            return None
        return {(True, False): "pre", (False, True): "post", (True, True): "sandwich"}.get(shapes.pop())


def sublayer_attrs(cls: cst.ClassDef) -> dict[str, str]:
    """``attr -> kind`` of the attributes holding the attention and MLP modules."""
    found: dict[str, str] = {}
    for attr, (_, value) in self_assignments(cls).items():
        # a class chosen per layer (``A(config) if dense else B(config)``: dense-layers) is
        # a sublayer when both classes are of one kind
        choices = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        kinds = {_sublayer_kind(attr, choice) for choice in choices}
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind is not None:
            found[attr] = kind
    return found


def _sublayer_kind(attr: str, value: cst.BaseExpression) -> str | None:
    if not isinstance(value, cst.Call):
        return None
    role = class_role((dotted(value.func) or "").split(".")[-1])
    kinds = [k for k in KINDS if role in ROLES[k] or (role is None and attr in NAMES[k])]
    return kinds[-1] if kinds else None


def norm_attrs(cls: cst.ClassDef) -> list[str]:
    found = []
    for attr, (_, value) in self_assignments(cls).items():
        if isinstance(value, cst.Call) and class_role((dotted(value.func) or "").split(".")[-1]) == "norm":
            found.append(attr)
    return found


def decoder_layer(module: cst.Module, ctx: FileContext) -> DecoderLayer | None:
    """The decoder layer of this file with every forward and its slots (None
    when the layer lives in another file of the package). A forward whose
    sublayers do not run in one slot each is refused, positioned."""
    cls = class_here(module, ctx, "decoder_layer", "<Prefix>DecoderLayer")
    if cls is None:
        return None
    init = require_method(module, ctx, cls, "__init__")
    attrs = sublayer_attrs(cls)
    norms = norm_attrs(cls)
    forwards = [
        DecoderForward(func, _slots(func, attrs, norms, ctx, module, cls))
        for func in layer_forwards(cls, attrs)
    ]
    if not forwards:
        raise ctx.refuse(
            f"{cls.name.value} calls no attention or MLP module in any method "
            f"(sublayer attributes: {', '.join(attrs) or 'none'})",
            cls,
            module,
        )
    return DecoderLayer(cls, init, forwards, norms, attrs)


def layer_forwards(cls: cst.ClassDef, attrs: dict[str, str] | None = None) -> list[cst.FunctionDef]:
    """The methods of a decoder layer that call its attention or MLP."""
    attrs = sublayer_attrs(cls) if attrs is None else attrs
    return [f for f in layer_methods(cls) if f.name.value not in LOAD_TIME and sublayer_calls(f, attrs)]


def layer_methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef)]


def sublayer_calls(node: cst.CSTNode, attrs: dict[str, str]) -> list[cst.Call]:
    return [n for n in cast(list[cst.Call], nodes_of(node, cst.Call)) if self_attr(n.func) in attrs]


def _slots(func, attrs, norms, ctx, module, cls) -> dict[str, Slot]:
    where = f"{cls.name.value}.{func.name.value}"
    slots: dict[str, Slot] = {}
    for stmt in func.body.body:
        kinds = {attrs[self_attr(c.func)] for c in sublayer_calls(stmt, attrs)}
        if not kinds:
            continue
        if len(kinds) > 1 or kinds & set(slots):
            raise ctx.refuse(
                f"{where} calls its sublayers in an unknown arrangement (expected one top-level "
                "statement per sublayer: h = self.<sublayer>(...), or an if/else calling it once per branch)",
                stmt,
                module,
            )
        kind = kinds.pop()
        slots[kind] = _slot(kind, stmt, attrs, norms, func.body.body, ctx, module, where)
    missing = [k for k in KINDS if k not in slots]
    if missing:
        raise ctx.refuse(
            f"{where} needs one top-level statement h = self.<{missing[0]}>(...) "
            f"(or an if/else calling it once per branch); the {missing[0]} attributes of "
            f"{cls.name.value}: {', '.join(a for a, k in attrs.items() if k == missing[0]) or 'none'}",
            func,
            module,
        )
    return slots


def _slot(kind, stmt, attrs, norms, body, ctx, module, where) -> Slot:
    call = _call_statement(stmt, attrs)
    if call is not None:
        return Slot(kind, stmt, [_sublayer(kind, stmt, None, body, norms)])
    blocks = _branches(stmt) if isinstance(stmt, cst.If) else None
    if blocks is None:
        raise ctx.refuse(
            f"{where} calls self.<{kind}> inside a statement that is neither h = self.<{kind}>(...) nor an "
            "if/else around such calls",
            stmt,
            module,
        )
    slot = Slot(kind, stmt, [])
    for block in blocks:
        hits = [s for s in block.body if sublayer_calls(s, attrs)]
        if is_guard(block):
            slot.guarded.append(block)
        elif len(hits) == 1 and _call_statement(hits[0], attrs) is not None:
            slot.calls.append(_sublayer(kind, hits[0], block, list(block.body), norms))
        else:
            raise ctx.refuse(
                f"{where}: every branch of this if must call self.<{kind}> once, as h = self.<{kind}>(...) "
                f"(found {len(hits)} such statement(s) in one branch)",
                stmt,
                module,
            )
    return slot


def _branches(stmt: cst.If) -> list[cst.IndentedBlock] | None:
    """The blocks of an ``if``/``elif``/``else`` chain; None without a final ``else``."""
    blocks = []
    node: cst.If | cst.Else | None = stmt
    while isinstance(node, cst.If):
        blocks.append(node.body)
        node = node.orelse
    if not isinstance(node, cst.Else):
        return None
    blocks.append(node.body)
    indented = [b for b in blocks if isinstance(b, cst.IndentedBlock)]
    return indented if len(indented) == len(blocks) else None


def _call_statement(stmt: cst.CSTNode, attrs: dict[str, str]) -> cst.Call | None:
    call = assigned_call(stmt)
    return call if call is not None and self_attr(call.func) in attrs else None


def _sublayer(kind, stmt, block, body, norms) -> SublayerCall:
    call, variable = assigned_call(stmt), assigned_name(stmt)
    assert call is not None and variable is not None  # a sublayer statement (_call_statement)
    index = body.index(stmt)
    before = body[index - 1] if index > 0 else None
    after = body[index + 1] if index + 1 < len(body) else None
    return SublayerCall(
        kind,
        stmt,
        call,
        variable,
        block,
        before if norm_call_attr(before, norms) is not None else None,
        after if norm_call_attr(after, norms) is not None else None,
        fused_norm(call, norms),
    )


def fused_norm(call: cst.Call, norms: list[str]) -> str | None:
    for arg in call.args:
        for node in walk(arg.value):
            if isinstance(node, cst.Attribute) and node.attr.value in ("weight", "bias"):
                attr = self_attr(node.value)
                if attr in norms:
                    return attr
    return None


def _called_attr(stmt: cst.SimpleStatementLine | None) -> str | None:
    call = assigned_call(stmt) if stmt is not None else None
    return self_attr(call.func) if call is not None else None


# -- guarded branches -------------------------------------------------------------


def is_guard(block: cst.BaseSuite) -> bool:
    """A branch that only raises ``NotImplementedError(...)``."""
    body = block.body if isinstance(block, cst.IndentedBlock) else []
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return False
    small = body[0].body[0]
    exc = small.exc if isinstance(small, cst.Raise) else None
    target = exc.func if isinstance(exc, cst.Call) else exc
    return dotted(target) == "NotImplementedError"


# -- the backbone's layer loop and the LM head ------------------------------------------


def logits_site(module: cst.Module, ctx: FileContext):
    """``(causal LM class, forward, logits variable, statement)``: the one
    top-level ``<logits> = self.lm_head(...)`` statement of the causal LM's
    ``forward``, after which every use of the logits (gathered for logprobs,
    sliced back from LM-head data parallelism, sampled, returned) reads that
    variable; None when the class lives in another file of the package. A
    forward that calls the LM head elsewhere is refused."""
    lm = class_here(module, ctx, "causal_lm", "<Prefix>ForCausalLM")
    if lm is None:
        return None
    forward = require_method(module, ctx, lm, "forward")
    calls = [n for n in cast(list[cst.Call], nodes_of(forward, cst.Call)) if self_attr(n.func) == "lm_head"]
    heads = [
        s
        for s in forward.body.body
        if (call := assigned_call(s)) is not None and self_attr(call.func) == "lm_head"
    ]
    if len(heads) != 1 or len(calls) != 1:
        raise ctx.refuse(
            f"{lm.name.value}.forward needs one top-level <logits> = self.lm_head(...) statement "
            f"and no other LM-head call (found {len(heads)} such statement(s), {len(calls)} call(s))",
            forward,
            module,
        )
    name = assigned_name(heads[0])
    body = list(forward.body.body)
    at = body.index(heads[0])
    while at + 1 < len(body) and _rescales(body[at + 1], name):
        at += 1  # after the logits' own rescaling (a divisor before a softcap)
    return lm, forward, name, body[at]


def _rescales(stmt: cst.CSTNode, name: str | None) -> bool:
    """``<name> = <expression of name>``, or an ``if`` (no ``else``) whose
    body is only such statements."""
    if isinstance(stmt, cst.If):
        inner = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []
        return stmt.orelse is None and bool(inner) and all(_rescales(s, name) for s in inner)
    value = assigned_value(stmt)
    if assigned_name(stmt) != name or value is None:
        return False
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(value))


# -- other models in the package (a speculative-decoding drafter) ------------------------

OTHER_MODEL_ROLES = ("decoder_layer", "backbone", "causal_lm")


def other_model_classes(module: cst.Module) -> list[cst.ClassDef]:
    """Model classes (decoder layer, backbone, causal LM) of a module file
    that is not a model file: another model shipped with the package, such
    as llama3's Eagle3 drafter (``eagle3_model.py``), which reuses the
    model's classes but computes its own (Llama-shaped) architecture."""
    return classes_with_role_in(module, OTHER_MODEL_ROLES)


def classes_with_role_in(module: cst.Module, roles: tuple[str, ...]) -> list[cst.ClassDef]:
    return [s for s in module.body if isinstance(s, cst.ClassDef) and class_role(s.name.value) in roles]


def subclasses_role(cls: cst.ClassDef, role: str) -> bool:
    return any(class_role((dotted(base.value) or "").split(".")[-1]) == role for base in cls.bases)


def norm_call_attr(stmt: cst.CSTNode | None, norms: list[str]) -> str | None:
    """``n`` for a ``v = self.n(v)`` statement where ``n`` holds a norm."""
    call = assigned_call(stmt) if stmt is not None else None
    if call is None or self_attr(call.func) not in norms or len(call.args) != 1:
        return None
    arg = call.args[0].value
    if not (isinstance(arg, cst.Name) and arg.value == assigned_name(stmt)):
        return None
    return self_attr(call.func)
