"""The ports of the mutation benchmark, their checkpoints and what their validation runs.

For each port: the package written by ``autoport-cst apply`` (or a reference
package copied as it is), the default tiny checkpoint of its architecture,
one tiny checkpoint per config variant its ``reference.json`` declares
(``config_driven``: another RoPE type, tied embeddings, ...), and the lines of
its ``model.py`` that a TP=1 fp32 validation executes on each of them
(``coverage``: traced with ``sys.settrace`` on that file only, in this
process: the rank processes of the default's TP=2 and DP 2 layouts are not
traced).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PortSource:
    """A port to mutate: an example plan to apply, or a reference package."""

    name: str
    plan: str | None = None  # examples/<plan>.plan.json
    reference: str | None = None  # reference_models/<reference>


PORTS = (
    PortSource("qwen2", plan="qwen2"),
    PortSource("phi3", plan="phi3"),
    PortSource("gemma2", plan="gemma2"),
    PortSource("mixtral", plan="mixtral"),
    PortSource("qwen3", reference="qwen3"),
)

# Config edits that realise a declared config variant, by spec feature and value
# (the tiny checkpoint's config is edited, then rebuilt with random weights).
_ROPE = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


def _variant_edit(feature: str, value: Any, config: dict) -> dict | None:
    """The config edit of one declared variant, None when the base config
    already is that variant or the feature is not one a config edit sets."""
    if feature == "rope.type" and value in _ROPE:
        return {"rope_parameters": {**(config.get("rope_parameters") or {}), **_ROPE[value]}}
    if feature == "embedding.tied" and bool(config.get("tie_word_embeddings")) != value:
        return {"tie_word_embeddings": value}
    if feature == "moe.norm_topk_prob" and "norm_topk_prob" in config and config["norm_topk_prob"] != value:
        return {"norm_topk_prob": value}
    if (
        feature == "attention.sliding_window"
        and value == "per_layer"
        and not config.get("use_sliding_window")
    ):
        layers = config["num_hidden_layers"]
        kinds = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        return {
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": layers,
            "layer_types": kinds,
        }
    return None


@dataclass(frozen=True)
class Variant:
    """A config variant the port declares, as a tiny checkpoint."""

    label: str
    checkpoint: Path


@dataclass
class Port:
    """A port ready to be mutated: its package, checkpoints and coverage."""

    name: str
    package: Path
    architecture: str
    checkpoint: Path
    variants: list[Variant] = field(default_factory=list)
    coverage: dict[str, set[int]] = field(default_factory=dict)  # "run" or a variant label -> lines
    refused_variants: dict[str, str] = field(default_factory=dict)  # label -> why the port does not run it

    @property
    def model_file(self) -> Path:
        return self.package / "model.py"


def _copy_package(source: Path, target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "companions"))
    return target


def write_package(source: PortSource, workdir: Path) -> Path:
    """The port's package under ``workdir/ports/<name>`` (its directory name
    is the package name the validator imports it under)."""
    if source.reference is not None:
        return _copy_package(ROOT / "reference_models" / source.reference, workdir / "ports" / source.name)
    out = workdir / "apply" / source.name
    command = [
        sys.executable,
        "-m",
        "autoport_cst",
        "apply",
        "--plan",
        str(ROOT / "examples" / f"{source.plan}.plan.json"),
    ]
    done = subprocess.run([*command, "--out", str(out), "--force"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"apply {source.plan}: exit {done.returncode}\n{done.stderr}")
    written = out / "vllm_neuron" / "model" / source.name
    return _copy_package(written, workdir / "ports" / source.name)


def declared_variants(package: Path) -> list[tuple[str, Any]]:
    """(feature, value) pairs of the port's ``config_driven`` declaration."""
    manifest = json.loads((package / "reference.json").read_text(encoding="utf-8"))
    return [
        (feature, value) for feature, values in manifest.get("config_driven", {}).items() for value in values
    ]


def build_checkpoints(port: Port, workdir: Path) -> None:
    """The port's variant checkpoints, one per declared variant a config edit
    realises (and the per-expert key format when ``checkpoint.gate_up`` is
    declared: the default tiny checkpoint stores experts fused)."""
    from autoport_cst.errors import InputError
    from autoport_cst.validate import build_tiny_checkpoint

    base = json.loads((port.checkpoint / "config.json").read_text(encoding="utf-8"))
    for feature, value in declared_variants(port.package):
        key_format = "saved" if feature == "checkpoint.gate_up" and value == "separate" else "model"
        edit = _variant_edit(feature, value, base) if key_format == "model" else {}
        if edit is None:
            continue
        label = f"{feature}={json.dumps(value)}"
        directory = workdir / "variants" / port.name / label.replace("=", "-").replace('"', "")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps({**base, **edit}, indent=2), encoding="utf-8")
        try:
            built = build_tiny_checkpoint(
                directory / "config.json", directory / "tiny", seed=0, key_format=key_format
            )
        except InputError as error:  # the architecture's config class refuses the variant
            port.refused_variants[label] = (
                f"transformers refuses the config: {str(error).splitlines()[-1].strip()}"
            )
            continue
        port.variants.append(Variant(label, Path(built.directory)))


def traced_lines(path: Path, run: Callable[[], Any]) -> tuple[set[int], Any]:
    """The lines of ``path`` executed while ``run()`` runs, and its result."""
    target = str(path.resolve())
    lines: set[int] = set()

    def local(frame, event, _arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def calls(frame, _event, _arg):
        return local if frame.f_code.co_filename == target else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        result = run()
    finally:
        sys.settrace(previous)
    return lines, result


def measure_coverage(port: Port, steps: int) -> None:
    """The lines each TP=1 fp32 validation of the unmutated port executes:
    on the default checkpoint (``"run"``, which must validate) and on each
    variant (kept only where the port validates on it)."""
    from autoport_cst.validate import validate_model

    def validation(checkpoint: Path) -> Callable[[], Any]:
        return lambda: validate_model(port.package, checkpoint, tp=1, dtype="fp32", steps=steps)

    lines, report = traced_lines(port.model_file, validation(port.checkpoint))
    if not report.equivalent:
        raise RuntimeError(f"{port.name}: the unmutated port does not validate: {report.failed_checks}")
    port.coverage["run"] = lines
    for variant in port.variants:
        try:
            lines, report = traced_lines(port.model_file, validation(variant.checkpoint))
        except Exception as error:  # noqa: BLE001 - the variant is reported, not run
            port.refused_variants[variant.label] = (
                f"the validation refuses it: {type(error).__name__}: {error}"
            )
            continue
        if report.equivalent:
            port.coverage[variant.label] = lines
        else:
            port.refused_variants[variant.label] = "the unmutated port does not validate: " + "; ".join(
                report.failed_checks
            )


def prepare(source: PortSource, workdir: Path, steps: int) -> Port:
    """Write the port, build its checkpoints and measure its coverage."""
    from autoport_cst.validate import build_tiny_checkpoint

    package = write_package(source, workdir)
    manifest = json.loads((package / "reference.json").read_text(encoding="utf-8"))
    architecture = manifest["architecture"]
    checkpoint = build_tiny_checkpoint(architecture, workdir / "tiny" / source.name, seed=0).directory
    port = Port(source.name, package, architecture, Path(checkpoint))
    build_checkpoints(port, workdir)
    measure_coverage(port, steps)
    return port
