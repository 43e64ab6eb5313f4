"""The decode edit sliding-window and chunked-attention share
(``backbone_masks.decode_mask_start_edits``) on an attention in the
production packages' decode shape (a module we write, mimicking it):

- the backbone builds the step's mask once through a module function whose
  parameters are one a line with a trailing comma, and calls it by keyword;
- the decode kernel is handed that mask, and masks from ``pos_ids=`` only
  when no mask is given, with ``swa_start_pos_ids=`` a local the method sets
  to None.

The codemods wrote a positional bound after keyword arguments (a crash), and
replaced whatever ``swa_start_pos_ids`` the kernel was given. Now: the bound
by keyword, the mask function's new parameter on a line of its own, the
written mask masks the prior slots before the layer's bound, and a start the
kernel is already given is refused, positioned."""

from __future__ import annotations

import libcst as cst
import pytest
import torch

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod
from autoport_cst.validate.standin.decode_mask import gen_attention_decode_mask

SOURCE = '''
def _decode_mask(
    attn_metadata: dict,
    positions: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """The step's decode mask, built once for every layer."""
    meta = attn_metadata["layers.0.self_attn"]
    mask = NF.gen_attention_decode_mask(
        pos_ids=positions.reshape(1, -1).to(torch.float32),
        bs=meta["batch"],
        q_head=heads,
        s_active=1,
        s_prior=meta["slots"],
        start_pos=None,
        block_len=meta["block_size"],
    )
    return mask


class MixtralAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.heads = config.num_attention_heads
        self.scaling = config.head_dim**-0.5
        self.qkv_proj_weight = nn.Parameter(torch.empty(config.hidden_size, 3 * config.hidden_size))

    def forward_prefill(self, q, k, v):
        return NF.flash_attention(q, k, v, scale=self.scaling, tp_q=False, tp_out=True)

    def forward_decode(self, x, positions, attn_mask):
        positions_kernel = None
        start_kernel = None
        if attn_mask is None:
            positions_kernel = positions.to(torch.float32)
        return NF.attention_decode(
            X=x,
            attention_mask=attn_mask,
            pos_ids=positions_kernel,
            swa_start_pos_ids=start_kernel,
            softmax_scale=self.scaling,
        )


class MixtralDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = MixtralAttention(config, layer_idx)


class MixtralModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([MixtralDecoderLayer(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, x, positions, attn_metadata, is_prefill):
        attn_mask = None
        if not is_prefill:
            attn_mask = _decode_mask(
                attn_metadata=attn_metadata,
                positions=positions,
                heads=self.layers[0].self_attn.heads,
            )
        for idx, layer in enumerate(self.layers):
            x = layer(x, positions=positions, attn_mask=attn_mask)
        return x
'''

# codemod id -> (params, the bound's parameter, the attention attribute, the start function)
BOUNDS = {
    "chunked-attention": ({}, "chunk", "attention_chunk_size", "_chunk_start"),
    "sliding-window": ({"layers": "per_layer"}, "window", "sliding_window", "_window_start"),
}


def _run(codemod_id: str, source: str = SOURCE) -> str:
    cls = get_codemod(codemod_id)
    output, _ = run_on_source(cls(cls.parse_params(BOUNDS[codemod_id][0])), source, "model.py", "model")
    return output


def _mask_function(output: str):
    module = cst.parse_module(output)
    function = next(
        s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == "_decode_mask"
    )
    namespace = {
        "torch": torch,
        "NF": type("NF", (), {"gen_attention_decode_mask": gen_attention_decode_mask}),
    }
    exec(module.code_for_node(function), namespace)  # noqa: S102 - the written mask function is under test
    return namespace["_decode_mask"]


@pytest.mark.parametrize("codemod_id", sorted(BOUNDS))
def test_every_decode_path_takes_the_layer_bound(codemod_id):
    _, param, attr, start = BOUNDS[codemod_id]
    output = _run(codemod_id)
    compile(output, "model.py", "exec")
    # the backbone's keyword call takes the bound by keyword, one mask per bound of the layers
    assert f"heads=self.layers[0].self_attn.heads, {param}={param})" in output
    assert f"for {param} in {{layer.self_attn.{attr} for layer in self.layers}}" in output
    assert f"attn_mask=None if attn_mask is None else attn_mask[layer.self_attn.{attr}]" in output
    # the mask function's parameter on a line of its own, before ")"
    assert f"    heads: int,\n    {param}: int | None = None,\n) -> torch.Tensor:" in output
    # the kernel that masks from pos_ids when given no mask
    assert f"swa_start_pos_ids={start}(positions_kernel, self.{attr})," in output
    assert _run(codemod_id, output) == output


def test_the_written_mask_hides_the_slots_before_the_bound():
    meta = {"layers.0.self_attn": {"batch": 2, "slots": 128, "block_size": 32}}
    positions = torch.tensor([9, 30])
    for codemod_id, expected_start in (("chunked-attention", [8, 28]), ("sliding-window", [6, 27])):
        mask = _mask_function(_run(codemod_id))
        bounded = mask(meta, positions, 2, 4)
        whole = mask(meta, positions, 2)
        for row, (position, start) in enumerate(zip(positions.tolist(), expected_start, strict=True)):
            seen = bounded[:-1, row, 0, 0].nonzero().flatten().tolist()
            assert seen == list(range(start, position)), (codemod_id, row, seen)
            assert whole[:-1, row, 0, 0].nonzero().flatten().tolist() == list(range(position))


@pytest.mark.parametrize("codemod_id", sorted(BOUNDS))
def test_a_start_the_kernel_is_given_is_refused_not_replaced(codemod_id):
    given = SOURCE.replace(
        "            positions_kernel = positions.to(torch.float32)\n",
        "            positions_kernel = positions.to(torch.float32)\n            start_kernel = positions_kernel - 3\n",
    )
    with pytest.raises(PreconditionError, match="already passes swa_start_pos_ids=start_kernel") as info:
        _run(codemod_id, given)
    assert info.value.position.line == SOURCE.count("\n", 0, SOURCE.index("NF.attention_decode(")) + 2


def test_a_second_bound_on_the_same_kernel_is_refused():
    chunked = _run("chunked-attention")
    with pytest.raises(PreconditionError, match="already passes swa_start_pos_ids=_chunk_start"):
        _run("sliding-window", chunked)
