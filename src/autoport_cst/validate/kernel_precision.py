"""Transformers at the stand-in kernels' precision policy: the second bf16
baseline of the three-way check (docs/validation.md, "The bf16 baseline").

The device kernels, and so the stand-in (``standin/numerics.py``,
``standin/prefill_attention.py``), round differently from transformers' eager
bf16 code in two places:

- attention: the scores, the mask, the sink column and the softmax are in
  float32; the probabilities are rounded to the value dtype once, before the
  value matmul (eager rounds the scores to bf16 and computes a sink's
  log-sum-exp from them);
- normalisations: the whole norm runs in float32, the weight (and bias)
  applied before the one rounding of the output (eager's RMSNorms round the
  normalised input first, then multiply by the weight in bf16).

At TP > 1 a third difference is the parallelism's, not the kernels': each
rank's share of a row-parallel projection is rounded before the all-reduce
sums them in the model's dtype; the policy run does the same
(``partial_sums``).

This module runs transformers' own modeling code with exactly those
changes: attention through an attention function registered with
transformers under ``POLICY_NAME`` (the model's weights, masks and RoPE are
its own), every normalisation module run on a float32 copy of itself, and
at TP > 1 the row-parallel projections summed over the ranks. Anything else
stays the eager computation. A model whose attention does not go through
transformers' attention interface, or passes it an option the policy does
not implement (softcapping), gets no such baseline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .partial_sums import split_row_parallel
from .reference import ReferenceOutput, load_reference, run_reference

POLICY_NAME = "autoport_kernel_precision"
POLICY = (
    "attention scores, mask, sink and softmax in float32, probabilities rounded once before the value "
    "matmul; normalisations in float32 with the weight applied before rounding; at TP > 1 the "
    "row-parallel projections summed over the ranks, each rank's share rounded"
)
# keyword arguments of transformers' attention functions that change the eager computation beyond
# the mask (which carries the sliding window) and the sink; the policy does not implement them
_REFUSED = ("softcap", "alibi", "position_bias", "s_aux_scale")


class PolicyUnavailable(RuntimeError):
    """The model computes something the precision policy does not cover."""


def kernel_precision_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention (``[B, H, S, D]`` in, ``[B, S, H, D]`` out) with the
    stand-in's ``softmax_attention`` numerics. The sliding window is in the
    mask, as for eager; a sink is ``s_aux`` or the module's ``sinks``."""
    unknown = {k for k in _REFUSED if kwargs.get(k) is not None}
    if unknown:
        raise PolicyUnavailable(f"attention option(s) {sorted(unknown)} not in the precision policy")
    # torch's stub of Module.__setattr__ takes tensors and modules only; a counter is a plain attribute
    module._kernel_precision_calls = getattr(module, "_kernel_precision_calls", 0) + 1  # type: ignore[assignment]
    groups = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(groups, dim=1).to(torch.float32)
    values = value.repeat_interleave(groups, dim=1)
    scores = (query.to(torch.float32) @ keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask.to(torch.float32)[..., : keys.shape[-2]]
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    if sinks is not None:
        column = sinks.to(torch.float32).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat((scores, column), dim=-1)
    probs = torch.nan_to_num(F.softmax(scores, dim=-1), nan=0.0)
    if sinks is not None:
        probs = probs[..., :-1]
    probs = probs.to(value.dtype)
    output = (probs.to(torch.float32) @ values.to(torch.float32)).to(value.dtype)
    return output.transpose(1, 2).contiguous(), probs


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(POLICY_NAME, kernel_precision_attention)
    AttentionMaskInterface.register(POLICY_NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def is_norm(module: nn.Module) -> bool:
    """A normalisation module: torch's own, or a modeling class named so."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)):
        return True
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm", "RmsNorm")) and not list(module.children())


def _float32_forward(module: nn.Module) -> Callable[..., Any]:
    """``module``'s forward computed by a float32 copy of it, the output
    rounded once to the input's dtype."""
    twin = copy.deepcopy(module).to(torch.float32)

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        dtype = hidden_states.dtype
        widened = [a.to(torch.float32) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
        return twin(hidden_states.to(torch.float32), *widened, **kwargs).to(dtype)

    return forward


def load_kernel_precision_reference(checkpoint_dir: str | Path, dtype: torch.dtype) -> Any:
    """The checkpoint's transformers model in ``dtype`` at the policy."""
    _register()
    try:
        model = load_reference(checkpoint_dir, dtype, attn_implementation=POLICY_NAME)
    except KeyError as error:  # GPT-Neo looks its attention class up by implementation name
        raise PolicyUnavailable(
            f"the model's code does not take a registered attention function (KeyError: {error})"
        ) from error
    norms = [m for m in model.modules() if is_norm(m)]
    for norm in norms:
        norm.forward = _float32_forward(norm)
    return model


def run_kernel_precision_reference(
    checkpoint_dir: str | Path,
    prompts: tuple[tuple[int, ...], ...],
    teacher: list[list[int]],
    dtype: torch.dtype = torch.bfloat16,
    run: Callable[..., ReferenceOutput] = run_reference,
    row_parallel: int = 1,
) -> ReferenceOutput:
    """``run(model, prompts, teacher)`` (``run_reference``, or the FP8-cache
    run) at the policy, the row-parallel projections summed over
    ``row_parallel`` ranks (``partial_sums``); ``PolicyUnavailable`` when
    some attention layer did not run through the policy's attention function."""
    model = load_kernel_precision_reference(checkpoint_dir, dtype)
    split_row_parallel(model, row_parallel)
    output = run(model, prompts, teacher)
    for component in output.components:
        if component.name.endswith(".attention"):
            attention = model.get_submodule(component.module_path)
            if not any(hasattr(m, "_kernel_precision_calls") for m in attention.modules()):
                raise PolicyUnavailable(
                    f"{component.module_path} does not compute through transformers' attention interface"
                )
    return output
