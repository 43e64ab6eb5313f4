"""Port every decoder-only causal-LM architecture of the installed transformers.

For each architecture: build a tiny random checkpoint, research it, compose and
apply the port, and validate it on CPU against transformers: TP=1 in fp32,
TP=1 in bf16, TP=2 in fp32 (``--full``: everything ``port --tp 2`` runs,
its FP8 KV-cache follow-up included, see ``corpus_runs``). Prints one row per
architecture (reference, codemods, verdict, max logit error, seconds and CPU
seconds), the totals, and the features that block the refused ones, by name.

    python benchmarks/corpus.py                     # everything, in 2 workers (see below)
    python benchmarks/corpus.py --only llama,qwen2  # some model types
    python benchmarks/corpus.py --no-tp2 --markdown corpus.md
    python benchmarks/corpus.py --readme README.md  # refresh the README's table
    python benchmarks/corpus.py --only glm4_moe --readme README.md  # refresh those rows only
    python benchmarks/corpus.py --full --only llama # port as a user runs it

A row takes 0.3 to 25 s of CPU (a ported one 6 to 27 s; the FP8 KV-cache
run left out, see ``corpus_runs``), each row's printed with it: the whole
run, by those figures about 15 min of CPU (not yet measured whole), more
than the 6 min it took when 46 model types ported.

The model types run in ``--workers`` processes at a time (2), each forked
for one model type from this process once it has imported torch,
transformers and autoport_cst. With ``--only`` or ``--limit``, ``--readme``
replaces those rows of the README's table and keeps the others (and the
last full run's time); without, it writes the whole table.

An architecture counts as ported only when every validation run is
equivalent. Refusals name the features no codemod realizes; failures name the
first diverging component; anything else is reported with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # corpus_runs, corpus_table

from corpus_runs import cpu_seconds, full_size_refusal, new_row, run_one  # noqa: E402, F401 - the former names
from corpus_table import markdown as table_markdown  # noqa: E402
from corpus_table import merge, parse_table, readme_table, update_readme  # noqa: E402

# AutoModelForCausalLM also maps multimodal models (their text part is ported
# from the VLM references, not here) and the older "LM head" names of causal
# decoders (GPT-2's GPT2LMHeadModel, OpenAI GPT, CTRL, ...), which are kept.
MULTIMODAL_SUFFIX = "ForConditionalGeneration"
# imported before the workers fork (each worker then pays only its model's own modules)
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "autoport_cst.port",
    "autoport_cst.research",
    "autoport_cst.apply",
    "autoport_cst.plan",
    "autoport_cst.validate",
    "autoport_cst.validate.api",
    "autoport_cst.validate.tiny",
)


def causal_lm_architectures(only: str = "") -> list[tuple[str, str]]:
    """(model_type, architecture) of the decoder-only causal LMs transformers
    registers for AutoModelForCausalLM, whatever their class is called
    (``...ForCausalLM`` or ``...LMHeadModel``), multimodal ones left out;
    with ``only`` (``--only``), of those it names (model types or
    architectures) alone: the configs of the others are not built (all of
    them take 9 s of CPU)."""
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto

    wanted = _names(only)
    pairs = []
    for model_type, names in sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        for name in (names,) if isinstance(names, str) else tuple(names):
            if name.endswith(MULTIMODAL_SUFFIX):
                continue
            if wanted and model_type not in wanted and name not in wanted:
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


def markdown(rows: list[dict], total: float) -> str:
    """The table of ``rows`` measured in ``total`` seconds."""
    return table_markdown(rows, f"{total / 60:.1f} min")


def _names(only: str) -> set[str]:
    return {name.strip() for name in only.split(",") if name.strip()}


def selected(pairs: list[tuple[str, str]], only: str, limit: int) -> list[tuple[str, str]]:
    if only:
        wanted = _names(only)
        unknown = wanted - {name for pair in pairs for name in pair}
        if unknown:
            print(f"--only: not a decoder-only causal LM here: {', '.join(sorted(unknown))}", file=sys.stderr)
        pairs = [p for p in pairs if p[0] in wanted or p[1] in wanted]
    return pairs[:limit] if limit else pairs


def longest_first(pairs: list[tuple[str, str]], readme: Path | None) -> list[tuple[str, str]]:
    """The model types in the order to start them: by the seconds of their
    rows in ``readme``'s table, longest first (model types without a row
    first), so that no long one starts last."""
    if readme is None or not readme.is_file():
        return pairs
    try:
        rows, _ = parse_table(readme_table(readme))
    except SystemExit:
        return pairs
    seconds = {}
    for row in rows:
        try:
            seconds[row["model_type"]] = float(row["cells"][6])
        except ValueError:
            continue
    return sorted(pairs, key=lambda p: -seconds.get(p[0], float("inf")))


def main() -> None:
    args = _arguments()
    start = time.perf_counter()
    load = os.getloadavg()
    pairs = selected(causal_lm_architectures(args.only), args.only, args.limit)
    order = longest_first(pairs, args.readme) if args.workers > 1 else pairs
    runs = "full" if args.full else "table"
    with tempfile.TemporaryDirectory(prefix="autoport-corpus-") as tmp:
        found = run_all(order, Path(tmp), not args.no_tp2, runs, args.workers)
    rows = [found[p[0]] for p in pairs]
    total = time.perf_counter() - start
    cpu = cpu_seconds()
    table = markdown(rows, total)
    print()
    print(table)
    print(
        f"wall {total / 60:.1f} min, CPU {cpu / 60:.1f} min (this process and its workers), "
        f"{args.workers} workers, {runs} runs; load average {load[0]:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.readme:
        partial = bool(args.only or args.limit)
        update_readme(args.readme, merged_table(args.readme, rows) if partial else table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


def merged_table(readme: Path, rows: list[dict]) -> str:
    """The README's table with ``rows`` in place of their model types' rows;
    the time stated stays that of the last full run."""
    old, total = parse_table(readme_table(readme))
    if total is None:
        total = "not measured"
    elif "last full run" not in total:
        total += " (the last full run)"
    return table_markdown(merge(old, rows), total)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model types (or architectures)")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--no-tp2", action="store_true", help="validate at TP=1 only")
    parser.add_argument(
        "--full",
        action="store_true",
        help="run port exactly as a user would (port --tp 2; several times slower)",
    )
    parser.add_argument("--workers", type=int, default=2, help="model types run at once (default 2)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="write the table between the corpus markers of this README (with --only / --limit: those rows)",
    )
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def run_all(pairs: list[tuple[str, str]], work: Path, tp2: bool, runs: str, workers: int) -> dict[str, dict]:
    """The row of each model type, by model type, printed as each ends."""
    from corpus_workers import run_forked

    _preload()
    found: dict[str, dict] = {}

    def done(row: dict) -> None:
        found[row["model_type"]] = _print(row, len(found) + 1, len(pairs))

    run_forked(pairs, work, tp2, runs, workers, done)
    for model_type, architecture in pairs:  # a worker that died before its row
        found.setdefault(model_type, new_row(model_type, architecture) | {"verdict": "crash"})
    return found


def _preload() -> None:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)


def _print(row: dict, index: int, count: int) -> dict:
    print(
        f"[{index}/{count}] {row['architecture']}: {row['verdict']}"
        + (f" ({row['detail']})" if row["detail"] else "")
        + f" {row['seconds']:.1f}s (CPU {row.get('cpu_seconds', 0.0):.1f}s)",
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
