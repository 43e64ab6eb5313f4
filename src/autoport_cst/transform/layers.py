"""Shared CST helpers of the MLP, norm, residual, embedding, LM-head and
checkpoint codemods (not a codemod: the library skips ``_`` modules).

Everything here finds its targets structurally (class roles, ``self.<attr> =``
statements, ``set_weight_loader`` calls, ``NF.*`` calls, ``mappings[...]``
entries) and works on plain nodes, like ``autoport_cst.transform.cst_helpers``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.arguments import keyword, remove_keyword, set_keyword  # noqa: F401  (re-exported)
from autoport_cst.transform.config_fields import (  # noqa: F401
    add_config_fields,
    config_class,
    config_fields,
)
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    code_of,
    dotted,
    keyword_arg,
    method,
    parse_statement,
    positional_args,
    self_assignment,
    self_attr,
    string_text,
    walk,
)
from autoport_cst.transform.loaders import (  # noqa: F401  (re-exported)
    MLP_CALLS,
    TORCH_MLP,
    Loader,
    LoaderEdits,
    MlpClass,
    attach_statement,
    find_loaders,
    mlp_classes,
)
from autoport_cst.transform.roles import class_role
from autoport_cst.transform.vocabulary import leading_lines, nodes_of

WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"
ACT_TYPES = "nkilib.core.utils.common_types"
# Methods that run at load time or build the module, not on the forward path.
LOAD_TIME = ("__init__", "_setup_weight_loaders", "load_weights", "load_weights_lite", "from_configs")

# -- classes and statements -----------------------------------------------------


def one_class(module: cst.Module, role: str, ctx: FileContext, codemod_id: str, what: str) -> cst.ClassDef:
    """The single class of ``role`` in the file, or a precondition error."""
    found = classes_with_role(module, role)
    if len(found) != 1:
        names = ", ".join(c.name.value for c in found) or "none"
        raise ctx.precondition(f"{codemod_id}: expected one {what} class in this file, found: {names}")
    return found[0]


def require_method(
    cls: cst.ClassDef, name: str, ctx: FileContext, module: cst.Module, codemod_id: str
) -> cst.FunctionDef:
    found = method(cls, name)
    if found is None:
        raise ctx.precondition(f"{codemod_id}: {cls.name.value} has no {name} method", cls, module)
    return found


def self_assignments(node: cst.CSTNode) -> dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression]]:
    """``attr -> (statement, value)`` of every ``self.attr = value`` under
    ``node`` (first assignment wins)."""
    found: dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression]] = {}
    for stmt in nodes_of(node, cst.SimpleStatementLine):
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = self_assignment(stmt)
            if pair is not None and pair[0] not in found:
                found[pair[0]] = (stmt, pair[1])
    return found


def is_parameter(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and dotted(value.func) in (
        "nn.Parameter",
        "torch.nn.Parameter",
        "Parameter",
    )


def parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``attr -> statement`` of ``self.attr = nn.Parameter(...)`` in ``cls``."""
    return {attr: stmt for attr, (stmt, value) in self_assignments(cls).items() if is_parameter(value)}


def _call_role(value: cst.BaseExpression) -> str | None:
    """The class role of ``<Class>(...)`` by the called name's suffix."""
    if not isinstance(value, cst.Call):
        return None
    name = dotted(value.func)
    return class_role(name.split(".")[-1]) if name else None


def instances_of_role(module: cst.Module, role: str) -> dict[str, list[cst.SimpleStatementLine]]:
    """``attr -> statements`` of ``self.attr = <Class of role>(...)`` anywhere
    in the module (the role read from the class name's suffix)."""
    found: dict[str, list[cst.SimpleStatementLine]] = {}
    for stmt in nodes_of(module, cst.SimpleStatementLine):
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = self_assignment(stmt)
            if pair is not None and _call_role(pair[1]) == role:
                found.setdefault(pair[0], []).append(stmt)
    return found


