"""Tensor- and expert-parallel sizes for a trn2.48xlarge.

Valid tensor-parallel (TP) degrees are the divisors of the world size
(64 ranks at LNC=2) that satisfy all five rules:

1. attention heads divisible by TP;
2. heads per rank even (the decode kernel);
3. KV heads divisible by TP, or TP divisible by KV heads (KV replication);
4. the intermediate size divisible by TP (for MoE, the expert intermediate
   size: every rank holds a slice of every expert);
5. the vocabulary divisible by TP, or padded to a multiple of TP (the
   embedding pads; the LM head's ColumnParallelLinear needs the padding);
   with a reference that shards it unpadded (the real vllm_neuron llama3
   and qwen3), divisible by TP (``unpadded_vocabulary``, applied by ``plan``
   once the reference is chosen).

Memory: bf16 weights (2 bytes per parameter) divided evenly over the ranks
must stay under a per-rank budget (20 GB of the ~24 GB HBM per rank; the
rest is KV cache and activations). The recommended TP is the smallest valid
TP >= 2 that fits (TP = 1 is not used on device).

Multi-latent attention (MLA, DeepSeek-V2/V3): rules 1 and 2 apply to the
query heads (the up-projections and the output projection are sharded by
heads); rule 3 does not apply: the cache holds one latent row per token and
layer (``kv_lora_rank + qk_rope_head_dim`` values) shared by every head, the
same on every rank, so the KV cache per rank does not shrink with TP. Its
size per token (bf16, every layer) is in each check's notes, and the
low-rank projections of the hidden state (``q_a_proj``, ``kv_a_proj``) are
replicated: their bytes count whole on every rank.

Expert parallelism (EP) is needed for an MoE model when no valid TP fits:
with the world size fixed, ``ep = world / tp``, attention and dense weights
are split over the TP group and expert weights over all ranks (each rank
holds ``experts / ep`` experts, each sliced over the TP group); the expert
count must be divisible by the EP degree.

Expert parallelism inside TP (vllm_neuron's layout, the deepseek_v3
reference's): the TP world of ``tp`` ranks is cut into ``ep`` partitions of
``tp / ep`` ranks; partition k holds experts [k E/ep, (k+1) E/ep), each
sliced over its ``tp / ep`` ranks, and attention and dense weights stay
sharded over all ``tp`` ranks. Each rank holds 1/tp of the experts' bytes
whatever ``ep``, so the memory per rank is the TP check's; what EP changes is
the experts per rank (``E / ep``) and the width of each expert's slice
(``moe_intermediate_size / (tp / ep)``: 32 for DeepSeek-V3 at TP 64 without
EP, 256 with EP 8). ``ep_inside_tp`` lists the degrees for the largest valid
TP (EP dividing the experts and TP, the slice dividing evenly).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

WORLD_SIZE = 64
RANK_BUDGET_BYTES = 20 * 10**9
BYTES_PER_PARAM = 2  # bf16


@dataclass(frozen=True)
class ParallelDims:
    num_heads: int
    num_kv_heads: int
    intermediate_size: int | None  # the size rule 4 checks (expert intermediate for MoE)
    vocab_size: int
    num_experts: int | None = None
    shared_intermediate_size: int | None = None
    dense_intermediate_size: int | None = None  # dense layers of an MoE model
    # multi-latent attention: the cached latent row's width (kv_lora_rank + qk_rope_head_dim) per
    # token and layer, the layers, and the parameters every rank holds whole (the low-rank projections)
    latent_width: int | None = None
    num_layers: int | None = None
    replicated_parameters: int = 0


@dataclass(frozen=True)
class TPCheck:
    tp: int
    valid: bool
    failures: tuple[str, ...]
    notes: tuple[str, ...]
    bytes_per_rank: int
    fits: bool


@dataclass(frozen=True)
class EPOption:
    tp: int
    ep: int
    local_experts: int
    bytes_per_rank: int
    fits: bool


@dataclass(frozen=True)
class EPInsideTP:
    """Expert parallelism inside a TP world: ``ep`` partitions of ``tp / ep`` ranks."""

    tp: int
    ep: int
    local_experts: int
    expert_slice: int | None  # each expert's intermediate columns on one rank
    bytes_per_rank: int
    fits: bool


@dataclass(frozen=True)
class ParallelPlan:
    world_size: int
    budget_bytes: int
    parameters: int
    expert_parameters: int
    weight_bytes: int
    checks: tuple[TPCheck, ...]
    recommended_tp: int | None
    ep_needed: bool
    ep: EPOption | None
    ep_options: tuple[EPOption, ...] = field(default=())
    reason: str = ""
    ep_inside_tp: tuple[EPInsideTP, ...] = field(default=())

    @property
    def valid_tps(self) -> tuple[int, ...]:
        return tuple(c.tp for c in self.checks if c.valid)


def tp_candidates(world_size: int = WORLD_SIZE) -> list[int]:
    return [d for d in range(1, world_size + 1) if world_size % d == 0]


def check_tp(tp: int, dims: ParallelDims, weight_bytes: int, budget: int = RANK_BUDGET_BYTES) -> TPCheck:
    failures = []
    notes = []
    h, kv = dims.num_heads, dims.num_kv_heads
    if not h or not kv:  # no attention heads found (a model without softmax attention)
        failures.append(f"rules 1-3: {h} attention heads, {kv} KV heads")
    elif h % tp:
        failures.append(f"rule 1: {h} attention heads not divisible by {tp}")
    elif (h // tp) % 2:
        failures.append(f"rule 2: {h // tp} heads per rank is odd")
    if dims.latent_width:
        notes.append(_latent_cache_note(dims))
    elif not h or not kv:
        pass
    elif kv % tp and tp % kv:
        failures.append(f"rule 3: {kv} KV heads and TP {tp}: neither divides the other")
    elif tp > kv:
        notes.append(f"KV heads replicated {tp // kv}x")
    if dims.intermediate_size is not None and dims.intermediate_size % tp:
        which = "expert intermediate size" if dims.num_experts else "intermediate size"
        failures.append(f"rule 4: {which} {dims.intermediate_size} not divisible by {tp}")
    for label, size in (
        ("shared-expert intermediate", dims.shared_intermediate_size),
        ("dense intermediate", dims.dense_intermediate_size),
    ):
        if size is not None and size % tp:
            failures.append(f"rule 4: {label} size {size} not divisible by {tp}")
    if dims.vocab_size % tp:
        padded = -(-dims.vocab_size // tp) * tp
        notes.append(f"rule 5: vocabulary {dims.vocab_size} padded to {padded}")
    replicated = min(dims.replicated_parameters * BYTES_PER_PARAM, weight_bytes)
    per_rank = -(-(weight_bytes - replicated) // tp) + replicated
    return TPCheck(tp, not failures, tuple(failures), tuple(notes), per_rank, per_rank <= budget)


def latent_cache_bytes_per_token(dims: ParallelDims) -> int | None:
    """bf16 bytes of the multi-latent cache per token on every rank (all
    layers): one row of ``latent_width`` values per layer, whatever the TP."""
    if not dims.latent_width or not dims.num_layers:
        return None
    return dims.latent_width * dims.num_layers * BYTES_PER_PARAM


def _latent_cache_note(dims: ParallelDims) -> str:
    per_token = latent_cache_bytes_per_token(dims)
    size = f": {per_token / 1024:.1f} KiB per token on every rank" if per_token else ""
    return (
        f"latent cache replicated ({dims.latent_width} values per token and layer, not divided by TP){size}"
    )


def plan_parallelism(
    dims: ParallelDims,
    parameters: int,
    expert_parameters: int = 0,
    world_size: int = WORLD_SIZE,
    budget: int = RANK_BUDGET_BYTES,
) -> ParallelPlan:
    weight_bytes = parameters * BYTES_PER_PARAM
    checks = tuple(check_tp(tp, dims, weight_bytes, budget) for tp in tp_candidates(world_size))
    fitting = [c for c in checks if c.valid and c.tp >= 2 and c.fits]
    recommended = fitting[0].tp if fitting else None
    ep_options: list[EPOption] = []
    ep_needed = False
    chosen = None
    if recommended is not None:
        check = fitting[0]
        reason = (
            f"TP {recommended}: the smallest valid TP >= 2 whose bf16 weights fit "
            f"({check.bytes_per_rank / 1e9:.1f} GB per rank <= {budget / 1e9:.0f} GB)"
        )
    else:
        valid = [c for c in checks if c.valid and c.tp >= 2]
        if not valid:
            reason = "no TP degree satisfies the five rules"
        elif not dims.num_experts:
            reason = (
                f"no valid TP fits: {weight_bytes / 1e9:.1f} GB of bf16 weights need more than "
                f"{world_size} ranks of {budget / 1e9:.0f} GB; the model needs more than one instance "
                "or quantized weights"
            )
        else:
            ep_needed = True
            ep_options, chosen, reason = _expert_parallelism(
                dims.num_experts, valid, weight_bytes, expert_parameters, world_size, budget
            )
    valid_all = [c for c in checks if c.valid and c.tp >= 2]
    inside = ep_inside_tp(dims, valid_all[-1]) if valid_all and dims.num_experts else []
    return ParallelPlan(
        ep_inside_tp=tuple(inside),
        world_size=world_size,
        budget_bytes=budget,
        parameters=parameters,
        expert_parameters=expert_parameters,
        weight_bytes=weight_bytes,
        checks=checks,
        recommended_tp=recommended,
        ep_needed=ep_needed,
        ep=chosen,
        ep_options=tuple(ep_options),
        reason=reason,
    )


def unpadded_vocabulary(plan: ParallelPlan, reference: str) -> ParallelPlan:
    """``plan`` for a reference that shards the vocabulary unpadded
    (``reference`` names it and its sites; the real vllm_neuron llama3 and
    qwen3): rule 5 then wants the vocabulary divisible by TP, which its
    ``ColumnParallelLinear`` and unpadded loaders need on device. A TP whose
    check padded the vocabulary becomes invalid; the recommendation is the
    smallest valid TP >= 2 that fits among the others, and EP splits keep
    only valid TPs."""
    checks = []
    for check in plan.checks:
        padded = [note for note in check.notes if note.startswith("rule 5: vocabulary ")]
        if not padded:
            checks.append(check)
            continue
        vocab = padded[0].split()[3]
        failure = f"rule 5: vocabulary {vocab} not divisible by {check.tp}, which {reference} shards unpadded"
        notes = tuple(note for note in check.notes if note not in padded)
        checks.append(replace(check, valid=False, failures=(*check.failures, failure), notes=notes))
    valid = {c.tp for c in checks if c.valid}
    if plan.recommended_tp is None or plan.recommended_tp in valid:
        ep_options = tuple(o for o in plan.ep_options if o.tp in valid)
        chosen = plan.ep if plan.ep is not None and plan.ep.tp in valid else None
        reason = plan.reason if chosen == plan.ep else f"no EP split over a TP that {reference} can take"
        return replace(plan, checks=tuple(checks), ep_options=ep_options, ep=chosen, reason=reason)
    fitting = [c for c in checks if c.valid and c.tp >= 2 and c.fits]
    if fitting:
        reason = (
            f"TP {fitting[0].tp}: the smallest valid TP >= 2 whose bf16 weights fit "
            f"({fitting[0].bytes_per_rank / 1e9:.1f} GB per rank <= {plan.budget_bytes / 1e9:.0f} GB); "
            f"{reference} shards the vocabulary unpadded"
        )
    else:
        which = "fits" if any(c.valid and c.tp >= 2 for c in checks) else "is valid"
        reason = f"no TP >= 2 {which}: {reference} shards the vocabulary unpadded (rule 5)"
    recommended = fitting[0].tp if fitting else None
    return replace(plan, checks=tuple(checks), recommended_tp=recommended, reason=reason)


def _expert_parallelism(
    num_experts: int,
    valid: list[TPCheck],
    weight_bytes: int,
    expert_parameters: int,
    world_size: int,
    budget: int,
) -> tuple[list[EPOption], EPOption | None, str]:
    """An MoE model no valid TP fits: the EP x TP splits of ``world_size``
    ranks (EP dividing the experts), the one with the least expert
    parallelism that fits, and why."""
    ep_options: list[EPOption] = []
    expert_bytes = expert_parameters * BYTES_PER_PARAM
    dense_bytes = weight_bytes - expert_bytes
    for check in valid:
        ep = world_size // check.tp
        if ep < 2 or num_experts % ep:
            continue
        per_rank = -(-dense_bytes // check.tp) + -(-expert_bytes // (check.tp * ep))
        ep_options.append(EPOption(check.tp, ep, num_experts // ep, per_rank, per_rank <= budget))
    fitting_ep = [o for o in ep_options if o.fits]
    if not fitting_ep:
        reason = (
            f"expert parallelism needed, but no EP degree dividing {num_experts} experts "
            f"fits in {world_size} ranks"
        )
        return ep_options, None, reason
    chosen = max(fitting_ep, key=lambda o: o.tp)  # the least expert parallelism that fits
    reason = (
        f"no valid TP fits ({valid[-1].bytes_per_rank / 1e9:.1f} GB per rank at the largest "
        f"valid TP {valid[-1].tp}): expert parallelism EP {chosen.ep} x TP {chosen.tp} = "
        f"{world_size} ranks, {chosen.local_experts} experts per rank, "
        f"{chosen.bytes_per_rank / 1e9:.1f} GB per rank"
    )
    return ep_options, chosen, reason


def ep_inside_tp(dims: ParallelDims, check: TPCheck) -> list[EPInsideTP]:
    """The EP degrees inside the TP world of ``check`` (EP >= 2 dividing the
    experts and the TP degree, each expert's intermediate size dividing over
    the ``tp / ep`` ranks of a partition): experts and slice width per rank,
    and the memory per rank (the TP check's: every rank holds 1/tp of the
    experts' bytes whatever the EP degree)."""
    options = []
    experts, size = dims.num_experts or 0, dims.intermediate_size
    for ep in tp_candidates(check.tp):
        per_partition = check.tp // ep
        if ep < 2 or experts % ep or (size is not None and size % per_partition):
            continue
        slice_width = size // per_partition if size is not None else None
        options.append(EPInsideTP(check.tp, ep, experts // ep, slice_width, check.bytes_per_rank, check.fits))
    return options


# config.json spellings of the sizes the rules check (the first present is used)
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _first_int(values: dict, keys: tuple[str, ...]) -> int | None:
    found = (values.get(key) for key in keys)
    return next((v for v in found if isinstance(v, int) and not isinstance(v, bool)), None)


def config_dims(config: dict) -> ParallelDims | None:
    """The sizes the rules check, read from a config.json's values without
    transformers (a multimodal config's ``text_config`` when the top level
    has no heads); None when no attention heads are named."""
    if _first_int(config, _HEAD_KEYS) is None and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    heads = _first_int(config, _HEAD_KEYS)
    if heads is None:
        return None
    kv_heads = 1 if _multi_query(config) else _first_int(config, _KV_HEAD_KEYS)
    rank, rope = _first_int(config, ("kv_lora_rank",)), _first_int(config, ("qk_rope_head_dim",))
    experts = _first_int(config, _EXPERT_KEYS)
    dense = _first_int(config, ("intermediate_size", "ffn_hidden_size", "n_inner"))
    expert_size = _first_int(config, ("moe_intermediate_size",)) if experts else None
    return ParallelDims(
        num_heads=heads,
        num_kv_heads=kv_heads or heads,
        intermediate_size=expert_size if expert_size is not None else dense,
        vocab_size=_first_int(config, ("vocab_size",)) or 0,
        num_experts=experts,
        shared_intermediate_size=_first_int(config, ("shared_expert_intermediate_size",)),
        dense_intermediate_size=dense if expert_size is not None else None,
        latent_width=rank + rope if rank and rope else None,
        num_layers=_first_int(config, ("num_hidden_layers",)),
    )


def _multi_query(config: dict) -> bool:
    """One KV head for every query head: ``multi_query``, which Falcon's new
    decoder architecture (Falcon-40B/180B) ignores for its ``num_kv_heads``
    (and its config class defaults to True, so config.json states it)."""
    return config.get("multi_query") is True and config.get("new_decoder_architecture") is not True


def tp_refusal(config: dict, tp: int) -> str | None:
    """Why the rules refuse tensor-parallel size ``tp`` for the model of a
    config.json (its failures, and the sizes they accept up to ``tp``), or
    None: TP 1 shards nothing, and a config without attention heads is left
    to the port."""
    dims = config_dims(config)
    if tp == 1 or dims is None:
        return None
    check = check_tp(tp, dims, 0)
    if check.valid:
        return None
    valid = [n for n in range(1, max(tp, 8) + 1) if check_tp(n, dims, 0).valid]
    accepted = f"; the rules accept TP {', '.join(map(str, valid))}" if valid else ""
    return f"TP {tp} breaks the tensor-parallel rules: {'; '.join(check.failures)}{accepted}"
