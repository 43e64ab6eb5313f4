"""fused-query-gate: load the queries and the attention output gate from one checkpoint tensor fusing them per head (MiniCPM5-MoE)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes_in
from autoport_cst.transform.anatomy.classes import is_quantized
from autoport_cst.transform.anatomy.loaders import find_loaders
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, dotted
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.tree import add_edit, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

ID = "fused-query-gate"
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"
LOADER = "query_gate_rows_loader"
QKV = "qkv_proj_weight"
GATE = "output_gate_proj_weight"  # the attention-output-gate codemod's parameter
COMMENT = (
    "<-- MODEL-SPECIFIC: the checkpoint fuses each head's query rows and output gate rows "
    "(part 0: the queries, part 1: the gate)"
)

LOADER_CODE = f'''
def {LOADER}(loader, head_dim, part):
    """``loader`` given, for its first checkpoint tensor, one part of a tensor
    that fuses each head's query rows and its output gate rows ([h0: q g,
    h1: q g, ...], head_dim rows each): the query rows (part 0) or the gate
    rows (part 1), head by head, as a separate tensor of them would hold
    them; ``loader`` shards them by query head as it shards that tensor."""

    class Rows:
        def __init__(self, tensor, source):
            self.tensor, self.source = tensor, source

        def get_shape(self):
            return list(self.tensor.shape)

        def get_dtype(self):
            return self.source.get_dtype()

        def __getitem__(self, index):
            return self.tensor[index]

    def transform(slices, rank):
        fused = slices[0][:]
        rest = list(fused.shape[1:])
        rows = fused.reshape(-1, 2, head_dim, *rest)[:, part].reshape(-1, *rest)
        return loader.load([Rows(rows, slices[0]), *slices[1:]], rank)

    return SafetensorsWeightLoader(transform)
'''

EXAMPLE_BEFORE = """
    from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


    class Qwen3MoeAttention(nn.Module):
        def __init__(self, config, layer_idx):
            self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
            self.output_gate_proj_weight = nn.Parameter(torch.empty(self.hidden_size, o_in))

        def _setup_weight_loaders(self):
            qkv_loader = fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size, num_shards=self.world_size)
            set_weight_loader(self.qkv_proj_weight, qkv_loader)
            set_weight_loader(
                self.output_gate_proj_weight,
                with_rank_override(sharding_weight_loader(shard_dim=1, shard_size=o_shard_size), rank=q_rank),
            )
"""
EXAMPLE_AFTER = f"""
    from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, set_weight_loader


{"".join("    " + line if line else "" for line in LOADER_CODE.strip(chr(10)).splitlines(True))}


    class Qwen3MoeAttention(nn.Module):
        def __init__(self, config, layer_idx):
            self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
            self.output_gate_proj_weight = nn.Parameter(torch.empty(self.hidden_size, o_in))

        def _setup_weight_loaders(self):
            qkv_loader = fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size, num_shards=self.world_size)
            # {COMMENT}
            set_weight_loader(self.qkv_proj_weight, {LOADER}(qkv_loader, self.head_dim, 0))
            # {COMMENT}
            set_weight_loader(
                self.output_gate_proj_weight,
                {LOADER}(with_rank_override(sharding_weight_loader(shard_dim=1, shard_size=o_shard_size), rank=q_rank), self.head_dim, 1),
            )
"""


class FusedQueryGate(Codemod):
    """The queries and the attention output gate loaded from one checkpoint
    tensor whose rows are, head after head, the head's query rows then its
    gate rows (MiniCPM5-MoE's ``q_gate_proj``, viewed per head as
    ``[query | gate]`` and chunked in two).

    Model file, attention class (``<Prefix>Attention``): the loader attached
    to ``self.qkv_proj_weight`` is wrapped in ``query_gate_rows_loader(<it>,
    self.head_dim, 0)`` and the one attached to ``self.output_gate_proj_weight``
    (the ``attention-output-gate`` codemod's parameter) in
    ``query_gate_rows_loader(<it>, self.head_dim, 1)``: the wrapper hands the
    loader, in place of its first checkpoint tensor (the query's, which the
    mapping names by the fused key, as it names the gate's: ``checkpoint-keys``
    renames ``q_proj`` and ``gate_proj`` to it), the query rows or the gate
    rows of every head in head order, so the wrapped loader shards them by
    query head per TP rank (and attention-DP rank) exactly as it shards a
    separate query or gate tensor. The module gets the wrapper's function and
    imports ``SafetensorsWeightLoader``.

    Quantized attention classes are left alone (``attention-output-gate``
    guards them). Preconditions: a loader attached to both parameters in
    every other attention class.
    """

    ID = ID
    REALIZES = Realizes({"checkpoint.output_gate": to("fused_query_per_head")})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    AFTER = ("attention-output-gate", "fused-checkpoint", "add-qkv-bias")
    EXAMPLES = (
        Example(
            title="the query loader and the gate loader each take their part of the fused rows",
            before=EXAMPLE_BEFORE,
            after=EXAMPLE_AFTER,
        ),
        Example(
            title="an attention class without the output gate's parameter is refused",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=8, kv_size=4))
            """,
            raises="fused-query-gate: LlamaAttention attaches no loader to self.output_gate_proj_weight",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        for cls in attention_classes_in(module, ctx):
            if is_quantized(cls):
                continue
            loaders = find_loaders(cls)
            for part, key in enumerate((QKV, GATE)):
                found = loaders.get(key, [])
                if not found:
                    raise ctx.precondition(
                        f"{ID}: {cls.name.value} attaches no loader to self.{key}", cls, module
                    )
                for loader in found:
                    if isinstance(loader.argument, cst.Call) and dotted(loader.argument.func) == LOADER:
                        continue
                    self._wrap(loader, part, module, edits)
        if not edits:
            return module
        module = rewrite(module, edits)
        module = add_functions(module, [LOADER_CODE])
        return ensure_import_from(module, WEIGHT_LOADERS, "SafetensorsWeightLoader")

    @staticmethod
    def _wrap(loader, part: int, module: cst.Module, edits: dict) -> None:
        wrapped = parse_expr(f"{LOADER}({code_of(loader.argument)}, self.head_dim, {part})", module)

        def edit(updated: cst.Call, wrapped=wrapped) -> cst.Call:
            args = list(updated.args)
            args[1] = args[1].with_changes(value=wrapped)
            return updated.with_changes(args=args)

        add_edit(edits, id(loader.call), edit)
        add_edit(edits, id(loader.statement), lambda updated: with_comment(updated, COMMENT))
