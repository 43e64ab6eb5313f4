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
    rewrite,
    self_assignment,
    walk,
    with_comment,
)
from autoport_cst.transform.layers import is_parameter, require_method

# -- finding targets -------------------------------------------------------------


def self_parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``self.<name> = nn.Parameter(...)`` statements of a class, by name."""
    found: dict[str, cst.SimpleStatementLine] = {}
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and is_parameter(pair[1]):
                found.setdefault(pair[0], node)
    return found


def attention_classes(module: cst.Module, ctx: FileContext, codemod_id: str) -> list[cst.ClassDef]:
    """Attention classes with a fused ``self.qkv_proj_weight`` parameter."""
    found = [
        c for c in classes_with_role(module, "attention") if "qkv_proj_weight" in self_parameters(c)
    ]
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
            if replace and not old.with_changes(leading_lines=[]).deep_equals(func.with_changes(leading_lines=[])):
                body[existing] = func.with_changes(leading_lines=old.leading_lines)
                changed = True
            continue
        func = func.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
        first_class = next((i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)), len(body))
        position = first_class
        while (
            position > 0
            and isinstance(body[position - 1], cst.FunctionDef)
            and body[position - 1].name.value > name
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

PARTIAL_FACTOR_FUNCTION = '''
def _partial_rotary_factor(config) -> float:
    """Fraction of each head that RoPE rotates: the config field, else the value
    in the RoPE parameters, else 1 (the whole head)."""
    if config.partial_rotary_factor is not None:
        return float(config.partial_rotary_factor)
    return float((config.rope_scaling or {}).get("partial_rotary_factor", 1.0))
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


def reorder_rope_columns(
    module: cst.Module,
    ctx: FileContext,
    codemod_id: str,
    rotary_dim: str | None = None,
    interleaved: bool | None = None,
) -> cst.Module:
    """Give every attention class ``self.rope_column_order`` (built with the
    given ``rotary_dim`` expression and/or ``interleaved`` flag, keeping what
    another codemod set) and wrap the loaders of the fused QKV weight and
    bias, and of per-head query/key norms, so that they load reordered."""
    from autoport_cst.transform.cst_helpers import ensure_import_from

    edits: dict = {}
    for cls in attention_classes(module, ctx, codemod_id):
        name = cls.name.value
        init = require_method(cls, "__init__", ctx, module, codemod_id)
        existing = None
        for node in walk(init):
            if isinstance(node, cst.SimpleStatementLine):
                pair = self_assignment(node)
                if pair is not None and pair[0] == "rope_column_order":
                    existing = node
        current_rotary, current_interleaved = "self.head_dim", "False"
        if existing is not None:
            call = self_assignment(existing)[1]
            if not (isinstance(call, cst.Call) and dotted(call.func) == "_rope_column_order"):
                raise ctx.precondition(
                    f"{codemod_id}: {name}.rope_column_order is not built by _rope_column_order(...)",
                    existing,
                    module,
                )
            current_rotary, current_interleaved = _order_call_values(call)
        init_params = [p.name.value for p in init.params.params]
        config = init_params[1] if len(init_params) > 1 else "config"
        new_rotary = rotary_dim.format(config=config) if rotary_dim is not None else current_rotary
        new_interleaved = (
            ("True" if interleaved else "False") if interleaved is not None else current_interleaved
        )
        code = (
            f"self.rope_column_order = _rope_column_order(self.head_dim, "
            f"rotary_dim={new_rotary}, interleaved={new_interleaved})"
        )
        stmt = with_comment(parse_statement(code, module), ROPE_ORDER_COMMENT)
        if existing is not None:
            if module.code_for_node(existing.with_changes(leading_lines=[])).strip() != code:
                edits[id(existing)] = lambda updated, stmt=stmt: stmt.with_changes(
                    leading_lines=updated.leading_lines
                )
        else:
            anchor = None
            for attr in ("qkv_split_indices", "kv_size", "q_size"):
                anchor = next(
                    (s for s in init.body.body if (p := self_assignment(s)) is not None and p[0] == attr),
                    None,
                )
                if anchor is not None:
                    break
            if anchor is None:
                raise ctx.precondition(
                    f"{codemod_id}: {name}.__init__ sets no self.q_size / self.kv_size "
                    "(the widths of the query and key heads)",
                    init,
                    module,
                )
            edits[id(anchor)] = lambda updated, stmt=stmt: cst.FlattenSentinel([updated, stmt])

        # loaders
        loaders: dict[str, cst.SimpleStatementLine] = {}
        wrapped: set[str] = set()
        for node in walk(cls):
            if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Expr):
                call = node.body[0].value
                if is_call(call, "set_weight_loader") and call.args:
                    target = dotted(call.args[0].value) or ""
                    inner = call.args[1].value if len(call.args) > 1 else None
                    if isinstance(inner, cst.Call) and dotted(inner.func) == "_rope_columns_loader":
                        wrapped.add(target)
                    else:
                        loaders.setdefault(target, node)
        params = self_parameters(cls)
        if "self.qkv_proj_weight" not in loaders and "self.qkv_proj_weight" not in wrapped:
            raise ctx.precondition(
                f"{codemod_id}: {name} attaches no loader to self.qkv_proj_weight "
                "(set_weight_loader(self.qkv_proj_weight, ...))",
                cls,
                module,
            )
        targets = [(f"self.{p}", width) for p, width in ROPE_REORDERED if p in params]
        for norm in ("q_norm", "k_norm"):
            if find_self_assignment_deep(init, norm) is not None:
                width = "self.head_dim"
                if norm_is_full_width(cls, norm):
                    width = "self.q_size" if norm == "q_norm" else "self.kv_size"
                targets.append((f"self.{norm}.weight", width))
        last_anchor = None
        additions = []
        for target, width in targets:
            if target in wrapped:
                continue
            anchor = loaders.get(target)
            wrap = parse_statement(
                f"set_weight_loader(\n"
                f"    {target},\n"
                f"    _rope_columns_loader(get_weight_loader({target}), self.rope_column_order, {width}),\n"
                f")",
                module,
            )
            if anchor is not None:
                edits[id(anchor)] = lambda updated, wrap=wrap: cst.FlattenSentinel([updated, wrap])
                last_anchor = anchor
            else:
                additions.append(wrap)
        if additions:
            # parameters loaded by name (norm gammas): wrap after the last loader
            anchor = last_anchor or loaders.get("self.qkv_proj_weight")
            if anchor is None:
                raise ctx.precondition(
                    f"{codemod_id}: nowhere to attach the reordering loaders in {name}", cls, module
                )
            previous = edits.get(id(anchor))

            def place(updated, previous=previous, additions=additions):
                base = previous(updated) if previous else updated
                nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
                return cst.FlattenSentinel([*nodes, *additions])

            edits[id(anchor)] = place
    module = rewrite(module, edits)
    module = add_functions(module, [ROPE_ORDER_FUNCTION, ROPE_LOADER_FUNCTION])
    loaders_module = "vllm_neuron.utils.weight_loader"
    for imported in ("SafetensorsWeightLoader", "get_weight_loader", "set_weight_loader"):
        module = ensure_import_from(module, loaders_module, imported)
    return module


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
