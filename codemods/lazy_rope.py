"""lazy-rope: RoPE tensors move out of ``__init__`` into ``_compute_inv_freq(device)``."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes,
    classes_with_role,
    deep_statements,
    dotted,
    free_names,
    is_call,
    is_docstring,
    is_none,
    keyword_arg,
    method,
    nodes_of,
    self_assignment,
    self_attr,
    statements,
    string_text,
    walk,
)
from autoport_cst.transform.edit.tree import with_statements

ROPE_NAME = re.compile(r"(^|_)(inv_freq|cos|sin)(_|$)")
METHOD = "_compute_inv_freq"
TENSOR_FACTORIES = (
    "arange",
    "ones",
    "zeros",
    "empty",
    "full",
    "tensor",
    "linspace",
    "logspace",
    "rand",
    "randn",
    "eye",
    "ones_like",
    "zeros_like",
)


class LazyRope(Codemod):
    """Compute RoPE tensors lazily: ``inv_freq`` (and cos/sin caches) move from
    ``__init__`` into a ``_compute_inv_freq(device)`` method called from ``forward``.

    Models are built under ``torch.device("meta")``: a tensor computed in
    ``__init__`` is a meta tensor with no data, and loading fails ("Cannot
    copy out of meta tensor"). Parameters are replaced by the weight loader,
    computed buffers are not.

    In every class whose ``__init__`` stores a RoPE tensor (an attribute or a
    ``register_buffer`` whose name contains ``inv_freq``, ``cos`` or ``sin``,
    with a value computed by ``torch`` calls):

    - those statements, and the tensor-valued local statements they depend on,
      move into ``_compute_inv_freq(self, device)``, which returns the tensors;
      tensor factories (``torch.arange`` ...) get ``device=device``;
    - Python values the moved code reads from ``__init__``'s locals or
      parameters stay in ``__init__`` and are kept as attributes (an existing
      ``self.x = x`` is reused);
    - ``forward`` starts with ``inv_freq = self._compute_inv_freq(<device>)``
      and reads the local instead of ``self.inv_freq``. The device is the
      ``device`` parameter when callers must pass it; the first other input's
      ``.device`` when there is none; and when ``device`` has a default (a
      caller may omit it, and ``None`` would build the tables on the default
      device, not the model's), ``device if device is not None else
      <input>.device``. A ``forward`` with neither is refused.

    Code that is already lazy is left unchanged. Preconditions: a moved
    attribute read outside ``forward`` (or by code staying in ``__init__``) is
    an error with its position, since rewriting only ``forward`` would leave
    that read broken; so is a file with neither a rotary-embedding class nor
    an eager RoPE tensor.
    """

    ID = "lazy-rope"
    PURPOSE = "hardware rule"
    EXAMPLES = (
        Example(
            title="register_buffer of inv_freq",
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, dim, base=10000, device=None):
                        super().__init__()
                        self.dim = dim
                        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
                        self.register_buffer("inv_freq", inv_freq, persistent=False)

                    def forward(self, x, position_ids):
                        freqs = torch.outer(position_ids.float(), self.inv_freq)
                        return freqs.cos(), freqs.sin()
            """,
            after="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, dim, base=10000, device=None):
                        super().__init__()
                        self.dim = dim
                        self.base = base

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float() / self.dim))
                        return inv_freq

                    def forward(self, x, position_ids):
                        inv_freq = self._compute_inv_freq(x.device)
                        freqs = torch.outer(position_ids.float(), inv_freq)
                        return freqs.cos(), freqs.sin()
            """,
        ),
        Example(
            title="a device argument a caller may omit: the input's device when it does",
            before="""
                class OldRotaryEmbedding(nn.Module):
                    def __init__(self, dim, base=10000):
                        super().__init__()
                        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))

                    def forward(self, position_ids, device=None, dtype=None):
                        freqs = torch.outer(position_ids.float(), self.inv_freq)
                        return freqs.cos().to(dtype), freqs.sin().to(dtype)
            """,
            after="""
                class OldRotaryEmbedding(nn.Module):
                    def __init__(self, dim, base=10000):
                        super().__init__()
                        self.base = base
                        self.dim = dim

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, device=device).float() / self.dim))
                        return inv_freq

                    def forward(self, position_ids, device=None, dtype=None):
                        inv_freq = self._compute_inv_freq(device if device is not None else position_ids.device)
                        freqs = torch.outer(position_ids.float(), inv_freq)
                        return freqs.cos().to(dtype), freqs.sin().to(dtype)
            """,
        ),
        Example(
            title="already lazy: unchanged",
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim

                    def _compute_inv_freq(self, device):
                        return 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=device) / self.head_dim))
            """,
            after="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim

                    def _compute_inv_freq(self, device):
                        return 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=device) / self.head_dim))
            """,
        ),
        Example(
            title="a cached table read outside forward",
            before="""
                class OldRotaryEmbedding(nn.Module):
                    def __init__(self, dim):
                        self.cos_cached = torch.ones(dim).cos()

                    def forward(self, x):
                        return x * self.cos_cached

                    def extend(self):
                        return self.cos_cached
            """,
            raises="self.cos_cached is read in extend",
        ),
        Example(
            title="nothing to make lazy",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.size = config.intermediate_size
            """,
            raises="no rotary embedding class",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        changed = False
        new_body = []
        for stmt in module.body:
            if isinstance(stmt, cst.ClassDef):
                new = self._transform_class(stmt, module, ctx)
                changed |= new is not stmt
                new_body.append(new)
            else:
                new_body.append(stmt)
        if changed:
            return module.with_changes(body=new_body)
        if not classes_with_role(module, "rotary") and not any(method(c, METHOD) for c in classes(module)):
            raise ctx.precondition(
                "lazy-rope: no rotary embedding class (<Prefix>RotaryEmbedding) and no "
                "inv_freq/cos/sin tensor computed in an __init__ in this file"
            )
        return module

    def _transform_class(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> cst.ClassDef:
        """``cls`` with the RoPE tensors its ``__init__`` computes moved to
        ``_compute_inv_freq(device)``, called from ``forward``."""
        init = method(cls, "__init__")
        if init is None:
            return cls
        body = list(statements(init))
        # RoPE tensors stored on self: attributes and buffers (a registered
        # buffer is a tensor whatever computes it)
        sinks = {index: name for index, stmt in enumerate(body) if (name := _rope_sink(stmt)) is not None}
        outputs = list(dict.fromkeys(sinks.values()))
        self._refuse_nested_buffers(cls, init, body, module, ctx)
        tensor_locals = _tensor_locals(body, sinks, outputs)
        moved = sorted(
            i
            for i, stmt in enumerate(body)
            if i in sinks or (_simple_local(stmt) or ("",))[0] in tensor_locals
        )
        _refuse_mixed_assignments(cls, body, tensor_locals, module, ctx)
        if not outputs:
            return cls
        if method(cls, METHOD) is not None:
            raise ctx.precondition(
                f"lazy-rope: {cls.name.value} already defines {METHOD} but still computes "
                f"{', '.join(outputs)} in __init__",
                cls,
                module,
            )
        # keep only the tensor locals the rope tensors need
        moved = _needed(body, moved, set(sinks))
        moved_set = set(moved)
        kept = [s for i, s in enumerate(body) if i not in moved_set]
        _refuse_reads_left_behind(cls, kept, tensor_locals, outputs, module, ctx)
        forward = method(cls, "forward")
        if forward is None:
            raise ctx.precondition(
                f"lazy-rope: {cls.name.value} has no forward to compute {outputs[0]} in", cls, module
            )
        moved_stmts = [body[i] for i in moved]
        keep_attrs, rename = _carried_scalars(init, kept, moved_stmts, tensor_locals, module)
        new_method = _lazy_method(moved_stmts, rename, outputs, module)
        new_init = with_statements(init, kept + keep_attrs)
        new_forward = self._rewrite_forward(forward, outputs, module, ctx, cls)
        new_members = []
        for member in cls.body.body:
            if member is init:
                new_members += [new_init, new_method]
            elif member is forward:
                new_members.append(new_forward)
            else:
                new_members.append(member)
        return cls.with_changes(body=cls.body.with_changes(body=new_members))

    def _refuse_nested_buffers(self, cls, init, body, module, ctx) -> None:
        """Buffers registered inside loops or conditions (per-layer-type tables,
        ``setattr(self, f"{t}_inv_freq", ...)``) are not moved: refuse rather
        than leave them silently."""
        rotary = class_role(cls.name.value) == "rotary"
        top_level = {id(s) for s in body}
        for stmt in deep_statements(init):
            if id(stmt) in top_level:
                continue
            for node in nodes_of(stmt, cst.Call):
                name = dotted(node.func) or ""
                stored = None
                if name == "self.register_buffer" and node.args:
                    stored = string_text(node.args[0].value)
                elif name == "setattr" and len(node.args) >= 2 and dotted(node.args[0].value) == "self":
                    stored = string_text(node.args[1].value)
                elif name.endswith("Buffer") and rotary:
                    stored = "a buffer"
                else:
                    continue
                if stored is None or "{" in stored or ROPE_NAME.search(stored) or rotary:
                    raise ctx.precondition(
                        f"lazy-rope: {cls.name.value}.__init__ stores {stored or 'a computed tensor'} "
                        "inside a loop or condition; lazy-rope only moves top-level statements",
                        node,
                        module,
                    )

    def _rewrite_forward(
        self, forward: cst.FunctionDef, outputs: list[str], module, ctx, cls
    ) -> cst.FunctionDef:
        device = _forward_device(forward)
        if device is None:
            raise ctx.precondition(
                f"lazy-rope: {cls.name.value}.forward takes neither a device nor a tensor to compute the RoPE "
                "tensors on",
                forward,
                module,
            )
        targets = ", ".join(outputs)
        call = parse_statement(f"{targets} = self.{METHOD}({device})", module)
        body = list(statements(forward))
        insert_at = 1 if body and is_docstring(body[0]) else 0
        body = body[:insert_at] + [call] + [s.visit(_ReadLocal(set(outputs))) for s in body[insert_at:]]
        return with_statements(forward, body)


def _tensor_locals(body: list[cst.BaseStatement], sinks: dict[int, str], outputs: list[str]) -> set[str]:
    """Locals of ``__init__`` holding tensors: read by a RoPE tensor stored
    on self, or computed by torch from tensors (to a fixed point)."""
    tensor_locals: set[str] = set()
    for index in sinks:
        tensor_locals |= _payload_names(_sink_value(body[index]))
    grew = True
    while grew:
        grew = False
        for stmt in body:
            local = _simple_local(stmt)
            if local and local[0] not in tensor_locals and _is_tensor_expr(local[1], tensor_locals, outputs):
                tensor_locals.add(local[0])
                grew = True
    return tensor_locals


def _refuse_mixed_assignments(cls, body, tensor_locals: set[str], module, ctx) -> None:
    """A tensor local assigned by anything but ``name = value`` cannot move."""
    for stmt in body:
        if _simple_local(stmt) is None and _assigned_names(stmt) & tensor_locals:
            raise ctx.precondition(
                f"lazy-rope: {cls.name.value}.__init__ computes "
                f"{', '.join(sorted(_assigned_names(stmt) & tensor_locals))} in a statement "
                "that also assigns other values; split it so the tensor can move",
                stmt,
                module,
            )


def _refuse_reads_left_behind(cls, kept, tensor_locals: set[str], outputs: list[str], module, ctx) -> None:
    """The tensors that move must not be read where they no longer are: by
    the statements ``__init__`` keeps, or by methods other than ``forward``."""
    for stmt in kept:
        reads = free_names(stmt) & tensor_locals
        if reads:
            raise ctx.precondition(
                f"lazy-rope: {cls.name.value}.__init__ keeps using the tensor "
                f"{sorted(reads)[0]} after it would move",
                stmt,
                module,
            )
    for node in walk(cls):
        if isinstance(node, cst.FunctionDef) and node.name.value not in ("__init__", "forward"):
            for attr in outputs:
                if any(self_attr(n) == attr for n in walk(node)):
                    raise ctx.precondition(
                        f"lazy-rope: self.{attr} is read in {node.name.value}; only forward "
                        "is rewritten to use the lazily computed tensor",
                        node,
                        module,
                    )


def _carried_scalars(
    init: cst.FunctionDef, kept, moved_stmts, tensor_locals: set[str], module: cst.Module
) -> tuple[list[cst.BaseStatement], dict[str, str]]:
    """The Python values the moved code reads from ``__init__``'s locals and
    parameters, carried on self: the ``self.<name> = <name>`` statements to
    add, and each name's attribute (an existing one when ``__init__``
    already stores it)."""
    init_params = [p.name.value for p in init.params.params[1:]]
    scalar_locals = {t for s in kept for t in _assigned_names(s)} | set(init_params)
    existing_attr = {}
    for stmt in kept:
        found = self_assignment(stmt)
        if found and isinstance(found[1], cst.Name) and found[1].value not in existing_attr:
            existing_attr[found[1].value] = found[0]
    needed = set()
    for stmt in moved_stmts:
        needed |= free_names(stmt)
    needed = (needed & scalar_locals) - tensor_locals - {"device"}
    keep_attrs = []
    rename = {}
    for name in sorted(needed):
        attr = existing_attr.get(name)
        if attr is None:
            attr = name
            keep_attrs.append(parse_statement(f"self.{name} = {name}", module))
        rename[name] = attr
    return keep_attrs, rename


def _lazy_method(
    moved_stmts, rename: dict[str, str], outputs: list[str], module: cst.Module
) -> cst.FunctionDef:
    """``_compute_inv_freq(self, device)``: the moved statements as locals,
    reading the carried values from self, returning the RoPE tensors."""
    method_body = []
    for stmt in moved_stmts:
        converted = _as_local(stmt)
        if converted is None:
            continue
        converted = converted.visit(_Relocate(rename)).visit(_ReadLocal(set(outputs)))
        method_body.append(converted.with_changes(leading_lines=[]))
    method_body += parse_statements(f"return {', '.join(outputs)}", module)
    new_method = parse_statement(f"def {METHOD}(self, device):\n    pass\n", module)
    assert isinstance(new_method, cst.FunctionDef)
    return with_statements(new_method, method_body).with_changes(leading_lines=[cst.EmptyLine(indent=False)])


def _forward_device(forward: cst.FunctionDef) -> str | None:
    """Where ``forward`` computes the RoPE tensors: its ``device`` argument
    when a caller must pass one; the device of its first other input (a
    tensor: the hidden states or the position ids) when there is no
    ``device`` argument, or as the fallback of one that defaults (a caller
    may omit it: ``None`` would build the tables on the default device)."""
    params = list(forward.params.params[1:])
    others = [p.name.value for p in params if p.name.value not in ("device", "dtype")]
    tensor = f"{others[0]}.device" if others else None
    device = next((p for p in params if p.name.value == "device"), None)
    if device is None:
        return tensor
    if device.default is None:
        return "device"
    if tensor is None:
        return None
    return f"device if device is not None else {tensor}"


def _is_tensor_expr(node: cst.CSTNode, tensor_locals: set[str], rope_attrs=()) -> bool:
    for n in walk(node):
        if isinstance(n, cst.Call) and (dotted(n.func) or "").startswith("torch."):
            return True
        if isinstance(n, cst.Name) and n.value in tensor_locals:
            return True
        if self_attr(n) in rope_attrs:
            return True
    return False


def _register_buffer(stmt: cst.BaseStatement) -> cst.Call | None:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and is_call(stmt.body[0].value, "self.register_buffer")
        and len(stmt.body[0].value.args) >= 2
    ):
        return stmt.body[0].value
    return None


