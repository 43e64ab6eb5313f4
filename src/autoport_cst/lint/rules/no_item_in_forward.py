"""NRN003 no-item-in-forward."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.index import Site
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.cst.vocabulary import positional_args, receiver

HOST_READS = {
    "item": "`.item()` reads a tensor value back to Python",
    "tolist": "`.tolist()` reads tensor values back to Python",
    "numpy": "`.numpy()` copies a tensor to the host",
}
CONVERSIONS = ("int", "float", "bool", "complex")
REDUCTIONS_TO_BOOL = frozenset({"torch.equal", "torch.allclose", "torch.is_nonzero"})


class NoItemInForward(Rule):
    """A tensor value read back into Python on the forward path:
    ``.item()``, ``.tolist()``, ``.numpy()``, ``int(t)`` / ``float(t)`` /
    ``bool(t)`` of a tensor, or a Python ``if`` / ``while`` / ``assert`` /
    conditional expression whose condition is a tensor.

    Why: ``forward`` is traced by ``torch.compile``; reading a tensor's value
    needs the data on the host at trace time. The Neuron backend fails with
    "Unsupported Tensor.item() call with capture_scalar_outputs=False", or the
    graph breaks and every step pays a device round trip. Keep values as
    tensors (``positions.max() + 1``), use ``torch.where`` instead of a Python
    branch, and read Python numbers from static metadata (``attn_metadata``
    ints, ``.shape``).

    Not reported: ``.items()`` of dicts, ``.shape[...]``, ``.size()``,
    ``.dim()``, ``.numel()``, comparisons of Python ints from metadata, and
    ``int(x)`` / ``if x`` when ``x`` is not known to be a tensor. A value is a
    tensor when it comes from a ``torch.*`` call, a tensor method (``.sum()``,
    ``.max()`` ...), arithmetic on a tensor, a parameter annotated
    ``torch.Tensor``, or a local assigned only from those.

    Example::

        def forward(self, positions):
            max_len = int(positions.max())   # NRN003
            max_len = positions.max() + 1    # fine: stays a tensor
    """

    CODE = "NRN003"
    NAME = "no-item-in-forward"
    MESSAGE = "tensor value read into Python on the forward path"
    SCOPE = "forward"

    VALID = (
        Valid(
            """
            class Attention(nn.Module):
                def forward(self, hidden_states, attn_metadata):
                    meta = attn_metadata["layers.0.self_attn"]
                    tokens = hidden_states.shape[0]
                    batch = int(meta["block_table_tensor"].shape[0])
                    if meta["max_query_len"] > meta["decode_token_threshold"]:
                        return hidden_states
                    for key, value in attn_metadata.items():
                        pass
                    assert tokens == batch * 2
                    return hidden_states.view(batch, -1), (hidden_states.max() + 1)
            """,
            title="metadata ints, shapes and dict items",
        ),
        Valid(
            """
            class Model(nn.Module):
                def _load_kv_cache_scales(self, checkpoint):
                    self.k_scale_float = self.k_scale.item()

                def forward(self, x, n: int):
                    if n:
                        return int(n) + x
                    return x
            """,
            title="load time, and Python ints",
        ),
        Valid(
            """
            class Model(nn.Module):
                def forward(self, x):
                    return self._debug(x)

                @torch.compiler.disable
                def _debug(self, x):
                    print(x.sum().item())
                    return x
            """,
            title="functions excluded from tracing",
        ),
    )
    INVALID = (
        Invalid(
            """
            class Model(nn.Module):
                def forward(self, positions, x: torch.Tensor):
                    first = positions[0].item()
                    ids = positions.tolist()
                    top = int(positions.max())
                    scale = float(x)
                    return first, ids, top, scale
            """,
            at=((3, 30), (4, 25), (5, 15), (6, 17)),
        ),
        Invalid(
            """
            class Model(nn.Module):
                def forward(self, x):
                    mask = torch.isfinite(x)
                    if mask.all():
                        return x
                    while (x > 0).any():
                        x = x - 1
                    assert torch.equal(x, x)
                    return x if mask else -x
            """,
            at=((4, 12), (6, 15), (8, 16), (9, 21)),
            title="Python control flow on tensors",
        ),
        Invalid(
            """
            def _max_len(positions):
                return positions.max().item() + 1

            class Attention(nn.Module):
                def forward(self, positions):
                    return _max_len(positions)
            """,
            at=((2, 28),),
            title="a module-level helper reached from forward",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        self.pending: list[tuple[cst.CSTNode, cst.BaseExpression, Site, str]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.function is None:
            return
        func = node.func
        if isinstance(func, cst.Attribute):
            if func.attr.value in HOST_READS and receiver(node) is not None and not node.args:
                what = HOST_READS[func.attr.value]
                self.report(
                    func.attr,
                    f"{what} on the forward path; torch.compile cannot "
                    "capture it on Neuron (keep the value as a tensor)",
                )
            return
        if isinstance(func, cst.Name) and func.value in CONVERSIONS:
            args = positional_args(node)
            if len(args) == 1 and len(node.args) == 1:
                self.pending.append((node, args[0].value, self.ctx.site(), f"{func.value}()"))

    def _condition(self, node: cst.CSTNode, test: cst.BaseExpression) -> None:
        if self.ctx.function is None:
            return
        for part in _operands(test):
            self.pending.append((part, part, self.ctx.site(), "condition"))

    def visit_If(self, node: cst.If) -> None:
        self._condition(node, node.test)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node, node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._condition(node, node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._condition(node, node.test)

    def finish(self) -> None:
        types = self.ctx.types
        for node, value, site, how in self.pending:
            if not self.ctx.on_forward_path(site.function):
                continue
            if how == "condition":
                if isinstance(value, cst.Call) and _dotted(value.func) in REDUCTIONS_TO_BOOL:
                    pass
                elif not types.is_tensor(value, site.function):
                    continue
                self.report(
                    node,
                    "Python control flow on a tensor value on the forward "
                    "path forces a host read; torch.compile cannot capture it on "
                    "Neuron (use torch.where or keep the branch static)",
                    site=site,
                )
            elif types.is_tensor(value, site.function):
                self.report(
                    node,
                    f"`{how}` of a tensor reads its value into Python on the "
                    "forward path; torch.compile cannot capture it on Neuron (keep "
                    "the value as a tensor)",
                    site=site,
                )


def _dotted(node):
    from autoport_cst.transform.cst.vocabulary import dotted

    return dotted(node)


def _operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The parts of a condition that Python converts to bool."""
    if isinstance(test, cst.BooleanOperation):
        return _operands(test.left) + _operands(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _operands(test.expression)
    return [test]
