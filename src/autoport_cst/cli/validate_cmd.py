"""``autoport-cst tiny`` and ``autoport-cst validate``.

torch and transformers are imported inside the commands only, so importing
``autoport_cst.cli`` stays cheap.

Exit codes of ``validate``: 0 equivalent within the documented tolerances
(docs/validation.md), 1 not equivalent (the first diverging component, or the
stage where the port failed, is named), 2 bad input (checked before torch is
imported), 130 interrupted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from autoport_cst.atomic import write_atomic
from autoport_cst.cli.common import EXIT_ERROR, error_boundary, stderr_console, stdout_console
from autoport_cst.cli.progress import StageProgress
from autoport_cst.errors import InputError
from autoport_cst.preflight import check_checkpoint_dir, check_output_file, require_extra
from autoport_cst.validate.package import check_package_dir
from autoport_cst.validate.scenario import check_decode_tokens


@click.command("tiny")
@click.argument("arch_or_config")
@click.argument("outdir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the weights.")
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="NAME=INT",
    help="Set an integer config attribute after shrinking (e.g. num_key_value_heads=1); repeatable.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write into an OUTDIR that holds something else than a tiny checkpoint of this model "
    "(its config.json, model.safetensors and tokenizer files are replaced; other files stay, "
    "but other weight files, shards or their index, are refused even then).",
)
@error_boundary
def tiny_command(
    arch_or_config: str, outdir: Path, seed: int, settings: tuple[str, ...], force: bool
) -> None:
    """Build a tiny random checkpoint (config.json + model.safetensors, and a
    byte-level tokenizer of its vocabulary: tokenizer.json).

    ARCH_OR_CONFIG is a transformers architecture (LlamaForCausalLM), a
    model_type (llama) or a config.json path. It is a path when it contains
    a / or ends in .json (config.json, ./llama, llama/); a bare word is
    always an architecture or a model_type, even where a file or directory
    of that name exists. The same seed gives byte-identical tensors.

    OUTDIR must be new, empty, or hold a tiny checkpoint of the same model
    (which is replaced); anything else is refused (exit 2) unless --force.
    """
    from autoport_cst.validate.tiny import check_architecture_name, check_model_type_name, source_is_path

    dimensions = _tiny_dimensions(settings)
    looks_like_path = source_is_path(arch_or_config)
    if looks_like_path and not Path(arch_or_config).exists():
        raise InputError(f"{arch_or_config}: no such config file or directory")
    if outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: exists and is not a directory")
    require_extra("tiny")
    from autoport_cst.cli.tiny_target import (
        check_causal_lm_model_type,
        check_config_source,
        check_forced_outdir,
        check_tiny_outdir,
    )

    if looks_like_path:
        check_config_source(arch_or_config)
    else:  # a misspelt class or model type, or a model type of no decoder, before torch
        check_architecture_name(arch_or_config)
        check_model_type_name(arch_or_config)
        check_causal_lm_model_type(arch_or_config)
    if not force:
        check_tiny_outdir(outdir, arch_or_config, looks_like_path)
    check_forced_outdir(outdir)  # never a mix of its weights and others (without --force: refused above)
    if not looks_like_path and Path(arch_or_config).exists():
        stderr_console().print(
            f"note: {arch_or_config!r} is read as a model name, not as the ./{arch_or_config} here "
            f"(give ./{arch_or_config} to build from its config.json)",
            markup=False,
        )
    from autoport_cst.cli.validate_vlm_cmd import tiny_vision_language

    if not looks_like_path and tiny_vision_language(arch_or_config, outdir, seed, dimensions):
        return
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    result = build_tiny_checkpoint(arch_or_config, outdir, seed=seed, dimensions=dimensions)
    stdout_console().print(
        f"wrote {result.directory}/config.json, model.safetensors and tokenizer: {result.architecture} "
        f"({result.model_type}), {result.num_parameters:,} parameters, seed {result.seed}"
    )


# sizes a model cannot have none of (num_hidden_layers=0 built a model of no
# layers, vocab_size=0 one of no tokens, exit 0); any other count or size
# (num_*, n_*, *_size, *_dim, *_layers...) may be 0 (num_kv_shared_layers) but
# not negative (transformers refused those only after torch, at build)
_AT_LEAST_ONE = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "head_dim",
    "max_position_embeddings",
)
_COUNT_OR_SIZE = re.compile(r"^(num|n)_|_(size|dim|layers|heads|experts|rank)$")


def _tiny_dimensions(settings: tuple[str, ...]) -> dict[str, int]:
    dimensions = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise InputError(f"--set takes NAME=INT, got {setting!r}")
        least = 1 if name in _AT_LEAST_ONE else 0 if _COUNT_OR_SIZE.search(name) else None
        if least is not None and int(value) < least:
            raise InputError(f"--set {setting}: {name} is a count or size, at least {least}")
        dimensions[name] = int(value)
    return dimensions


@click.command("validate")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "--hf",
    "checkpoint_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Checkpoint directory (config.json + safetensors) read by both sides.",
)
@click.option(
    "--tp",
    type=int,
    default=1,
    show_default=True,
    help="Tensor-parallel size (ranks run as local processes).",
)
@click.option(
    "--ep",
    type=int,
    default=1,
    show_default=True,
    help="Expert-parallel degree inside the TP ranks (MoE ports; must divide --tp and the "
    "expert count). 1: no expert parallelism.",
)
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True)
@click.option("--steps", type=int, default=16, show_default=True, help="Decode steps after the prefill.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the JSON report here.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompts and block tables.")
@click.option(
    "--prefill",
    type=click.Choice(["auto", "segmented", "off"]),
    default="auto",
    show_default=True,
    help="The runner's cache paths (a chunked prefill and a prefix-cache hit, segmented): auto = when "
    "the port reads kv_segment_size; segmented = always; off = never.",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(["auto", "fp8"]),
    default="auto",
    show_default=True,
    help="KV-cache dtype: the model's, or FP8 (emulated in float8_e4m3fn; cache paths off under auto).",
)
@click.option(
    "--attention-dp",
    type=int,
    default=1,
    show_default=True,
    help="Attention data parallelism of the decode graph (Q/O heads over TP x this; each DP replica "
    "decodes its own batch). Runs tp x dp ranks.",
)
@click.option(
    "--mlp-dp",
    type=int,
    default=1,
    show_default=True,
    help="MLP data parallelism of the decode graph (intermediate size over TP x this).",
)
@click.option(
    "--embedding-dp",
    type=int,
    default=1,
    show_default=True,
    help="Embedding data parallelism of the decode graph (vocabulary over TP x this).",
)
@click.option(
    "--lm-head-dp",
    type=int,
    default=1,
    show_default=True,
    help="LM-head data parallelism of the decode graph (vocabulary over TP x this).",
)
@click.option(
    "--dcp",
    type=int,
    default=1,
    show_default=True,
    help="Decode context parallelism inside TP (the KV cache interleaved over this many ranks).",
)
@click.option(
    "--dcp-interleave",
    type=int,
    default=1,
    show_default=True,
    help="cp_kv_cache_interleave_size: positions per run dealt to each DCP rank (divides the block size).",
)
@click.option(
    "--prefill-dcp",
    is_flag=True,
    default=False,
    help="Context-parallel prefill graph too (apply_prefill_dcp; needs --tp equal to --dcp).",
)
@click.option(
    "--decode-tokens",
    type=int,
    default=1,
    show_default=True,
    help="New tokens per sequence in each decode call, as speculative decoding's verification step "
    "feeds them (N - 1 draft tokens); at most --steps. The default run goes on to 2 after a passing 1.",
)
@error_boundary
def validate_command(
    model_dir: Path,
    checkpoint_dir: Path,
    tp: int,
    ep: int,
    dtype: str,
    steps: int,
    json_path: Path | None,
    seed: int,
    prefill: str,
    kv_cache_dtype: str,
    attention_dp: int,
    mlp_dp: int,
    embedding_dp: int,
    lm_head_dp: int,
    dcp: int,
    dcp_interleave: int,
    prefill_dcp: bool,
    decode_tokens: int,
) -> None:
    """Run the port in MODEL_DIR and transformers on the same checkpoint
    through prefill and decode, and compare them.

    Exit code 0: equivalent; 1: not equivalent, or the port cannot load a
    checkpoint that transformers loads (names the first diverging component,
    or the parameter and the key); 2: bad input (a TP size the
    tensor-parallel rules refuse, a truncated safetensors file...), checked
    before any process starts; 130: interrupted.
    """
    import sys

    if steps < 1:
        raise InputError(f"--steps must be at least 1, got {steps}")
    check_decode_tokens(decode_tokens, steps)
    check_package_dir(model_dir)
    config = check_checkpoint_dir(checkpoint_dir, tp)
    check_output_file(json_path, "--json")
    require_extra("validate")
    # what is run, and what the port's logit test reruns
    run: dict[str, Any] = dict(
        tp=tp,
        ep=ep,
        dtype=dtype,
        steps=steps,
        seed=seed,
        prefill=prefill,
        kv_cache_dtype=kv_cache_dtype,
        attention_dp=attention_dp,
        mlp_dp=mlp_dp,
        embedding_dp=embedding_dp,
        lm_head_dp=lm_head_dp,
        dcp=dcp,
        dcp_interleave=dcp_interleave,
        prefill_dcp=prefill_dcp,
        decode_tokens=decode_tokens,
    )
    from autoport_cst.config_json import is_vision_language

    if is_vision_language(config):  # a vision tower too: validate_vlm
        _validate_vision_language(model_dir, checkpoint_dir, config, run, json_path)
    from autoport_cst.validate.api import validate_model

    with StageProgress("validate") as progress:
        report = validate_model(model_dir, checkpoint_dir, on_stage=progress.stage, **run)

    if json_path is not None:
        write_atomic(json_path, report.to_json())
    print_report(report)
    if report.equivalent:  # the port's logit test reruns what it was validated on
        from autoport_cst.validation_record import record_beside

        recorded = record_beside(model_dir, checkpoint_dir, **run)
        if recorded is not None:
            stdout_console().print(f"recorded for the port's logit test: {recorded}", style="dim")
    sys.exit(report.exit_code)


def _validate_vision_language(
    model_dir: Path, checkpoint_dir: Path, config: dict, run: dict[str, Any], json_path: Path | None
) -> None:
    """``validate_vlm`` on a vision-language checkpoint; the text validator's
    other options are refused by name."""
    from autoport_cst.cli.validate_vlm_cmd import validate_vision_language

    others = {k: v for k, v in run.items() if k not in ("tp", "dtype", "steps", "seed")}
    settings = {k: run[k] for k in ("tp", "dtype", "steps", "seed")}
    validate_vision_language(
        model_dir, checkpoint_dir, config, json_path=json_path, others=others, **settings
    )


def print_report(report) -> None:
    """The rich summary: settings, verdict, logit metrics, component table."""
    from rich.markup import escape

    console = stdout_console()
    _print_settings(console, report)
    if report.failure is not None and report.failure.stage == "lint":  # not run (validate.lint_gate)
        console.print("[bold red]DOES NOT VALIDATE[/]: it breaks a Trainium hardware rule")
        console.print(escape(report.failure.message))
        return
    if report.failure is not None:
        console.print(f"[bold red]NOT EQUIVALENT[/]: the port failed at {report.failure.stage}")
        console.print(escape(report.failure.message))
        return
    console.print(_logits_table(report.logits or {}))
    console.print(_components_table(report.components))
    if report.not_compared:
        console.print("not compared: " + escape(", ".join(report.not_compared)))
    _print_labelled_runs(console, "config variants", report.config_variants)
    _print_labelled_runs(console, "parallel layouts", report.parallel_layouts)
    if report.equivalent:
        console.print(f"[bold green]EQUIVALENT[/] {escape(report.summary().removeprefix('equivalent '))}")
    else:
        console.print(
            f"[bold red]NOT EQUIVALENT[/]: {escape(report.summary().removeprefix('not equivalent: '))}"
        )


def _print_labelled_runs(console, title: str, runs: list[dict]) -> None:
    """The runs a default validation goes on to (config variants, parallel
    layouts): one line each, with its verdict or why it did not run."""
    if not runs:
        return
    console.print(f"{title}:")
    for run in runs:
        verdict = {True: "pass", False: "FAIL", None: "-"}[run["equivalent"]]
        console.print(f"  {run['label']}: {verdict}: {run['summary']}", markup=False)


def _print_settings(console, report) -> None:
    """What was compared, and the run's settings."""
    from rich.markup import escape

    settings = report.settings
    console.print(
        f"[bold]{escape(report.factory or '?')}[/] from {escape(report.model_dir)} vs transformers "
        f"{escape(report.architecture or '?')} on {escape(report.checkpoint_dir)}"
    )
    ep = f" ep={settings['ep']}" if settings.get("ep", 1) > 1 else ""
    ep += _layout_text(settings.get("layout"))
    console.print(
        f"tp={settings['tp']}{ep} dtype={settings['dtype']} prompts={settings['prompt_lengths']} "
        f"decode steps={settings['steps']} block size={settings.get('block_size')}"
    )


