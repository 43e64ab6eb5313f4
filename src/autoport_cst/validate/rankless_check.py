"""The rank-less forward check a run with embedding DP > 1 drives.

The causal LM's forward of every text reference declares ``rank:
torch.Tensor | None = None`` and gives ``None`` a meaning: the embedding,
the LM head's padding mask and the sampler fall back to their own group's
rank (llama3, qwen3_moe, gpt_oss, smollm3, starcoder2: ``embedding_rank =
rank``, shifted to the embedding TP group only ``if rank is not None and
self.embedding_dp_size > 1``, and ``lm_head_rank`` the LM-head TP group's
rank unless ``rank`` is given; qwen3 and deepseek_v3 hand ``rank`` on as it
is). vllm_neuron's runner, and every other call the validator makes, passes
the rank tensor, so a port that breaks the ``None`` path (that ``and``
turned into ``or``: ``None + int``, the mutation benchmark's mixtral:1219)
validated. That path differs from the rank-given one only where the
embedding's group is not the TP group: the decode graph of a run with
embedding DP > 1.

So every such run (the parallel layouts ``DP 2 (MLP, embedding, LM head)``
and ``embedding DP 2``, or ``validate --embedding-dp 2``) of a port whose
reference declares the default (``declared_default``: the ``forward`` of
the reference's factory class, the one defining ``from_configs``, has a
``rank`` parameter defaulting to None; read from the reference the port was
applied from, as ``sp_length_check`` reads its rule, never from the port
alone) goes on, on each rank after its run, to ONE more decode call: the
run's last decode step again, the same inputs, ``rank`` omitted (``probe``).
It rewrites the step's KV-cache slots with what the step wrote there, after
the run's outputs were taken, so no other check sees it. It passes when its
logits equal, bit for bit (the same inputs on the same rank: every text
reference gives them), the logits of the run's call of that step with
``rank``; a call that raises, or other logits, fails the run, naming the
check (``apply``). Only runs without on-device sampling ask (the layouts
above): the sampler is not driven without ``rank``, as the references
themselves refuse it there (qwen3 and deepseek_v3 hand the Sampler
``tp_rank=None``, the others an int where it needs a tensor: the stand-in
refuses both, as vllm_neuron's Sampler does).

Cost: one decode step of the tiny model per rank, on the two layouts that
ask (4 calls per default validation): 0.003 to 0.014 s of CPU per rank
(``time.process_time`` in the rank; the report's ``port_rankless_check_cpu``,
the ranks' largest) for the tiny checkpoints of the seven text references,
and 0.02 s once per process to read the reference's forward: under 0.1 s of
a default validation's 14 to 20 s.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

CHECK = "forward without rank"


def declared_default(package_dir: str | Path) -> str | None:
    """Where the port's reference declares ``rank=None`` on its causal LM's
    forward (``"reference qwen3_moe (model.py)"``), or None: the port is not asked."""
    from .reference_source import reference_of

    source, directory = reference_of(package_dir)
    for path in sorted(directory.glob("*.py")):
        if _declares_in(str(path), path.stat().st_mtime_ns):
            return f"{source} ({path.name})"
    return None


@functools.lru_cache(maxsize=32)
def _declares_in(path: str, _mtime: int) -> bool:
    """Whether a class of the module at ``path`` defining ``from_configs`` has
    a ``forward`` whose ``rank`` defaults to None."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        if "from_configs" in methods and "forward" in methods:
            return _rank_defaults_to_none(methods["forward"].args)
    return False


def _rank_defaults_to_none(args: ast.arguments) -> bool:
    positional = [*args.posonlyargs, *args.args]
    with_default = positional[len(positional) - len(args.defaults) :]
    defaults = {a.arg: d for a, d in zip(with_default, args.defaults, strict=True)}
    defaults.update(
        {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    )
    found = defaults.get("rank")
    return isinstance(found, ast.Constant) and found.value is None


# -- in the rank ---------------------------------------------------------------


def probe(session: Any, teacher: list[list[int]], output: Any) -> list[dict[str, Any]]:
    """The last decode step of a ``LayoutSession``'s run again, ``rank``
    omitted, against the logits the run's call gave: one entry."""
    from .port_failure import PortFailure

    step = session.scenario.steps - 1
    batch = session.decode_batch
    tokens = [0 if b is None else teacher[b][step] for b in batch]
    asked = f"decode step {step} again with rank omitted (embedding DP {session.layout.embedding_dp})"
    try:
        logits = session.decode_again(step, tokens, batch, with_rank=False)
    except PortFailure as failure:
        return [_entry(False, f"{asked} raised: {failure.message}")]
    given = output.decode_logits[step]
    logits = logits[: given.shape[0]]
    if logits.shape != given.shape:
        return [
            _entry(False, f"{asked} returned logits of shape {list(logits.shape)}, not {list(given.shape)}")
        ]
    if not bool((logits == given).all()):
        difference = float((logits.float() - given.float()).abs().max())
        return [
            _entry(
                False, f"{asked}: its logits differ from the call with rank given (max |d| {difference:.3g})"
            )
        ]
    return [_entry(True, f"{asked}: the same logits as the call with rank given")]


def _entry(passed: bool, message: str) -> dict[str, Any]:
    return {"passed": passed, "message": message}


# -- in the parent -------------------------------------------------------------


def merged(per_rank: list[list[dict[str, Any]] | None]) -> list[dict[str, Any]] | None:
    """The ranks' entries as one: every failing rank's, named, in one entry
    (a rank that raised ends the collectives of the others, which then fail
    in them: its own error is among them), else rank 0's; None when no rank
    was asked."""
    failing = [
        f"rank {rank}: {entry['message']}"
        for rank, entries in enumerate(per_rank)
        for entry in entries or []
        if not entry["passed"]
    ]
    if failing:
        return [_entry(False, "; ".join(failing))]
    return per_rank[0] if per_rank and per_rank[0] is not None else None


def apply(report: Any, entries: list[dict[str, Any]] | None) -> None:
    """The check's outcome into ``report``: its settings say what was asked;
    a failing entry fails the report, named after the check."""
    from .report import record_check

    record_check(report, CHECK, "rankless_check", entries)
