"""CPU validation of ports against transformers.

Public API (imports torch lazily: importing this package is cheap):

- ``validate_model(model_dir, checkpoint_dir, *, tp=1, dtype="fp32", steps=16,
  prompt_lengths=None, block_size=32, seed=0, on_stage=None) -> ValidationReport``
- ``build_tiny_checkpoint(source, outdir, seed=0) -> TinyCheckpoint``
- ``REPORT_SCHEMA`` / ``report_schema_json()``: the report's JSON Schema.

Modules: ``tiny`` (tiny checkpoints), ``standin`` (the vllm_neuron / vllm
stand-in), ``package`` (import a model package), ``scenario`` (prompts and KV
layout), ``driver`` (run a port like the engine), ``reference``
(transformers), ``distributed`` (TP > 1 ranks), ``metrics``, ``compare``,
``report``, ``api``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPORT_SCHEMA", "build_tiny_checkpoint", "report_schema_json", "validate_model"]


def __getattr__(name: str) -> Any:
    if name == "validate_model":
        from .api import validate_model

        return validate_model
    if name == "build_tiny_checkpoint":
        from .tiny import build_tiny_checkpoint

        return build_tiny_checkpoint
    if name in ("REPORT_SCHEMA", "report_schema_json"):
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