def attr_of_role(cls: cst.ClassDef, module: cst.Module, role: str) -> list[str]:
    """Attributes of ``cls`` holding an instance of a class of ``role``
    (``self.self_attn = LlamaAttention(...)`` for ``attention``)."""
    return [attr for attr, (_, value) in self_assignments(cls).items() if _call_role(value) == role]


def param_ctor(stmt: cst.SimpleStatementLine) -> cst.Call | None:
    """``torch.empty(...)`` of ``self.x = nn.Parameter(torch.empty(...))``."""
    pair = self_assignment(stmt)
    value = pair[1] if pair is not None else None
    if not (isinstance(value, cst.Call) and is_parameter(value) and value.args):
        return None
    inner = value.args[0].value
    return inner if isinstance(inner, cst.Call) else None


def bias_parameter(
    weight_stmt: cst.SimpleStatementLine, bias_attr: str, module: cst.Module
) -> cst.BaseStatement:
    """``self.<bias> = nn.Parameter(torch.zeros(<last weight dim>, dtype=<same>))``."""
    ctor = param_ctor(weight_stmt)
    if ctor is None:
        raise ValueError("weight is not nn.Parameter(torch.<ctor>(...))")
    dims = positional_args(ctor)
    dtype = keyword_arg(ctor, "dtype")
    dtype_code = f", dtype={code_of(dtype.value)}" if dtype is not None else ""
    pair = self_assignment(weight_stmt)
    assert pair is not None and isinstance(pair[1], cst.Call)  # as param_ctor found it
    param = dotted(pair[1].func)
    return parse_statement(
        f"self.{bias_attr} = {param}(torch.zeros({code_of(dims[-1].value)}{dtype_code}))", module
    )


# -- weight loaders -------------------------------------------------------------
# Found and edited where they are built, through locals and wrappers:
# ``autoport_cst.transform.loaders`` (re-exported above).


def kwarg_code(call: cst.Call | None, name: str) -> str | None:
    if call is None:
        return None
    arg = keyword_arg(call, name)
    return None if arg is None else code_of(arg.value)


# -- the dense MLP call -----------------------------------------------------------


@dataclass
class MLPCall:
    """An ``NF.mlp(x, gate_w, up_w, down_w, ...)`` call (or the plain-torch
    ``torch_mlp`` with the same arguments) and its weight attributes."""

    call: cst.Call
    gate: str | None
    up: str
    down: str

    @property
    def gated(self) -> bool:
        arg = keyword_arg(self.call, "skip_gate")
        return arg is None or dotted(arg.value) != "True"


def parse_mlp_call(call: cst.Call, ctx: FileContext, module: cst.Module, codemod_id: str) -> MLPCall:
    args = positional_args(call)
    attrs = [self_attr(a.value) for a in args[1:4]]
    if len(args) < 4 or attrs[1] is None or attrs[2] is None:
        raise ctx.precondition(
            f"{codemod_id}: expected {dotted(call.func)}(hidden, self.<gate>, self.<up>, self.<down>, ...) "
            "with the weights as positional arguments",
            call,
            module,
        )
    return MLPCall(call, attrs[0], attrs[1], attrs[2])


# Every dense MLP class of a file (quantized ones flagged): ``loaders.mlp_classes``
# (re-exported above).


# Keyword order of NF.mlp (its signature): codemods insert keywords in this
# order whatever order they run in, so that they commute.
MLP_KEYWORDS = ("eps", "ln_w", "skip_gate", "act_fn", "gate_b", "up_b", "down_b", "norm_b", "norm_type")


# -- config dataclass --------------------------------------------------------------


# -- checkpoint keys ---------------------------------------------------------------


def _segment_pattern(old: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_{])" + re.escape(old) + r"(?![A-Za-z0-9_}])")


