"""Where a port's logit test lives, and the record of the validations it
reruns (``validated.json`` beside the test). Plain paths and JSON, no torch:
``apply`` writes the test, ``port`` and ``validate`` write the record, the
test reads it (``autoport_cst.validate.recorded`` rebuilds and reruns).

The test of port ``<name>`` is ``test/vllm_neuron/model/<name>/test_<name>_logits.py``
under the output root that holds ``vllm_neuron/``. The record::

    {"version": 1, "runs": [{"label": "tp1-fp32", "config": {...config.json...},
      "weights_seed": 0, "key_format": "model", "tp": 1, "ep": 1, "dtype": "fp32",
      "steps": 16, "seed": 0, "options": {}}, ...]}

A run on a tiny checkpoint built here records the checkpoint's
``config.json``, the seed of its random weights and how it names its tensors
(``key_format``; rebuilt tensor for tensor
anywhere); a run on any other checkpoint records its directory
(``checkpoint_dir``) and config. ``options`` holds the other arguments of
``validate_model`` the run was given (layouts, prefill, KV-cache dtype).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoport_cst.atomic import write_atomic

PORT_TEST_ROOT = "test/vllm_neuron/model"
RECORD = "validated.json"
VERSION = 1


def port_test_dir(name: str) -> str:
    """Output-relative directory of the port's test and its record."""
    return f"{PORT_TEST_ROOT}/{name}"


def port_test_path(name: str) -> str:
    return f"{port_test_dir(name)}/test_{name}_logits.py"


def port_test_dir_of(package_dir: str | Path) -> Path | None:
    """The directory of the logit test ``apply`` wrote for the port package
    ``<root>/vllm_neuron/model/<name>``; None when there is no such test."""
    package = Path(package_dir).resolve()
    if package.parent.name != "model" or package.parent.parent.name != "vllm_neuron":
        return None
    root = package.parents[2]
    test = root / port_test_path(package.name)
    return test.parent if test.is_file() else None


def run_record(
    checkpoint_dir: str | Path,
    *,
    tp: int,
    dtype: str,
    steps: int,
    seed: int,
    ep: int = 1,
    weights_seed: int | None = None,
    options: dict[str, Any] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """The record of one validation run; ``weights_seed`` when the
    checkpoint is a tiny one built here with that seed."""
    directory = Path(checkpoint_dir)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    options = dict(options or {})
    default = f"tp{tp}{f'-ep{ep}' if ep > 1 else ''}-{dtype}" + "".join(
        f"-{k}={v}" for k, v in options.items()
    )
    record: dict[str, Any] = {"label": label or default, "config": config}
    if weights_seed is not None:
        record["weights_seed"] = weights_seed
        record["key_format"] = key_format_of(directory)
    else:
        record["checkpoint_dir"] = str(directory.resolve())
    record.update(tp=tp, ep=ep, dtype=dtype, steps=steps, seed=seed, options=options)
    return record


KEY_FORMAT = "key_format"  # the safetensors metadata entry of a tiny checkpoint (validate.tiny.KEY_FORMAT)


def key_format_of(directory: Path) -> str:
    """How a tiny checkpoint names its tensors (``"model"`` or ``"saved"``),
    from its safetensors header; ``"model"`` when it does not say."""
    for path in sorted(directory.glob("*.safetensors")):
        with path.open("rb") as stream:
            size = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(size))
        value = header.get("__metadata__", {}).get(KEY_FORMAT)
        if value in ("model", "saved"):
            return value
    return "model"


def load_runs(test_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(test_dir) / RECORD
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: version {data.get('version')!r}, this autoport-cst reads {VERSION}")
    return list(data["runs"])


def save_runs(test_dir: str | Path, runs: list[dict[str, Any]], *, merge: bool) -> Path:
    """Write the record; with ``merge``, keep the recorded runs of other
    labels (a run of the same label replaces the recorded one)."""
    labels = {run["label"] for run in runs}
    kept = [run for run in load_runs(test_dir) if run["label"] not in labels] if merge else []
    path = Path(test_dir) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"version": VERSION, "runs": [*kept, *runs]}, indent=2) + "\n")
    return path


# validate_model's defaults of the options a record keeps
OPTION_DEFAULTS: dict[str, Any] = {
    "prefill": "auto",
    "kv_cache_dtype": "auto",
    "attention_dp": 1,
    "mlp_dp": 1,
    "embedding_dp": 1,
    "lm_head_dp": 1,
    "dcp": 1,
    "dcp_interleave": 1,
    "prefill_dcp": False,
    "decode_tokens": 1,
}


def record_beside(package_dir: str | Path, checkpoint_dir: str | Path, **run: Any) -> Path | None:
    """Add a run of ``validate`` on the port in ``package_dir`` to the record
    beside its logit test (the checkpoint by its directory); None when the
    port has no such test. ``run``: tp, ep, dtype, steps, seed and the
    options of ``OPTION_DEFAULTS``."""
    test_dir = port_test_dir_of(package_dir)
    if test_dir is None:
        return None
    options = {k: run.pop(k) for k in OPTION_DEFAULTS if k in run}
    options = {k: v for k, v in options.items() if v != OPTION_DEFAULTS[k]}
    return save_runs(test_dir, [run_record(checkpoint_dir, options=options, **run)], merge=True)
