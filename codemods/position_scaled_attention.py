"""position-scaled-attention: queries multiplied by a factor that grows with
their position (attention temperature: Ministral 3, Llama 4)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED,
    SEGMENTED_CP,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.anatomy.config import mentions
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import find_self_assignment, walk
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.attention import place_setting
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.kernels import insert_before, substitutes_for, to_unfused
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import ANY, Realizes, not_to

ID = "position-scaled-attention"
ATTR = "temperature"
COMMENT = "<-- MODEL-SPECIFIC: attention temperature: (beta, floor_scale) of this layer (None: none)"
SCALE_COMMENT = "<-- MODEL-SPECIFIC: attention temperature: the queries scaled by their position"
PREFILL_KINDS = (FLASH, SEGMENTED, SEGMENTED_CP)
_KEY = re.compile(r"(rope_parameters\.)?[A-Za-z_][A-Za-z0-9_]*")

FUNCTIONS = '''
def _query_temperature(positions, temperature, offset, dtype=None):
    """The factor of each token's queries, 1 + beta * log(1 + floor((position
    + offset) / floor_scale)) in float32 (in ``dtype`` when the model rounds
    it to the queries' dtype), for ``temperature`` = (beta, floor_scale);
    None for a layer without temperature."""
    if temperature is None:
        return None
    beta, floor_scale = temperature
    steps = torch.floor((positions.reshape(-1).to(torch.float32) + offset) / floor_scale)
    factor = 1.0 + beta * torch.log1p(steps)
    return factor if dtype is None else factor.to(dtype)


def _with_temperature(q, factor):
    """q [Nq, T, Dh] times the factor of each of its T tokens, rounded to q's dtype."""
    if factor is None:
        return q
    return (q * factor.view(1, -1, 1)).to(q.dtype)
'''


@dataclass(frozen=True)
class PositionScaledAttentionParams:
    beta_key: str = field(
        default="attn_scale",
        metadata={"doc": "Config field holding beta (rope_parameters.<key>: an entry of rope_parameters)."},
    )
    floor_key: str = field(
        default="floor_scale",
        metadata={"doc": "Config field holding floor_scale (same forms as beta_key)."},
    )
    offset: float = field(default=0.0, metadata={"doc": "Added to the position before the division."})
    layers: str = field(
        default="all",
        metadata={"doc": "all: every layer; nope: the layers without RoPE (_layer_uses_rope, nope-layers)."},
    )
    rounded: bool = field(
        default=False,
        metadata={
            "doc": "The factor is cast to the queries' dtype before the product (else the product is)."
        },
    )


def _config_read(key: str, config: str) -> str:
    if key.startswith("rope_parameters."):
        return f'{config}.rope_parameters["{key.split(".", 1)[1]}"]'
    return f"{config}.{key}"


class PositionScaledAttention(Codemod):
    """Multiply the rotated queries of each token by
    ``1 + beta * log(1 + floor((position + offset) / floor_scale))``, as
    Ministral 3 (every layer, beta and floor_scale from
    ``config.rope_parameters``) and Llama 4 (its layers without RoPE,
    ``attn_scale`` and ``floor_scale``, offset 1) do.

    The attention's ``__init__`` keeps ``self.temperature = (beta,
    floor_scale)``, or None on a layer without temperature (``layers="nope"``:
    the layers ``_layer_uses_rope`` says rotate, a function nope-layers adds).
    Every attention path scales its queries with the positions the attention
    is passed:

    - prefill (flash, segmented and context-parallel alike): right after the
      statement that last assigns ``q`` before the first kernel (and the
      statements right after it that assign ``k`` without reading ``q``,
      such as a key norm: the order does not depend on whether qk-norm or
      qk-norm-position ran first),
      ``q = _with_temperature(q, _query_temperature(positions, ...))``; the
      kernels then read the scaled queries (the context-parallel path gathers
      them, each rank's share scaled with its own positions);
    - decode: the fused kernel computes its queries itself, so
      ``NF.attention_decode(...)`` becomes ``_attention_decode_unfused(...,
      q_scale=_query_temperature(positions, ...))``, the kernel op by op
      (``autoport_cst.transform.edit.kernels``) with the factor multiplying
      the rotated queries; what it does not implement (FP8 caches, attention
      DP, decode context parallelism) it refuses by name.

    Keys of ``config.rope_parameters`` need no config field; other keys are
    added to the config dataclass. Preconditions: an attention class whose
    prefill method takes ``positions`` and assigns ``q`` before its first
    kernel call, and whose decode method takes ``positions``.
    """

    ID = ID
    REALIZES = Realizes(
        {
            "attention.temperature_beta_key": not_to(None),
            "attention.temperature_floor_key": not_to(None),
            "attention.temperature_offset": ANY,
            "attention.temperature_layers": ANY,
            "attention.temperature_rounded": ANY,
        }
    )
    Params = PositionScaledAttentionParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            95,
            lambda spec, facts: spec.attention.temperature_beta_key is not None,
            lambda spec, facts: (
                f"queries scaled by 1 + {spec.attention.temperature_beta_key} * log(1 + floor((position + "
                f"{spec.attention.temperature_offset:g}) / {spec.attention.temperature_floor_key})): "
                "every attention path must scale them"
            ),
        ),
    )
    AFTER = ("nope-layers", "qk-norm", "attention-softcap", "attention-sinks", "sliding-window")
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="every layer, beta and floor_scale from rope_parameters (Ministral 3)",
            params={
                "beta_key": "rope_parameters.llama_4_scaling_beta",
                "floor_key": "rope_parameters.original_max_position_embeddings",
                "rounded": True,
            },
            before="""
                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                class Ministral3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        qkv = NF.qkv_proj(hidden=hidden_states, qkv_weights=self.qkv_proj_weight)
                        q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
                        out = NF.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v, scale=self.scaling)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return NF.attention_decode(X=hidden_states, attention_mask=mask)
            """,
            after='''
                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                def _query_temperature(positions, temperature, offset, dtype=None):
                    """The factor of each token's queries, 1 + beta * log(1 + floor((position
                    + offset) / floor_scale)) in float32 (in ``dtype`` when the model rounds
                    it to the queries' dtype), for ``temperature`` = (beta, floor_scale);
                    None for a layer without temperature."""
                    if temperature is None:
                        return None
                    beta, floor_scale = temperature
                    steps = torch.floor((positions.reshape(-1).to(torch.float32) + offset) / floor_scale)
                    factor = 1.0 + beta * torch.log1p(steps)
                    return factor if dtype is None else factor.to(dtype)


                def _with_temperature(q, factor):
                    """q [Nq, T, Dh] times the factor of each of its T tokens, rounded to q's dtype."""
                    if factor is None:
                        return q
                    return (q * factor.view(1, -1, 1)).to(q.dtype)


                class Ministral3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: attention temperature: (beta, floor_scale) of this layer (None: none)
                        self.temperature = (config.rope_parameters["llama_4_scaling_beta"], config.rope_parameters["original_max_position_embeddings"])
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        qkv = NF.qkv_proj(hidden=hidden_states, qkv_weights=self.qkv_proj_weight)
                        q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
                        # <-- MODEL-SPECIFIC: attention temperature: the queries scaled by their position
                        q = _with_temperature(q, _query_temperature(positions, self.temperature, 0.0, q.dtype))
                        out = NF.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v, scale=self.scaling)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return _attention_decode_unfused(X=hidden_states, attention_mask=mask, q_scale=_query_temperature(positions, self.temperature, 0.0, self.dtype))
            ''',
        ),
        Example(
            title="the layers without RoPE only, offset 1, the product rounded (Llama 4)",
            params={"offset": 1.0, "layers": "nope"},
            before="""
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    ...


                def _query_temperature(positions, temperature, offset, dtype=None):
                    ...


                def _with_temperature(q, factor):
                    ...


                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        if meta["kv_segment_size"]:
                            q = NF.qkv_proj(hidden=hidden_states, k_cache=self.k_cache)
                        else:
                            q, k, v = NF.qkv_proj(hidden=hidden_states)
                        if self.dcp_size > 1:
                            q_all = self.cp_kv_group.all_gather(q.contiguous(), dim=1)
                            out = NF.segmented_attention_cp(q=q_all, k_local=k, v_local=v)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            out = NF.flash_attention(q, k, v)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return NF.attention_decode(X=hidden_states, attention_mask=mask)
            """,
            after="""
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    ...


                def _query_temperature(positions, temperature, offset, dtype=None):
                    ...


                def _with_temperature(q, factor):
                    ...


                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: attention temperature: (beta, floor_scale) of this layer (None: none)
                        self.temperature = None if _layer_uses_rope(config, layer_idx) else (config.attn_scale, config.floor_scale)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        if meta["kv_segment_size"]:
                            q = NF.qkv_proj(hidden=hidden_states, k_cache=self.k_cache)
                        else:
                            q, k, v = NF.qkv_proj(hidden=hidden_states)
                        # <-- MODEL-SPECIFIC: attention temperature: the queries scaled by their position
                        q = _with_temperature(q, _query_temperature(positions, self.temperature, 1.0, None))
                        if self.dcp_size > 1:
                            q_all = self.cp_kv_group.all_gather(q.contiguous(), dim=1)
                            out = NF.segmented_attention_cp(q=q_all, k_local=k, v_local=v)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            out = NF.flash_attention(q, k, v)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return _attention_decode_unfused(X=hidden_states, attention_mask=mask, q_scale=_query_temperature(positions, self.temperature, 1.0, None))
            """,
        ),
        Example(
            title="the config fields (keys outside rope_parameters)",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Llama4TextConfig:
                    head_dim: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class Llama4TextConfig:
                    head_dim: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # attention temperature: beta
                    attn_scale: float | None = None
                    # attention temperature: floor_scale
                    floor_scale: float | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="q assigned on each path, in the block of its kernel (qwen3_moe's prefill)",
            params={"offset": 1.0},
            before="""
                def _query_temperature(positions, temperature, offset, dtype=None):
                    ...


                def _with_temperature(q, factor):
                    ...


                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        if meta["kv_segment_size"]:
                            q_flat, _, _ = NF.qkv_proj(hidden=hidden_states, k_cache=self.k_cache)
                            q = q_flat.transpose(0, 1)
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            q, k, v = NF.qkv_proj(hidden=hidden_states)
                            self._write_paged_kv_cache(k, v)
                            out = NF.flash_attention(q.transpose(1, 2), k, v)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return NF.attention_decode(X=hidden_states, attention_mask=mask)
            """,
            after="""
                def _query_temperature(positions, temperature, offset, dtype=None):
                    ...


                def _with_temperature(q, factor):
                    ...


                def _attention_decode_unfused(X, q_scale=None, **kernel_options):
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: attention temperature: (beta, floor_scale) of this layer (None: none)
                        self.temperature = (config.attn_scale, config.floor_scale)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, meta):
                        if meta["kv_segment_size"]:
                            q_flat, _, _ = NF.qkv_proj(hidden=hidden_states, k_cache=self.k_cache)
                            q = q_flat.transpose(0, 1)
                            # <-- MODEL-SPECIFIC: attention temperature: the queries scaled by their position
                            q = _with_temperature(q, _query_temperature(positions, self.temperature, 1.0, None))
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            q, k, v = NF.qkv_proj(hidden=hidden_states)
                            self._write_paged_kv_cache(k, v)
                            # <-- MODEL-SPECIFIC: attention temperature: the queries scaled by their position
                            q = _with_temperature(q, _query_temperature(positions, self.temperature, 1.0, None))
                            out = NF.flash_attention(q.transpose(1, 2), k, v)
                        return out

                    def forward_decode(self, hidden_states, positions, mask):
                        return _attention_decode_unfused(X=hidden_states, attention_mask=mask, q_scale=_query_temperature(positions, self.temperature, 1.0, None))
            """,
        ),
        Example(
            title="queries computed in the kernel's own statement: nothing to scale before it",
            before="""
                class Ministral3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions):
                        return NF.flash_attention(self.q_proj(hidden_states), hidden_states, hidden_states)

                    def forward_decode(self, hidden_states, positions, mask):
                        return NF.attention_decode(X=hidden_states, attention_mask=mask)
            """,
            raises=(
                "position-scaled-attention: Ministral3Attention.forward_prefill assigns no q before its "
                "first attention kernel"
            ),
        ),
    )

    @classmethod
    def check_params(cls, params: PositionScaledAttentionParams) -> list[str]:
        problems = [
            f"{name} {value!r} is not a config field nor rope_parameters.<key>"
            for name, value in (("beta_key", params.beta_key), ("floor_key", params.floor_key))
            if not _KEY.fullmatch(value)
        ]
        if params.layers not in ("all", "nope"):
            problems.append(f"layers {params.layers!r} is not all or nope")
        return problems

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> PositionScaledAttentionParams:
        attention = target.attention
        return PositionScaledAttentionParams(
            beta_key=attention.temperature_beta_key,
            floor_key=attention.temperature_floor_key,
            offset=float(attention.temperature_offset),
            layers=attention.temperature_layers,
            rounded=bool(attention.temperature_rounded),
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            keys = [k for k in (self.params.beta_key, self.params.floor_key) if "." not in k]
            fields = [
                (f"{key}: float | None = None", f"attention temperature: {what}")
                for key, what in zip(
                    (self.params.beta_key, self.params.floor_key), ("beta", "floor_scale"), strict=True
                )
                if key in keys
            ]
            return add_config_fields(module, ctx, fields) if fields else module
        edits: dict = {}
        for cls in attention_classes_in(module, ctx):
            self._attention_edits(cls, module, ctx, edits)
        module = rewrite(module, edits)
        return add_functions(module, [*FUNCTIONS.split("\n\n\n"), *substitutes_for({DECODE})])

    def _factor(self, dtype: str) -> str:
        rounded = dtype if self.params.rounded else "None"
        return f"_query_temperature(positions, self.{ATTR}, {self.params.offset!r}, {rounded})"

    def _attention_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        sites = kernel_sites(cls)
        prefill = [s for s in sites if s.kind in PREFILL_KINDS]
        decode = [s for s in sites if s.kind == DECODE]
        if not prefill:
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[FLASH]}(...) call in {name}", cls, module)
        if not decode:
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[DECODE]}(...) call in {name}", cls, module)
        if find_self_assignment(init, ATTR) is None:
            self._init_setting(init, name, module, ctx, edits)
        for method in {id(s.method): s.method for s in prefill}.values():
            self._scale_prefill(method, [s for s in prefill if s.method is method], name, module, ctx, edits)
        for site in decode:
            _require_positions(site.method, name, module, ctx)
            factor = parse_expr(self._factor("self.dtype"), module)
            edits[id(site.call)] = lambda updated, factor=factor: set_keyword(
                to_unfused(updated, DECODE), "q_scale", factor
            )

    def _init_setting(
        self, init: cst.FunctionDef, name: str, module: cst.Module, ctx: FileContext, edits: dict
    ) -> None:
        params = [p.name.value for p in init.params.params]
        config = params[1] if len(params) > 1 else "config"
        pair = (
            f"({_config_read(self.params.beta_key, config)}, {_config_read(self.params.floor_key, config)})"
        )
        if self.params.layers == "nope":
            if "_layer_uses_rope" not in {n.value for n in walk(module) if isinstance(n, cst.Name)}:
                raise ctx.precondition(
                    f"{ID}: {name}: no _layer_uses_rope function (nope-layers) to tell the layers without RoPE",
                    init,
                    module,
                )
            layer = params[2] if len(params) > 2 else "layer_idx"
            value = f"None if _layer_uses_rope({config}, {layer}) else {pair}"
        else:
            value = pair
        stmt = with_comment(parse_statement(f"self.{ATTR} = {value}", module), COMMENT)
        if not place_setting(init, ATTR, stmt, edits):
            raise ctx.precondition(
                f"{ID}: {name}.__init__ sets none of self.scaling / self.head_dim / self.layer_idx "
                "to place the temperature after",
                init,
                module,
            )

    def _scale_prefill(self, method, sites, name, module, ctx, edits) -> None:
        """Scale ``q`` after the last top-level statement of ``method`` that
        assigns it before the first kernel call."""
        where = f"{name}.{method.name.value}"
        _require_positions(method, name, module, ctx)
        for site in sites:
            ctx.unaffected(site.call, "reads the queries scaled before it")
        if any(isinstance(n, cst.Name) and n.value == "_with_temperature" for n in walk(method)):
            return  # scaled already
        body = list(method.body.body) if isinstance(method.body, cst.IndentedBlock) else []
        calls = {id(s.call) for s in sites}
        first = next((i for i, stmt in enumerate(body) if any(id(n) in calls for n in walk(stmt))), None)
        assigning = [i for i, stmt in enumerate(body[: first or 0]) if _assigns_q(stmt)]
        stmt = parse_statement(f"q = _with_temperature(q, {self._factor('q.dtype')})", module)
        if first is not None and assigning:
            index = assigning[-1] + 1
            while index < first and _assigns(body[index], "k") and not mentions(body[index], "q"):
                index += 1  # the key's own statements (a key norm) stay beside the query's
            insert_before(edits, body[index], [with_comment(stmt, SCALE_COMMENT)])
            return
        # q assigned on each path, inside the block of each kernel (qwen3_moe's
        # branches): scaled right before each kernel's statement
        holders = _kernel_holders(method, sites)
        if first is None or not holders:
            raise ctx.precondition(
                f"{ID}: {where} assigns no q before its first attention kernel", method, module
            )
        for holder in holders:
            insert_before(edits, holder, [with_comment(stmt, SCALE_COMMENT)])


def _kernel_holders(method: cst.FunctionDef, sites) -> list[cst.BaseStatement]:
    """The statement holding each kernel call, when every one of them
    follows, in its own block, a statement assigning q after which nothing
    reads or assigns q before the kernel; empty otherwise."""
    holders: list[cst.BaseStatement] = []
    for site in sites:
        block = next(
            (
                node
                for node in walk(method)
                if isinstance(node, cst.IndentedBlock)
                and any(any(n is site.call for n in walk(stmt)) for stmt in node.body)
                and not any(
                    isinstance(inner, cst.IndentedBlock) and inner is not node and _holds(inner, site.call)
                    for stmt in node.body
                    for inner in walk(stmt)
                )
            ),
            None,
        )
        if block is None:
            return []
        index = next(i for i, stmt in enumerate(block.body) if _holds(stmt, site.call))
        if not any(_assigns_q(stmt) for stmt in block.body[:index]):
            return []
        if not any(h is block.body[index] for h in holders):
            holders.append(block.body[index])
    return holders


def _holds(node: cst.CSTNode, target: cst.CSTNode) -> bool:
    return any(n is target for n in walk(node))


def _assigns_q(stmt: cst.CSTNode) -> bool:
    return _assigns(stmt, "q")


def _assigns(stmt: cst.CSTNode, name: str) -> bool:
    """``stmt`` assigns ``name`` (alone or in a tuple), at any depth."""
    for node in walk(stmt):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                names = [target.target] if isinstance(target.target, cst.Name) else []
                if isinstance(target.target, cst.Tuple):
                    names = [e.value for e in target.target.elements]
                if any(isinstance(n, cst.Name) and n.value == name for n in names):
                    return True
    return False


def _require_positions(method: cst.FunctionDef, name: str, module: cst.Module, ctx: FileContext) -> None:
    if "positions" not in [p.name.value for p in method.params.params]:
        raise ctx.precondition(
            f"{ID}: {name}.{method.name.value} takes no positions to scale the queries by", method, module
        )