def _rope_sink(stmt: cst.BaseStatement) -> str | None:
    """Name of the RoPE tensor this statement stores on self: a buffer or an
    attribute named like inv_freq / cos / sin, holding a computed value."""
    found = self_assignment(stmt)
    if found and ROPE_NAME.search(found[0]):
        value = found[1]
        literal = (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
        if isinstance(value, literal) or dotted(value) in ("None", "True", "False"):
            return None
        return found[0]
    call = _register_buffer(stmt)
    if call is not None:
        name = string_text(call.args[0].value)
        if name and ROPE_NAME.search(name) and not is_none(call.args[1].value):
            return name
    return None


def _sink_value(stmt: cst.BaseStatement) -> cst.BaseExpression:
    found = self_assignment(stmt)
    if found:
        return found[1]
    return _register_buffer(stmt).args[1].value


def _payload_names(value: cst.BaseExpression) -> set[str]:
    """Locals whose tensor a stored value carries: ``x``, ``nn.Buffer(x, ...)``,
    ``x.clone()``, ``x.cos()``, ``x[...]``."""
    if isinstance(value, cst.Name):
        return {value.value}
    if isinstance(value, cst.Call):
        if (dotted(value.func) or "").endswith("Buffer") and value.args:
            return _payload_names(value.args[0].value)
        if isinstance(value.func, cst.Attribute):
            return _payload_names(value.func.value)
    if isinstance(value, cst.Subscript):
        return _payload_names(value.value)
    return set()


def _simple_local(stmt: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """(name, value) of ``name = value`` (one Name target)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
    ):
        return small.targets[0].target.value, small.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
        return small.target.value, small.value
    return None


def _assigned_names(stmt: cst.CSTNode) -> set[str]:
    """Names a statement binds (plain, annotated, augmented and tuple targets,
    loop targets)."""
    names = set()
    for n in nodes_of(stmt, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For):
        target = n.target  # type: ignore[attr-defined]
        if not isinstance(target, cst.Attribute):
            names.update(leaf.value for leaf in nodes_of(target, cst.Name))  # type: ignore[attr-defined]
    return names


def _needed(body, moved: list[int], rope_indexes: set[int]) -> list[int]:
    """Moved statements that the rope tensors depend on (backward slice)."""
    keep: list[int] = []
    wanted: set[str] = set()
    for index in reversed(moved):
        stmt = body[index]
        if index in rope_indexes:
            keep.append(index)
            wanted |= free_names(stmt)
            continue
        if _assigned_names(stmt) & wanted:
            keep.append(index)
            wanted |= free_names(stmt)
    return sorted(keep)


def _as_local(stmt: cst.BaseStatement) -> cst.BaseStatement | None:
    """``self.x = e`` / ``register_buffer("x", e)`` -> ``x = e`` (None when
    it would be ``x = x``); other statements unchanged."""
    found = self_assignment(stmt)
    name = value = None
    if found:
        name, value = found
    elif _register_buffer(stmt) is not None:
        call = _register_buffer(stmt)
        name, value = string_text(call.args[0].value), call.args[1].value
    if name is None:
        return stmt
    if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("Buffer") and value.args:
        value = value.args[0].value  # nn.Buffer(t, persistent=False) -> t
    if isinstance(value, cst.Name) and value.value == name:
        return None
    return cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=value)])


class _Relocate(cst.CSTTransformer):
    """Inside the new method: __init__ locals become attributes, and tensor
    factories are created on ``device``."""

    def __init__(self, rename: dict[str, str]) -> None:
        self.rename = rename
        self.not_variables: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_variables.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_variables.add(id(node.keyword))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        name = dotted(updated.func) or ""
        if name.startswith("torch.") and name.split(".")[-1] in TENSOR_FACTORIES:
            device = cst.Name("device")
            existing = keyword_arg(updated, "device")
            if existing is not None:
                return updated.with_changes(
                    args=[a.with_changes(value=device) if a is existing else a for a in updated.args]
                )
            new_arg = cst.Arg(
                keyword=cst.Name("device"),
                value=device,
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
            args = list(updated.args)
            if args:
                last = args[-1]
                args[-1] = (
                    last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    if last.comma is cst.MaybeSentinel.DEFAULT
                    else last
                )
            return updated.with_changes(args=[*args, new_arg])
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.not_variables or original.value not in self.rename:
            return updated
        return cst.Attribute(value=cst.Name("self"), attr=cst.Name(self.rename[original.value]))


class _ReadLocal(cst.CSTTransformer):
    """``self.inv_freq`` -> ``inv_freq`` for the lazily computed tensors."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        attr = self_attr(updated)
        if attr in self.names:
            return cst.Name(attr)
        return updated
