"""The architecture spec (bottom layer: imports nothing else of ours)."""

from autoport_cst.spec.diff import FieldDiff, diff_specs, get_field, leaf_fields
from autoport_cst.spec.model import (
    SPEC_VERSION,
    ArchSpec,
    AttentionSpec,
    CheckpointSpec,
    EmbeddingSpec,
    LMHeadSpec,
    MLPSpec,
    MoESpec,
    NormSpec,
    ResidualSpec,
    RopeSpec,
    VisionSpec,
)
from autoport_cst.spec.typed_json import JsonProblem, from_json, schema_of, to_json

__all__ = [
    "SPEC_VERSION",
    "ArchSpec",
    "AttentionSpec",
    "CheckpointSpec",
    "EmbeddingSpec",
    "FieldDiff",
    "JsonProblem",
    "LMHeadSpec",
    "MLPSpec",
    "MoESpec",
    "NormSpec",
    "ResidualSpec",
    "RopeSpec",
    "VisionSpec",
    "diff_specs",
    "from_json",
    "get_field",
    "leaf_fields",
    "schema_of",
    "to_json",
]
