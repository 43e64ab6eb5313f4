"""partial-rotary: RoPE on the first partial_rotary_factor * head_dim dimensions of each head."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import statement_containing
from autoport_cst.transform.anatomy.qkv import mentions
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    method,
    self_assignment,
    self_attr,
    statements,
    walk,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.qkv import partial_factor_function
from autoport_cst.transform.edit.rope_columns import reorder_rope_columns
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "partial-rotary"
ROTARY_DIM = "int(self.head_dim * _partial_rotary_factor({config}))"
# the attention factor per column of cos/sin: the rotated pairs take it, the pass-through ones 1
COLUMN_SCALING = """
rotated = torch.arange(self.head_dim // 2, device={freqs}.device) < self.rotary_dim // 2
column_scaling = torch.where(rotated.repeat(2), self.attention_scaling, 1.0)
"""


class PartialRotary(Codemod):
    """Rotate only the first ``partial_rotary_factor`` of each query and key head.

    ``R = int(head_dim * partial_rotary_factor)`` dimensions rotate; the
    others pass through.

    The prefill RoPE and the decode kernel rotate pairs ``(i, i + head_dim /
    2)`` over the whole head, while the checkpoint's model rotates pairs
    ``(j, j + R / 2)`` inside the first R dimensions. Two changes make them
    agree without touching either path:

    - rotary class (``<Prefix>RotaryEmbedding``): ``self.rotary_dim = R`` in
      ``__init__``; the inverse frequencies are computed over ``R`` (every
      ``self.head_dim`` read in its other methods becomes
      ``self.rotary_dim``); ``forward`` pads the frequencies with zeros to
      ``head_dim / 2``, so the tables are full width with ``cos = 1``,
      ``sin = 0`` on the pass-through pairs; an attention factor that
      ``forward`` multiplies cos and sin by (YaRN, LongRoPE) scales the
      rotated pairs only (``column_scaling``), as the checkpoint's model
      passes the other dimensions through unscaled;
    - attention class: the loaders of the fused QKV weight (and bias, and
      per-head query/key norm gammas) reorder each query and key head's
      columns at load time (``_rope_column_order``, ``_rope_columns_loader``)
      so that checkpoint pair ``j`` lands on pair ``i = j`` here and the
      pass-through columns on the padded pairs. Queries and keys move alike,
      so attention scores are unchanged; values and the output projection are
      not touched.

    The factor comes from ``partial_rotary_factor`` in the config (added to
    the dataclass) or, as transformers v5 stores it, from the RoPE
    parameters: the config attribute the model file reads them from
    (``rope_parameters`` or ``rope_scaling``); a config that keeps no
    ``rope_parameters`` gains that field, read when the model file reads
    neither. Composes with ``interleaved-rope`` (one column order for
    both) and runs after ``rope-scaling``, whose frequency code then uses
    ``self.rotary_dim`` too.

    The loaders are wrapped as ``interleaved-rope`` wraps them: every tensor
    laid out in query/key head columns, wherever and however its loader is
    attached.

    Preconditions: one rotary class in the package, with ``__init__``
    (setting ``self.head_dim``) and a ``forward`` that duplicates the
    frequencies with ``torch.cat((freqs, freqs), ...)``; attention classes
    with ``self.head_dim``, ``self.q_size`` and ``self.kv_size`` assigned in
    ``__init__`` and a loader on ``self.qkv_proj_weight``.
    """

    ID = ID
    REALIZES = Realizes({"rope.partial_rotary_factor": not_to(1.0)})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            140,
            lambda spec, facts: spec.rope.partial_rotary_factor != 1.0,
            "partial rotary ({spec.rope.partial_rotary_factor:g} of head_dim): the fused kernels rotate the "
            "whole head; pass-through dims need cos=1/sin=0 and a Q/K column permutation at load time",
        ),
    )
    AFTER = ("rope-scaling", "add-qkv-bias", "qk-norm", "lazy-rope", "fused-checkpoint")
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="rotary tables and the query/key column order",
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class StableLmRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim

                    def _compute_inv_freq(self, device):
                        exponents = torch.arange(0, self.head_dim, 2, device=device).float()
                        return 1.0 / (self.rope_theta ** (exponents / self.head_dim))

                    def forward(self, position_ids, device, dtype):
                        freqs = torch.outer(position_ids.float(), self._compute_inv_freq(device))
                        emb = torch.cat((freqs, freqs), dim=-1)
                        return emb.cos().to(dtype), emb.sin().to(dtype)


                class StableLmAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size))
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, get_weight_loader, set_weight_loader


                def _partial_rotary_factor(config) -> float:
                    """Fraction of each head that RoPE rotates: the config field, else the value
                    in the RoPE parameters, else 1 (the whole head)."""
                    if config.partial_rotary_factor is not None:
                        return float(config.partial_rotary_factor)
                    return float((config.rope_parameters or {}).get("partial_rotary_factor", 1.0))


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


                class StableLmRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim
                        # <-- MODEL-SPECIFIC: partial rotary: the first rotary_dim dims of each head rotate
                        self.rotary_dim = int(self.head_dim * _partial_rotary_factor(config))

                    def _compute_inv_freq(self, device):
                        exponents = torch.arange(0, self.rotary_dim, 2, device=device).float()
                        return 1.0 / (self.rope_theta ** (exponents / self.rotary_dim))

                    def forward(self, position_ids, device, dtype):
                        freqs = torch.outer(position_ids.float(), self._compute_inv_freq(device))
                        # <-- MODEL-SPECIFIC: the pairs past rotary_dim / 2 rotate by angle zero
                        freqs = torch.nn.functional.pad(freqs, (0, (self.head_dim - self.rotary_dim) // 2))
                        emb = torch.cat((freqs, freqs), dim=-1)
                        return emb.cos().to(dtype), emb.sin().to(dtype)


                class StableLmAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        # <-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here
                        self.rope_column_order = _rope_column_order(self.head_dim, rotary_dim=int(self.head_dim * _partial_rotary_factor(config)), interleaved=False)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size))
                        set_weight_loader(
                            self.qkv_proj_weight,
                            _rope_columns_loader(get_weight_loader(self.qkv_proj_weight), self.rope_column_order, self.q_size + self.kv_size),
                        )
            ''',
        ),
        Example(
            title="an attention factor on cos and sin (YaRN) scales the rotated pairs only",
            package_classes=("Qwen3Attention",),
            before="""
                class Qwen3RotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim

                    def forward(self, position_ids, device, dtype):
                        freqs = torch.outer(position_ids.float(), self._compute_inv_freq(device))
                        emb = torch.cat((freqs, freqs), dim=-1)
                        cos = emb.cos() * self.attention_scaling
                        sin = emb.sin() * self.attention_scaling
                        return cos.to(dtype), sin.to(dtype)
            """,
            after='''
                def _partial_rotary_factor(config) -> float:
                    """Fraction of each head that RoPE rotates: the config field, else the value
                    in the RoPE parameters, else 1 (the whole head)."""
                    if config.partial_rotary_factor is not None:
                        return float(config.partial_rotary_factor)
                    return float((config.rope_parameters or {}).get("partial_rotary_factor", 1.0))


                class Qwen3RotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim
                        # <-- MODEL-SPECIFIC: partial rotary: the first rotary_dim dims of each head rotate
                        self.rotary_dim = int(self.head_dim * _partial_rotary_factor(config))

                    def forward(self, position_ids, device, dtype):
                        freqs = torch.outer(position_ids.float(), self._compute_inv_freq(device))
                        # <-- MODEL-SPECIFIC: the pairs past rotary_dim / 2 rotate by angle zero
                        freqs = torch.nn.functional.pad(freqs, (0, (self.head_dim - self.rotary_dim) // 2))
                        # <-- MODEL-SPECIFIC: the attention factor scales the rotated pairs, not the pass-through ones
                        rotated = torch.arange(self.head_dim // 2, device=freqs.device) < self.rotary_dim // 2
                        column_scaling = torch.where(rotated.repeat(2), self.attention_scaling, 1.0)
                        emb = torch.cat((freqs, freqs), dim=-1)
                        cos = emb.cos() * column_scaling
                        sin = emb.sin() * column_scaling
                        return cos.to(dtype), sin.to(dtype)
            ''',
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class StableLmConfig:
                    head_dim: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class StableLmConfig:
                    head_dim: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # fraction of each head that RoPE rotates (else read from rope_parameters)
                    partial_rotary_factor: float | None = None
                    # RoPE type, base and parameters
                    rope_parameters: dict | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="cos/sin must be built from duplicated frequencies",
            before="""
                class PhiRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.head_dim = config.head_dim

                    def forward(self, position_ids):
                        return self.cos_cached[position_ids], self.sin_cached[position_ids]
            """,
            raises="partial-rotary: PhiRotaryEmbedding.forward does not build cos/sin as torch.cat((freqs, freqs), ...)",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            # a config that turns rope_parameters into rope_scaling (ours) is read from the latter
            both = mentions(module, "rope_scaling") and mentions(module, "rope_parameters")
            where = "rope_scaling" if both else "rope_parameters"
            fields = [
                (
                    "partial_rotary_factor: float | None = None",
                    f"fraction of each head that RoPE rotates (else read from {where})",
                )
            ]
            if not mentions(module, "rope_parameters"):
                # transformers v5 keeps the factor in rope_parameters only
                fields.append(("rope_parameters: dict | None = None", "RoPE type, base and parameters"))
            return add_config_fields(module, ctx, fields)
        rotary = classes_with_role(module, "rotary")
        elsewhere = not rotary and any(class_role(name) == "rotary" for name in ctx.port.package_classes)
        if len(rotary) != 1 and not elsewhere:
            raise ctx.precondition(
                f"{ID}: expected one rotary embedding class (<Prefix>RotaryEmbedding), found {len(rotary)}"
            )
        if rotary:
            module = self._rotary(rotary[0], module, ctx)
        module = reorder_rope_columns(module, ctx, rotary_dim=ROTARY_DIM)
        if elsewhere and not any(
            isinstance(s, cst.FunctionDef) and s.name.value == "_rope_column_order" for s in module.body
        ):
            return module  # neither the rotary embedding nor an attention class in this file
        return add_functions(module, [partial_factor_function(module)])

    def _rotary(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> cst.Module:
        name = cls.name.value
        init = method(cls, "__init__")
        forward = method(cls, "forward")
        if init is None or forward is None:
            raise ctx.precondition(f"{ID}: {name} needs __init__ and forward", cls, module)
        edits: dict = {}
        config = init.params.params[1].name.value if len(init.params.params) > 1 else "config"
        # __init__: the rotated width
        if not any((p := self_assignment(s)) is not None and p[0] == "rotary_dim" for s in statements(init)):
            anchor = next(
                (s for s in statements(init) if (p := self_assignment(s)) is not None and p[0] == "head_dim"),
                None,
            )
            if anchor is None:
                raise ctx.precondition(f"{ID}: {name}.__init__ sets no self.head_dim", init, module)
            stmt = with_comment(
                parse_statement(f"self.rotary_dim = {ROTARY_DIM.format(config=config)}", module),
                "<-- MODEL-SPECIFIC: partial rotary: the first rotary_dim dims of each head rotate",
            )
            edits[id(anchor)] = lambda updated, stmt=stmt: cst.FlattenSentinel([updated, stmt])
        # other methods: frequencies over the rotated width
        rotary_dim = parse_expr("self.rotary_dim", module)
        for member in cls.body.body:
            if isinstance(member, cst.FunctionDef) and member.name.value not in ("__init__", "forward"):
                for node in walk(member):
                    if self_attr(node) == "head_dim":
                        edits[id(node)] = lambda updated: rotary_dim
        # forward: zero frequencies for the pass-through pairs
        if not any(self_attr(n) == "rotary_dim" for n in walk(forward)):
            duplicated = [
                n
                for n in walk(forward)
                if isinstance(n, cst.Call)
                and dotted(n.func) == "torch.cat"
                and n.args
                and isinstance(n.args[0].value, cst.Tuple)
                and len(n.args[0].value.elements) == 2
                and all(isinstance(e.value, cst.Name) for e in n.args[0].value.elements)
                and n.args[0].value.elements[0].value.value == n.args[0].value.elements[1].value.value
            ]
            if len(duplicated) != 1:
                raise ctx.precondition(
                    f"{ID}: {name}.forward does not build cos/sin as torch.cat((freqs, freqs), ...)",
                    forward,
                    module,
                )
            freqs = duplicated[0].args[0].value.elements[0].value.value
            holder = statement_containing(forward, duplicated[0])
            pad = with_comment(
                parse_statement(
                    f"{freqs} = torch.nn.functional.pad({freqs}, (0, (self.head_dim - self.rotary_dim) // 2))",
                    module,
                ),
                "<-- MODEL-SPECIFIC: the pairs past rotary_dim / 2 rotate by angle zero",
            )
            edits[id(holder)] = lambda updated, pad=pad: cst.FlattenSentinel([pad, updated])
            edits.update(_unscaled_pass_through(forward, holder, freqs, pad, module))
        return rewrite(module, edits)


def _unscaled_pass_through(
    forward: cst.FunctionDef,
    holder: cst.BaseStatement | None,
    freqs: str,
    pad: cst.BaseStatement,
    module: cst.Module,
) -> dict:
    """YaRN's and LongRoPE's attention factor on the rotated pairs only: the
    checkpoint's model multiplies the rotated part of q and k by it and passes
    the other dimensions through unscaled, so every ``self.attention_scaling``
    that ``forward`` reads becomes a per-column factor (1 on the pass-through
    pairs); the pad and the factor's statements go before ``holder``."""
    reads = [n for n in walk(forward) if self_attr(n) == "attention_scaling"]
    if not reads:
        return {}
    factor = parse_statements(COLUMN_SCALING.format(freqs=freqs).strip("\n"), module)
    factor[0] = with_comment(
        factor[0],
        "<-- MODEL-SPECIFIC: the attention factor scales the rotated pairs, not the pass-through ones",
    )
    column = parse_expr("column_scaling", module)
    edits: dict = {id(node): (lambda updated: column) for node in reads}
    edits[id(holder)] = lambda updated: cst.FlattenSentinel([pad, *factor, updated])
    return edits
