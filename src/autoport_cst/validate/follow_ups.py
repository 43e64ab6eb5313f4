"""The fp32 runs a passing plain validation goes on to (``validate_model``'s
follow-ups): the config variants the reference declares, the FP8 KV-cache
checks, then the parallel layouts (``parallel_checks``, ``dcp_layouts``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoport_cst.config_json import parse_config_text

from .inputs import expert_count
from .layout import ParallelLayout

if TYPE_CHECKING:
    from .report import ValidationReport


@dataclass(frozen=True)
class FollowUps:
    """The fp32 runs a passing plain validation goes on to, of the same port
    with the same steps, prompts, seed and prefill mode: a checkpoint of each
    declared config variant (``config_variants``), then the parallel layouts
    on the same checkpoint (``parallel_checks``, ``dcp_layouts``)."""

    model_dir: str | Path
    steps: int
    prompt_lengths: tuple[int, ...] | None
    seed: int
    prefill: str
    # api._validate: one run of the port, with the reuse of earlier runs
    validate: Callable[..., ValidationReport]

    def check(
        self, report: ValidationReport, checkpoint_dir: str | Path, variants: bool, layouts: bool, notify=None
    ) -> None:
        from .config_variants import check_config_variants
        from .dcp_layouts import dcp_runs
        from .follow_up_stages import announced
        from .guard_checks import check_fp8_segmented_guard
        from .kv_scale_variant import check_kv_scale_variant
        from .parallel_checks import StandIns, check_parallel_layouts, replicated_kv_run
        from .unread_fields import check_unread_fields

        if variants:
            start, run = time.perf_counter(), announced(self.run, notify, "config variant")
            check_config_variants(report, report.model_dir, checkpoint_dir, run)
            check_unread_fields(report, checkpoint_dir, run)
            fp8 = functools.partial(run, kv_cache_dtype="fp8")
            check_kv_scale_variant(report, report.model_dir, checkpoint_dir, fp8, self.seed)
            check_fp8_segmented_guard(report, report.model_dir, functools.partial(run, checkpoint_dir))
            report.timings["config_variants"] = time.perf_counter() - start
        if layouts and report.equivalent:
            start, run = time.perf_counter(), announced(self.run, notify, "parallel layout")
            config = parse_config_text((Path(checkpoint_dir) / "config.json").read_text("utf-8"))
            experts = expert_count(config) if isinstance(config, dict) else None
            with StandIns() as stand_ins:  # the replicated-KV and DCP runs share theirs
                check_parallel_layouts(
                    report,
                    lambda **options: run(checkpoint_dir, **options),
                    experts=experts,
                    replicated_kv=lambda: replicated_kv_run(run, checkpoint_dir, stand_ins),
                    dcp=dcp_runs(report.model_dir, run, checkpoint_dir, stand_ins),
                )
            report.timings["parallel_layouts"] = round(time.perf_counter() - start, 4)

    def run(
        self,
        checkpoint: str | Path,
        tp: int = 1,
        attention_dp: int = 1,
        mlp_dp: int = 1,
        embedding_dp: int = 1,
        lm_head_dp: int = 1,
        kv_cache_dtype: str = "auto",
        seed: int | None = None,
        prefill: str | None = None,
        prompt_embeds: bool = False,
        ep: int = 1,
        decode_tokens: int = 1,
        on_device_sampling: bool = False,
        dcp: int = 1,
        prefill_dcp: bool = False,
    ) -> ValidationReport:
        """The port on ``checkpoint`` in fp32 at TP ``tp`` with those data-parallel degrees
        (and that KV-cache dtype; the prompts of ``seed``, default the validation's; the
        prefill mode ``prefill``, default the validation's, none of the cache paths with
        an FP8 cache; ``prompt_embeds``: prompts fed partly as embeddings; ``ep``
        expert-parallel partitions of the TP ranks; ``decode_tokens`` new tokens per
        sequence in each decode call, as in speculative decoding; ``on_device_sampling``:
        the port samples on the device and returns the logits too, ``sampled_output``;
        ``dcp``, ``prefill_dcp``: decode context parallelism, ``dcp_layouts``)."""
        if prefill is None:
            prefill = self.prefill if kv_cache_dtype == "auto" else "auto"  # an FP8 cache: no cache paths
        layout = ParallelLayout(
            tp=tp,
            attention_dp=attention_dp,
            mlp_dp=mlp_dp,
            embedding_dp=embedding_dp,
            lm_head_dp=lm_head_dp,
            ep=ep,
            dcp=dcp,
            prefill_dcp=prefill_dcp,
        )
        return self.validate(
            self.model_dir,
            checkpoint,
            tp=tp,
            ep=ep,
            dtype="fp32",
            steps=self.steps,
            prompt_lengths=self.prompt_lengths,
            block_size=None,
            seed=self.seed if seed is None else seed,
            on_stage=None,
            prefill=prefill,
            kv_cache_dtype=kv_cache_dtype,
            layout=layout,
            prompt_embeds=prompt_embeds,
            decode_tokens=decode_tokens,
            on_device_sampling=on_device_sampling,
        )
