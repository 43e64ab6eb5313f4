"""NRN001 no-tensor-compute-in-init."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.exprs import tensor_call
from autoport_cst.lint.index import CallSite, FunctionInfo, ModuleIndex, Site
from autoport_cst.lint.rule import Invalid, Option, Rule, Valid
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    iter_nodes,
    keyword_arg,
    positional_args,
    receiver,
    self_assignment,
    string_value,
)

PARAMETER = frozenset({"nn.Parameter", "torch.nn.Parameter", "Parameter"})
# allocations that nn.Parameter(...) may wrap: replaced by load_state_dict(assign=True)
ALLOCATIONS = frozenset(
    {
        "empty",
        "zeros",
        "ones",
        "full",
        "rand",
        "randn",
        "randint",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "eye",
        "tensor",
        "Tensor",
        "empty_strided",
        "as_tensor",
    }
)
# methods that may wrap an allocation inside nn.Parameter(...)
WRAPPERS = frozenset(
    {
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "contiguous",
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
        "requires_grad_",
        "clone",
    }
)
ROPE_INIT = re.compile(r"(^|\.)(rope_init_fn|_?compute_\w*rope\w*)$")
LOADER = re.compile(r"^(load_weights|_load_\w*)$")
ROPE_TEXT = re.compile(r"inv_freq|rope|rotary|cos_cached|sin_cached|_cos\b|_sin\b", re.I)


@dataclass
class _Found:
    node: cst.Call
    site: Site
    what: str  # "torch.arange", "ROPE_INIT_FUNCTIONS[...]"
    allocation: bool
    device: str | None  # "cpu", "other" or None (no device argument)
    device_name: str | None = None  # the device argument when it is a bare name (a parameter, say)


class NoTensorComputeInInit(Rule):
    """Tensor computation in ``__init__`` of an ``nn.Module``: ``torch.*``
    calls (``torch.arange``, ``torch.outer``, ``torch.tensor``, ``F.*`` ...),
    RoPE initializers (``ROPE_INIT_FUNCTIONS[...]``, ``self.rope_init_fn``),
    and tensor attributes such as ``self.k_scale = torch.ones(1, 1)``, directly
    in ``__init__`` or in a method or module-level function it calls (reported
    at the call in ``__init__``).

    Why: the vLLM Neuron runner builds the model inside
    ``with torch.device("meta")``. A tensor computed in ``__init__`` is a meta
    tensor with no data. Parameters are replaced by the checkpoint loader
    (``load_state_dict(..., assign=True)``), but computed buffers and tensor
    attributes are not: the first use fails with "Cannot copy out of meta
    tensor; no data!", or the model silently runs on garbage. Keep Python
    scalars in ``__init__`` and compute tensors in ``forward`` (for RoPE: a
    ``_compute_inv_freq(device)`` method called from ``forward``).

    Not reported: ``nn.Parameter(torch.empty/ones/zeros/...(...))``,
    ``register_buffer(name, None)``, ``nn.init.*``, submodule constructors,
    Python float math (``head_dim ** -0.5``, ``math.log``), and lambdas and
    closures (they run later, e.g. weight-loader transforms). A computation
    with an explicit ``device="cpu"`` (and arithmetic on such tensors) is the
    grey zone of the real gpt_oss and qwen3_moe models, whose RoPE buffers
    follow ``model.to(device)``: it is reported as a warning, or not at all
    with the option ``allow-cpu-device = true``; so is a call in ``__init__``
    of a helper whose every tensor takes a device this call gives as CPU
    (the real qwen3_moe's ``_compute_yarn_inv_freq_and_concentration("cpu")``).
    A tensor allocated as ``self.A = torch.ones(...)`` where a load method of
    the file (``load_weights``, ``_load_*``) sets ``A`` on a module (``x.A =
    ...`` or ``setattr(x, "A", ...)``, the name a literal or a loop over
    literals) is a placeholder the loader replaces: a warning, since a read
    before the load still finds no data (the real qwen3_moe's ``k_scale``).

    Fix: the ``lazy-rope`` codemod, offered where the finding is RoPE (a
    rotary-embedding class, or ``inv_freq`` / cos / sin tables).

    Example::

        class LlamaRotaryEmbedding(nn.Module):
            def __init__(self, config):
                inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2) / 64))   # NRN001
                self.register_buffer("inv_freq", inv_freq, persistent=False)
    """

    CODE = "NRN001"
    NAME = "no-tensor-compute-in-init"
    MESSAGE = "tensor computed in __init__"
    SCOPE = "init"
    FIX = "lazy-rope"
    OPTIONS = {
        "allow-cpu-device": Option(
            "bool",
            False,
            "Accept tensors computed in __init__ on an explicit CPU device (gpt_oss-style "
            "RoPE buffers) instead of reporting them as warnings.",
        ),
    }

    VALID = (
        Valid(
            """
            class Attention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.scaling = config.head_dim ** -0.5
                    self.concentration = 0.1 * math.log(config.factor) + 1.0
                    self.qkv_proj_weight = nn.Parameter(torch.empty(config.hidden, config.qkv, dtype=config.dtype))
                    self.norm = nn.Parameter(torch.ones(config.hidden).to(config.dtype))
                    self.sinks = nn.Parameter(data=torch.zeros(config.heads, dtype=torch.float32))
                    self.register_buffer("k_scale", None, persistent=False)
                    self.layers = nn.ModuleList([Layer(i) for i in range(config.layers)])
                    set_weight_loader(self.qkv_proj_weight, lambda slices, rank: torch.cat([s[:] for s in slices]))
                    self.dtype = torch.bfloat16
            """,
            title="parameters, scalars, submodules, loader lambdas",
        ),
        Valid(
            """
            class RotaryEmbedding(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.head_dim = config.head_dim

                def _compute_inv_freq(self, device):
                    return 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=device) / self.head_dim))

                def forward(self, positions, device, dtype):
                    return torch.outer(positions, self._compute_inv_freq(device))
            """,
            title="lazy RoPE",
        ),
        Valid(
            """
            class Config:
                def __init__(self):
                    self.mask = torch.ones(4)

            def make_table():
                return torch.arange(10)
            """,
            title="not an nn.Module, and code outside __init__",
        ),
        Valid(
            """
            class RotaryEmbedding(nn.Module):
                def __init__(self, dim):
                    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device="cpu") / dim))
                    self.register_buffer("inv_freq", inv_freq, persistent=False)
            """,
            options={"allow-cpu-device": True},
            title="explicit CPU tensors, accepted by option",
        ),
    )
    INVALID = (
        Invalid(
            """
            class LlamaRotaryEmbedding(nn.Module):
                def __init__(self, dim, base=10000):
                    super().__init__()
                    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
                    self.register_buffer("inv_freq", inv_freq, persistent=False)

                def forward(self, x, position_ids):
                    return torch.outer(position_ids.float(), self.inv_freq)
            """,
            at=((4, 36),),
            message="`torch.arange`",
            fixable=True,
        ),
        Invalid(
            """
            class Qwen3MoeAttention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.k_scale = torch.ones(1, 1)
                    self.mask = nn.Parameter(torch.arange(8).float())
            """,
            at=((4, 24), (5, 34)),
            message="meta",
            fixable=False,
            title="a tensor attribute, and computation inside a parameter",
        ),
        Invalid(
            """
            def _default_inv_freq(dim):
                return 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))

            class RotaryEmbedding(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self._setup(config)

                def _setup(self, config):
                    self.inv_freq = _default_inv_freq(config.head_dim)
                    self.rope_init_fn = ROPE_INIT_FUNCTIONS[config.rope_type]
                    freqs, self.attention_scaling = self.rope_init_fn(config, None)
            """,
            at=((7, 9),),
            message="`self._setup(...)` computes tensors in __init__",
            title="helpers called from __init__",
        ),
        Invalid(
            """
            class GptOssRotaryEmbedding(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    idx = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device="cpu")
                    inv_freq = 1.0 / (config.theta ** (idx / config.head_dim))
                    t = torch.arange(config.max_len, device=torch.device("cpu"))
                    self.register_buffer("cos", torch.outer(t, inv_freq).cos(), persistent=False)
            """,
            at=((4, 15), (6, 13), (7, 37)),
            severity=WARNING,
            message="grey zone",
            title="explicit CPU device: a warning",
        ),
        Invalid(
            """
            class Qwen3MoeRotaryEmbedding(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    inv_freq, concentration = self._yarn_tables(config, "cpu")
                    self.register_buffer("inv_freq", inv_freq, persistent=False)

                def _yarn_tables(self, config, device):
                    freq = config.theta ** (torch.arange(0, config.head_dim, 2, device=device) / config.head_dim)
                    return 1.0 / freq, torch.tensor(1.1, device=device)

                def forward(self, positions):
                    return torch.outer(positions, self.inv_freq)
            """,
            at=((4, 35),),
            severity=WARNING,
            message="explicit CPU device",
            title="a helper given an explicit CPU device by the call in __init__: a warning",
        ),
        Invalid(
            """
            class Qwen3MoeAttention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.k_scale = torch.ones(1, 1, dtype=torch.bfloat16)

            class Qwen3MoeForCausalLM(nn.Module):
                def _load_kv_cache_scales(self, checkpoint):
                    for layer in self.model.layers:
                        for scale_name in ("k_scale", "v_scale"):
                            setattr(layer.self_attn, scale_name, checkpoint.scale(scale_name))
            """,
            at=((4, 24),),
            severity=WARNING,
            message="placeholder",
            fixable=False,
            title="a placeholder the file's loader replaces: a warning",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        self.allowed: set[int] = set()
        self.found: dict[FunctionInfo, list[_Found]] = {}
        self.found_ids: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        fn = ctx.function
        if fn is None or ctx.lambda_depth:
            return
        name = dotted(node.func)
        if name in PARAMETER:
            args = positional_args(node)
            data = args[0].value if args else None
            if data is None:
                arg = keyword_arg(node, "data")
                data = arg.value if arg is not None else None
            root = _allocation_root(data)
            if root is not None:
                self.allowed.add(id(root))
            return
        if id(node) in self.allowed:
            return
        what = None
        allocation = False
        if name is not None and tensor_call(name):
            what = f"`{name}`"
            allocation = name.rsplit(".", 1)[-1] in ALLOCATIONS
        elif name is not None and ROPE_INIT.search(name):
            what = f"`{name}(...)`"
        elif isinstance(node.func, cst.Subscript) and (dotted(node.func.value) or "").endswith(
            "ROPE_INIT_FUNCTIONS"
        ):
            what = "`ROPE_INIT_FUNCTIONS[...](...)`"
        if what is None:
            return
        # report the outermost computation of an expression only
        for outer in ctx.calls[:-1]:
            if id(outer) in self.found_ids:
                return
        self.found_ids.add(id(node))
        found = _Found(node, ctx.site(), what, allocation, _device(node), _device_name(node))
        self.found.setdefault(fn, []).append(found)

    # -- after the traversal ---------------------------------------------------

    def finish(self) -> None:
        index = self.ctx.index
        roots = index.init_roots()
        if not roots:
            return
        root_set = set(roots)
        memo: dict[FunctionInfo, _Found | None] = {}
        replaced = _loader_replaced(index)
        for root in roots:
            cpu = self._cpu_names(root)
            for found in self.found.get(root, ()):
                self._report_direct(found, cpu, replaced)
            for site, target in index.init_callees(root):
                if target in root_set:
                    continue  # super().__init__(): reported in that class
                first = self._reaches(target, memo, set())
                if first is not None:
                    self._report_callee(root, site, target, first, memo)

    def _report_callee(
        self, root: FunctionInfo, site: CallSite, target: FunctionInfo, first: _Found, memo: dict
    ) -> None:
        """A call in ``__init__`` of an in-file function that computes tensors:
        the grey zone when it computes them all on an explicit CPU device,
        given by this call (``helper("cpu")`` for a ``device`` parameter)."""
        call = site.node
        grey = self._cpu_helper(target, call, memo)
        if grey and self.options["allow-cpu-device"]:
            return
        callee = self.ctx.module.code_for_node(call.func)
        where = first.site.function.name if first.site.function else "?"
        if grey:
            message = (
                f"`{callee}(...)` computes tensors in __init__ on an explicit CPU device "
                f"({first.what} in `{where}`; grey zone: gpt_oss/qwen3_moe keep RoPE buffers this "
                "way and rely on model.to(device)); prefer computing them lazily in forward"
            )
        else:
            message = (
                f"`{callee}(...)` computes tensors in __init__ ({first.what} in `{where}`); "
                "the model is built on the meta device, so they hold no data ("
                '"Cannot copy out of meta tensor"): compute them lazily in forward'
            )
        self.report(
            call,
            message,
            site=Site(root, root.cls, site.statement, False),
            severity=WARNING if grey else "error",
            fix=self._rope_like(first.site, call, root),
        )

    def _cpu_helper(self, target: FunctionInfo, call: cst.Call, memo: dict) -> bool:
        """Whether every tensor ``target`` computes itself is on an explicit
        CPU device (given literally, or through a parameter this ``call``
        binds to one), and it calls no other function that computes any."""
        found = self.found.get(target, [])
        if not found or any(
            self._reaches(t, memo, set()) for _site, t in self.ctx.index.init_callees(target)
        ):
            return False
        params = _cpu_parameters(target, call)
        cpu = self._cpu_names(target, params)
        return all(
            f.device == "cpu"
            or (f.device_name is not None and f.device_name in params)
            or (f.device is None and self._from_cpu(f, cpu))
            for f in found
        )

    def _report_direct(self, found: _Found, cpu: set[str], replaced: dict[str, str]) -> None:
        grey = found.device == "cpu" or (found.device is None and self._from_cpu(found, cpu))
        if grey and self.options["allow-cpu-device"]:
            return
        placeholder = _placeholder_of(found)
        if placeholder is not None and placeholder in replaced:
            self.report(
                found.node,
                f"{found.what} makes `self.{placeholder}` a placeholder in __init__ that "
                f"`{replaced[placeholder]}` replaces when it loads the checkpoint; read before "
                "that, it holds no data (the model is built on the meta device): prefer "
                f'`self.register_buffer("{placeholder}", None, persistent=False)`',
                site=found.site,
                severity=WARNING,
                fix=False,
            )
            return
        if found.allocation and found.device != "cpu":
            message = (
                f"{found.what} creates a tensor in __init__ outside nn.Parameter: the model is "
                "built on the meta device and only parameters are replaced by the weight "
                "loader, so this tensor never holds data"
            )
        else:
            message = (
                f"{found.what} computes a tensor in __init__: the model is built on the meta "
                'device, so the result holds no data ("Cannot copy out of meta tensor"); '
                "compute it lazily in forward"
            )
        severity = "error"
        if grey:
            severity = WARNING
            message = (
                f"{found.what} computes a tensor in __init__ on an explicit CPU device "
                "(grey zone: gpt_oss/qwen3_moe keep RoPE buffers this way and rely on "
                "model.to(device)); prefer computing it lazily in forward"
            )
        fn = found.site.function
        self.report(
            found.node,
            message,
            site=found.site,
            severity=severity,
            fix=self._rope_like(found.site, found.node, fn),
        )

    def _rope_like(self, site: Site, node: cst.CSTNode, fn: FunctionInfo | None) -> bool:
        """Whether lazy-rope can fix this: RoPE tensors of a class with a
        forward to compute them in."""
        cls = fn.method_class if fn is not None else None
        if cls is None or self.ctx.index.lookup_method(cls, "forward") is None:
            return False
        if cls is not None:
            if class_role(cls.name) == "rotary" or re.search(r"Rotary|Rope|RoPE", cls.name):
                return True
        text = self.ctx.module.code_for_node(site.statement) if site.statement is not None else ""
        return bool(ROPE_TEXT.search(text))

    def _reaches(self, fn: FunctionInfo, memo: dict, stack: set) -> _Found | None:
        if fn in memo:
            return memo[fn]
        if fn in stack:
            return None
        stack.add(fn)
        result = None
        direct = self.found.get(fn)
        if direct:
            result = direct[0]
        else:
            for _site, target in self.ctx.index.init_callees(fn):
                result = self._reaches(target, memo, stack)
                if result is not None:
                    break
        stack.discard(fn)
        memo[fn] = result
        return result

    # -- the CPU grey zone -------------------------------------------------------

    def _cpu_names(self, fn: FunctionInfo, cpu_params: frozenset[str] = frozenset()) -> set[str]:
        """Locals of ``fn`` computed only from explicit-CPU tensors (``device``
        given literally, or as one of ``cpu_params``)."""
        cpu_ids = {
            id(f.node)
            for f in self.found.get(fn, ())
            if f.device == "cpu" or (f.device_name is not None and f.device_name in cpu_params)
        }
        if not cpu_ids:
            return set()
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, values in fn.assigns.items():
                known = [v for v in values if v is not None]
                if name in names or not values or len(known) < len(values):
                    continue
                if all(_only_cpu(v, cpu_ids, names, self.found_ids) for v in known):
                    names.add(name)
                    changed = True
        return names

    def _from_cpu(self, found: _Found, cpu: set[str]) -> bool:
        if not cpu:
            return False
        args = found.node.args
        names = {n.value for a in args for n in iter_nodes(a.value) if isinstance(n, cst.Name)}
        base = receiver(found.node)
        if base is not None:
            names |= {n.value for n in iter_nodes(base) if isinstance(n, cst.Name)}
        tensors = names & set(found.site.function.assigns) if found.site.function else set()
        return bool(tensors) and tensors <= cpu


def _only_cpu(
    value: cst.BaseExpression, cpu_ids: set[int], cpu_names: set[str], compute_ids: set[int]
) -> bool:
    """Whether every computation in ``value`` is an explicit-CPU one or uses
    only CPU locals."""
    has_cpu = False
    for node in iter_nodes(value):
        if isinstance(node, cst.Call) and id(node) in compute_ids:
            if id(node) in cpu_ids:
                has_cpu = True
            else:
                return False
        elif isinstance(node, cst.Name) and node.value in cpu_names:
            has_cpu = True
    return has_cpu


def _allocation_root(data: cst.BaseExpression | None) -> cst.Call | None:
    node = data
    while isinstance(node, cst.Call):
        name = dotted(node.func)
        if name is not None and name.startswith(("torch.", "nn.", "torch.nn.")):
            return node if name.rsplit(".", 1)[-1] in ALLOCATIONS else None
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in WRAPPERS:
            node = node.func.value
            continue
        return None
    return None


def _device(call: cst.Call) -> str | None:
    arg = keyword_arg(call, "device")
    if arg is None:
        return None
    return "cpu" if _cpu_literal(arg.value) else "other"


def _device_name(call: cst.Call) -> str | None:
    arg = keyword_arg(call, "device")
    return arg.value.value if arg is not None and isinstance(arg.value, cst.Name) else None


def _cpu_literal(value: cst.BaseExpression | None) -> bool:
    """``"cpu"``, ``"cpu:0"`` or ``torch.device("cpu")``."""
    if value is None:
        return False
    text = string_value(value)
    if text is None and isinstance(value, cst.Call) and dotted(value.func) in ("torch.device", "device"):
        text = string_value(value.args[0].value) if value.args else None
    return text is not None and text.split(":")[0] == "cpu"


def _cpu_parameters(target: FunctionInfo, call: cst.Call) -> frozenset[str]:
    """The parameters of ``target`` that ``call`` binds to an explicit CPU
    device, by position or keyword, or leaves at such a default."""
    names = list(target.params)
    if target.cls is not None and "staticmethod" not in target.decorators and names:
        names = names[1:]  # self / cls, bound by the attribute access
    bound: dict[str, cst.BaseExpression | None] = dict(target.params)
    for index, arg in enumerate(call.args):
        if arg.star:
            return frozenset()  # *args / **kwargs: the binding is not read
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
        elif index < len(names):
            bound[names[index]] = arg.value
    return frozenset(name for name in names if _cpu_literal(bound.get(name)))


def _placeholder_of(found: _Found) -> str | None:
    """``A`` when ``found`` is an allocation that is the whole value of a
    ``self.A = ...`` statement."""
    if not found.allocation or found.site.statement is None:
        return None
    assigned = self_assignment(found.site.statement)
    return assigned[0] if assigned is not None and assigned[1] is found.node else None


def _loader_replaced(index: ModuleIndex) -> dict[str, str]:
    """Attribute -> the load method that sets it on a module of the file:
    ``x.A = ...`` or ``setattr(x, "A", ...)`` (also with the name a loop
    variable over string literals) in a function named ``load_weights`` or
    ``_load_*``."""
    found: dict[str, str] = {}
    for fn in index.all_functions:
        if not LOADER.match(fn.name):
            continue
        for node in iter_nodes(fn.node.body):
            for attr in _set_attributes(node, fn):
                found.setdefault(attr, fn.name)
    return found


def _set_attributes(node: cst.CSTNode, fn: FunctionInfo) -> list[str]:
    if isinstance(node, cst.Assign):
        return [t.target.attr.value for t in node.targets if isinstance(t.target, cst.Attribute)]
    if isinstance(node, cst.Call) and dotted(node.func) == "setattr" and len(node.args) >= 3:
        name = node.args[1].value
        text = string_value(name)
        if text is not None:
            return [text]
        if isinstance(name, cst.Name):
            return _loop_strings(fn, name.value)
    return []


def _loop_strings(fn: FunctionInfo, variable: str) -> list[str]:
    """The string literals a ``for variable in (<literals>)`` loop of ``fn`` ranges over."""
    for node in iter_nodes(fn.node.body):
        if (
            isinstance(node, cst.For)
            and isinstance(node.target, cst.Name)
            and node.target.value == variable
            and isinstance(node.iter, cst.Tuple | cst.List)
        ):
            texts = [string_value(element.value) for element in node.iter.elements]
            if all(text is not None for text in texts):
                return [text for text in texts if text is not None]
    return []
