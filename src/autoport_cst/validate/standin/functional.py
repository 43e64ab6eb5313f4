"""Stand-in for ``vllm_neuron.functional`` (imported by models as ``NF``).

Each op computes what the Neuron kernel computes, in plain PyTorch, with the
kernels' numerics where they matter (``numerics``). The ops live in modules
named for what they hold and are gathered here:

- ``projections``: ``qkv_proj`` (fused norm, QK norms, RoPE, in-kernel paged
  cache write), ``o_proj``;
- ``prefill_attention``: ``flash_attention``, ``segmented_attention``,
  ``segmented_attention_cp``;
- ``decode_mask`` and ``decode_attention``: ``gen_attention_decode_mask``,
  ``attention_decode`` (also installed as the modules
  ``vllm_neuron.functional.attention.attention_decode_mask`` and
  ``.attention_decode``);
- ``dense_mlp``: ``mlp``, ``merge_prompt_embeds``;
- ``moe``: the mixture-of-experts kernels;
- ``collectives``: ``all_to_all``;
- ``mla``: multi-latent attention, ``mla_absorb`` and ``mla_decode_attention``.

Constraints of the hardware kernels that decide whether a port runs on a
device are enforced with the kernel's wording, so a port that passes on CPU
does not then fail on Trainium (2-D ``[1, N]`` biases, decode contexts in
multiples of 128 slots, int32 block tables, uint32 cache-update indices,
in-bounds cache-write slots, the segmented kernel's segment sizes...).
Keyword arguments a kernel does not have, and values of its options the
stand-in does not implement, are refused by name (``kernel_options``).
"""

from __future__ import annotations

from typing import Any

from . import kernel_phases
from .collectives import all_to_all as _all_to_all
from .common_types import ActFnType, NormType
from .decode_attention import attention_decode
from .decode_mask import gen_attention_decode_mask
from .dense_mlp import merge_prompt_embeds, mlp
from .kernel_options import KernelArgumentError, UnsupportedKernelOption
from .mla import mla_absorb, mla_decode_attention
from .numerics import P_MAX, KernelConstraintError
from .prefill_attention import flash_attention, segmented_attention, segmented_attention_cp
from .projections import o_proj, qkv_proj

__all__ = [
    "ActFnType",
    "KernelArgumentError",
    "KernelConstraintError",
    "NormType",
    "P_MAX",
    "UnsupportedKernelOption",
    "all_to_all",
    "attention_decode",
    "flash_attention",
    "gen_attention_decode_mask",
    "merge_prompt_embeds",
    "mla_absorb",
    "mla_decode_attention",
    "mlp",
    "o_proj",
    "qkv_proj",
    "segmented_attention",
    "segmented_attention_cp",
]


def all_to_all(tensor: Any, split_dim: int, concat_dim: int, group: Any = None) -> Any:
    """``NF.all_to_all``: exchange chunks of ``split_dim`` over ``group``
    (a process group; ``None`` is a single rank)."""
    kernel_phases.record("all_to_all")
    return _all_to_all(tensor, split_dim, concat_dim, group)


def _not_in_standin(name: str):
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"NF.{name} is not in the CPU stand-in")

    op.__name__ = name
    op.__doc__ = f"NF.{name}: not implemented in the CPU stand-in (raises NotImplementedError)."
    return op


sample = _not_in_standin("sample")
rmsnorm_quant = _not_in_standin("rmsnorm_quant")


# -- mixture of experts (implemented in .moe) ------------------------------------------
# Imported last: .moe builds on the kernels above. Re-exported as NF.<name>.
from .moe import (  # noqa: E402, I001
    RouterComputationOrder as RouterComputationOrder,
    build_blockwise_mapping as build_blockwise_mapping,
    get_local_expert_affinities as get_local_expert_affinities,
    moe_block_tkg as moe_block_tkg,
    moe_cte as moe_cte,
    router as router,
)
