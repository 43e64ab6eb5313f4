"""Port every decoder-only causal-LM architecture of the installed transformers.

For each architecture: build a tiny random checkpoint, research it, compose and
apply the port, and validate it on CPU against transformers (TP=1 in fp32 and
bf16, TP=2 in fp32). Prints one row per architecture (reference, codemods,
verdict, max logit error, seconds), the totals, and the features that block
the refused ones, by name.

    python benchmarks/corpus.py                     # everything (tens of minutes)
    python benchmarks/corpus.py --only llama,qwen2  # some model types
    python benchmarks/corpus.py --no-tp2 --markdown corpus.md
    python benchmarks/corpus.py --readme README.md  # refresh the README's table

An architecture counts as ported only when every validation run is
equivalent. Refusals name the features no codemod realizes; failures name the
first diverging component; anything else is reported with its error.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

DECODER_ONLY_SUFFIX = "ForCausalLM"


def causal_lm_architectures() -> list[tuple[str, str]]:
    """(model_type, architecture) of the decoder-only causal LMs transformers
    registers for AutoModelForCausalLM."""
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto

    pairs = []
    for model_type, names in sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        for name in (names,) if isinstance(names, str) else tuple(names):
            if not name.endswith(DECODER_ONLY_SUFFIX):
                continue
            try:
                config = AutoConfig.for_model(model_type)
            except Exception:  # noqa: BLE001 - types without a standalone config
                continue
            if getattr(config, "is_encoder_decoder", False):
                continue
            pairs.append((model_type, name))
            break
    return pairs


def full_size_refusal(architecture: str, directory: Path) -> list[str]:
    """The features that refuse ``architecture``, researched from its
    transformers default config alone, when no tiny checkpoint can be built;
    empty when the research does not refuse it (or cannot run)."""
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    try:
        config, _ = resolve_config(architecture)
        config.architectures = [architecture]
        directory.mkdir(parents=True, exist_ok=True)
        write_config_json(config, directory / "config.json")
        found = research(str(directory))
        error = refusal(found, choose_reference(found.spec, "full_size", found.architecture, None))
    except Exception:  # noqa: BLE001 - the row keeps its tiny-checkpoint error
        return []
    return list(error.features) if error is not None else []


def run_one(model_type: str, architecture: str, work: Path, tp2: bool) -> dict:
    from autoport_cst.errors import AutoportError, UnrealizableDiffError
    from autoport_cst.port import port
    from autoport_cst.validate import build_tiny_checkpoint

    row = {
        "model_type": model_type,
        "architecture": architecture,
        "reference": None,
        "steps": [],
        "verdict": "",
        "detail": "",
        "max_error": None,
        "seconds": 0.0,
        "blocked": [],
    }
    start = time.perf_counter()
    source = work / f"{model_type}-src"
    try:
        build_tiny_checkpoint(architecture, source, seed=0)
    except Exception as error:  # noqa: BLE001
        row.update(verdict="no tiny checkpoint", detail=f"{type(error).__name__}: {error}"[:160])
        features = full_size_refusal(architecture, work / f"{model_type}-full")
        if features:
            # refused by research on the full-size config (no weights needed)
            row.update(
                verdict="refused",
                blocked=features,
                detail="no codemod realizes " + ", ".join(features) + " (full-size config)",
            )
        row["seconds"] = time.perf_counter() - start
        return row
    name = "port_" + "".join(c if c.isalnum() else "_" for c in model_type.lower())
    try:
        outcome = port(str(source), name, work / "out", tp=2 if tp2 else 1, force=True)
        row.update(reference=outcome.reference, steps=outcome.steps)
        errors = [r.max_abs_error for r in outcome.runs if r.dtype == "fp32" and r.max_abs_error is not None]
        row["max_error"] = max(errors) if errors else None
        if outcome.validated:
            row["verdict"] = "ported"
        else:
            bad = [r for r in outcome.runs if not r.equivalent]
            row["verdict"] = "does not validate"
            row["detail"] = "; ".join(f"tp{r.tp} {r.dtype}: {r.first_diverging}" for r in bad)
            # beyond the planned config (autoport_cst.port_variants)
            bad_variants = [
                f"config variant: {r.first_diverging}" for r in outcome.variant_runs if not r.equivalent
            ]
            bad_variants += [
                f"config guard {g.field}: not refused by name" for g in outcome.guards if not g.refused
            ]
            row["detail"] = "; ".join([row["detail"], *bad_variants] if row["detail"] else bad_variants)
    except UnrealizableDiffError as error:
        row.update(
            verdict="refused",
            blocked=list(error.features),
            detail="no codemod realizes " + ", ".join(error.features),
        )
    except AutoportError as error:
        row.update(verdict="error", detail=str(error).splitlines()[0][:200])
    except Exception as error:  # noqa: BLE001
        row.update(verdict="crash", detail=f"{type(error).__name__}: {error}"[:200])
        traceback.print_exc(file=sys.stderr)
    row["seconds"] = time.perf_counter() - start
    return row


def markdown(rows: list[dict], total: float) -> str:
    lines = [
        "| architecture | model_type | reference | codemods | verdict | max error (fp32) | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        steps = ", ".join(
            s for s in r["steps"] if s not in ("rename-classes", "set-constants", "register-model")
        )
        verdict = r["verdict"] + (f": {r['detail']}" if r["detail"] and r["verdict"] != "ported" else "")
        error = "-" if r["max_error"] is None else f"{r['max_error']:.1e}"
        lines.append(
            f"| {r['architecture']} | {r['model_type']} | {r['reference'] or '-'} | {steps or '-'} | {verdict} | {error} | {r['seconds']:.1f} |"
        )
    counts = collections.Counter(r["verdict"] for r in rows)
    ported = sorted({r["architecture"] for r in rows if r["verdict"] == "ported"})
    lines.append("")
    lines.append(
        f"{len(rows)} model types: "
        + ", ".join(f"{n} {v}" for v, n in counts.most_common())
        + f"; {len(ported)} distinct architectures ported; total {total / 60:.1f} min"
    )
    blocked = collections.Counter(f for r in rows for f in r["blocked"])
    if blocked:
        lines.append("")
        lines.append("Unrealized features (model types refused because of each):")
        lines.append("")
        for feature, n in blocked.most_common():
            lines.append(f"- `{feature}`: {n}")
    return "\n".join(lines) + "\n"


README_START = "<!-- corpus table: written by benchmarks/corpus.py --readme -->"
README_END = "<!-- end of corpus table -->"


def update_readme(path: Path, table: str) -> None:
    """Put ``table`` between the README's corpus markers."""
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path}: no corpus markers ({README_START} ... {README_END})")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(f"{head}{README_START}\n{table}{README_END}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--no-tp2", action="store_true", help="validate at TP=1 only")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="replace the table between the corpus markers of this README",
    )
    args = parser.parse_args()

    start = time.perf_counter()
    pairs = causal_lm_architectures()
    if args.only:
        wanted = set(args.only.split(","))
        pairs = [p for p in pairs if p[0] in wanted or p[1] in wanted]
    if args.limit:
        pairs = pairs[: args.limit]
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoport-corpus-") as tmp:
        for index, (model_type, architecture) in enumerate(pairs, 1):
            row = run_one(model_type, architecture, Path(tmp), tp2=not args.no_tp2)
            rows.append(row)
            print(
                f"[{index}/{len(pairs)}] {architecture}: {row['verdict']}"
                + (f" ({row['detail']})" if row["detail"] else "")
                + f" {row['seconds']:.1f}s",
                flush=True,
            )
    total = time.perf_counter() - start
    table = markdown(rows, total)
    print()
    print(table)
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.readme:
        update_readme(args.readme, table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
