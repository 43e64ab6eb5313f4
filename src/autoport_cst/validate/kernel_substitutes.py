"""A port's op-by-op attention substitutes, checked against the kernels they stand for.

A port whose attention does what no fused kernel does (softcapping, ALiBi, a
norm over all heads, ...) carries op-by-op substitutes of the kernels, written
by codemods from ``autoport_cst.transform.edit.kernels``:
``_flash_attention_unfused``, ``_segmented_attention_unfused`` and
``_attention_decode_unfused``. Each takes its kernel's arguments and layouts
and must compute what the kernel computes wherever it does not use an option
of its own. The model run drives only the layouts of the port's own calls
(4-D caches, queries as long as their keys), so a substitute edited wrongly
in a layout it still accepts (a one-KV-head 3-D cache, keys longer than the
queries, the K/V returned without a cache write) would validate, and the next
port of the architecture that passes that layout would be wrong.

So every validation of a package that defines one of them (a text search
first: packages without substitutes import nothing) imports the package with
the stand-in installed and runs each substitute it defines, next to the
stand-in kernel, on the cases below: seeded float32 inputs in every layout
the substitute documents, none of its own options set. Both sides get their
own copies of every tensor argument; they must return the same outputs and
leave the same caches (``torch.testing.assert_close`` at float32's default
tolerances). A case that differs, or that the substitute crashes on,
fails the validation, naming the function, the case and what differed
(``apply``); a case it refuses with ``NotImplementedError`` passes (a
substitute may refuse a layout by name, which is never a silently wrong
port). About 0.1 s of CPU for a port with all three substitutes.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoport_cst.transform.anatomy.attention import (
    UNFUSED_DECODE_CALL,
    UNFUSED_PREFILL_CALL,
    UNFUSED_SEGMENTED_CALL,
)

CHECK = "kernel substitute conformance"
KERNELS = {
    UNFUSED_PREFILL_CALL: "flash_attention",
    UNFUSED_SEGMENTED_CALL: "segmented_attention",
    UNFUSED_DECODE_CALL: "attention_decode",
}


@dataclass(frozen=True)
class Case:
    """One call of a kernel: a label and its keyword arguments."""

    label: str
    kwargs: dict[str, Any]


# -- cases --------------------------------------------------------------------------------------


def flash_cases() -> Iterator[Case]:
    """Whole prefill: heads-first and token-first layouts, grouped-query
    heads, windows, sinks, no causal mask, and keys longer than the queries
    (the queries are the last tokens)."""
    generator = torch.Generator().manual_seed(0)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator)

    for window, sink in ((None, False), (3, False), (None, True), (4, True)):
        kwargs = {"q": tensor(4, 16, 7), "k": tensor(2, 16, 7), "v": tensor(2, 7, 16)}
        kwargs.update(scale=0.3, sliding_window=window, tp_q=False, tp_out=True)
        kwargs["sink"] = tensor(4, 1) if sink else None
        yield Case(f"[heads, D, S] layouts, window {window}, sink {sink}", kwargs)
    for window, causal in ((None, True), (3, True), (None, False)):
        kwargs = {"q": tensor(4, 5, 16), "k": tensor(2, 9, 16), "v": tensor(2, 9, 16)}
        kwargs.update(tp_q=True, tp_k=True, causal_mask=causal, sliding_window=window)
        yield Case(f"5 queries over 9 keys, token-first, window {window}, causal {causal}", kwargs)


def segmented_cases() -> Iterator[Case]:
    """Chunked prefill over a cached prefix: 4-D caches and one-KV-head 3-D
    caches, windows and sinks, queries ``[heads, S, D]`` with the output
    ``[heads, D, S]``, and the other way round."""
    generator = torch.Generator().manual_seed(2)
    heads, d, prior, segment, block, blocks = 2, 8, 64, 512, 32, 24
    for kv_heads, window, sink, token_first in (
        (2, None, False, True),
        (2, 64, True, True),
        (1, 96, False, True),
        (2, 64, False, False),
    ):
        shape = (blocks, kv_heads, block, d) if kv_heads > 1 else (blocks, block, d)
        order = torch.randperm(blocks, generator=generator)[: (prior + segment) // block]
        q = torch.randn(heads, segment, d, generator=generator)
        kwargs = {
            "q": q if token_first else q.transpose(1, 2).contiguous(),
            "k_cache": torch.randn(*shape, generator=generator),
            "v_cache": torch.randn(*shape, generator=generator),
            "block_tables": order.view(1, -1).to(torch.int32),
            "prior_tokens": torch.tensor([prior]),
            "block_size": block,
            "kv_segment_size": segment,
            "scale": 0.35,
            "tp_q": token_first,
            "tp_out": token_first,
            "sliding_window": window,
            "sink": torch.randn(heads, 1, generator=generator) if sink else None,
        }
        layout = "" if token_first else ", queries [heads, D, S], output [heads, S, D]"
        yield Case(
            f"{kv_heads} KV heads ({len(shape)}-D caches), window {window}, sink {sink}{layout}", kwargs
        )


def decode_cases(gen_mask: Callable[..., torch.Tensor]) -> Iterator[Case]:
    """Decode: the cache written in the kernel and the K/V returned instead,
    masks given and built from ``pos_ids`` with a bounded gather, 3-D caches,
    two tokens per sequence, a step written at slot 0, QK norms before and after RoPE, sinks, windows,
    the fused input norm at the kernel's default epsilon with interleaved RoPE
    and the head-major output, over a zero-padded hidden size, and FP8 caches
    with the step quantized by its scales.
    ``gen_mask`` is the stand-in's ``gen_attention_decode_mask``."""
    variants = (
        "plain",
        "qk_norm",
        "post_rope_qk_norm",
        "sink",
        "window",
        "3d_cache",
        "two_tokens",
        "block_0",
    )
    for variant in variants:
        for update in (True, False):
            kwargs, positions, mask = decode_kwargs(len(variant), variant)
            pos_ids = positions.reshape(1, -1).float()
            start = (pos_ids - 20).clamp(min=0) if variant == "window" else None
            kwargs.update(
                attention_mask=gen_mask(pos_ids=pos_ids, start_pos=start, **mask), update_cache=update
            )
            kwargs.update(_decode_variant(variant, kwargs, mask["q_head"]))
            yield Case(f"{variant}, update_cache {update}", kwargs)
    for window in (None, 20):
        kwargs, positions, _ = decode_kwargs(4, "plain")
        pos_ids = positions.reshape(1, -1).float()
        kwargs.update(
            pos_ids=pos_ids,
            swa_start_pos_ids=None if window is None else (pos_ids - (window - 1)).clamp(min=0),
            max_context_len=(positions.max() + 1).reshape(1).to(torch.int32),
            update_cache=True,
        )
        yield Case(f"mask from pos_ids, bounded gather, window {window}", kwargs)
    kwargs, positions, mask = decode_kwargs(5, "plain")
    kwargs.update(attention_mask=_position_mask(gen_mask, positions, mask), update_cache=True)
    kwargs.update(rmsnorm_X_enabled=True, rmsnorm_X_gamma=torch.randn(1, 32))  # the kernel's epsilon
    kwargs.update(rope_contiguous_layout=False, W_out=None, bias_out=None)
    yield Case("fused input norm at the default epsilon, interleaved RoPE, head-major output", kwargs)
    yield _padded_input_norm(gen_mask, 24, "plain")
    yield _padded_input_norm(gen_mask, 2, "two_tokens")
    yield from _fp8_cache(gen_mask)


