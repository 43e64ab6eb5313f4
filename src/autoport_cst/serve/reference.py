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


class TeacherForcedLogits:
    """transformers' logits along a served sequence, in float32 and in
    bfloat16 (eager attention): ``logits(prompt, served)`` gives the rows that
    predict each served token, each computed on the prompt and the served
    tokens before it, as the bf16 check of ``bf16_checks`` compares them."""

    def __init__(self, checkpoint: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.models: dict[str, Any] = {
            name: AutoModelForCausalLM.from_pretrained(
                checkpoint, dtype=dtype, attn_implementation="eager"
            ).eval()
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }

    def logits(self, prompt_ids: list[int], served_ids: list[int]) -> tuple[Any, Any]:
        """(fp32 rows, bf16 rows), each ``[len(served_ids), vocab]`` in float32."""
        torch = self.torch
        ids = torch.tensor([list(prompt_ids) + list(served_ids)[:-1]])
        rows = slice(len(prompt_ids) - 1, None)
        with torch.no_grad():
            fp32, bf16 = (self.models[name](ids).logits[0, rows].float() for name in ("fp32", "bf16"))
        return fp32, bf16


class FP8CacheGreedyReference:
    """transformers' greedy generation with the port's FP8 KV cache, the
    validator's FP8 baseline (``validate.fp8_reference``): float32, eager,
    the prompt as one prefill forward (attending to its fresh K/V), then one
    forward per token, the cache storing K/V rounded through float8_e4m3fn
    with each layer's checkpoint scales. A correct FP8 port matches it to
    fp32 rounding, so its greedy tokens must be equal."""

    def __init__(self, checkpoint: str) -> None:
        import inspect

        import torch
        from transformers import AutoModelForCausalLM

        from autoport_cst.validate.fp8_reference import checkpoint_kv_scales

        self.torch = torch
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self.scales = checkpoint_kv_scales(checkpoint)
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self._memo: dict[tuple[int, ...], list[int]] = {}

    def tokens(self, prompt_ids: list[int], count: int) -> list[int]:
        from autoport_cst.validate.fp8_reference import _rounding_cache

        key = tuple(prompt_ids)
        if len(self._memo.get(key, [])) >= count:
            return self._memo[key][:count]
        torch = self.torch
        cache = _rounding_cache(self.model.config, self.scales)
        step, generated = list(prompt_ids), []
        with torch.no_grad():
            for _ in range(count):
                output = self.model(
                    input_ids=torch.tensor([step]), use_cache=True, **{self.cache_keyword: cache}
                )
                generated.append(int(torch.argmax(output.logits[0, -1])))
                step = generated[-1:]
        self._memo[key] = generated
        return generated
