"""sinusoidal-positions: fixed sinusoidal position embeddings, computed in forward, instead of RoPE (XGLM)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import one_class, require_method, self_assignments
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import assigns_call_of, classes_with_role, free_names, statements
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions, parse_method
from autoport_cst.transform.edit.tree import followed_by, rewrite, with_comment
from autoport_cst.transform.edit.unrotated import unrotated, unrotated_backbone, without_rotary_class
from autoport_cst.transform.realizes import Realizes, to

ID = "sinusoidal-positions"
MARK = "<-- MODEL-SPECIFIC: fixed sinusoidal positions"
# the backbone attributes the lookup puts the positions in the token rows' layout with
LAYOUT = ("world_size", "rank", "embedding_dp_size", "embedding_dp_group", "mlp_dp_group")

ROWS = '''
def _sinusoidal_rows(rows: torch.Tensor, width: int, base: float, padding_idx: int | None) -> torch.Tensor:
    """Rows ``rows`` of the fixed sinusoidal position table, in float32: the
    sines of the first half of the width, the cosines of the second, at the
    frequencies exp(-i * log(base) / (half - 1)); a zero column when the
    width is odd; the row ``padding_idx`` zero (transformers' XGLM table,
    computed for the rows asked for instead of held: nothing to load)."""
    half = width // 2
    step = math.log(base) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64, device=rows.device).float() * -step)
    angles = rows.float().unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if width % 2 == 1:
        table = torch.cat([table, torch.zeros_like(table[:, :1])], dim=1)
    if padding_idx is not None:
        table = torch.where((rows == padding_idx).unsqueeze(1), torch.zeros_like(table), table)
    return table
'''

LOOKUP = '''
def _position_embeddings(self, positions: torch.Tensor, is_prefill: bool, rows: int) -> torch.Tensor:
    """The sinusoidal embeddings of ``positions`` (row ``position + offset``
    of the table) in the layout of the token embeddings: this rank's SP
    slice in prefill; in decode the positions of every embedding-DP rank,
    moved to the MLP-DP state as the tokens are."""
    if is_prefill:
        if self.world_size > 1:
            positions = positions[self.rank * rows : (self.rank + 1) * rows]
    else:
        if self.embedding_dp_size > 1:
            positions = self.embedding_dp_group.all_gather(positions, dim=0)
        positions = _dp_transition(positions, self.embedding_dp_group, self.mlp_dp_group)
    table_rows = positions.to(torch.long) + self.position_offset
    return _sinusoidal_rows(table_rows, self.position_width, self.position_base, self.position_padding_idx)
'''


@dataclass(frozen=True)
class SinusoidalPositionsParams:
    offset: int = field(
        default=0,
        metadata={"doc": "Rows of the table before position 0 (XGLM: 2): position p reads row p + offset."},
    )
    base: float = field(
        default=10000.0,
        metadata={"doc": "Base of the frequencies exp(-i * log(base) / (half - 1)) (XGLM: 10000)."},
    )
    padding_key: str | None = field(
        default=None,
        metadata={"doc": "Config field of the row set to zero (XGLM: pad_token_id); None: no such row."},
    )


class SinusoidalPositions(Codemod):
    """Fixed sinusoidal position embeddings added to the token embeddings, and no RoPE (XGLM).

    transformers' XGLM adds row ``position + 2`` of a table it computes at
    construction: row ``p`` is ``[sin(p * f_0) .. sin(p * f_{h-1}), cos(p *
    f_0) .. cos(p * f_{h-1})]`` for ``h = hidden_size // 2`` and ``f_i =
    exp(-i * log(10000) / (h - 1))`` (a zero column for an odd width), the
    row ``pad_token_id`` zero. The port computes the rows it needs in
    ``forward`` instead (a tensor computed in ``__init__`` would be a meta
    tensor; there is nothing in the checkpoint to load): a module-level
    ``_sinusoidal_rows(rows, width, base, padding_idx)`` computes them the
    same way in float32, cast to the hidden states' dtype before the add.

    Model file, backbone (``<Prefix>Model``): ``__init__`` keeps Python
    scalars only after the token embedding: ``position_offset``,
    ``position_base``, ``position_width`` (``config.hidden_size``) and
    ``position_padding_idx`` (``config.<padding_key>``, or None), in place of
    the rotary embedding; ``forward`` adds ``self._position_embeddings(
    positions, is_prefill, rows)`` after the prompt embeddings are merged
    (transformers adds the positions to ``inputs_embeds`` too). The added
    method puts the runner's ``positions`` in the token rows' layout (this
    rank's SP slice in prefill; in decode every embedding-DP rank's, moved to
    the MLP-DP state with ``_dp_transition``) before computing their rows.

    RoPE is removed from every attention path as learned-positions does
    (``autoport_cst.transform.edit.unrotated``): the step's ``(cos, sin)``
    becomes ``None``, what the attention methods compute from it binds
    ``None``, any other use refuses; the rotary class and the rotation
    helpers go when nothing else uses them. Config file: the dataclass gains
    ``<padding_key>``.

    Preconditions: a backbone whose ``__init__`` builds ``self.embed_tokens``
    and sets the layout attributes, whose ``forward`` computes
    ``position_embeddings = self.rotary_emb(...)`` and ``is_prefill``, and a
    module-level ``_dp_transition``.
    """

    ID = ID
    REALIZES = Realizes({"embedding.sinusoidal_positions": to(True)})
    # every RoPE site goes (the token lookup itself is unchanged: the positions are added after it)
    TOUCHES = ("rope.frequencies", "rope.application")
    Params = SinusoidalPositionsParams
    NEEDS_REAL_MODEL = True
    AFTER = (
        # a model has one kind of absolute positions (research sets one of the two fields): never composed,
        # the order only declared
        "learned-positions",
        "rope-scaling",
        "lazy-rope",
        "partial-rotary",
        "interleaved-rope",
        "nope-layers",
        "rope-layer-parameters",
        "qk-norm-position",
    )
    PITFALLS = (
        Pitfall(
            266,
            lambda spec, facts: spec.embedding.sinusoidal_positions,
            lambda spec, facts: (
                "fixed sinusoidal positions: compute rows position + "
                f"{spec.embedding.positions_offset} of the sin/cos table (base {spec.embedding.positions_base:g}, "
                f"row config.{spec.embedding.positions_padding_key} zero) in forward for the token rows this "
                "rank holds, and call the kernels without cos/sin"
            ),
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="the rows computed in forward, and no rotary embedding",
            params={"offset": 2, "padding_key": "pad_token_id"},
            before="""
                import math


                def _dp_transition(x, current_group, target_group):
                    return x


                class XGLMRotaryEmbedding(nn.Module):
                    def forward(self, position_ids, device, dtype):
                        return position_ids, position_ids


                class XGLMModel(nn.Module):
                    def __init__(self, config):
                        self.world_size = self.tp_group.world_size
                        self.rank = self.tp_group.rank_in_group
                        self.embedding_dp_size = 1
                        self.embedding_dp_group = get_neuron_embedding_dp_group()
                        self.mlp_dp_group = get_neuron_mlp_dp_group()
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        self.rotary_emb = XGLMRotaryEmbedding(config)

                    def forward(self, input_ids, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, None, None)
                        position_embeddings = self.rotary_emb(positions, device=hidden_states.device, dtype=hidden_states.dtype)
                        return self.layers(hidden_states, position_embeddings)
            """,
            after='''
                import math


                def _dp_transition(x, current_group, target_group):
                    return x


                def _sinusoidal_rows(rows: torch.Tensor, width: int, base: float, padding_idx: int | None) -> torch.Tensor:
                    """Rows ``rows`` of the fixed sinusoidal position table, in float32: the
                    sines of the first half of the width, the cosines of the second, at the
                    frequencies exp(-i * log(base) / (half - 1)); a zero column when the
                    width is odd; the row ``padding_idx`` zero (transformers' XGLM table,
                    computed for the rows asked for instead of held: nothing to load)."""
                    half = width // 2
                    step = math.log(base) / (half - 1)
                    frequencies = torch.exp(torch.arange(half, dtype=torch.int64, device=rows.device).float() * -step)
                    angles = rows.float().unsqueeze(1) * frequencies.unsqueeze(0)
                    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
                    if width % 2 == 1:
                        table = torch.cat([table, torch.zeros_like(table[:, :1])], dim=1)
                    if padding_idx is not None:
                        table = torch.where((rows == padding_idx).unsqueeze(1), torch.zeros_like(table), table)
                    return table


                class XGLMModel(nn.Module):
                    def __init__(self, config):
                        self.world_size = self.tp_group.world_size
                        self.rank = self.tp_group.rank_in_group
                        self.embedding_dp_size = 1
                        self.embedding_dp_group = get_neuron_embedding_dp_group()
                        self.mlp_dp_group = get_neuron_mlp_dp_group()
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        # <-- MODEL-SPECIFIC: fixed sinusoidal positions (row position + offset), computed in forward
                        self.position_offset = 2
                        self.position_base = 10000.0
                        self.position_width = config.hidden_size
                        self.position_padding_idx = config.pad_token_id

                    def forward(self, input_ids, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, None, None)
                        # <-- MODEL-SPECIFIC: fixed sinusoidal positions added to the token embeddings
                        hidden_states = hidden_states + self._position_embeddings(positions, is_prefill, hidden_states.shape[0]).to(hidden_states.dtype)
                        # <-- MODEL-SPECIFIC: no rotary embedding: the attention kernels rotate nothing
                        position_embeddings = None
                        return self.layers(hidden_states, position_embeddings)

                    def _position_embeddings(self, positions: torch.Tensor, is_prefill: bool, rows: int) -> torch.Tensor:
                        """The sinusoidal embeddings of ``positions`` (row ``position + offset``
                        of the table) in the layout of the token embeddings: this rank's SP
                        slice in prefill; in decode the positions of every embedding-DP rank,
                        moved to the MLP-DP state as the tokens are."""
                        if is_prefill:
                            if self.world_size > 1:
                                positions = positions[self.rank * rows : (self.rank + 1) * rows]
                        else:
                            if self.embedding_dp_size > 1:
                                positions = self.embedding_dp_group.all_gather(positions, dim=0)
                            positions = _dp_transition(positions, self.embedding_dp_group, self.mlp_dp_group)
                        table_rows = positions.to(torch.long) + self.position_offset
                        return _sinusoidal_rows(table_rows, self.position_width, self.position_base, self.position_padding_idx)
            ''',
        ),
        Example(
            title="a backbone computing no rotary embedding refuses",
            before="""
                def _dp_transition(x, current_group, target_group):
                    return x


                class XGLMModel(nn.Module):
                    def __init__(self, config):
                        self.world_size = self.tp_group.world_size
                        self.rank = self.tp_group.rank_in_group
                        self.embedding_dp_size = 1
                        self.embedding_dp_group = get_neuron_embedding_dp_group()
                        self.mlp_dp_group = get_neuron_mlp_dp_group()
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)

                    def forward(self, input_ids, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)
                        hidden_states = self.embed_tokens(input_ids)
                        return self.layers(hidden_states)
            """,
            raises="sinusoidal-positions: XGLMModel.forward has no `position_embeddings = self.rotary_emb(...)`",
        ),
        Example(
            title="a backbone that does not set the token rows' layout refuses",
            before="""
                def _dp_transition(x, current_group, target_group):
                    return x


                class XGLMModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)

                    def forward(self, input_ids, positions, attn_metadata=None):
                        return self.layers(self.embed_tokens(input_ids))
            """,
            raises="sinusoidal-positions: XGLMModel.__init__ sets no world_size, rank",
        ),
        Example(
            title="the config field of the padding row",
            role="config",
            path="config.py",
            params={"offset": 2, "padding_key": "pad_token_id"},
            before="""
                @dataclass
                class XGLMConfig:
                    hidden_size: int = 4096
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class XGLMConfig:
                    hidden_size: int = 4096
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # the row of the sinusoidal position table set to zero
                    pad_token_id: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> SinusoidalPositionsParams:
        base = target.embedding.positions_base
        return SinusoidalPositionsParams(
            offset=target.embedding.positions_offset,
            base=float(base) if base is not None else 10000.0,
            padding_key=target.embedding.positions_padding_key,
        )

    @classmethod
    def check_params(cls, params: SinusoidalPositionsParams) -> list[str]:
        problems = []
        if params.offset < 0:
            problems.append(f"offset {params.offset} is negative")
        if not (math.isfinite(params.base) and params.base > 1):
            problems.append(f"base {params.base} is not a number above 1")
        if params.padding_key is not None and not params.padding_key.isidentifier():
            problems.append(f"padding_key {params.padding_key!r} is not a config field name")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            key = self.params.padding_key
            if key is None:
                return module
            return add_config_fields(
                module,
                ctx,
                [(f"{key}: int | None = None", "the row of the sinusoidal position table set to zero")],
            )
        edits: dict = {}
        for cls in classes_with_role(module, "attention"):
            for func in cls.body.body:
                if isinstance(func, cst.FunctionDef):
                    unrotated(cls.name.value, func, module, ctx, edits)
        backbones = classes_with_role(module, "backbone")
        if backbones:  # a file of attention classes alone has none
            backbone = one_class(module, ctx, "backbone", "<Prefix>Model backbone")
            if not any(
                isinstance(s, cst.FunctionDef) and s.name.value == "_position_embeddings"
                for s in backbone.body.body
            ):
                self._backbone_edits(backbone, module, ctx, edits)
        module = without_rotary_class(rewrite(module, edits))
        return add_functions(module, [ROWS]) if backbones else module

    def _backbone_edits(
        self, backbone: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict
    ) -> None:
        name = backbone.name.value
        init = require_method(module, ctx, backbone, "__init__")
        forward = require_method(module, ctx, backbone, "forward")
        assigned = self_assignments(init)
        missing = [a for a in LAYOUT if a not in assigned]
        if missing or not any(
            isinstance(n, cst.FunctionDef) and n.name.value == "_dp_transition" for n in module.body
        ):
            raise ctx.refuse(
                f"{name}.__init__ sets no {', '.join(missing) or 'module-level _dp_transition'} "
                "(the token rows' layout the positions must follow)",
                init,
                module,
            )
        _init_edits(name, init, module, ctx, self.params, edits)
        _forward_edits(name, forward, module, ctx, edits)
        why = "no rotary embedding: the attention kernels rotate nothing"
        unrotated_backbone(name, init, forward, module, ctx, edits, why, required=True)
        lookup = parse_method(LOOKUP, module).with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        edits[id(forward)] = followed_by(lookup)