def _position_mask(
    gen_mask: Callable[..., torch.Tensor], positions: torch.Tensor, mask: dict
) -> torch.Tensor:
    """The causal decode mask of ``positions`` [B, S] with ``decode_kwargs``' sizes ``mask``."""
    return gen_mask(pos_ids=positions.reshape(1, -1).float(), **mask)


def _fp8_cache(gen_mask: Callable[..., torch.Tensor]) -> Iterator[Case]:
    """FP8 caches with the step's K/V quantized by ``k_scale`` and
    ``v_scale`` (unequal, one a fraction), the cache written and not."""
    for update in (True, False):
        kwargs, positions, mask = decode_kwargs(12, "plain")
        kwargs.update(
            attention_mask=_position_mask(gen_mask, positions, mask),
            update_cache=update,
            K_cache=kwargs["K_cache"].to(torch.float8_e4m3fn),
            V_cache=kwargs["V_cache"].to(torch.float8_e4m3fn),
            k_scale=torch.tensor([2.0]),
            v_scale=torch.tensor([0.5]),
        )
        yield Case(f"FP8 cache with k_scale and v_scale, update_cache {update}", kwargs)


def _padded_input_norm(gen_mask: Callable[..., torch.Tensor], width: int, variant: str) -> Case:
    """The fused input norm over a zero-padded hidden size: ``X`` is 32 wide,
    its real width ``width`` (``X_hidden_dim_actual``), the columns past it
    zero, and the mean of squares divides by the real width. Run at a real
    width of 24 and at one equal to the tokens per sequence (2, two tokens a
    step): the one width at which a norm that reads the token axis for the
    hidden one still takes the padded branch's count."""
    kwargs, positions, mask = decode_kwargs(6, variant)
    kwargs["X"][..., width:] = 0.0
    gamma = torch.randn(1, 32, generator=torch.Generator().manual_seed(6))
    kwargs.update(
        attention_mask=_position_mask(gen_mask, positions, mask),
        update_cache=True,
        rmsnorm_X_enabled=True,
        rmsnorm_X_eps=1e-5,
        rmsnorm_X_gamma=gamma,
        X_hidden_dim_actual=width,
    )
    tokens = positions.shape[-1]
    return Case(
        f"fused input norm over a zero-padded hidden size (X_hidden_dim_actual {width} of 32, "
        f"{tokens} token{'s' if tokens > 1 else ''} a step)",
        kwargs,
    )


