"""transformers' greedy generation on the same checkpoint: what every
served completion must equal, token for token."""

from __future__ import annotations

from typing import Any


class GreedyReference:
    """The checkpoint in float32 with eager attention; ``tokens(prompt, n)``
    is its ``n`` greedy tokens after ``prompt`` (no stop at EOS: the server
    runs with ``ignore_eos``)."""

    def __init__(self, checkpoint: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self._memo: dict[tuple[int, ...], list[int]] = {}

    def tokens(self, prompt_ids: list[int], count: int) -> list[int]:
        key = tuple(prompt_ids)
        known = self._memo.get(key, [])
        if len(known) >= count:
            return known[:count]
        torch = self.torch
        ids = list(prompt_ids)
        with torch.no_grad():
            for _ in range(count):
                logits = self.model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
        self._memo[key] = ids[len(prompt_ids) :]
        return self._memo[key]
