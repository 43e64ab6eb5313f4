"""autoport-cst against the real vllm_neuron model packages, in figures.

The real packages are public but third-party: this project never ships them.
Check them out (or rebuild them) yourself and point this script at them:

    python benchmarks/real_code.py --dense llama3=DIR --dense qwen3=DIR \
        [--moe qwen3_moe=DIR --moe gpt_oss=DIR] [--plans examples] [--quick]

Each DIR is a model package directory (``.../vllm_neuron/model/llama3``) with a
``reference.json`` describing what it computes (write one by hand: its spec is
what ``autoport-cst schema reference`` documents).

It prints two tables:

1. each real package validated through the stand-in against transformers on a
   tiny checkpoint: TP=1 fp32, TP=1 bf16 and TP=2 (MoE packages, bf16 only by
   design: TP=1 bf16 and TP=2 with EP=2);
2. every plan applied with each dense package as ``--ref``: ``refused`` (exit 2:
   the first line of the message), ``validated`` (written, and equivalent at
   every setting), or ``WRONG`` (written but not equivalent at some setting,
   or failing to build or load).

``--vocab-size N`` builds every tiny checkpoint with a vocabulary of N (the
default, 511, is one no TP size divides: vllm_neuron's llama3 and qwen3 build
their LM head over config.vocab_size, and the llama3 loads its embedding
without padding, so a validation at TP=2 is refused, exit 2, naming those
sites: ``autoport_cst.validate.vocab_shards``; a setting refused so is shown
as refused beside the ones validated). ``--set NAME:key=value`` gives a package's own checkpoint a config value (a
package may declare a fixed value, as the real qwen3_moe's top-k renormalization,
that transformers' default config lacks); the table shows it. ``--quick``
validates ports at TP=1 fp32 only. Tiny checkpoints are built once
per architecture in a temporary directory, with their tensors named as the hub
stores them (``save_pretrained``'s layout: per-expert MoE tensors, the names a
served checkpoint has); ``--key-format model`` names them as transformers'
module tree does instead.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DENSE_SETTINGS = (("fp32", 1, 1), ("bf16", 1, 1), ("fp32", 2, 1))
MOE_SETTINGS = (("bf16", 1, 1), ("bf16", 2, 2))


@dataclass
class Outcome:
    verdict: str
    detail: str = ""


def _pairs(values: list[str]) -> dict[str, Path]:
    found = {}
    for value in values:
        name, _, path = value.partition("=")
        if not path or not Path(path, "reference.json").is_file():
            raise SystemExit(f"{value}: expected NAME=DIR with DIR/reference.json")
        found[name] = Path(path)
    return found


class Checkpoints:
    """Tiny checkpoints, one per architecture, built on first use."""

    def __init__(self, root: Path, key_format: str, common: dict | None = None) -> None:
        self.root = root
        self.key_format = key_format
        self.common = dict(common or {})  # config values of every checkpoint (--vocab-size)
        self.made: dict[str, Path] = {}

    def get(self, architecture: str, values: dict | None = None) -> Path:
        values = {**self.common, **(values or {})}
        key = architecture + "".join(f",{k}={v}" for k, v in sorted((values or {}).items()))
        if key not in self.made:
            from autoport_cst.validate import build_tiny_checkpoint

            out = self.root / str(len(self.made)) / architecture
            build_tiny_checkpoint(architecture, out, seed=0, dimensions=values, key_format=self.key_format)
            self.made[key] = out
        return self.made[key]


def _settings(values: list[str]) -> dict[str, dict]:
    """``NAME:key=value`` (value as JSON) -> {NAME: {key: value}}."""
    found: dict[str, dict] = {}
    for value in values:
        name, _, assignment = value.partition(":")
        key, _, text = assignment.partition("=")
        if not key or not text:
            raise SystemExit(f"{value}: expected NAME:key=value")
        found.setdefault(name, {})[key] = json.loads(text)
    return found


def validate_all(package: Path, checkpoint: Path, settings) -> Outcome:
    """Each setting: validated, refused (bad input, exit 2: a TP size the
    package cannot shard the checkpoint's vocabulary over, say) or failed."""
    from autoport_cst.errors import AutoportError, InputError
    from autoport_cst.validate import validate_model

    failures, refused, passed = [], [], []
    for dtype, tp, ep in settings:
        label = f"tp{tp}{'/ep' + str(ep) if ep > 1 else ''} {dtype}"
        try:
            report = validate_model(package, checkpoint, tp=tp, dtype=dtype, ep=ep)
        except InputError as error:
            refused.append(f"{label} refused: {str(error).splitlines()[0]}")
            continue
        except AutoportError as error:
            failures.append(f"{label}: {str(error).splitlines()[0]}")
            continue
        if not report.equivalent:
            failures.append(f"{label}: {report.summary().splitlines()[0]}")
        else:
            passed.append(label)
    if failures:
        return Outcome("WRONG", "; ".join(failures + refused))
    if not passed:
        return Outcome("refused", "; ".join(refused))
    return Outcome("validated", "; ".join([", ".join(passed), *refused]))


def apply_plan(plan_path: Path, reference: Path, out: Path) -> tuple[Outcome, Path | None, str]:
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import load_plan

    plan = load_plan(plan_path)
    result = build_port(plan, load_reference(str(reference)))
    if not result.ok:
        return Outcome("refused", str(result.failure).splitlines()[0]), None, plan.architecture
    write_port(out, result.files, result.package_dir, force=True)
    return Outcome("written"), out / result.package_dir, plan.architecture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense", action="append", default=[], help="NAME=DIR of a dense package")
    parser.add_argument("--moe", action="append", default=[], help="NAME=DIR of an MoE package")
    parser.add_argument("--plans", default=str(ROOT / "examples"), help="directory of *.plan.json")
    parser.add_argument("--quick", action="store_true", help="validate ports at TP=1 fp32 only")
    parser.add_argument(
        "--key-format",
        choices=("saved", "model"),
        default="saved",
        help="tensor names of the tiny checkpoints: as the hub stores them (default) or as the model holds them",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="NAME:key=value (JSON value): a config value of the package's own tiny checkpoint, for a "
        "package that declares a fixed value transformers' default config does not have",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="vocabulary of every tiny checkpoint (default: the tiny default, 511, which no TP size divides)",
    )
    args = parser.parse_args()
    overrides = _settings(args.set)
    dense, moe = _pairs(args.dense), _pairs(args.moe)
    port_settings = DENSE_SETTINGS[:1] if args.quick else DENSE_SETTINGS

    with tempfile.TemporaryDirectory() as scratch:
        common = {"vocab_size": args.vocab_size} if args.vocab_size else {}
        checkpoints = Checkpoints(Path(scratch) / "checkpoints", args.key_format, common)
        print("## The real packages through the stand-in\n")
        print("| package | settings | verdict | detail |\n|---|---|---|---|")
        for name, path in {**dense, **moe}.items():
            settings = MOE_SETTINGS if name in moe else DENSE_SETTINGS
            architecture = json.loads((path / "reference.json").read_text())["architecture"]
            outcome = validate_all(path, checkpoints.get(architecture, overrides.get(name)), settings)
            shown = ", ".join(f"tp{tp}{'/ep' + str(ep) if ep > 1 else ''} {d}" for d, tp, ep in settings)
            shown += "".join(f", {k}={json.dumps(v)}" for k, v in overrides.get(name, {}).items())
            print(f"| {name} | {shown} | {outcome.verdict} | {outcome.detail} |")

        print("\n## Every plan with each real dense package as the reference\n")
        print("| plan | " + " | ".join(dense) + " |\n|---|" + "---|" * len(dense))
        totals: dict[str, dict[str, int]] = {name: {} for name in dense}
        started = time.perf_counter()
        for plan_path in sorted(Path(args.plans).glob("*.plan.json")):
            cells = []
            for name, reference in dense.items():
                out = Path(scratch) / "ports" / name / plan_path.stem
                outcome, package, architecture = apply_plan(plan_path, reference, out)
                if package is not None:
                    outcome = validate_all(package, checkpoints.get(architecture), port_settings)
                totals[name][outcome.verdict] = totals[name].get(outcome.verdict, 0) + 1
                cells.append(f"{outcome.verdict}: {outcome.detail}"[:160])
            print(f"| {plan_path.stem} | " + " | ".join(cells) + " |")
        print()
        for name, counts in totals.items():
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(f"(plans: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
