"""The input checks of a validation run: the package and checkpoint
directories, the dtype, the TP and EP sizes, the prefill mode and the KV-cache
dtype. Each bad input raises ``InputError`` (exit 2) before anything runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autoport_cst.config_json import parse_config_text
from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import read_checkpoint
from autoport_cst.research.parallelism import tp_refusal

from .driver import PREFILL_MODES
from .package import check_package_dir

DTYPE_NAMES = ("fp32", "bf16")
KV_CACHE_DTYPE_NAMES = ("auto", "fp8")
MAX_TP = 8
# config.json keys that hold the number of routed experts (mixture-of-experts
# configs spell it differently); the first one present is used
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def expert_count(config: dict) -> int | None:
    return next((config[k] for k in EXPERT_COUNT_KEYS if isinstance(config.get(k), int)), None)


def check_inputs(
    model_dir: str | Path, checkpoint_dir: str | Path, tp: int, dtype: str, ep: int = 1
) -> tuple[Path, Path, dict]:
    """The package directory, the checkpoint directory and its config."""
    package = check_package_dir(model_dir)
    checkpoint = Path(checkpoint_dir)
    if not checkpoint.is_dir():
        raise InputError(f"{checkpoint}: no such checkpoint directory")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise InputError(f"{checkpoint}: no config.json")
    if not any(checkpoint.glob("*.safetensors")):
        raise InputError(f"{checkpoint}: no .safetensors file")
    read_checkpoint(checkpoint)  # every header, and each file's size against it
    try:
        config = parse_config_text(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{config_path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from error
    if dtype not in DTYPE_NAMES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    if not 1 <= tp <= MAX_TP:
        raise InputError(f"--tp must be between 1 and {MAX_TP}, got {tp}")
    refusal = tp_refusal(config, tp) if isinstance(config, dict) else None
    if refusal is not None:
        raise InputError(f"--tp {tp}: {refusal} (sizes from {config_path})")
    check_expert_parallel(ep, tp, config, config_path)
    return package, checkpoint, config


def check_expert_parallel(ep: int, tp: int, config: dict, config_path: Path) -> None:
    """EP runs inside the TP world: ``ep`` partitions of the experts, each
    held by ``tp / ep`` ranks. 1 turns it off."""
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise InputError(f"--ep must be a positive integer (1: no expert parallelism), got {ep!r}")
    if ep == 1:
        return
    if tp % ep != 0:
        raise InputError(
            f"--ep {ep} needs --tp to be a multiple of it (expert parallelism splits the experts "
            f"among the TP ranks), got --tp {tp}"
        )
    experts = expert_count(config)
    if experts is None:
        raise InputError(
            f"--ep {ep} needs a mixture-of-experts checkpoint: {config_path} has no expert count "
            f"({', '.join(EXPERT_COUNT_KEYS)})"
        )
    if experts % ep != 0:
        raise InputError(
            f"--ep {ep}: the {experts} experts of {config_path} do not split into {ep} equal "
            f"partitions ({experts} is not a multiple of {ep})"
        )


def check_prefill(prefill: str, kv_cache_dtype: str) -> str:
    """The prefill mode the run takes (``auto`` with an FP8 cache: ``off``)."""
    if prefill not in PREFILL_MODES:
        raise InputError(f"--prefill must be one of {', '.join(PREFILL_MODES)}, got {prefill!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPE_NAMES:
        raise InputError(
            f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPE_NAMES)}, got {kv_cache_dtype!r}"
        )
    if kv_cache_dtype == "fp8" and prefill == "auto":
        return "off"  # segmented prefill reads only a packed FP8 cache
    return prefill


@dataclass(frozen=True)
class RunOptions:
    """The dtype, the prefill mode (``check_prefill``'s) and the KV-cache dtype of a run."""

    dtype: str
    prefill: str
    kv_cache_dtype: str