# the logit metrics the table shows when the report has them, in this order
_LOGIT_METRICS = (
    "max_abs_error",
    "max_rel_error",
    "cosine_min",
    "cosine_p5",
    "kl_mean",
    "kl_max",
    "top1_agreement",
    "greedy_match",
    "sigma_ratio",
    "bhattacharyya",
)
_LOGIT_RATIOS = (
    ("linf_ratio_max", "worst L-inf ratio, per sequence"),
    ("l2_ratio_max", "worst L2 ratio, per sequence"),
    ("token_linf_ratio_max", "worst L-inf ratio, per token (not gated)"),
    ("token_l2_ratio_max", "worst L2 ratio, per token (not gated)"),
)


def _logits_table(logits: dict):
    """The logit metrics and gates."""
    from rich.table import Table

    table = Table(title="logits", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for level, error in (logits.get("topk_max_error") or {}).items():
        rtol = logits["topk_rtol"][level]
        table.add_row(f"top-{level} error (rtol {rtol})", _num(error))
    table.add_row("tokens passing the two-way check", f"{logits.get('tokens_passed')}/{logits.get('tokens')}")
    labelled = [(key, key.replace("_", " ")) for key in _LOGIT_METRICS] + list(_LOGIT_RATIOS)
    for key, label in labelled:
        if logits.get(key) is not None:
            table.add_row(label, _num(logits[key]))
    for gate, ok in (logits.get("gates") or {}).items():
        table.add_row(f"gate: {gate}", "[green]pass[/]" if ok else "[red]FAIL[/]")
    return table


def _components_table(components: list[dict]):
    """Port against transformers, component by component, with the gate as caption."""
    from rich.markup import escape
    from rich.table import Table

    first = components[0] if components else None
    caption = None
    if first is not None:
        sign = "<=" if first["gate"] == "rel_error" else "<"
        caption = f"gate: {first['gate']} {sign} {first['tolerance']:g}"
    table = Table(title="components (port vs transformers)", caption=caption, header_style="bold")
    table.add_column("component", overflow="fold")
    table.add_column("phase", no_wrap=True)
    for column in ("rel error", "R-ratio", "max abs"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("gate", no_wrap=True, min_width=4)
    for row in components:
        gate = "[green]pass[/]" if row["passed"] else "[red]FAIL[/]"
        numbers = (_num(row["rel_error"]), _num(row["r_ratio"]), _num(row["max_abs_error"]))
        table.add_row(escape(row["name"]), row["phase"], *numbers, gate)
    return table


def _layout_text(layout: dict | None) -> str:
    """The DP / DCP sizes of a disaggregated run (prefill and decode graphs)."""
    if not layout:
        return ""
    parts = [
        f"{name}={layout[name]}"
        for name in ("attention_dp", "mlp_dp", "embedding_dp", "lm_head_dp", "dcp")
        if layout[name] > 1
    ]
    if layout["dcp"] > 1:
        parts.append(f"dcp_interleave={layout['dcp_interleave']}")
        parts.append("prefill=context-parallel" if layout["prefill_dcp"] else "prefill=plain TP")
    return (
        " " + " ".join(parts) + f" ({layout['world']} ranks, decode graph fed the prefill graph's KV cache)"
    )


def _num(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


__all__ = ["EXIT_ERROR", "tiny_command", "validate_command"]
