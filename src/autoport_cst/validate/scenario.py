"""What a validation run feeds the models: prompts of different lengths,
the number of decode steps, and the paged KV-cache layout the port runs with.

Everything is a plain, picklable value, so TP ranks in other processes get
exactly the same scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from autoport_cst.errors import InputError

DEFAULT_PROMPT_LENGTHS = (8, 12, 20)
DEFAULT_STEPS = 16
DEFAULT_BLOCK_SIZE = 32
DECODE_CONTEXT_MULTIPLE = 128  # the decode kernel needs s_prior % 128 == 0


@dataclass(frozen=True)
class PagedLayout:
    """Block tables of a paged KV cache: sequence ``b`` owns the blocks
    ``block_tables[b]`` (not contiguous: the order is shuffled so that a port
    that ignores the block table reads the wrong blocks)."""

    block_size: int
    blocks_per_seq: int
    num_blocks: int
    block_tables: tuple[tuple[int, ...], ...]

    @property
    def context(self) -> int:
        return self.blocks_per_seq * self.block_size

    def slot(self, sequence: int, position: int) -> int:
        block = self.block_tables[sequence][position // self.block_size]
        return block * self.block_size + position % self.block_size

    @classmethod
    def plan(cls, batch: int, max_length: int, block_size: int, seed: int) -> "PagedLayout":
        if block_size <= 0 or DECODE_CONTEXT_MULTIPLE % block_size != 0:
            raise InputError(
                f"block size {block_size} must divide {DECODE_CONTEXT_MULTIPLE} "
                "(the decode context must be a multiple of 128 slots)"
            )
        context = -(-max_length // DECODE_CONTEXT_MULTIPLE) * DECODE_CONTEXT_MULTIPLE
        blocks_per_seq = context // block_size
        # block 0 is never handed out, like a runner's null block
        blocks = list(range(1, batch * blocks_per_seq + 1))
        random.Random(seed).shuffle(blocks)
        tables = tuple(
            tuple(blocks[b * blocks_per_seq : (b + 1) * blocks_per_seq]) for b in range(batch)
        )
        return cls(block_size, blocks_per_seq, batch * blocks_per_seq + 1, tables)


@dataclass(frozen=True)
class Scenario:
    """Prompts (token ids), decode steps and KV layout of one validation."""

    prompts: tuple[tuple[int, ...], ...]
    steps: int
    layout: PagedLayout
    seed: int = 0
    prompt_lengths: tuple[int, ...] = field(default=())

    @property
    def batch(self) -> int:
        return len(self.prompts)

    @classmethod
    def build(
        cls,
        vocab_size: int,
        tp: int,
        steps: int = DEFAULT_STEPS,
        prompt_lengths: tuple[int, ...] | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        seed: int = 0,
    ) -> "Scenario":
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
        rng = random.Random(seed)
        prompts = tuple(tuple(rng.randrange(vocab_size) for _ in range(n)) for n in prompt_lengths)
        layout = PagedLayout.plan(len(prompts), max(prompt_lengths) + steps, block_size, seed)
        return cls(prompts, steps, layout, seed, tuple(prompt_lengths))


def default_prompt_lengths(tp: int) -> tuple[int, ...]:
    """The default lengths, raised to a multiple of ``tp`` above ``tp``."""
    lengths = []
    for length in DEFAULT_PROMPT_LENGTHS:
        length = max(length, 2 * tp)
        lengths.append(-(-length // tp) * tp)
    return tuple(lengths)
