"""Shared CST helpers of the attention and RoPE codemods (this module is not a
codemod: the library skips files whose name starts with ``_``).

Everything here finds its targets structurally (class roles, parameter and
method names, ``NF.*`` calls) and inserts code at positions that do not
depend on the order in which codemods run, so that codemods using these
helpers commute with each other:

- config fields go right before ``torch_dtype`` (or after the last field),
  after any of the fields just above it whose names sort before theirs;
- module-level helper functions go before the first class, after any of the
  functions just above it whose names sort before theirs.
"""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    dotted,
    is_call,
    keyword_arg,
    method,
    parse_statement,
    self_assignment,
    walk,
)
from autoport_cst.transform.layers import is_parameter
from autoport_cst.transform.vocabulary import nodes_of

# -- finding targets -------------------------------------------------------------


def self_parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``self.<name> = nn.Parameter(...)`` statements of a class, by name."""
    found: dict[str, cst.SimpleStatementLine] = {}
    for node in nodes_of(cls, cst.SimpleStatementLine):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and is_parameter(pair[1]):
                found.setdefault(pair[0], node)
    return found


def attention_classes(module: cst.Module, ctx: FileContext, codemod_id: str) -> list[cst.ClassDef]:
    """Attention classes with a fused ``self.qkv_proj_weight`` parameter."""
    found = [c for c in classes_with_role(module, "attention") if "qkv_proj_weight" in self_parameters(c)]
    if not found:
        raise ctx.precondition(
            f"{codemod_id}: no attention class (<Prefix>Attention with "
            "self.qkv_proj_weight = nn.Parameter(...)) in this file"
        )
    return found


def init_anchor(init: cst.FunctionDef, attrs: tuple[str, ...] = ("scaling", "head_dim", "layer_idx")):
    """The top-level ``self.<attr> = ...`` statement of ``__init__`` to insert
    per-layer settings after: the first of ``attrs`` found."""
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else []
    for attr in attrs:
        for stmt in body:
            pair = self_assignment(stmt)
            if pair is not None and pair[0] == attr:
                return stmt
    return None


def place_setting(init: cst.FunctionDef, attr: str, stmt: cst.BaseStatement, edits: dict) -> bool:
    """Record in ``edits`` the insertion of ``stmt`` (``self.<attr> = ...``
    with a comment) among the per-layer settings that follow ``init_anchor``:
    after the anchor and after the settings other codemods placed there whose
    names sort before ``attr`` (statements led by a MODEL-SPECIFIC comment),
    so that the order does not depend on which codemod ran first. Returns
    False when ``__init__`` has no anchor."""
    body = list(init.body.body) if isinstance(init.body, cst.IndentedBlock) else []
    anchor = init_anchor(init)
    if anchor is None:
        return False
    index = body.index(anchor)
    while index + 1 < len(body):
        following = body[index + 1]
        pair = self_assignment(following)
        marked = any(
            line.comment is not None and line.comment.value.startswith("# <-- MODEL-SPECIFIC")
            for line in getattr(following, "leading_lines", ())
        )
        if pair is None or not marked or pair[0] >= attr:
            break
        index += 1
    target = body[index]
    previous = edits.get(id(target))

    def place(updated, previous=previous, stmt=stmt):
        base = previous(updated) if previous else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        return cst.FlattenSentinel([*nodes, stmt])

    edits[id(target)] = place
    return True


def calls_in(node: cst.CSTNode, name: str) -> list[cst.Call]:
    return [n for n in walk(node) if isinstance(n, cst.Call) and is_call(n, name)]


def statement_containing(func: cst.FunctionDef, target: cst.CSTNode) -> cst.BaseStatement | None:
    """The top-level statement of ``func``'s body that contains ``target``."""
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else []
    for stmt in body:
        if any(n is target for n in walk(stmt)):
            return stmt
    return None


def norm_class(module: cst.Module) -> cst.ClassDef | None:
    norms = [c for c in classes_with_role(module, "norm")]
    return norms[0] if len(norms) == 1 else None


def eps_attribute(norm: cst.ClassDef) -> str | None:
    """The epsilon attribute a norm class stores (``variance_epsilon``)."""
    init = method(norm, "__init__")
    if init is None:
        return None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and "eps" in pair[0]:
                return pair[0]
    return None


# -- call arguments -----------------------------------------------------------------


# -- comments -----------------------------------------------------------------------


# -- config dataclass ---------------------------------------------------------------


# -- module-level helper functions -------------------------------------------------


def add_functions(module: cst.Module, functions: list[str], replace: bool = False) -> cst.Module:
    """Add module-level functions (source text) not yet defined, before the
    first class of the module. With ``replace``, a function of the same name
    whose text differs is replaced in place."""
    body = list(module.body)
    changed = False
    for code in functions:
        func = parse_statement(code.strip("\n"), module)
        assert isinstance(func, cst.FunctionDef), code
        name = func.name.value
        existing = next(
            (i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == name), None
        )
        if existing is not None:
            old = body[existing]
            if replace and not old.with_changes(leading_lines=[]).deep_equals(
                func.with_changes(leading_lines=[])
            ):
                body[existing] = func.with_changes(leading_lines=old.leading_lines)
                changed = True
            continue
        func = func.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
        first_class = next((i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)), len(body))
        position = first_class
        while (
            position > 0
            and isinstance(previous := body[position - 1], cst.FunctionDef)
            and previous.name.value > name
        ):
            position -= 1
        if position == 0:
            func = func.with_changes(leading_lines=body[0].leading_lines if body else [])
            if body:
                body[0] = body[0].with_changes(
                    leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
                )
        body.insert(position, func)
        changed = True
    return module.with_changes(body=body) if changed else module


