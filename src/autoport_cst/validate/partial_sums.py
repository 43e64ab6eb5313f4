"""transformers' row-parallel projections computed as ``tp`` ranks compute
them: the bf16 baseline of a TP > 1 validation where the eager one fails
(docs/validation.md, "The bf16 baseline").

At TP = N a row-parallel projection (the attention's output projection, the
MLP's down projection) is N partial products, one per rank over its share
of the input features, each rounded to the model's dtype, summed over the
ranks in that dtype by the all-reduce, the bias added once after the sum.
transformers' eager run computes one product and rounds it once, so at
bf16 a correct port's error at those components grows with N (measured:
Qwen2-VL's tiny port, R-ratio of ``layers.2.attention`` 0.98 at TP=1 and
1.21 at TP=2 against eager; 1.04 at TP=2 against this baseline).

Which modules are row-parallel is what the model's own config declares in
transformers' tensor-parallel plan (``base_model_tp_plan``, of the config
and of its sub-configs: a vision-language model's ``text_config``):
``"rowwise"`` and ``"rowwise_split_input"`` entries whose module is an
``nn.Linear``. The input features are split into N contiguous equal shares,
rank order, as the port's sharding loaders split the weight's columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ROW_PARALLEL_STYLES = ("rowwise", "rowwise_split_input")


def row_parallel_patterns(config: Any) -> list[re.Pattern[str]]:
    """The row-parallel entries of the tensor-parallel plans of ``config``
    and its sub-configs, as patterns over module names (``*`` is one name
    part; any prefix before the plan's path, such as ``model.`` or
    ``model.language_model.``)."""
    plans = [getattr(config, "base_model_tp_plan", None)]
    for name in getattr(config, "sub_configs", {}) or {}:
        plans.append(getattr(getattr(config, name, None), "base_model_tp_plan", None))
    patterns = []
    for plan in plans:
        for path, style in (plan or {}).items():
            if style in ROW_PARALLEL_STYLES:
                body = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in path.split("."))
                patterns.append(re.compile(rf"(^|\.){body}$"))
    return patterns


def split_row_parallel(model: nn.Module, tp: int) -> list[str]:
    """Make every row-parallel ``nn.Linear`` of ``model`` (its config's plan)
    compute as ``tp`` ranks do (module docstring); the names of the modules
    changed (none at ``tp`` 1). A module whose input features ``tp`` does
    not divide is left."""
    if tp <= 1:
        return []
    patterns = row_parallel_patterns(model.config)
    changed = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module.in_features % tp:
            continue
        if any(pattern.search(name) for pattern in patterns):
            module.forward = _summed_over_ranks(module, tp)  # type: ignore[method-assign,assignment]
            changed.append(name)
    return changed


def _summed_over_ranks(linear: nn.Linear, tp: int) -> Callable[[torch.Tensor], torch.Tensor]:
    share = linear.in_features // tp

    def forward(x: torch.Tensor) -> torch.Tensor:
        total = None
        for rank in range(tp):
            columns = slice(rank * share, (rank + 1) * share)
            partial = nn.functional.linear(x[..., columns], linear.weight[:, columns])
            total = partial if total is None else total + partial
        assert total is not None
        return total if linear.bias is None else total + linear.bias

    return forward
