"""chunked-attention: layers that attend only within their chunk of attention_chunk_size tokens (Llama 4)."""

from __future__ import annotations

import textwrap

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED,
    SEGMENTED_CP,
    KernelSite,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    find_self_assignment,
    is_none,
    keyword_arg,
    walk,
)
from autoport_cst.transform.edit.attention import place_setting
from autoport_cst.transform.edit.backbone_masks import (
    DecodeMasks,
    MaskStart,
    caller_mask_edits,
    decode_mask_start_edits,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.kernels import (
    argument,
    guard,
    innermost_statement,
    insert_before,
)
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "chunked-attention"
ATTR = "attention_chunk_size"
HELPER = "_PrefillChunks"
LOCAL = "attention_chunks"

LAYER_FUNCTION = '''
def _layer_chunk_size(config, layer_idx: int) -> int | None:
    """The attention chunk of one layer in tokens, or None for a layer that
    attends to its whole context: ``config.layer_types`` marks the chunked
    layers "chunked_attention"."""
    if config.attention_chunk_size is None:
        return None
    if config.layer_types is None:
        raise ValueError("the config sets attention_chunk_size but no layer_types")
    if config.layer_types[layer_idx] == "chunked_attention":
        return config.attention_chunk_size
    return None
'''

CHUNK_START = '''
def _chunk_start(pos_ids, chunk):
    """The first position each query of a chunked layer sees, the start of its
    chunk ``floor(pos_ids / chunk) * chunk`` (None: no chunks, or no positions)."""
    if chunk is None or pos_ids is None:
        return None
    return torch.div(pos_ids, chunk, rounding_mode="floor") * chunk
'''

HELPER_CLASS = '''
class _PrefillChunks:
    """Prefill attention within chunks of ``size`` positions (None: one chunk).

    Flash attention (a whole prompt from position 0): ``fold`` makes every
    chunk of a head a row of the kernel's batch, chunk-major (``[n * B, ...]``,
    the last chunk zero-padded: its padded keys come after every query of the
    chunk, hidden by the causal mask), and ``unfold`` puts the kernel's output
    back in sequence order. Grouped query heads keep their KV head: row
    ``c * Hq + h`` of the queries reads row ``c * Hkv + h // groups``.

    Segmented attention (rows after ``prior`` cached tokens, padded to the
    segment): one kernel call per chunk the rows can reach (a count fixed by
    the segment and the chunk), each seeing the cache from its chunk's start
    only (the block table shifted by whole blocks, ``prior`` made relative to
    the chunk) and its queries from its first row on; ``merge`` takes each row
    from the call of its chunk.
    """

    def __init__(self, size):
        self.size = size
        self.rows = None

    def fold(self, x, dim):
        """``x`` with the sequence on ``dim`` (the batch on 0) -> one batch row per chunk."""
        rows = x.shape[dim]
        if self.size is None or rows <= self.size:
            return x
        self.rows = rows
        count = -(-rows // self.size)
        pad = [0, 0] * (x.dim() - 1 - dim) + [0, count * self.size - rows]
        x = torch.nn.functional.pad(x, pad).unflatten(dim, (count, self.size))
        return x.movedim(dim, 0).flatten(0, 1)

    def unfold(self, x, dim):
        """The kernel output of folded inputs, its sequence on ``dim``, in sequence order."""
        if self.rows is None:
            return x
        count = -(-self.rows // self.size)
        x = x.unflatten(0, (count, -1)).movedim(0, dim).flatten(dim, dim + 1)
        return x.narrow(dim, 0, self.rows)

    def segments(self, prior_tokens, block_size, kv_segment_size):
        """The calls of one segmented prefill (``range``; one when unchunked)."""
        if self.size is None:
            return range(1)
        if self.size % block_size != 0:
            raise NotImplementedError(
                "chunked attention: NF.segmented_attention needs chunks of whole KV-cache blocks"
            )
        self.block_size = block_size
        self.prior = torch.as_tensor(prior_tokens).reshape(-1)[:1].to(torch.int64)
        self.first = torch.div(self.prior, self.size, rounding_mode="floor") * self.size
        return range(kv_segment_size // self.size + 2)

    def _bounds(self, call):
        """(chunk start, first row's position) of call ``call``."""
        start = self.first + call * self.size
        return start, torch.maximum(start, self.prior)

    def queries(self, q, call, dim):
        """The queries of call ``call``: its first row on, zero-padded."""
        if self.size is None:
            return q
        _, first = self._bounds(call)
        rows = q.shape[dim]
        index = torch.arange(rows, device=q.device) + (first - self.prior)
        kept = q.index_select(dim, index.clamp(max=rows - 1))
        shape = [1] * q.dim()
        shape[dim] = rows
        return torch.where((index < rows).view(shape), kept, torch.zeros_like(kept))

    def block_table(self, block_tables, call):
        """The block table of call ``call``: from its chunk's first block on."""
        if self.size is None:
            return block_tables
        start, _ = self._bounds(call)
        width = block_tables.shape[-1]
        index = torch.arange(width, device=block_tables.device) + torch.div(
            start, self.block_size, rounding_mode="floor"
        )
        return block_tables.index_select(-1, index.clamp(max=width - 1))

    def prior_tokens(self, prior_tokens, call):
        """The cached tokens call ``call`` sees before its first row (from its chunk's start)."""
        if self.size is None:
            return prior_tokens
        start, first = self._bounds(call)
        return (first - start).to(torch.as_tensor(prior_tokens).dtype)

    def merge(self, outputs, dim):
        """The rows of every call's output (its sequence on ``dim``), each from its chunk's call."""
        if self.size is None:
            return outputs[0]
        rows = outputs[0].shape[dim]
        position = torch.arange(rows, device=outputs[0].device) + self.prior
        call = (torch.div(position, self.size, rounding_mode="floor") * self.size - self.first) // self.size
        call = call.clamp(0, len(outputs) - 1)
        _, first = self._bounds(call)
        source = (position - first).clamp(0, rows - 1)
        stacked = torch.stack(outputs).movedim(dim + 1, 1)
        return stacked[call, source].movedim(0, dim)
'''


def _helpers_and(functions: tuple[str, ...], classes: str) -> str:
    """An example's output: the module functions and the helper class, then ``classes``."""
    parts = [*functions, HELPER_CLASS, textwrap.dedent(classes)]
    return "\n\n\n".join(part.strip("\n") for part in parts) + "\n"


CONFIG_FIELDS = [
    ("attention_chunk_size: int | None = None", "chunked attention: chunk length in tokens (None: none)"),
    ("layer_types: list[str] | None = None", ""),
]
GUARD_COMMENT = "<-- MODEL-SPECIFIC: chunked attention: a path whose kernel cannot mask by chunk refuses"
CP_MESSAGE = "chunked attention: NF.segmented_attention_cp (context-parallel prefill) takes no chunk mask"
DCP_MESSAGE = "chunked attention: the context-parallel decode mask (local_filled_slots) takes no chunk start"
FOLD_COMMENT = "<-- MODEL-SPECIFIC: chunked attention: attend within chunks of attention_chunk_size tokens"

MASK = MaskStart(
    attr=ATTR,
    param="chunk",
    start="""
start_pos = None
if {window} is not None:
    start_pos = torch.div({positions}, {window}, rounding_mode="floor") * {window}
""",
    start_comment="<-- MODEL-SPECIFIC: chunked attention: mask prior positions before the chunk's start",
    start_function="_chunk_start",
    dcp_message=DCP_MESSAGE,
    guard_comment=GUARD_COMMENT,
    masks_comment=(
        "<-- MODEL-SPECIFIC: chunked attention: one decode mask per chunk size of the layers, built once per step"
    ),
)


class ChunkedAttention(Codemod):
    """Attention within chunks of ``attention_chunk_size`` tokens on the layers ``layer_types`` marks (Llama 4).

    The layers ``config.layer_types`` marks "chunked_attention" attend only to
    the earlier tokens of their own chunk of ``config.attention_chunk_size``
    positions (Llama 4's RoPE layers: the block-diagonal causal mask of
    transformers' ``create_chunked_causal_mask``). A query at position p sees
    the keys at positions ``floor(p / chunk) * chunk .. p``.

    Model file, attention class (``<Prefix>Attention``): ``__init__`` sets
    ``self.attention_chunk_size`` from ``_layer_chunk_size(config,
    layer_idx)`` (added to the module; None on the other layers). Every
    attention kernel of the class, on every path
    (``autoport_cst.transform.anatomy.attention``):

    - ``NF.flash_attention`` (or its op-by-op substitute): its q, k and v are
      folded, each chunk of a head one row of the kernel's batch, and its
      output unfolded (``_PrefillChunks``, added to the module), so the
      kernel's causal mask is the chunked one; a flash call with a ``sink``
      (one value per batch row) is refused;
    - ``NF.segmented_attention`` (chunked prefill, prefix-cache hits, or its
      substitute): one call per chunk its rows can reach, each with the
      block table from its chunk's start and ``prior_tokens`` relative to
      it, the rows merged from the call of their chunk; chunks that are not
      whole KV-cache blocks raise ``NotImplementedError``;
    - ``NF.segmented_attention_cp`` (context-parallel prefill) takes no chunk
      mask: its path raises when the layer is chunked;
    - decode: each ``NF.gen_attention_decode_mask`` of the decode method gets
      ``start_pos`` = the start of the chunk of each position (prior slots
      before it are masked); a kernel that builds its mask from ``pos_ids=``
      gets ``swa_start_pos_ids=_chunk_start(pos_ids, ...)``; a mask the
      backbone builds once per step becomes one per chunk size of the
      layers (``autoport_cst.transform.edit.backbone_masks``); the
      context-parallel mask (``local_filled_slots``) raises when the layer is
      chunked.

    Config file: the dataclass gains ``attention_chunk_size`` and
    ``layer_types``. The KV-cache spec is unchanged (the cache keeps the
    whole context; only the masks change).

    Preconditions: an attention class with ``__init__(self, config,
    layer_idx)``, a flash and a decode kernel call, no sliding window on the
    same class, and for each decode kernel call a mask built in its method,
    by the backbone, or from ``pos_ids=``. Decode masks take one start per
    sequence (the largest of its active tokens), as the sliding window's do:
    speculative steps whose active tokens cross a chunk boundary are not
    masked per token.
    """

    ID = ID
    REALIZES = Realizes({"attention.chunked": not_to("none")})
    AFTER = (
        "attention-sinks",
        "attention-softcap",
        "attention-output-gate",
        "sliding-window",
        "position-scaled-attention",
        "nope-layers",
    )
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            71,
            lambda spec, facts: spec.attention.chunked != "none",
            "chunked attention ({spec.attention.chunk_size} tokens): every prefill path masks by chunk and "
            "every decode mask starts at the chunk of its position; a port that ignores it is wrong past "
            "the first chunk",
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="flash prefill folded by chunk, the decode mask from the chunk's start",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        out = NF.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v, scale=self.scaling, tp_q=False, tp_out=True)
                        return out

                    def forward_decode(self, x, positions):
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, bs=1, start_pos=None)
                        return NF.attention_decode(X=x, attention_mask=mask)
            """,
            after=_helpers_and(
                (LAYER_FUNCTION,),
                """
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: chunked attention (chunk in tokens, None: the whole context)
                        self.attention_chunk_size = _layer_chunk_size(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        # <-- MODEL-SPECIFIC: chunked attention: attend within chunks of attention_chunk_size tokens
                        attention_chunks = _PrefillChunks(self.attention_chunk_size)
                        out = attention_chunks.unfold(NF.flash_attention(attention_chunks.fold(q.transpose(1, 2), 2), attention_chunks.fold(k.transpose(1, 2), 2), attention_chunks.fold(v, 1), scale=self.scaling, tp_q=False, tp_out=True), 2)
                        return out

                    def forward_decode(self, x, positions):
                        # <-- MODEL-SPECIFIC: chunked attention: mask prior positions before the chunk's start
                        start_pos = None
                        if self.attention_chunk_size is not None:
                            start_pos = torch.div(positions, self.attention_chunk_size, rounding_mode="floor") * self.attention_chunk_size
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, bs=1, start_pos=start_pos)
                        return NF.attention_decode(X=x, attention_mask=mask)
                """,
            ),
        ),
        Example(
            title="segmented prefill: one call per chunk; the context-parallel paths guarded; pos_ids decode",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, block_tables=table, prior_tokens=cached, block_size=block_size, kv_segment_size=segment, tp_q=True, tp_out=True)
                        else:
                            out = NF.flash_attention(q, k, v)
                        return out

                    def forward_decode(self, x, positions, local_filled):
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, start_pos=None, local_filled_slots=local_filled)
                        return NF.attention_decode(X=x, attention_mask=None, pos_ids=positions)
            """,
            after=_helpers_and(
                (CHUNK_START, LAYER_FUNCTION),
                """
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        # <-- MODEL-SPECIFIC: chunked attention (chunk in tokens, None: the whole context)
                        self.attention_chunk_size = _layer_chunk_size(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            # <-- MODEL-SPECIFIC: chunked attention: a path whose kernel cannot mask by chunk refuses
                            if self.attention_chunk_size is not None:
                                raise NotImplementedError(
                                    "chunked attention: NF.segmented_attention_cp (context-parallel prefill) takes no chunk mask"
                                )
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v)
                        elif meta["kv_segment_size"]:
                            # <-- MODEL-SPECIFIC: chunked attention: attend within chunks of attention_chunk_size tokens
                            attention_chunks = _PrefillChunks(self.attention_chunk_size)
                            out = attention_chunks.merge([NF.segmented_attention(attention_chunks.queries(q, segment_call, 1), k_cache=self.k_cache, v_cache=self.v_cache, block_tables=attention_chunks.block_table(table, segment_call), prior_tokens=attention_chunks.prior_tokens(cached, segment_call), block_size=block_size, kv_segment_size=segment, tp_q=True, tp_out=True) for segment_call in attention_chunks.segments(cached, block_size, segment)], 2)
                        else:
                            # <-- MODEL-SPECIFIC: chunked attention: attend within chunks of attention_chunk_size tokens
                            attention_chunks = _PrefillChunks(self.attention_chunk_size)
                            out = attention_chunks.unfold(NF.flash_attention(attention_chunks.fold(q, 1), attention_chunks.fold(k, 2), attention_chunks.fold(v, 1)), 1)
                        return out

                    def forward_decode(self, x, positions, local_filled):
                        # <-- MODEL-SPECIFIC: chunked attention: a path whose kernel cannot mask by chunk refuses
                        if self.attention_chunk_size is not None and local_filled is not None:
                            raise NotImplementedError(
                                "chunked attention: the context-parallel decode mask (local_filled_slots) takes no chunk start"
                            )
                        # <-- MODEL-SPECIFIC: chunked attention: mask prior positions before the chunk's start
                        start_pos = None
                        if self.attention_chunk_size is not None:
                            start_pos = torch.div(positions, self.attention_chunk_size, rounding_mode="floor") * self.attention_chunk_size
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, start_pos=start_pos, local_filled_slots=local_filled)
                        return NF.attention_decode(X=x, attention_mask=None, pos_ids=positions, swa_start_pos_ids=_chunk_start(positions, self.attention_chunk_size))
                """,
            ),
        ),
        Example(
            title="the config fields",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    tie_word_embeddings: bool = False
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    tie_word_embeddings: bool = False
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # chunked attention: chunk length in tokens (None: none)
                    attention_chunk_size: int | None = None
                    layer_types: list[str] | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="a flash kernel with a sink per head",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, sink=self.sinks)

                    def forward_decode(self, x, positions):
                        return NF.attention_decode(X=x, pos_ids=positions)
            """,
            raises="passes a sink",
        ),
        Example(
            title="a sliding window on the same layers",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.sliding_window = config.sliding_window
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, sliding_window=self.sliding_window)

                    def forward_decode(self, x, positions):
                        return NF.attention_decode(X=x, pos_ids=positions)
            """,
            raises="slides too",
        ),
    )

    # -- files -----------------------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return add_config_fields(module, ctx, CONFIG_FIELDS)
        edits: dict = {}
        self._functions: set[str] = set()
        self._decodes = DecodeMasks()
        attention = attention_classes_in(module, ctx)
        for cls in attention:
            self._attention_edits(cls, module, ctx, edits)
        if self._decodes.outside:
            self._backbone_mask_edits(module, attention, ctx, edits)
        module = rewrite(module, edits)
        if not attention:
            return module
        functions = [LAYER_FUNCTION] + ([CHUNK_START] if self._decodes.start_function else [])
        module = add_functions(module, functions, replace=True)
        return _add_helper_class(module) if "helper" in self._functions else module

    def _attention_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        if find_self_assignment(init, "sliding_window") is not None:
            raise ctx.precondition(
                f"{ID}: {name} slides too (self.sliding_window): one mask cannot hold both", init, module
            )
        self._init_edit(cls, init, module, ctx, edits)
        sites = kernel_sites(cls)
        for kind in (FLASH, DECODE):
            if not any(site.kind == kind for site in sites):
                raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[kind]}(...) call in {name}", cls, module)
        for site in sites:
            if site.kind == FLASH:
                self._flash_edits(site, cls, module, ctx, edits)
            elif site.kind == SEGMENTED:
                self._segmented_edits(site, cls, module, ctx, edits)
            elif site.kind == SEGMENTED_CP:
                guard(module, ctx, site, f"self.{ATTR} is not None", CP_MESSAGE, edits, GUARD_COMMENT)
            elif site.kind == DECODE:
                decode_mask_start_edits(
                    site, cls, module, ctx, edits, self._decodes, ID, MASK, _refuse_memoized
                )

    def _init_edit(self, cls, init, module, ctx, edits) -> None:
        params = [p.name.value for p in init.params.params]
        if len(params) < 3:
            raise ctx.precondition(
                f"{ID}: {cls.name.value}.__init__ must take (self, config, layer_idx)", init, module
            )
        if find_self_assignment(init, ATTR) is not None:
            return
        stmt = with_comment(
            parse_statement(f"self.{ATTR} = _layer_chunk_size({params[1]}, {params[2]})", module),
            "<-- MODEL-SPECIFIC: chunked attention (chunk in tokens, None: the whole context)",
        )
        if not place_setting(init, ATTR, stmt, edits):
            body = [s for s in init.body.body]
            edits[id(body[0])] = lambda updated, stmt=stmt: cst.FlattenSentinel([stmt, updated])

    def _holder(self, site: KernelSite, cls, module, ctx, edits) -> None:
        """``attention_chunks = _PrefillChunks(...)`` before the kernel's statement."""
        holder = innermost_statement(site.method, site.call)
        if holder is None:  # pragma: no cover - a call always sits in a statement
            raise ctx.precondition(f"{ID}: cannot place the chunks before a kernel call", site.call, module)
        stmt = with_comment(parse_statement(f"{LOCAL} = {HELPER}(self.{ATTR})", module), FOLD_COMMENT)
        insert_before(edits, holder, [stmt])
        self._functions.add("helper")

    def _flash_edits(self, site: KernelSite, cls, module, ctx, edits) -> None:
        """q, k, v folded by chunk, the output unfolded."""
        sink = argument(site.call, "sink")
        if sink is not None and not is_none(sink):
            raise ctx.precondition(
                f"{ID}: {site.where(cls)} passes a sink to the flash kernel (one per batch row: the "
                "folded chunks would need it repeated)",
                site.call,
                module,
            )
        if _done(site.call):
            return
        layouts = (("q", 0, "tp_q", True), ("k", 1, "tp_k", False), ("v", 2, None, None))
        dims = {}
        for name, position, flag, default in layouts:
            if argument(site.call, name, position) is None:
                raise ctx.precondition(f"{ID}: {site.where(cls)}: no {name} argument", site.call, module)
            dims[name] = "1" if flag is None else _sequence_dim(site.call, flag, default, "1", "2")
        out_dim = _sequence_dim(site.call, "tp_out", False, "2", "1")
        self._holder(site, cls, module, ctx, edits)

        def edit(updated: cst.Call) -> cst.BaseExpression:
            call = _map_arguments(
                updated, {"q": 0, "k": 1, "v": 2}, lambda name, code: f"{LOCAL}.fold({code}, {dims[name]})"
            )
            return parse_expr(f"{LOCAL}.unfold({_code(call)}, {out_dim})", module)

        edits[id(site.call)] = edit

    def _segmented_edits(self, site: KernelSite, cls, module, ctx, edits) -> None:
        """One kernel call per chunk the rows reach, merged."""
        if _done(site.call):
            return
        names = {"q": 0, "block_tables": 3, "prior_tokens": 4, "block_size": 5, "kv_segment_size": 6}
        found = {name: argument(site.call, name, position) for name, position in names.items()}
        missing = [name for name, value in found.items() if value is None]
        if missing:
            raise ctx.precondition(
                f"{ID}: {site.where(cls)}: the segmented kernel call has no {', '.join(missing)} argument",
                site.call,
                module,
            )
        q_dim = _sequence_dim(site.call, "tp_q", True, "1", "2")
        out_dim = _sequence_dim(site.call, "tp_out", False, "2", "1")
        prior, block, segment = (_code(found[n]) for n in ("prior_tokens", "block_size", "kv_segment_size"))
        self._holder(site, cls, module, ctx, edits)
        rewrites = {
            "q": lambda code: f"{LOCAL}.queries({code}, segment_call, {q_dim})",
            "block_tables": lambda code: f"{LOCAL}.block_table({code}, segment_call)",
            "prior_tokens": lambda code: f"{LOCAL}.prior_tokens({code}, segment_call)",
        }

        def edit(updated: cst.Call) -> cst.BaseExpression:
            call = _map_arguments(
                updated,
                {name: names[name] for name in rewrites},
                lambda name, code: rewrites[name](code),
            )
            calls = f"{LOCAL}.segments({prior}, {block}, {segment})"
            return parse_expr(
                f"{LOCAL}.merge([{_code(call)} for segment_call in {calls}], {out_dim})", module
            )

        edits[id(site.call)] = edit

    def _backbone_mask_edits(self, module, attention, ctx, edits) -> None:
        method = self._decodes.outside[0].method
        caller_mask_edits(module, ctx, attention, method, ID, edits, MASK)


