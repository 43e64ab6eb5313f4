"""swapped-halves-rope: RoPE whose rotate_half turns the pairs the other way (NanoChat's cat(x2, -x1))."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes_in
from autoport_cst.transform.anatomy.classes import is_quantized, require_method
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, self_assignment, statements, walk
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.rope_columns import append_after, reorder_rope_columns
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, from_to

ID = "swapped-halves-rope"
SWAP = "_halves_swapped"
COMMENT = (
    "<-- MODEL-SPECIFIC: the checkpoint turns each pair (j, j + head_dim / 2) the other way: halves swapped"
)
IDENTITY = "_rope_column_order(self.head_dim, rotary_dim=self.head_dim, interleaved=False)"
SWAP_FUNCTION = '''
def _halves_swapped(order: list[int]) -> list[int]:
    """``order`` with the halves of each query and key head swapped.

    The checkpoint's rotate_half is cat(x2, -x1): it turns each pair
    (j, j + head_dim / 2) by minus the position's angle. That is the usual turn
    (cat(-x2, x1), the RoPE here and the decode kernel) of the head with its
    halves swapped, swapped back; loading every query and key head with its
    halves swapped makes the turn here the checkpoint's. Queries and keys are
    swapped alike, so their dot products do not change, nor does a norm of a
    whole head.
    """
    half = len(order) // 2
    return order[half:] + order[:half]
'''


class SwappedHalvesRope(Codemod):
    """RoPE turning each pair of halves the other way: the query and key heads loaded with their halves swapped.

    NanoChat's ``rotate_half(x)`` is ``cat((x2, -x1))`` where transformers'
    is ``cat((-x2, x1))`` (x1, x2 the halves of a head): ``x * cos +
    rotate_half(x) * sin`` then turns each pair ``(x1[j], x2[j])`` by minus
    the position's angle, which is ``P R P`` with ``R`` the usual rotation
    and ``P`` the swap of the halves. Rather than change the prefill RoPE
    and the decode kernel, the attention class loads the query and key
    columns of each head with their halves swapped (``self.rope_column_order
    = _halves_swapped(...)`` after the identity order, the loaders of the
    fused QKV weight, its bias and the query/key norm gammas wrapped as
    ``interleaved-rope`` wraps them): the rotated queries and keys are then
    the checkpoint's with their halves swapped, and their dot products the
    checkpoint's. Values, the output projection and the cos/sin tables stay
    as they are; a weightless norm of a whole head, before or after the
    rotation, is unchanged by the swap, and a norm's gammas are swapped with
    their columns.

    Preconditions: as ``interleaved-rope`` (``self.head_dim``, ``self.q_size``,
    ``self.kv_size`` and a loader on ``self.qkv_proj_weight``), and a column
    order that is the identity (a partial or interleaved rotation is refused:
    the halves of what is rotated would not be the halves of the head).
    """

    ID = ID
    REALIZES = Realizes({"rope.style": from_to("rotate_half", "rotate_half_swapped")})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            151,
            lambda spec, facts: spec.rope.style == "rotate_half_swapped",
            "rotate_half as cat(x2, -x1) turns each pair the other way: swap the halves of each Q/K head at load",
        ),
    )
    AFTER = ("add-qkv-bias", "qk-norm", "fused-checkpoint", "partial-rotary", "interleaved-rope")
    EXAMPLES = (
        Example(
            title="query/key heads loaded with their halves swapped",
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class NanoChatAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size),
                        )
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, get_weight_loader, set_weight_loader


                def _halves_swapped(order: list[int]) -> list[int]:
                    """``order`` with the halves of each query and key head swapped.

                    The checkpoint's rotate_half is cat(x2, -x1): it turns each pair
                    (j, j + head_dim / 2) by minus the position's angle. That is the usual turn
                    (cat(-x2, x1), the RoPE here and the decode kernel) of the head with its
                    halves swapped, swapped back; loading every query and key head with its
                    halves swapped makes the turn here the checkpoint's. Queries and keys are
                    swapped alike, so their dot products do not change, nor does a norm of a
                    whole head.
                    """
                    half = len(order) // 2
                    return order[half:] + order[:half]


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


                class NanoChatAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        # <-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here
                        self.rope_column_order = _rope_column_order(self.head_dim, rotary_dim=self.head_dim, interleaved=False)
                        # <-- MODEL-SPECIFIC: the checkpoint turns each pair (j, j + head_dim / 2) the other way: halves swapped
                        self.rope_column_order = _halves_swapped(self.rope_column_order)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size),
                        )
                        set_weight_loader(
                            self.qkv_proj_weight,
                            _rope_columns_loader(get_weight_loader(self.qkv_proj_weight), self.rope_column_order, self.q_size + self.kv_size),
                        )
            ''',
        ),
        Example(
            title="a partial rotation: the halves of the rotated part are not the head's",
            before="""
                class NanoChatAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        self.rope_column_order = _rope_column_order(self.head_dim, rotary_dim=self.head_dim // 2, interleaved=False)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        set_weight_loader(self.qkv_proj_weight, loader)
            """,
            raises="swapped-halves-rope: NanoChatAttention.rope_column_order is not the identity",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        classes = [c for c in attention_classes_in(module, ctx) if not is_quantized(c)]
        if classes and all(_swaps(c) for c in classes):
            return module  # applied already
        for cls in classes:
            order = _order_statement(cls)
            if order is not None and code_of(self_assignment(order)[1]) != IDENTITY:  # type: ignore[index]
                raise ctx.precondition(
                    f"{ID}: {cls.name.value}.rope_column_order is not the identity ({code_of(order).strip()}): "
                    "the halves of a partial or interleaved rotation are not the halves of the head",
                    order,
                    module,
                )
        module = reorder_rope_columns(module, ctx)
        edits: dict = {}
        for cls in attention_classes_in(module, ctx):
            order = _order_statement(cls)
            if is_quantized(cls) or order is None:
                continue
            require_method(module, ctx, cls, "__init__")
            swap = with_comment(
                parse_statement(f"self.rope_column_order = {SWAP}(self.rope_column_order)", module), COMMENT
            )
            append_after(edits, id(order), [swap])
        return add_functions(rewrite(module, edits), [SWAP_FUNCTION])


def _order_statement(cls: cst.ClassDef) -> cst.SimpleStatementLine | None:
    """The last ``self.rope_column_order = ...`` of ``__init__``."""
    init = next(
        (n for n in cls.body.body if isinstance(n, cst.FunctionDef) and n.name.value == "__init__"), None
    )
    found = None
    for stmt in statements(init) if init is not None else ():
        pair = self_assignment(stmt)
        if pair is not None and pair[0] == "rope_column_order":
            found = stmt
    return found


def _swaps(cls: cst.ClassDef) -> bool:
    return any(isinstance(n, cst.Call) and code_of(n.func) == SWAP for n in walk(cls))
