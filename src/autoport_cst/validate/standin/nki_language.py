"""Stand-in for ``nki.language``: the dtype names model code passes to NF ops
(``compute_dtype=nl.bfloat16``, ``router_mm_dtype=nl.float32``). They are
the matching torch dtypes, which the stand-in ops accept."""

from __future__ import annotations

import torch

float32 = torch.float32
bfloat16 = torch.bfloat16
float16 = torch.float16