def drop_unused_function(module: cst.Module, name: str) -> cst.Module:
    """Remove the module-level function ``name`` when no other top-level
    statement names it."""
    function = next((s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)
    if function is None:
        return module
    for stmt in module.body:
        if stmt is not function and any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt)):
            return module
    return module.with_changes(body=[s for s in module.body if s is not function])


# -- the op-by-op kernel substitutes live in autoport_cst.transform.kernels -----------------

from autoport_cst.transform.kernels import (  # noqa: E402,F401 - re-exported for the codemods
    DECODE_UNFUSED,
    PREFILL_UNFUSED,
    UNFUSED_DECODE_CALL,
    UNFUSED_PREFILL_CALL,
    to_unfused_decode,
    to_unfused_prefill,
)


def parse_method(code: str, module: cst.Module) -> cst.FunctionDef:
    """A method from source written at module level (``def m(self, ...):``):
    parsed inside a class so that multi-line strings keep the method's
    indentation."""
    import textwrap

    indent = module.default_indent
    wrapped = "class _Holder:\n" + textwrap.indent(code.strip("\n") + "\n", indent)
    holder = parse_statement(wrapped, module)
    assert isinstance(holder, cst.ClassDef)
    func = holder.body.body[0]
    assert isinstance(func, cst.FunctionDef), code
    return func


# -- checkpoint RoPE pairs moved to the kernel's pairs (partial-rotary, interleaved-rope) ----

ROPE_ORDER_FUNCTION = '''
def _rope_column_order(head_dim: int, rotary_dim: int, interleaved: bool) -> list[int]:
    """The checkpoint column that each column of a query or key head comes from,
    so that the checkpoint's rotated pairs land on the pairs (i, i + head_dim / 2)
    that the RoPE here and the decode kernel rotate together.

    The checkpoint rotates the first ``rotary_dim`` columns of each head, in
    pairs (j, j + rotary_dim / 2), or (2j, 2j + 1) when ``interleaved``; the
    other columns pass through. Pair i < rotary_dim / 2 here is the
    checkpoint's pair j = i; the pass-through columns fill the other places in
    order (the cos/sin tables rotate them by angle zero). Queries and keys are
    reordered alike, so their dot products do not change.
    """
    half, rotary_half = head_dim // 2, rotary_dim // 2
    if interleaved:
        first = [2 * j for j in range(rotary_half)]
        second = [2 * j + 1 for j in range(rotary_half)]
    else:
        first = list(range(rotary_half))
        second = [rotary_half + j for j in range(rotary_half)]
    rest = list(range(rotary_dim, head_dim))
    return first + rest[: half - rotary_half] + second + rest[half - rotary_half :]
'''

ROPE_LOADER_FUNCTION = '''
def _rope_columns_loader(loader, order: list[int], width: int):
    """Wrap a weight loader: reorder the columns of each head, by ``order``,
    in the first ``width`` entries of the loaded tensor's last dimension (the
    query and key heads of a fused [q | k | v] weight or bias, or a norm's
    gammas); the rest (values) is left as it is."""
    head_dim = len(order)

    def transform(slices, rank):
        tensor = loader.load(slices, rank)
        index = torch.arange(tensor.shape[-1])
        starts = torch.arange(0, width, head_dim).repeat_interleave(head_dim)
        index[:width] = torch.tensor(order).repeat(width // head_dim) + starts
        return tensor[..., index]

    return SafetensorsWeightLoader(transform)
'''

ROPE_ORDER_COMMENT = (
    "<-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here"
)

# (parameter, width of its query/key part)
ROPE_REORDERED = (
    ("qkv_proj_weight", "self.q_size + self.kv_size"),
    ("qkv_proj_bias", "self.q_size + self.kv_size"),
)


def _order_call_values(call: cst.Call) -> tuple[str, str]:
    args = list(call.args)
    rotary = keyword_arg(call, "rotary_dim")
    interleaved = keyword_arg(call, "interleaved")
    if rotary is None and len(args) > 1 and args[1].keyword is None:
        rotary = args[1]
    if interleaved is None and len(args) > 2 and args[2].keyword is None:
        interleaved = args[2]
    module = cst.Module([])
    return (
        module.code_for_node(rotary.value) if rotary is not None else "self.head_dim",
        module.code_for_node(interleaved.value) if interleaved is not None else "False",
    )


def find_self_assignment_deep(func: cst.FunctionDef, attr: str):
    for node in walk(func):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == attr:
                return node
    return None


def norm_is_full_width(cls: cst.ClassDef, norm: str) -> bool:
    """Whether ``self.<norm>`` is built over all heads (``self.q_size`` /
    ``self.kv_size`` wide) rather than one head."""
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == norm and isinstance(pair[1], cst.Call) and pair[1].args:
                return dotted(pair[1].args[0].value) in ("self.q_size", "self.kv_size")
    return False
