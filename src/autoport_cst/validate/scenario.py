"""What a validation run feeds the models: prompts of different lengths,
the number of decode steps, the paged KV-cache layout, and how each prompt
is prefilled.

Besides the prompts prefilled whole (one call each), a scenario holds two
prompts that exercise the runner's cache paths when the port implements
segmented prefill:

- a **chunked** prompt, prefilled in two calls: its first ``PREFIX_TOKENS``
  tokens, then the rest with ``cached_seq_len = PREFIX_TOKENS``;
- a **prefix-cache hit**: a prompt that starts with the chunked prompt's
  first ``PREFIX_TOKENS`` tokens, whose block table starts with that
  prompt's blocks (already filled), and whose prefill computes only the
  remaining tokens, from ``cached_seq_len = PREFIX_TOKENS``.

Segmented calls carry ``kv_segment_size = SEGMENT_SIZE`` and are padded to
that many rows, as the runner pads a chunk to the segment size (padding rows:
token 0, position 0, slot -1). A run without the cache paths (a port that
does not implement segmented prefill) leaves those two prompts out (see
``sequences`` and ``prefill_plan``).

Everything is a plain, picklable value, so TP ranks in other processes get
exactly the same scenario.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from autoport_cst.errors import InputError

DEFAULT_PROMPT_LENGTHS = (8, 12, 20)
DEFAULT_STEPS = 16
DEFAULT_BLOCK_SIZE = 32
DECODE_CONTEXT_MULTIPLE = 128  # the decode kernel needs s_prior % 128 == 0
SEGMENT_SIZE = 512  # the smallest kv_segment_size the segmented kernel supports
PREFIX_TOKENS = 32  # the chunk boundary and the shared prefix
CHUNKED_LENGTH = 40
PREFIX_HIT_LENGTH = 48


@dataclass(frozen=True)
class PrefillCall:
    """One prefill forward: positions ``[start, end)`` of a sequence, with
    ``start`` tokens already cached; ``segment`` is the kv_segment_size (0:
    a whole prompt, not padded). ``last_only``: the call samples its last
    token only, as the runner does (``sampling_positions = [tokens - 1]``);
    otherwise every computed position."""

    sequence: int
    start: int
    end: int
    segment: int = 0
    padded_rows: int = 0  # a whole prompt padded (context-parallel prefill)
    last_only: bool = False

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def sampled(self) -> tuple[int, ...]:
        """The rows the call samples (its ``sampling_positions``)."""
        return (self.tokens - 1,) if self.last_only else tuple(range(self.tokens))

    @property
    def sampled_positions(self) -> tuple[int, ...]:
        """The sequence positions whose logits the call returns."""
        return tuple(self.start + row for row in self.sampled)

    @property
    def rows(self) -> int:
        """Rows fed to the model: the chunk padded to the segment size (or to
        ``padded_rows``)."""
        return max(self.segment, self.tokens, self.padded_rows)


@dataclass(frozen=True)
class PagedLayout:
    """Block tables of a paged KV cache: sequence ``b`` owns the blocks
    ``block_tables[b]`` (not contiguous: the order is shuffled so that a port
    that ignores the block table reads the wrong blocks). Block 0 (the
    runner's null block) and the last block (the cache is over-allocated:
    a write to the -1 sentinel slot lands there) are never handed out."""

    block_size: int
    blocks_per_seq: int
    num_blocks: int
    block_tables: tuple[tuple[int, ...], ...]

    @property
    def context(self) -> int:
        return self.blocks_per_seq * self.block_size

    def slot(self, table: tuple[int, ...], position: int) -> int:
        block = table[position // self.block_size]
        return block * self.block_size + position % self.block_size

    def cp_slot(self, table: tuple[int, ...], position: int, width: int, interleave: int, rank: int) -> int:
        """The slot of ``position`` in context-parallel rank ``rank``'s cache
        (-1 when another rank holds it), as vLLM maps it: table entry ``j`` is
        a *virtual* block of ``block_size * width`` positions, dealt to the
        ranks in runs of ``interleave``; a rank stores its runs of a virtual
        block in order in its own block ``table[j]``."""
        if width == 1:
            return self.slot(table, position)
        virtual = self.block_size * width
        offset = position % virtual
        if (offset // interleave) % width != rank:
            return -1
        local = (offset // (width * interleave)) * interleave + offset % interleave
        return table[position // virtual] * self.block_size + local

    @classmethod
    def plan(cls, batch: int, max_length: int, block_size: int, seed: int) -> PagedLayout:
        if block_size <= 0 or DECODE_CONTEXT_MULTIPLE % block_size != 0:
            raise InputError(
                f"block size {block_size} must divide {DECODE_CONTEXT_MULTIPLE} "
                "(the decode context must be a multiple of 128 slots)"
            )
        context = -(-max_length // DECODE_CONTEXT_MULTIPLE) * DECODE_CONTEXT_MULTIPLE
        blocks_per_seq = context // block_size
        blocks = list(range(1, batch * blocks_per_seq + 1))
        random.Random(seed).shuffle(blocks)
        tables = tuple(tuple(blocks[b * blocks_per_seq : (b + 1) * blocks_per_seq]) for b in range(batch))
        return cls(block_size, blocks_per_seq, batch * blocks_per_seq + 2, tables)


@dataclass(frozen=True)
class Scenario:
    """Prompts (token ids), decode steps, KV layout and prefill plans of one
    validation. ``chunked`` and ``prefix_hit`` index the two cache-path
    prompts (None when the scenario has none)."""

    prompts: tuple[tuple[int, ...], ...]
    steps: int
    layout: PagedLayout
    seed: int = 0
    prompt_lengths: tuple[int, ...] = field(default=())
    chunked: int | None = None
    prefix_hit: int | None = None
    # per prompt, transformers' input embeddings ``[L, H]`` (what its forward computes from
    # the token ids): a run with them feeds these rows instead of the ids at ``embedded``
    # positions, as vllm_neuron's runner does with ``enable_prompt_embeds``
    prompt_embeds: tuple[Any, ...] | None = None
    # new tokens per sequence in each decode call: 1, or k + 1 as in a speculative decoding
    # verification step of k draft tokens (the runner's decode_token_threshold is then k + 1)
    decode_tokens: int = 1
    # the port built with on-device sampling and logprobs (the runner's default sampling):
    # its forward returns the sampled tokens and the logits, checked by ``sampled_output``
    on_device_sampling: bool = False

    def decode_calls(self) -> tuple[tuple[int, int], ...]:
        """``(first step, new tokens per sequence)`` of each decode call:
        ``decode_tokens`` steps at a time, the last call taking what is left."""
        return tuple(
            (step, min(self.decode_tokens, self.steps - step))
            for step in range(0, self.steps, self.decode_tokens)
        )

    def decode_width(self, step: int) -> int:
        """The new tokens per sequence of the decode call starting at ``step``."""
        return min(self.decode_tokens, self.steps - step)

    @staticmethod
    def embedded(position: int) -> bool:
        """Whether a prompt position is fed as an embedding in a run with
        prompt embeddings (every second one, so that each sequence-parallel
        slice has both kinds)."""
        return position % 2 == 1

    @property
    def batch(self) -> int:
        return len(self.prompts)

    @property
    def shared_blocks(self) -> int:
        return PREFIX_TOKENS // self.layout.block_size

    def shared_blocks_at(self, width: int) -> int:
        """Blocks of the shared prefix when each block holds ``width`` times
        ``block_size`` positions (a context-parallel cache's virtual blocks)."""
        return PREFIX_TOKENS // (self.layout.block_size * width)

    def sequences(self, cache_paths: bool) -> tuple[int, ...]:
        """The sequences a run feeds: every prompt, or without the cache paths
        the prompts prefilled whole only."""
        return tuple(b for b in range(self.batch) if cache_paths or b not in (self.chunked, self.prefix_hit))

    def prefill_plan(self, cache_paths: bool) -> tuple[PrefillCall, ...]:
        """The prefill calls in order: one per whole prompt, and with the
        cache paths the chunked prompt's two calls and the prefix-cache hit's
        call. The first call samples every position (each prompt position's
        logits are compared); the others only their last token, as the
        runner samples (a port that ignores ``sampling_positions``, or
        selects them the wrong way, returns other rows)."""
        calls: list[PrefillCall] = []
        for b in self.sequences(cache_paths):
            length = len(self.prompts[b])
            if b == self.chunked:
                calls += [
                    PrefillCall(b, 0, PREFIX_TOKENS, SEGMENT_SIZE),
                    PrefillCall(b, PREFIX_TOKENS, length, SEGMENT_SIZE),
                ]
            elif b == self.prefix_hit:
                calls.append(PrefillCall(b, PREFIX_TOKENS, length, SEGMENT_SIZE))
            else:
                calls.append(PrefillCall(b, 0, length))
        return tuple(call if i == 0 else replace(call, last_only=True) for i, call in enumerate(calls))

    def block_table(self, sequence: int, width: int = 1) -> tuple[int, ...]:
        """A sequence's block table; the prefix-cache hit's starts with the
        chunked prompt's blocks (those holding the shared prefix: fewer when
        a context-parallel cache's blocks are ``width`` times larger)."""
        table = self.layout.block_tables[sequence]
        if sequence == self.prefix_hit and self.chunked is not None:  # (set together)
            count = self.shared_blocks_at(width)
            shared = self.layout.block_tables[self.chunked][:count]
            return shared + table[count:]
        return table

    def replicas(self, sequences: tuple[int, ...], dp: int) -> list[tuple[int, ...]]:
        """The sequences of each of ``dp`` data-parallel replicas: the whole
        prompts dealt in contiguous runs (the first replicas take one more
        when they do not divide evenly), then the two cache-path prompts
        (which share blocks: one replica) to the replica with the fewest. Each
        replica has at least one whole prompt, so its first prefill is one."""
        whole = [b for b in sequences if b not in (self.chunked, self.prefix_hit)]
        if len(whole) < dp:
            raise InputError(f"{dp} data-parallel replicas need at least {dp} prompts prefilled whole")
        runs, first = [], 0
        for replica in range(dp):
            size = len(whole) // dp + (1 if replica < len(whole) % dp else 0)
            runs.append(list(whole[first : first + size]))
            first += size
        paths = [b for b in sequences if b in (self.chunked, self.prefix_hit)]
        if paths:
            smallest = min(range(dp), key=lambda r: (len(runs[r]), -r))
            runs[smallest] += paths
        return [tuple(run) for run in runs]

    @classmethod
    def build(
        cls,
        vocab_size: int,
        tp: int,
        steps: int = DEFAULT_STEPS,
        prompt_lengths: tuple[int, ...] | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        seed: int = 0,
        cache_paths: bool = False,
    ) -> Scenario:
        if steps < 1:
            raise InputError(f"--steps must be at least 1, got {steps}")
        if prompt_lengths is None:
            prompt_lengths = default_prompt_lengths(tp)
        for length in prompt_lengths:
            if length <= tp or length % tp != 0:
                raise InputError(
                    f"prompt length {length} must exceed and be divisible by the TP size {tp} "
                    "(sequence-parallel prefill)"
                )
        if len(set(prompt_lengths)) < 2:
            raise InputError("validation needs prompts of at least two different lengths")
        if PREFIX_TOKENS % block_size != 0:
            raise InputError(f"block size {block_size} must divide the {PREFIX_TOKENS}-token shared prefix")
        rng = random.Random(seed)
        prompts = [tuple(rng.randrange(vocab_size) for _ in range(n)) for n in prompt_lengths]
        chunked = prefix_hit = None
        if cache_paths:
            chunked, prefix_hit = len(prompts), len(prompts) + 1
            chunk = tuple(rng.randrange(vocab_size) for _ in range(CHUNKED_LENGTH))
            suffix = tuple(rng.randrange(vocab_size) for _ in range(PREFIX_HIT_LENGTH - PREFIX_TOKENS))
            prompts += [chunk, chunk[:PREFIX_TOKENS] + suffix]
        longest = max(len(p) for p in prompts)
        layout = PagedLayout.plan(len(prompts), longest + steps, block_size, seed)
        return cls(tuple(prompts), steps, layout, seed, tuple(prompt_lengths), chunked, prefix_hit)


def default_prompt_lengths(tp: int, count: int = len(DEFAULT_PROMPT_LENGTHS)) -> tuple[int, ...]:
    """The default lengths (``count`` of them: after the defaults, 16, 24,
    28, ...), raised to a multiple of ``tp`` above ``tp``."""
    extra = [16, 24] + [28 + 4 * k for k in range(max(0, count - 5))]
    lengths = []
    for length in (list(DEFAULT_PROMPT_LENGTHS) + extra)[: max(count, len(DEFAULT_PROMPT_LENGTHS))]:
        length = max(length, 2 * tp)
        lengths.append(-(-length // tp) * tp)
    return tuple(lengths)


def cache_paths_fit(tp: int) -> bool:
    """Whether the padded segmented calls meet the sequence-parallel rule at
    this TP size."""
    return SEGMENT_SIZE > tp and SEGMENT_SIZE % tp == 0


def segment_block_size(sliding_windows: list[int], default: int = DEFAULT_BLOCK_SIZE) -> int:
    """The block size of the run: ``default``, or a divisor of it that also
    divides every sliding window (the segmented kernel needs windows in
    whole blocks)."""
    size = default
    for window in sliding_windows:
        size = math.gcd(size, window)
    return size


def check_decode_tokens(decode_tokens: object, steps: int) -> int:
    """``--decode-tokens``: new tokens per sequence in each decode call, from 1
    to the run's decode steps (a call takes at most the steps left)."""
    if not isinstance(decode_tokens, int) or isinstance(decode_tokens, bool) or decode_tokens < 1:
        raise InputError(
            f"--decode-tokens must be a positive integer (1: one new token per decode step), got {decode_tokens!r}"
        )
    if decode_tokens > steps:
        raise InputError(
            f"--decode-tokens {decode_tokens} exceeds --steps {steps}: a decode call takes at most the "
            "steps left, so no call would feed that many tokens"
        )
    return decode_tokens