def decode_kwargs(seed: int, variant: str) -> tuple[dict[str, Any], torch.Tensor, dict[str, int]]:
    """Two sequences in the kernel's layouts (caches ``[blocks, Nkv, block,
    Dh]``, or 3-D with one KV head), their positions and the mask's sizes."""
    generator = torch.Generator().manual_seed(seed)
    kv_heads, seq = (1 if variant == "3d_cache" else 2), (2 if variant == "two_tokens" else 1)
    batch, hidden, d, q_heads, block, blocks = 2, 32, 8, 4, 32, 4
    shape = (1 + batch * blocks, kv_heads, block, d) if kv_heads > 1 else (1 + batch * blocks, block, d)
    # "block_0": the second sequence's step written at slot 0 (block 0 is a block like any other to the kernel)
    table = torch.tensor([[4, 2, 6, 8], [1, 3, 0 if variant == "block_0" else 5, 7]], dtype=torch.int32)
    second = 64 if variant == "block_0" else 90
    positions = torch.tensor([[37 + i for i in range(seq)], [second + i for i in range(seq)]])  # [B, S]
    slots = torch.stack(
        [table[b, positions[b] // block] * block + positions[b] % block for b in range(batch)]
    )
    angles = torch.randn(d // 2, batch, seq, generator=generator)
    width = (q_heads + 2 * kv_heads) * d
    kwargs = {
        "X": torch.randn(batch, seq, hidden, generator=generator),
        "K_cache": torch.randn(*shape, generator=generator),
        "V_cache": torch.randn(*shape, generator=generator),
        "W_qkv": torch.randn(hidden, width, generator=generator) * 0.2,
        "bias_qkv": torch.randn(1, width, generator=generator),
        "active_blocks_table": table,
        "cos": angles.cos(),
        "sin": angles.sin(),
        "softmax_scale": 0.4,
        "kv_cache_update_idx": slots.to(torch.uint32),
        "W_out": torch.randn(q_heads * d, hidden, generator=generator),
        "bias_out": torch.randn(1, hidden, generator=generator),
        "rope_contiguous_layout": True,
    }
    mask = {"q_head": q_heads, "s_active": seq, "s_prior": blocks * block, "block_len": block, "bs": batch}
    return kwargs, positions, mask


def _decode_variant(variant: str, kwargs: dict[str, Any], q_heads: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(11)
    d = kwargs["cos"].shape[0] * 2
    if variant in ("qk_norm", "post_rope_qk_norm"):
        stage, eps = ("pre", 1e-6) if variant == "qk_norm" else ("post", 1e-5)
        prefix = f"rmsnorm_QK_{stage}_rope"
        w_q, w_k = torch.randn(1, d, generator=generator), torch.randn(1, d, generator=generator)
        return {f"{prefix}_enabled": True, f"{prefix}_eps": eps, f"{prefix}_W_Q": w_q, f"{prefix}_W_K": w_k}
    if variant == "sink":
        return {"sink": torch.randn(q_heads, 1, generator=generator)}
    return {}


# -- running ------------------------------------------------------------------------------------


def cases_for(name: str, nf: Any) -> list[Case]:
    """The cases of the substitute ``name``; ``nf`` is the stand-in's functional module."""
    if name == UNFUSED_PREFILL_CALL:
        return list(flash_cases())
    if name == UNFUSED_SEGMENTED_CALL:
        return list(segmented_cases())
    return list(decode_cases(nf.gen_attention_decode_mask))


def _copied(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()}


def mismatch(substitute: Callable, kernel: Callable, case: Case) -> str | None:
    """What differs between the substitute and the kernel on ``case`` (their
    outputs, or a tensor argument either wrote), or None."""
    ours, theirs = _copied(case.kwargs), _copied(case.kwargs)
    expected = kernel(**theirs)
    try:
        actual = substitute(**ours)
    except NotImplementedError:  # refused by name, as a substitute may: never silently wrong
        return None
    except Exception as error:  # the substitute's own failure is the finding
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__]
        where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return f"raised {type(error).__name__}{where}: {' '.join(str(error).split())[:300]}"
    pairs = [("output", actual, expected)]
    pairs += [
        (f"{key} after the call", ours[key], v) for key, v in theirs.items() if isinstance(v, torch.Tensor)
    ]
    for label, mine, kernels in pairs:
        try:
            torch.testing.assert_close(mine, kernels)
        except AssertionError as error:
            return f"{label}: {' '.join(str(error).split())[:400]}"
    return None


def check_functions(functions: dict[str, Callable], nf: Any) -> list[str]:
    """Every failing case of ``functions`` (substitute name -> function)."""
    failures = []
    for name, function in sorted(functions.items()):
        kernel = getattr(nf, KERNELS[name])
        for case in cases_for(name, nf):
            found = mismatch(function, kernel, case)
            if found is not None:
                failures.append(f"{name} differs from NF.{KERNELS[name]} on {case.label}: {found}")
    return failures


def defining_files(package_dir: Path) -> list[Path]:
    """The package's files that define a substitute (a text search)."""
    heads = [f"def {name}(" for name in KERNELS]
    return [path for path in sorted(package_dir.glob("*.py")) if any(h in path.read_text() for h in heads)]


def substitutes_of(package_name: str, files: list[Path]) -> dict[str, Callable]:
    """The substitutes the imported package's ``files`` define, by name (the
    modules imported here: a package imports its model module lazily)."""
    found: dict[str, Callable] = {}
    for path in files:
        name = package_name if path.stem == "__init__" else f"{package_name}.{path.stem}"
        module = importlib.import_module(name)
        for substitute in KERNELS:
            function = vars(module).get(substitute)
            if callable(function) and function.__module__ == name:
                found[substitute] = function
    return found


def check_package(package_dir: Path, checkpoint: Path) -> list[str] | None:
    """The failing cases of the package's substitutes; None when it defines
    none. Once per content of the defining files in a process (the follow-up
    runs of a validation ask again)."""
    files = defining_files(package_dir)
    if not files:
        return None
    key = tuple((str(path.resolve()), path.read_text()) for path in files)
    if key not in _CHECKED:
        _CHECKED.clear()
        _CHECKED[key] = _checked(package_dir, files, checkpoint)
    return _CHECKED[key]


_CHECKED: dict[tuple, list[str] | None] = {}


def _checked(package_dir: Path, files: list[Path], checkpoint: Path) -> list[str] | None:
    from .package import imported_package
    from .standin import functional, standin_installed

    with (
        standin_installed(model=str(checkpoint)),
        imported_package(package_dir) as package,
    ):
        functions = substitutes_of(package.module.__name__, files)
        return check_functions(functions, functional) if functions else None


def apply(report: Any, package_dir: Path, checkpoint: Path) -> None:
    """The check of the package's substitutes into ``report``: its settings
    say it ran; every failing case fails the report, named after the check."""
    from .report import fail_at_check

    failures = check_package(package_dir, checkpoint)
    if failures is None:
        return
    report.settings["kernel_substitutes"] = "checked against the stand-in kernels"
    fail_at_check(report, CHECK, failures)
