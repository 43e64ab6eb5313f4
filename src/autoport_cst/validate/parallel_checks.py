"""The parallel layouts a default validation runs after its TP=1 fp32 run.

A TP=1 run executes the port's parallel code with identity values: rank 0 of
one rank, data-parallel groups of one. Rank and size arithmetic that is wrong
(``world_size > 1`` read as ``> 2``, ``+ rank * size`` as ``-``, a shard
offset of the wrong rank, a data-parallel gather left out) gives the right
numbers there. So a plain TP=1 fp32 validation that passes goes on, on the
same checkpoint and prompts, to the smallest layouts that give that code
other values (``LAYOUTS``):

- ``TP=2``: two tensor-parallel ranks (sharded weights, the sequence-parallel
  prefill, the collectives; every TP > 1 run without data parallelism also asks
  for the prefill-length refusal the reference declares: ``sp_length_check``);
- ``attention DP 2``: TP=1 with the attention data-parallel over 2 ranks in
  the decode graph (a disaggregated run: ``layout_session``);
- ``DP 2 (MLP, embedding, LM head)``: TP=1 with the MLP, the embedding and
  the LM head each data-parallel over 2 ranks in the decode graph (apart from
  the attention's, which some ports refuse);
- ``embedding DP 2``: the embedding alone data-parallel over 2 ranks. With
  every component at DP 2 the embedding's and the MLP's DP groups are the
  same, and the transition of the decode batch between them is the identity;
  here they differ. These two (embedding DP > 1) also repeat their last
  decode step with ``rank`` omitted, the default the reference declares, and
  ask for the same logits (``rankless_check``);
- ``2 tokens per decode step`` (TP=1): every decode call feeds two new
  tokens per sequence (the teacher's next two, with
  ``decode_token_threshold`` 2), as the runner's verification step of
  speculative decoding with one draft token does; the logits of both rows
  are compared. A port whose forward takes no ``spec_decode_metadata`` (no
  speculative decoding) is reported as refusing it;
- ``prompt embeddings`` (TP=1) and ``prompt embeddings at TP=2``: every odd
  prompt position fed as transformers' input embedding of its id
  (``inputs_embeds``, ``is_token_ids`` false), as vllm_neuron's runner does
  with ``enable_prompt_embeds``; at TP=2 the port cuts them to its
  sequence-parallel slice (``driver._embed_prompt``). A port whose forward
  does not name both arguments is reported as refusing them;
- ``TP=2 with MLP DP 2`` (four ranks): the decode rows come back from the
  MLP in its DP state, every replica's batch; a rank keeps its own slice of
  them. At TP=2 alone, or MLP DP 2 alone, a decode batch gathered over the TP
  group by mistake (TP copies of the same rows) still yields the right rows
  first; here a rank's slice is another replica's rows;
- ``on-device sampling at TP=2, LM-head DP 2`` (four ranks): the port built
  as the runner builds it by default, sampling on the device, with logprobs
  asked for: the forward's other branch, which hands the logits to the
  sampler and returns the sampled tokens and the logits. The tiny
  checkpoint's odd vocabulary is padded in the LM head (over 2 ranks in the
  TP=2 prefill graph, over the 4 of the LM-head TP group in the decode
  graph), and the padding's ids must reach the sampler masked, the returned
  logits cut (``sampled_output``: checked on what the sampler is handed, as
  a greedy choice lands on the padding only for some weights). With LM-head
  DP 2 the padding sits on LM-head rank 3, TP rank 1, so a mask placed by
  the wrong rank leaves it unmasked (at TP=2 alone the two ranks agree), and
  the sampler, which reduces over the LM-head TP group, must be handed every
  LM-head-DP rank's rows. No other run takes that branch;
- ``TP=4, KV heads replicated`` (``REPLICATED_KV``, four ranks): more TP ranks
  than KV heads, as in production (TP 16, 32 or 64 with 8 KV heads or fewer),
  so each KV head is held by several ranks (``num_kv_replicas``: the fused QKV
  loader's K/V shard, the KV cache of one head per rank). TP=4 also tells rank
  arithmetic that TP=2 cannot: a shard index ``d - k r`` for ``d + k r`` picks
  the same shard modulo ``k T`` for both ranks of TP=2. The rules want an even
  head count per rank (rule 2 of ``research.parallelism``), which the tiny
  checkpoint's 4 heads do not give at TP=4, so a checkpoint that cannot take
  TP=4 with fewer than 4 KV heads is stood in for by a tiny checkpoint of its
  config with 8 attention heads and 2 KV heads (``tiny``, seed 0; latent
  attention keeps as many KV heads as heads), with a transformers run of its
  own; one that the rules still refuse, or that transformers cannot build or
  run, or a config without ``num_key_value_heads`` (multi-head attention), or
  a checkpoint holding tensors the stand-in lacks (names transformers does not
  write, layer indices aside), is reported as not run. The two runs of four ranks (forked from this
  process, ``rank_start``) add 4 to 7 s of CPU to the default validation of
  the tiny Qwen3 or Mixtral, 2 to 4 s each (docs/validation.md, "Four ranks":
  measured at load average 10 to 20 on 2 cores);
- ``TP=4, DCP 2`` and ``TP=2, DCP 2 with a context-parallel prefill``, for a
  port whose reference takes decode context parallelism (``dcp_layouts``,
  on a stand-in checkpoint as above when the checkpoint cannot take them);
- ``EP 2 at TP=2``, for a mixture-of-experts checkpoint only (``MOE_LAYOUTS``):
  the experts split into two expert-parallel partitions of one rank each, so
  each rank holds half of the experts whole (at TP=2 without EP each holds
  every expert's half). The code only expert parallelism runs (the local
  expert range, the decode kernel's all-expert mode with the rank's
  ``rank_id``) gets other values than at TP=1, where a rank holds every
  expert. A port that refuses EP by its own guard is reported as not run.

Each runs as ``validate --tp 2`` / ``--attention-dp 2`` / ``--mlp-dp 2
--embedding-dp 2 --lm-head-dp 2`` / ``--embedding-dp 2`` / ``--tp 2 --mlp-dp
2`` / ``--tp 4`` would, with its ranks as local processes; on the same
checkpoint, the transformers run of the TP=1 validation is reused
(``reference_reuse``).
A layout the checkpoint cannot take (the tensor-parallel rules refuse TP=2,
prompt lengths given that it cannot split), or that the port refuses with a
NotImplementedError of its own (a guard a codemod wrote: q/k norms over all
heads under attention data parallelism, say), is reported as not run; the first
layout that fails fails the report, named after it, and ends the checks.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autoport_cst.config_json import parse_config_text
from autoport_cst.errors import InputError

# (label, validate_model's options) of each layout, in the order they run
LAYOUTS: tuple[tuple[str, dict[str, int]], ...] = (
    ("TP=2", {"tp": 2}),
    ("attention DP 2", {"attention_dp": 2}),
    ("DP 2 (MLP, embedding, LM head)", {"mlp_dp": 2, "embedding_dp": 2, "lm_head_dp": 2}),
    ("embedding DP 2", {"embedding_dp": 2}),
    ("2 tokens per decode step", {"decode_tokens": 2}),
    ("prompt embeddings", {"prompt_embeds": True}),
    ("prompt embeddings at TP=2", {"tp": 2, "prompt_embeds": True}),
    ("TP=2 with MLP DP 2", {"tp": 2, "mlp_dp": 2}),
    ("on-device sampling at TP=2, LM-head DP 2", {"tp": 2, "lm_head_dp": 2, "on_device_sampling": True}),
)
# after LAYOUTS: KV heads replicated over the TP ranks (``replicated_kv_run``)
REPLICATED_KV = ("TP=4, KV heads replicated", {"tp": 4})
# the attention of the checkpoint that stands in when the validated one cannot take REPLICATED_KV
REPLICATED_KV_HEADS = {"num_attention_heads": 8, "num_key_value_heads": 2}
# after LAYOUTS, for a checkpoint with routed experts (their count, split in two)
MOE_LAYOUTS: tuple[tuple[str, dict[str, int]], ...] = (("EP 2 at TP=2", {"tp": 2, "ep": 2}),)


def check_parallel_layouts(
    report: Any,
    validate: Callable[..., Any],
    experts: int | None = None,
    replicated_kv: Callable[[], Any] | None = None,
    dcp: Sequence[tuple[str, Callable[[], Any]]] = (),
) -> None:
    """Validate the port at each of ``LAYOUTS`` (``validate(**options) ->
    ValidationReport``), at ``REPLICATED_KV`` when given ``replicated_kv()``
    (``replicated_kv_run``), at the ``dcp`` (label, run) layouts
    (``dcp_layouts``), and at ``MOE_LAYOUTS`` when the checkpoint has
    ``experts`` routed experts, into ``report.parallel_layouts``, until one
    fails: it makes ``report`` fail, named after it (the later ones are not run)."""
    runs: list[tuple[str, Callable[[], Any]]] = [
        (label, functools.partial(validate, **options)) for label, options in LAYOUTS
    ]
    if replicated_kv is not None:
        runs.append((REPLICATED_KV[0], replicated_kv))
    runs += dcp
    runs += [(label, functools.partial(validate, **options)) for label, options in MOE_LAYOUTS if experts]
    for label, run in runs:
        entry: dict[str, Any] = {"label": label, "equivalent": None, "summary": None}
        report.parallel_layouts.append(entry)
        try:
            found = run()
        except InputError as refused:
            entry["summary"] = f"not run: {_first_line(refused)}"
            continue
        if found.failure is not None and found.failure.refusal:
            # the port's own guard (NotImplementedError) declares the layout unsupported
            entry["summary"] = (
                f"not run: the port refuses it ({found.failure.stage}: {found.failure.message})"
            )
            continue
        entry.update(equivalent=found.equivalent, summary=found.summary())
        if not found.equivalent:
            report.fail_as(label, found)
            return


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def replicated_kv_run(
    validate_on: Callable[..., Any], checkpoint: str | Path, stand_ins: StandIns | None = None
) -> Any:
    """The port at ``REPLICATED_KV`` (``validate_on(checkpoint, **options) ->
    ValidationReport``): on ``checkpoint`` when the rules take its TP with fewer
    KV heads than TP ranks, else on a tiny checkpoint of its config with
    ``REPLICATED_KV_HEADS`` (``run_on_stand_in``)."""
    from autoport_cst.research.parallelism import tp_refusal

    tp = REPLICATED_KV[1]["tp"]

    def takes(config: dict) -> bool:
        kv_heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
        return isinstance(kv_heads, int) and kv_heads < tp and tp_refusal(config, tp) is None

    return run_on_stand_in(validate_on, checkpoint, REPLICATED_KV[1], REPLICATED_KV_HEADS, takes, stand_ins)


def run_on_stand_in(
    validate_on: Callable[..., Any],
    checkpoint: str | Path,
    options: dict[str, Any],
    heads: dict[str, int],
    takes: Callable[[dict], bool],
    stand_ins: StandIns | None = None,
    edits: dict[str, Any] | None = None,
) -> Any:
    """The port at ``options`` (``validate_on(checkpoint, **options) ->
    ValidationReport``): on ``checkpoint`` when ``takes`` its config and no
    ``edits`` are asked, else on a tiny checkpoint of its config with the
    attention ``heads``, its vocabulary and the config values ``edits``
    (kept in ``stand_ins`` for the other layouts of the validation,
    or in a temporary directory removed after the run).
    ``InputError`` when transformers cannot build or run that one, or it lacks
    tensor names of ``checkpoint``."""
    from .config_variants import raised_in_transformers

    config_path = Path(checkpoint) / "config.json"
    config = parse_config_text(config_path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: not a JSON object")
    if takes(config) and not edits:
        return validate_on(checkpoint, **options)
    heads_of = {**_stand_in_heads(config, heads), **(edits or {})}
    described = ", ".join(f"{name} {value}" for name, value in heads_of.items())
    # the checkpoint's own vocabulary: whether the TP ranks divide it is the checkpoint's, not the
    # tiny default's (a port whose LM head needs a vocabulary they divide, as vllm_neuron's do)
    vocabulary = {"vocab_size": config["vocab_size"]} if isinstance(config.get("vocab_size"), int) else {}
    with contextlib.ExitStack() as stack:
        if stand_ins is None:
            stand_ins = stack.enter_context(StandIns())
        wide = stand_ins.checkpoint(checkpoint, {**heads_of, **vocabulary}, described)
        try:
            found = validate_on(wide, **options)
        except Exception as error:
            if not raised_in_transformers(error):
                raise
            raise InputError(
                f"transformers cannot run {checkpoint}'s config with {described}: {type(error).__name__}: {error}"
            ) from error
    refused = _guard_refusal(found)
    if refused:
        raise InputError(f"the port's config guards refuse {checkpoint}'s config with {described}: {refused}")
    return found


# the function config-guards writes into a port's config module: it refuses a config the port was not made for
_GUARD_FUNCTION = "check_assumed_config"


def _guard_refusal(report: Any) -> str | None:
    """The refusal of the port's config guards when ``report`` failed at
    build on one, else None. The stand-in is the validator's own config, not
    the user's: a guard that refuses it (a head size the port was made for,
    which more heads of the same width change: Helium's ``head_dim``) says
    the layout cannot be run on it, not that the port is wrong."""
    failure = getattr(report, "failure", None)
    if failure is None or failure.stage != "build" or failure.raised_in != _GUARD_FUNCTION:
        return None
    return failure.message.split(" (at ", 1)[0]


class StandIns:
    """The stand-in checkpoints of one validation's layouts (``run_on_stand_in``),
    each built once: the replicated-KV run and the DCP run at TP=4 take the
    same one, and its transformers run (``reference_reuse``). A context
    manager: the checkpoints are removed on exit."""

    def __enter__(self) -> StandIns:
        self._scratch = tempfile.TemporaryDirectory(prefix="autoport-stand-in-")
        self._built: dict[tuple[str, str], Path] = {}
        return self

    def __exit__(self, *_exc: object) -> None:
        self._scratch.cleanup()

    def checkpoint(self, checkpoint: str | Path, dimensions: dict[str, Any], described: str) -> Path:
        """The tiny checkpoint of ``checkpoint``'s config with ``dimensions``
        (seed 0, its layer kinds and tensor names), built on first use."""
        from .tiny import build_tiny_checkpoint, key_format_of

        key = (str(checkpoint), repr(sorted(dimensions.items())))
        if key not in self._built:
            target = Path(self._scratch.name) / str(len(self._built))
            try:
                target = build_tiny_checkpoint(
                    Path(checkpoint) / "config.json",
                    target,
                    seed=0,
                    dimensions=dimensions,
                    key_format=key_format_of(checkpoint),
                    keep_layer_kinds=True,  # the checkpoint's dense / MoE layers
                ).directory
            except (InputError, ValueError, TypeError) as error:  # the config class refuses those heads
                raise InputError(
                    f"transformers cannot build {checkpoint}'s config with {described}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            _check_same_tensor_names(checkpoint, target, described)
            self._built[key] = target
        return self._built[key]


def _check_same_tensor_names(checkpoint: str | Path, stand_in: str | Path, described: str) -> None:
    """``InputError`` when the stand-in checkpoint transformers writes lacks
    tensor names (layer indices aside) of the validated ``checkpoint``: one
    carrying tensors transformers does not write (copies under other names,
    extra heads) is not stood in for by it, and a port reading those would
    fail there through no fault of its own."""
    from autoport_cst.research.checkpoint import pattern, read_checkpoint

    ours, theirs = read_checkpoint(checkpoint), read_checkpoint(stand_in)
    if ours is None or theirs is None:
        return
    missing = sorted({pattern(n) for n in ours.tensors} - {pattern(n) for n in theirs.tensors})
    if missing:
        shown = ", ".join(missing[:3]) + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else "")
        raise InputError(
            f"the checkpoint transformers writes for {checkpoint}'s config with {described} lacks "
            f"{len(missing)} of its tensor names: {shown}"
        )


def _stand_in_heads(config: dict, heads: dict[str, int]) -> dict[str, int]:
    """The attention of the stand-in checkpoint: ``heads``, or,
    for latent attention (one latent row per token, the same on every rank:
    rule 3 does not apply), as many KV heads as heads, as its config has them.
    ``InputError`` for a config without a KV-head count (multi-head attention,
    whose KV heads are as many as its heads: never fewer than the TP ranks)."""
    from autoport_cst.research.parallelism import config_dims

    dims = config_dims(config)
    if dims is not None and dims.latent_width:
        count = heads["num_attention_heads"]
        return {"num_attention_heads": count, "num_key_value_heads": count}
    if "num_key_value_heads" not in config:
        raise InputError(
            "multi-head attention (its config has no num_key_value_heads): no KV heads fewer than the TP ranks"
        )
    if _derived_kv_heads(config):
        raise InputError(
            "its config class derives num_key_value_heads from other fields (no field of its own to set "
            "fewer KV heads than the TP ranks with)"
        )
    return dict(heads)


def _derived_kv_heads(config: dict) -> bool:
    """Whether the config class of ``config`` derives ``num_key_value_heads``
    at init instead of declaring it (transformers 5.25's FalconConfig:
    ``num_kv_heads``, or 1 with multi-query attention, and written to
    config.json): set to the stand-in's 2 beside the fields it derives from,
    it would say 2 where the model builds others (Falcon without multi-query
    builds a KV head per query head)."""
    import dataclasses

    from autoport_cst.config_json import config_object

    try:
        resolved = config_object(config)
    except Exception:  # noqa: BLE001 - no config class to ask: taken as declared
        return False
    cls = type(resolved)
    return dataclasses.is_dataclass(cls) and "num_key_value_heads" not in {
        f.name for f in dataclasses.fields(cls)
    }