def replace_segment(node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression | None:
    """A string literal (plain or f-string) with the dotted key segment(s)
    ``old`` replaced by ``new`` in its text parts; None when ``old`` does not
    occur as whole segments."""
    pattern = _segment_pattern(old)
    if isinstance(node, cst.SimpleString):
        text = string_text(node)
        if text is None or not pattern.search(text):
            return None
        body = node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
        return node.with_changes(value=f"{node.prefix}{node.quote}{pattern.sub(new, body)}{node.quote}")
    if isinstance(node, cst.FormattedString):
        changed = False
        parts = []
        for part in node.parts:
            if isinstance(part, cst.FormattedStringText) and pattern.search(part.value):
                part = part.with_changes(value=pattern.sub(new, part.value))
                changed = True
            parts.append(part)
        return node.with_changes(parts=parts) if changed else None
    if isinstance(node, cst.ConcatenatedString):
        left = replace_segment(node.left, old, new)
        right = replace_segment(node.right, old, new)
        if left is None and right is None:
            return None
        return node.with_changes(left=left or node.left, right=right or node.right)
    return None


def has_segment(text: str, old: str) -> bool:
    return bool(_segment_pattern(old).search(text))


def strings_of(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The string literals of a mapping value (a string, or a list/tuple of
    strings), possibly parenthesized."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [e.value for e in value.elements]
    return [value]


def map_value_strings(value: cst.BaseExpression, fn) -> cst.BaseExpression | None:
    """Apply ``fn`` (string node -> node or None for unchanged) to every string
    of a mapping value; None when nothing changed."""
    if isinstance(value, (cst.List, cst.Tuple)):
        changed = False
        elements = []
        for element in value.elements:
            new = fn(element.value)
            if new is not None:
                changed = True
                element = element.with_changes(value=new)
            elements.append(element)
        return value.with_changes(elements=elements) if changed else None
    return fn(value)


def forward_path_functions(module: cst.Module) -> list[cst.FunctionDef]:
    """Functions and methods that are not load-time code (``__init__``,
    loader setup, ``load_weights``...)."""
    out = []
    for node in walk(module):
        if isinstance(node, cst.FunctionDef) and node.name.value not in LOAD_TIME:
            out.append(node)
    return out


# -- scalar settings read from the config ----------------------------------------------


def has_self_assignment(func: cst.FunctionDef, attr: str) -> bool:
    return attr in self_assignments(func)


def append_statements_edit(func: cst.FunctionDef, new: list[cst.BaseStatement]) -> tuple[int, object]:
    """An edit (``(id, fn)`` for ``rewrite``) that appends ``new`` at the end
    of ``func``'s body (after its last statement)."""
    last = func.body.body[-1]
    return id(last), (lambda updated: cst.FlattenSentinel([updated, *new]))


def uses_self_attr(node: cst.CSTNode, attr: str) -> bool:
    return any(self_attr(n) == attr for n in walk(node))


def assigned_name(stmt: cst.CSTNode | None) -> str | None:
    """``x`` for a one-target ``x = ...`` statement line."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            return small.targets[0].target.value
    return None


def assigned_value(stmt: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of a one-target ``x = <value>`` statement line."""
    if assigned_name(stmt) is None or not isinstance(stmt, cst.SimpleStatementLine):
        return None
    small = stmt.body[0]
    return small.value if isinstance(small, cst.Assign) else None


def assigned_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call of ``x = <call>(...)``."""
    value = assigned_value(stmt)
    return value if isinstance(value, cst.Call) else None


def config_scalar_edit(
    module: cst.Module,
    ctx: FileContext,
    codemod_id: str,
    key: str,
    annotation: str,
    default: object,
    comment: str,
) -> cst.Module:
    """The config-file half of a codemod that reads a scalar setting from the
    config: the dataclass field ``key: annotation = default``."""
    comment = comment.removeprefix("<-- MODEL-SPECIFIC: ")
    return add_config_fields(module, ctx, codemod_id, [(f"{key}: {annotation} = {default!r}", comment)])


def init_reads_config(
    cls: cst.ClassDef, key: str, module: cst.Module, ctx: FileContext, codemod_id: str
) -> dict:
    """Edits that append ``self.<key> = config.<key>`` to ``cls.__init__``
    (none when it is already assigned). ``__init__`` must take ``config``."""
    init = require_method(cls, "__init__", ctx, module, codemod_id)
    if key in self_assignments(init):
        return {}
    names = [p.name.value for p in init.params.params]
    if "config" not in names:
        raise ctx.precondition(
            f"{codemod_id}: {cls.name.value}.__init__ takes no config argument to read {key} from",
            init,
            module,
        )
    stmt = parse_statement(f"self.{key} = config.{key}", module)
    key_id, edit = append_statements_edit(init, [stmt])
    return {key_id: edit}


def logits_site(module: cst.Module, ctx: FileContext, codemod_id: str):
    """``(causal LM class, forward, logits variable, last top-level statement
    assigning it)``: the logits are what ``self.lm_head(...)`` returns."""
    lm = one_class(module, "causal_lm", ctx, codemod_id, "<Prefix>ForCausalLM")
    forward = require_method(lm, "forward", ctx, module, codemod_id)
    body = list(forward.body.body) if isinstance(forward.body, cst.IndentedBlock) else []
    name = None
    for stmt in body:
        call = assigned_call(stmt)
        if call is not None and self_attr(call.func) == "lm_head":
            name = assigned_name(stmt)
    if name is None:
        raise ctx.precondition(
            f"{codemod_id}: {lm.name.value}.forward has no top-level <logits> = self.lm_head(...) statement",
            forward,
            module,
        )
    last = [s for s in body if assigned_name(s) == name][-1]
    return lm, forward, name, last


def add_edit(edits: dict, key: int, fn) -> None:
    """Register ``fn`` for node ``key``, after an edit already registered
    there (when that one keeps the node)."""
    previous = edits.get(key)
    if previous is None:
        edits[key] = fn
        return

    def both(updated, first=previous, second=fn):
        result = first(updated)
        if isinstance(result, (cst.FlattenSentinel, cst.RemovalSentinel)):
            return result
        return second(result)

    edits[key] = both


def removal_edits(root: cst.CSTNode, doomed: Sequence[cst.CSTNode]) -> dict:
    """Edits removing ``doomed`` statements; the leading lines of a removed
    statement that carry comments (section markers) move to the next kept
    statement of its block."""
    doomed_ids = {id(s) for s in doomed}
    edits: dict = {}
    for node in walk(root):
        if not isinstance(node, (cst.IndentedBlock, cst.Module)):
            continue
        carried: list[cst.EmptyLine] = []
        for stmt in node.body:
            if id(stmt) in doomed_ids:
                edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
                if any(line.comment is not None for line in leading_lines(stmt)):
                    carried += list(leading_lines(stmt))
                continue
            if carried:
                edits[id(stmt)] = lambda updated, lines=carried: updated.with_changes(
                    leading_lines=[*lines, *updated.leading_lines]
                )
                carried = []
    return edits


# -- decoder-layer structure -------------------------------------------------------------


@dataclass
class LayerForward:
    """The top-level statements of a decoder layer's ``forward`` around its
    sublayers: ``attn`` is ``v = self.<attention>(...)``, ``mlp`` is ``v =
    self.<mlp>(...)``; ``pre_*``/``post_*`` are the ``v = self.<norm>(v)``
    statements right before / after each (None when absent)."""

    layer: cst.ClassDef
    init: cst.FunctionDef
    forward: cst.FunctionDef
    body: list[cst.BaseStatement]
    attn: cst.SimpleStatementLine
    mlp: cst.SimpleStatementLine
    pre_attn: cst.SimpleStatementLine | None
    post_attn: cst.SimpleStatementLine | None
    pre_mlp: cst.SimpleStatementLine | None
    post_mlp: cst.SimpleStatementLine | None
    norm_attrs: list[str]

    @property
    def placement(self) -> str | None:
        pres = self.pre_attn is not None and self.pre_mlp is not None
        posts = self.post_attn is not None and self.post_mlp is not None
        no_pres = self.pre_attn is None and self.pre_mlp is None
        no_posts = self.post_attn is None and self.post_mlp is None
        if pres and no_posts:
            return "pre"
        if posts and no_pres:
            return "post"
        if pres and posts:
            return "sandwich"
        return None


def call_attr(call: cst.Call | None) -> str | None:
    """``x`` for ``self.x(...)`` or ``self.x.method(...)``."""
    if call is None:
        return None
    func = call.func
    attr = self_attr(func)
    if attr is None and isinstance(func, cst.Attribute):
        attr = self_attr(func.value)
    return attr


def norm_call_attr(stmt: cst.CSTNode | None, norms: list[str]) -> str | None:
    """``n`` for a ``v = self.n(v)`` statement where ``n`` holds a norm."""
    call = assigned_call(stmt) if stmt is not None else None
    if call is None or self_attr(call.func) not in norms or len(call.args) != 1:
        return None
    arg = call.args[0].value
    if not (isinstance(arg, cst.Name) and arg.value == assigned_name(stmt)):
        return None
    return self_attr(call.func)


def layer_forward(module: cst.Module, ctx: FileContext, codemod_id: str) -> LayerForward:
    layer = one_class(module, "decoder_layer", ctx, codemod_id, "<Prefix>DecoderLayer")
    name = layer.name.value
    init = require_method(layer, "__init__", ctx, module, codemod_id)
    forward = require_method(layer, "forward", ctx, module, codemod_id)
    attn_attrs = attr_of_role(layer, module, "attention")
    mlp_attrs = attr_of_role(layer, module, "mlp") + attr_of_role(layer, module, "moe")
    norms = attr_of_role(layer, module, "norm")
    body = list(forward.body.body) if isinstance(forward.body, cst.IndentedBlock) else []

    def find(attrs: list[str], what: str) -> int:
        hits = [i for i, s in enumerate(body) if call_attr(assigned_call(s)) in attrs]
        if len(hits) != 1:
            raise ctx.precondition(
                f"{codemod_id}: {name}.forward needs one top-level statement h = self.<{what}>(...) "
                f"(the {what} attributes of {name}: {', '.join(attrs) or 'none'}), found {len(hits)}",
                forward,
                module,
            )
        return hits[0]

    a, m = find(attn_attrs, "attention"), find(mlp_attrs, "mlp")
    attn, mlp = body[a], body[m]
    # statements of assigned calls (find)
    assert isinstance(attn, cst.SimpleStatementLine) and isinstance(mlp, cst.SimpleStatementLine)

    def at(i: int):
        return body[i] if 0 <= i < len(body) else None

    def norm_at(i: int):
        return at(i) if norm_call_attr(at(i), norms) is not None else None

    return LayerForward(
        layer,
        init,
        forward,
        body,
        attn,
        mlp,
        norm_at(a - 1),
        norm_at(a + 1),
        norm_at(m - 1),
        norm_at(m + 1),
        norms,
    )


def mapping_entries_of_attr(module: cst.Module, attr: str):
    """Mapping entries whose key has the segment ``attr`` (a module attribute
    such as ``post_attention_layernorm``)."""
    from autoport_cst.transform.mappings import mapping_entries

    return [e for e in mapping_entries(module) if has_segment(e.key, attr)]


def other_uses(module: cst.Module, attr: str, handled: Iterable[cst.CSTNode]) -> cst.CSTNode | None:
    """The first ``<...>.attr`` attribute read outside ``handled`` nodes."""
    skipped = {id(n) for h in handled for n in walk(h)}
    for node in walk(module):
        if id(node) in skipped:
            continue
        if isinstance(node, cst.Attribute) and node.attr.value == attr:
            return node
    return None
