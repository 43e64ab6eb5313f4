"""learned-positions: learned absolute position embeddings instead of RoPE (GPT-2, gpt_bigcode, OPT)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import one_class, require_method, self_assignments
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    assigns_call_of,
    classes,
    classes_with_role,
    deep_statements,
    free_names,
    method,
    statements,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import parse_method
from autoport_cst.transform.edit.key_renames import mappings_statement
from autoport_cst.transform.edit.tree import followed_by, rewrite, with_comment
from autoport_cst.transform.edit.unrotated import unrotated, unrotated_backbone, without_rotary_class
from autoport_cst.transform.realizes import Realizes, to

ID = "learned-positions"
TABLE = "embed_positions"
MARK = "<-- MODEL-SPECIFIC: learned absolute positions"
# the backbone attributes the lookup puts the positions in the token rows' layout with
LAYOUT = ("world_size", "rank", "embedding_dp_size", "embedding_dp_group", "mlp_dp_group")

LOOKUP = '''
def _position_embeddings(self, positions: torch.Tensor, is_prefill: bool, rows: int) -> torch.Tensor:
    """The learned embeddings of ``positions`` in the layout of the token
    embeddings: this rank's SP slice in prefill; in decode the positions of
    every embedding-DP rank, moved to the MLP-DP state as the tokens are.
    Row ``position + offset`` of the table (OPT keeps 2 rows before position 0)."""
    if is_prefill:
        if self.world_size > 1:
            positions = positions[self.rank * rows : (self.rank + 1) * rows]
    else:
        if self.embedding_dp_size > 1:
            positions = self.embedding_dp_group.all_gather(positions, dim=0)
        positions = _dp_transition(positions, self.embedding_dp_group, self.mlp_dp_group)
    return self.embed_positions(positions.to(torch.long) + self.position_offset)
'''

# a backbone setting none of these (and no _dp_transition) has no embedding or MLP DP
DP_LAYOUT = ("embedding_dp_size", "embedding_dp_group", "mlp_dp_group")

LOOKUP_WITHOUT_DP = '''
def _position_embeddings(self, positions: torch.Tensor, is_prefill: bool, rows: int) -> torch.Tensor:
    """The learned embeddings of ``positions`` in the layout of the token
    embeddings: this rank's SP slice in prefill; in decode every token's (this
    backbone has no embedding or MLP DP). Row ``position + offset`` of the table."""
    if is_prefill and self.world_size > 1:
        positions = positions[self.rank * rows : (self.rank + 1) * rows]
    return self.embed_positions(positions.to(torch.long) + self.position_offset)
'''


@dataclass(frozen=True)
class LearnedPositionsParams:
    size_key: str = field(
        default="max_position_embeddings",
        metadata={"doc": "Config field holding the number of positions (GPT-2: n_positions)."},
    )
    offset: int = field(
        default=0,
        metadata={"doc": "Rows of the table before position 0 (OPT: 2); it has size + offset rows."},
    )


class LearnedPositions(Codemod):
    """Learned absolute position embeddings added to the token embeddings, and no RoPE (GPT-2, OPT).

    Model file, backbone (``<Prefix>Model``): ``__init__`` builds
    ``self.embed_positions = nn.Embedding(config.<size_key> + offset,
    hidden_size)`` (replicated on every rank, loaded whole from
    ``model.embed_positions.weight``) in place of the rotary embedding;
    ``forward`` adds ``self._position_embeddings(positions, is_prefill,
    rows)`` to the token embeddings after the prompt embeddings are merged
    (transformers adds positions to ``inputs_embeds`` too). The added method
    looks up row ``position + offset`` for the rows this rank holds: its SP
    slice of the prompt in prefill; in decode the positions of every
    embedding-DP rank moved to the MLP-DP state with ``_dp_transition``,
    exactly as the token ids are. The position ids are the runner's
    ``positions`` input.

    RoPE is removed from every attention path: the step's ``(cos, sin)``
    becomes ``None``; in each attention method the unpacking ``cos, sin =
    position_embeddings`` goes, and every assignment computed from those
    names (the prefill kernel's ``cos_cache``/``sin_cache``, the decode
    kernel's ``cos_kernel``/``sin_kernel``, the DCP share of the tables) binds
    ``None`` (a later reassignment is dropped, and so is a call-free
    assignment only they read: decode's ``half``), so ``NF.qkv_proj`` and
    ``NF.attention_decode`` are called without a rotation. Any other use of
    the rotation refuses, but for an explicit ``q, k =
    apply_rotary_pos_emb(q, k, cos, sin)``, dropped (q and k unrotated). The rotary class and the rotation
    helpers (``apply_rotary_pos_emb``, ``_apply_rotary_emb``) go when nothing
    else uses them. ``load_weights`` maps the table after the token embedding;
    ``checkpoint-keys`` then renames it to the checkpoint's key
    (``transformer.wpe``). Config file: the dataclass gains ``<size_key>``.

    Preconditions: a backbone whose ``__init__`` builds the token embedding
    and sets the layout attributes (``world_size``, ``rank``,
    ``embedding_dp_size``, ``embedding_dp_group``, ``mlp_dp_group``; or
    ``world_size`` and ``rank`` alone, with no module-level ``_dp_transition``:
    no embedding or MLP DP, every token's row in decode, the real vllm_neuron
    qwen3), whose
    ``forward`` computes ``position_embeddings = self.rotary_emb(...)`` and
    ``is_prefill``, a module-level ``_dp_transition``, and in
    ``load_weights`` a ``mappings["model.embed_tokens.weight"]`` entry (the
    table's entry follows it) or, where the token embedding loads under its
    own name (the real vllm_neuron llama3), one ``mappings = {}`` (the entry
    follows it).
    """

    ID = ID
    REALIZES = Realizes({"embedding.learned_positions": to(True)})
    # every RoPE site goes (the token lookup itself is unchanged: the positions are added after it)
    TOUCHES = ("rope.frequencies", "rope.application")
    Params = LearnedPositionsParams
    NEEDS_REAL_MODEL = True
    AFTER = (
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
            265,
            lambda spec, facts: spec.embedding.learned_positions,
            lambda spec, facts: (
                "learned absolute positions: add the table's rows for the runner's positions (offset "
                f"{spec.embedding.positions_offset}) to the token rows this rank holds (SP slice in prefill, "
                "MLP-DP state in decode), and call the kernels without cos/sin"
            ),
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="the table, the lookup, and no rotary embedding",
            params={"size_key": "n_positions"},
            before="""
                def _dp_transition(x, current_group, target_group):
                    return x


                class GPT2RotaryEmbedding(nn.Module):
                    def forward(self, position_ids, device, dtype):
                        return position_ids, position_ids


                class GPT2Model(nn.Module):
                    def __init__(self, config):
                        self.world_size = self.tp_group.world_size
                        self.rank = self.tp_group.rank_in_group
                        self.embedding_dp_size = 1
                        self.embedding_dp_group = get_neuron_embedding_dp_group()
                        self.mlp_dp_group = get_neuron_mlp_dp_group()
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        self.rotary_emb = GPT2RotaryEmbedding(config)

                    def forward(self, input_ids, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, None, None)
                        position_embeddings = self.rotary_emb(positions, device=hidden_states.device, dtype=hidden_states.dtype)
                        return self.layers(hidden_states, position_embeddings)


                class GPT2ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        return mappings
            """,
            after='''
                def _dp_transition(x, current_group, target_group):
                    return x


                class GPT2Model(nn.Module):
                    def __init__(self, config):
                        self.world_size = self.tp_group.world_size
                        self.rank = self.tp_group.rank_in_group
                        self.embedding_dp_size = 1
                        self.embedding_dp_group = get_neuron_embedding_dp_group()
                        self.mlp_dp_group = get_neuron_mlp_dp_group()
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        # <-- MODEL-SPECIFIC: learned absolute positions (row position + offset), on every rank
                        self.position_offset = 0
                        self.embed_positions = nn.Embedding(
                            config.n_positions + self.position_offset, config.hidden_size, dtype=config.torch_dtype
                        )

                    def forward(self, input_ids, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, None, None)
                        # <-- MODEL-SPECIFIC: learned absolute positions added to the token embeddings
                        hidden_states = hidden_states + self._position_embeddings(positions, is_prefill, hidden_states.shape[0])
                        # <-- MODEL-SPECIFIC: no rotary embedding: the attention kernels rotate nothing
                        position_embeddings = None
                        return self.layers(hidden_states, position_embeddings)

                    def _position_embeddings(self, positions: torch.Tensor, is_prefill: bool, rows: int) -> torch.Tensor:
                        """The learned embeddings of ``positions`` in the layout of the token
                        embeddings: this rank's SP slice in prefill; in decode the positions of
                        every embedding-DP rank, moved to the MLP-DP state as the tokens are.
                        Row ``position + offset`` of the table (OPT keeps 2 rows before position 0)."""
                        if is_prefill:
                            if self.world_size > 1:
                                positions = positions[self.rank * rows : (self.rank + 1) * rows]
                        else:
                            if self.embedding_dp_size > 1:
                                positions = self.embedding_dp_group.all_gather(positions, dim=0)
                            positions = _dp_transition(positions, self.embedding_dp_group, self.mlp_dp_group)
                        return self.embed_positions(positions.to(torch.long) + self.position_offset)


                class GPT2ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["model.embed_positions.weight"] = "model.embed_positions.weight"
                        return mappings
            ''',
        ),
        Example(
            title="a load_weights that loads the token embedding under its own name (the real vllm_neuron llama3)",
            before="""
                class GPT2ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings: dict[str, str | list[str]] = {}
                        for layer_id in range(len(self.model.layers)):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                        return mappings
            """,
            after="""
                class GPT2ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings: dict[str, str | list[str]] = {}
                        # <-- MODEL-SPECIFIC: learned absolute positions: the table, loaded whole (the token embedding loads under its own name)
                        mappings["model.embed_positions.weight"] = "model.embed_positions.weight"
                        for layer_id in range(len(self.model.layers)):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                        return mappings
            """,
        ),
        Example(
            title="every rotation site of the attention: prefill, DCP share, decode",
            before="""
                class GPT2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        if self.dcp_size > 1:
                            hidden_states = _interleaved_rows(hidden_states, *share)
                            cos, sin = position_embeddings
                            position_embeddings = (_interleaved_rows(cos, *share), _interleaved_rows(sin, *share))
                        return self.forward_prefill(hidden_states, positions, position_embeddings)

                    def forward_prefill(self, hidden_states, positions, position_embeddings):
                        cos, sin = position_embeddings
                        cos_cache = cos.unsqueeze(0)
                        sin_cache = sin.unsqueeze(0)
                        qkv = NF.qkv_proj(hidden_states, cos_cache=cos_cache, sin_cache=sin_cache)
                        return qkv

                    def forward_decode(self, hidden_states, positions, position_embeddings):
                        cos, sin = position_embeddings
                        half = self.head_dim // 2
                        cos_kernel = cos[:, :half].permute(1, 0)
                        sin_kernel = sin[:, :half].permute(1, 0)
                        cos_kernel = cos_kernel.contiguous()
                        return NF.attention_decode(hidden_states, cos=cos_kernel, sin=sin_kernel)
            """,
            after="""
                class GPT2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
                        if self.dcp_size > 1:
                            hidden_states = _interleaved_rows(hidden_states, *share)
                        return self.forward_prefill(hidden_states, positions, position_embeddings)

                    def forward_prefill(self, hidden_states, positions, position_embeddings):
                        cos_cache = None
                        sin_cache = None
                        qkv = NF.qkv_proj(hidden_states, cos_cache=cos_cache, sin_cache=sin_cache)
                        return qkv

                    def forward_decode(self, hidden_states, positions, position_embeddings):
                        cos_kernel = None
                        sin_kernel = None
                        return NF.attention_decode(hidden_states, cos=cos_kernel, sin=sin_kernel)
            """,
        ),
        Example(
            title="a rotation used otherwise than in an assignment refuses",
            before="""
                class GPT2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_decode(self, hidden_states, positions, position_embeddings):
                        cos, sin = position_embeddings
                        return NF.attention_decode(hidden_states, cos=cos, sin=sin)
            """,
            raises="learned-positions: GPT2Attention.forward_decode uses the rotation",
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            params={"size_key": "n_positions"},
            before="""
                @dataclass
                class GPT2Config:
                    hidden_size: int = 4096
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class GPT2Config:
                    hidden_size: int = 4096
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # number of learned absolute positions
                    n_positions: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> LearnedPositionsParams:
        return LearnedPositionsParams(
            size_key=target.embedding.positions_key or "max_position_embeddings",
            offset=target.embedding.positions_offset,
        )

    @classmethod
    def check_params(cls, params: LearnedPositionsParams) -> list[str]:
        problems = []
        if not params.size_key.isidentifier():
            problems.append(f"size_key {params.size_key!r} is not a config field name")
        if params.offset < 0:
            problems.append(f"offset {params.offset} is negative")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            field_code = f"{self.params.size_key}: int | None = None"
            return add_config_fields(module, ctx, [(field_code, "number of learned absolute positions")])
        edits: dict = {}
        for cls in classes_with_role(module, "attention"):
            for func in cls.body.body:
                if isinstance(func, cst.FunctionDef):
                    unrotated(cls.name.value, func, module, ctx, edits)
        if classes_with_role(module, "backbone"):  # a file of attention classes alone has none
            backbone = one_class(module, ctx, "backbone", "<Prefix>Model backbone")
            self._backbone_edits(backbone, module, ctx, edits)
        _mapping_edit(module, ctx, edits)
        module = rewrite(module, edits)
        return without_rotary_class(module)

    def _backbone_edits(
        self, backbone: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict
    ) -> None:
        name = backbone.name.value
        init = require_method(module, ctx, backbone, "__init__")
        forward = require_method(module, ctx, backbone, "forward")
        if any(s for s in deep_statements(forward) if f"self.{TABLE}" in module.code_for_node(s)) or any(
            isinstance(s, cst.FunctionDef) and s.name.value == "_position_embeddings"
            for s in backbone.body.body
        ):
            return
        assigned = self_assignments(init)
        missing = [a for a in LAYOUT if a not in assigned]
        transition = any(
            isinstance(n, cst.FunctionDef) and n.name.value == "_dp_transition" for n in module.body
        )
        lookup_code = LOOKUP
        if missing == list(DP_LAYOUT) and not transition:  # no DP: decode rows are every token (real qwen3)
            lookup_code = LOOKUP_WITHOUT_DP
        elif missing or not transition:
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
        lookup = parse_method(lookup_code, module).with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        edits[id(forward)] = followed_by(lookup)


def _init_edits(name, init, module, ctx, params: LearnedPositionsParams, edits: dict) -> None:
    """The table after the token embedding's statements."""
    body = list(statements(init))
    tokens = [i for i, s in enumerate(body) if "self.embed_tokens" in module.code_for_node(s)]
    if not tokens:
        raise ctx.refuse(f"{name}.__init__ builds no self.embed_tokens", init, module)
    table = parse_statements(
        f"self.position_offset = {params.offset}\n"
        f"self.{TABLE} = nn.Embedding(\n"
        f"    config.{params.size_key} + self.position_offset, config.hidden_size, dtype=config.torch_dtype\n"
        ")",
        module,
    )
    table[0] = with_comment(table[0], f"{MARK} (row position + offset), on every rank")
    edits[id(body[tokens[-1]])] = followed_by(*table)


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
        "hidden_states = hidden_states + self._position_embeddings(positions, is_prefill, hidden_states.shape[0])",
        module,
    )
    edits[id(anchors[-1])] = followed_by(with_comment(add, f"{MARK} added to the token embeddings"))


def _mapping_edit(module: cst.Module, ctx: FileContext, edits: dict) -> None:
    """``mappings["model.embed_positions.weight"]`` after the token
    embedding's entry; where ``load_weights`` loads the token embedding under
    its own name (no entry: the real vllm_neuron llama3), right after its
    ``mappings = {}``, so that checkpoint-keys renames the table's key."""
    entries = mapping_entries(module)
    key = f"model.{TABLE}.weight"
    if not entries or any(e.key == key for e in entries):
        return
    tokens = [e for e in entries if e.key == "model.embed_tokens.weight"]
    if tokens:
        new = entry_statement(tokens[0], cst.SimpleString(f'"{key}"'), cst.SimpleString(f'"{key}"'))
        edits[id(tokens[0].statement)] = followed_by(new)
        return
    loaders = [m for c in classes(module) if (m := method(c, "load_weights")) is not None]
    anchors = [a for m in loaders if (a := mappings_statement(m)) is not None]
    if len(anchors) != 1:
        raise ctx.refuse(
            f'load_weights has no mappings["model.embed_tokens.weight"] entry and {len(anchors)} '
            "`mappings = {}` statements (one is needed to map the position table after)",
            loaders[0] if loaders else None,
            module if loaders else None,
        )
    new = with_comment(
        parse_statement(f'mappings["{key}"] = "{key}"', module),
        f"{MARK}: the table, loaded whole (the token embedding loads under its own name)",
    )
    edits[id(anchors[0])] = followed_by(new)
