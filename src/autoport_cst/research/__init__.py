"""Architecture research for ``autoport-cst plan``: what a model computes,
read from its config.json, its transformers modeling source (analysed as
code, never imported) and its safetensors headers; which reference is
closest; how it must be sharded.

Importing this package imports neither torch nor transformers; functions
that need transformers (the configuration class defaults, the location of
the modeling source) import it when called.
"""

from autoport_cst.research.checkpoint import (
    CheckpointHeader,
    TensorInfo,
    read_checkpoint,
    read_safetensors_header,
)
from autoport_cst.research.findings import Claim, Conflict, Finding
from autoport_cst.research.parallelism import (
    RANK_BUDGET_BYTES,
    WORLD_SIZE,
    EPOption,
    ParallelDims,
    ParallelPlan,
    TPCheck,
    check_tp,
    plan_parallelism,
)
from autoport_cst.research.pipeline import Research, research
from autoport_cst.research.reference_choice import Candidate, ReferenceChoice, choose_reference

__all__ = [
    "RANK_BUDGET_BYTES",
    "WORLD_SIZE",
    "Candidate",
    "CheckpointHeader",
    "Claim",
    "Conflict",
    "EPOption",
    "Finding",
    "ParallelDims",
    "ParallelPlan",
    "ReferenceChoice",
    "Research",
    "TPCheck",
    "TensorInfo",
    "check_tp",
    "choose_reference",
    "plan_parallelism",
    "read_checkpoint",
    "read_safetensors_header",
    "research",
]