def _init_edits(name, init, module, ctx, params: SinusoidalPositionsParams, edits: dict) -> None:
    """The table's scalars after the token embedding's statements."""
    body = list(statements(init))
    tokens = [i for i, s in enumerate(body) if "self.embed_tokens" in module.code_for_node(s)]
    if not tokens:
        raise ctx.refuse(f"{name}.__init__ builds no self.embed_tokens", init, module)
    padding = f"config.{params.padding_key}" if params.padding_key is not None else "None"
    scalars = parse_statements(
        f"self.position_offset = {params.offset}\n"
        f"self.position_base = {params.base!r}\n"
        "self.position_width = config.hidden_size\n"
        f"self.position_padding_idx = {padding}",
        module,
    )
    scalars[0] = with_comment(scalars[0], f"{MARK} (row position + offset), computed in forward")
    edits[id(body[tokens[-1]])] = followed_by(*scalars)


def _forward_edits(name, forward, module, ctx, edits: dict) -> None:
    """The positions added after the merged prompt embeddings (or the token lookup)."""
    body = list(statements(forward))
    anchors = [s for s in body if assigns_call_of(s, "NF.merge_prompt_embeds")] or [
        s for s in body if assigns_call_of(s, "self.embed_tokens")
    ]
    if not anchors:
        raise ctx.refuse(f"{name}.forward has no `hidden_states = self.embed_tokens(...)`", forward, module)
    if not any("is_prefill" in free_names(s) for s in body):
        raise ctx.refuse(f"{name}.forward computes no is_prefill", forward, module)
    add = parse_statement(
        "hidden_states = hidden_states + self._position_embeddings("
        "positions, is_prefill, hidden_states.shape[0]).to(hidden_states.dtype)",
        module,
    )
    edits[id(anchors[-1])] = followed_by(with_comment(add, f"{MARK} added to the token embeddings"))