def _done(call: cst.Call) -> bool:
    """Whether a kernel call reads its queries through the chunks already."""
    first = call.args[0].value if call.args else None
    return first is not None and code_of(first).startswith(f"{LOCAL}.")


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _sequence_dim(call: cst.Call, flag: str, default: bool, when_true: str, when_false: str) -> str:
    """The code of the sequence dimension of a tensor whose layout ``flag`` chooses."""
    arg = keyword_arg(call, flag)
    if arg is None:
        return when_true if default else when_false
    text = code_of(arg.value)
    if text in ("True", "False"):
        return when_true if text == "True" else when_false
    return f"({when_true} if {text} else {when_false})"


def _map_arguments(call: cst.Call, positions: dict[str, int], wrap) -> cst.Call:
    """``call`` with the arguments ``positions`` names (by keyword or
    position) replaced by ``wrap(name, code)``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    args = []
    for arg in call.args:
        name = None
        if arg.keyword is not None and arg.keyword.value in positions:
            name = arg.keyword.value
        elif arg.keyword is None and not arg.star:
            index = positional.index(arg)
            name = next((n for n, p in positions.items() if p == index), None)
        if name is not None:
            arg = arg.with_changes(value=parse_expr(wrap(name, _code(arg.value))))
        args.append(arg)
    return call.with_changes(args=args)


def _refuse_memoized(mask: cst.Call, decode: cst.FunctionDef, where: str, module, ctx, _edits: dict) -> None:
    """A decode mask kept in a dict for the next layers holds one layer's
    start: not handled."""
    holder = innermost_statement(decode, mask)
    if not (isinstance(holder, cst.SimpleStatementLine) and isinstance(holder.body[0], cst.Assign)):
        return
    target = dotted(holder.body[0].targets[0].target)
    for node in walk(decode):
        if (
            isinstance(node, cst.Assign)
            and target is not None
            and dotted(node.value) == target
            and isinstance(node.targets[0].target, cst.Subscript)
        ):
            raise ctx.precondition(
                f"{ID}: {where} keeps its decode mask for the next layers ({code_of(node.targets[0].target)}); "
                "a chunk start per layer is not handled there",
                mask,
                module,
            )


def _add_helper_class(module: cst.Module) -> cst.Module:
    """``_PrefillChunks`` before the first class of the module (replaced when present)."""
    helper = parse_statement(HELPER_CLASS.strip("\n"), module)
    body = list(module.body)
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == HELPER:
            body[i] = helper.with_changes(leading_lines=stmt.leading_lines)
            return module.with_changes(body=body)
    first = next((i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)), len(body))
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    body.insert(first, helper.with_changes(leading_lines=blank))
    return module.with_changes(body=body)
