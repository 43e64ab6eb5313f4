"""What the port computed while serving: calls, rows and tokens per phase,
and the prompt tokens vLLM's prefix cache supplied. The benchmark and the
smoke test read them to show the prefill work prefix caching saves."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class StepStats:
    prefill_calls: int = 0
    prefill_rows: int = 0  # rows computed, padding included
    prefill_tokens: int = 0  # scheduled prompt tokens computed
    decode_calls: int = 0
    decode_rows: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    prefill_seconds: float = 0.0  # in the port's forward
    decode_seconds: float = 0.0
    step_seconds: float = 0.0  # in execute_model, the plugin's own work included

    def record(self, call: Any, seconds: float = 0.0) -> None:
        if call.stage == "prefill":
            self.prefill_calls += 1
            self.prefill_rows += call.rows
            self.prefill_tokens += call.new_tokens
            self.prefill_seconds += seconds
        else:
            self.decode_calls += 1
            self.decode_rows += call.rows
            self.decode_seconds += seconds

    def cached_at_admission(self, tokens: int) -> None:
        self.cached_prompt_tokens += tokens

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
