"""NRN002 no-device-move-in-forward."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.index import Site
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.cst.vocabulary import keyword_arg, positional_args, receiver


class NoDeviceMoveInForward(Rule):
    """A tensor moved between devices on the forward path: ``.to(<device>)``,
    ``.to(device=...)``, ``.cuda()`` or ``.cpu()``.

    Why: the runner builds the model on the meta device, loads the weights on
    the Neuron device and traces ``forward`` (and everything it calls) with
    ``torch.compile``. A device move inside the traced graph becomes a
    cross-device copy that the Neuron backend cannot lower ("NotImplementedError:
    unimplemented _copy_from xla:0 neuron:N"), or a host round trip on every
    step. Create tensors where they are needed instead
    (``torch.arange(n, device=x.device)``).

    Dtype casts are fine and are not reported: ``.to(torch.float32)``,
    ``.to(x.dtype)``, ``.to(self.dtype)``, ``.to(dtype=...)``,
    ``.to(input_dtype)``. The argument of ``.to`` is read as in the anatomy's
    linter notes: a name containing ``dtype``, a ``torch.<dtype>`` or an
    attribute ending in ``.dtype`` is a dtype; a name containing ``device``, an
    attribute ending in ``.device``, a string, an integer or ``torch.device(...)``
    is a device; a local is followed to its assignments; anything else is
    unknown and not reported.

    Example::

        def forward(self, positions):
            positions = positions.to(self.device)   # NRN002
            positions = positions.to(torch.int32)   # fine: a dtype cast
    """

    CODE = "NRN002"
    NAME = "no-device-move-in-forward"
    MESSAGE = "device move on the forward path"
    SCOPE = "forward"

    VALID = (
        Valid(
            """
            class Norm(nn.Module):
                def forward(self, x):
                    dtype = x.dtype
                    x = x.to(torch.float32)
                    y = x.to(self.weight.dtype).to(dtype=torch.bfloat16)
                    return (self.weight * y).to(dtype)
            """,
            title="dtype casts",
        ),
        Valid(
            """
            class Attention(nn.Module):
                def forward(self, x, slot_mapping, input_dtype):
                    heads = torch.arange(4, device=x.device)
                    idx = slot_mapping.view(2, 3).to(torch.uint32)
                    return x.to(input_dtype), heads, idx, x.to(other)
            """,
            title="factories with device= and unknown arguments",
        ),
        Valid(
            """
            class Model(nn.Module):
                def load_weights(self, path, device="cpu"):
                    self.scale = self.scale.to(device)

                def _load_kv_cache_scales(self, device):
                    return self.k.to(device)

                def forward(self, x):
                    return x
            """,
            title="load-time methods are not on the forward path",
        ),
        Valid(
            """
            def helper(x, device):
                return x.to(device)

            class Model(nn.Module):
                def forward(self, x):
                    return x
            """,
            title="a helper that forward never calls",
        ),
    )
    INVALID = (
        Invalid(
            """
            class Model(nn.Module):
                def forward(self, x):
                    x = x.to(self.device)
                    y = x.cuda()
                    return y.cpu()
            """,
            at=((3, 15), (4, 15), (5, 18)),
        ),
        Invalid(
            """
            class Model(nn.Module):
                def forward(self, x, other):
                    a = x.to(other.device)
                    b = x.to("cpu")
                    c = x.to(device=other.device, dtype=torch.float32)
                    return a, b, c, x.to(torch.device("neuron"))
            """,
            at=((3, 15), (4, 15), (5, 15), (6, 27)),
        ),
        Invalid(
            """
            def _rotate(x):
                return x.to(x.device)

            class Attention(nn.Module):
                def forward(self, x):
                    return self._step(x)

                def _step(self, x):
                    target = torch.device("cpu")
                    return _rotate(x).to(target)
            """,
            at=((2, 14), (10, 27)),
            title="helpers reached from forward, and a local device",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        # (the name of the ``.to`` call, its device argument, where, how it is passed)
        self.pending: list[tuple[cst.Name, cst.BaseExpression, Site, str]] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or receiver(node) is None:
            return
        name = func.attr.value
        if name in ("cuda", "cpu"):
            if not positional_args(node) or name == "cuda":
                self.report(
                    func.attr,
                    f"`.{name}()` moves a tensor on the forward path; "
                    "Neuron traces forward with torch.compile and cannot lower "
                    "device copies",
                )
            return
        if name != "to" or self.ctx.function is None:
            return
        device = keyword_arg(node, "device")
        if device is not None:
            self.pending.append((func.attr, device.value, self.ctx.site(), "device="))
            return
        args = positional_args(node)
        if args:
            self.pending.append((func.attr, args[0].value, self.ctx.site(), ""))

    def finish(self) -> None:
        types = self.ctx.types
        for to_name, arg, site, how in self.pending:
            if not self.ctx.on_forward_path(site.function):
                continue
            kind = types.kind(arg, site.function)
            if how == "device=":
                if kind == "none":
                    continue
            elif kind != "device":
                continue
            self.report(
                to_name,
                "`.to(<device>)` moves a tensor on the forward path; Neuron traces forward "
                "with torch.compile and cannot lower device copies (create the tensor on "
                "the right device, e.g. torch.arange(n, device=x.device))",
                site=site,
            )
