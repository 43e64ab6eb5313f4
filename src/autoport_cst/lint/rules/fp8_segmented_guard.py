"""NRN009 fp8-segmented-guard."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.index import FunctionInfo, Site
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.cst.vocabulary import dotted, string_value

GUARD = "validate_fp8_segmented_supported"
SEGMENTED = frozenset({"segmented_attention", "segmented_attention_cp"})
# names that say the module may run with an FP8 KV cache
FP8_CACHE_MARKERS = frozenset(
    {
        "k_scale",
        "kv_cache_dtype",
        "cache_dtype",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    }
)


class Fp8SegmentedGuard(Rule):
    """A forward-path call of ``NF.segmented_attention`` or
    ``NF.segmented_attention_cp`` in a module that may run with an FP8 KV
    cache, with no ``validate_fp8_segmented_supported(...)`` call before it.

    A module may run with an FP8 KV cache when it names ``k_scale``,
    ``kv_cache_dtype``, ``cache_dtype`` or a ``torch.float8_*`` dtype (the
    FP8 branches of the references: scales read by ``_load_kv_cache_scales``,
    ``self.k_cache.dtype in _FP8_DTYPES``).

    Why: the segmented (chunked or prefix-cached) prefill kernel reads an FP8
    K cache only in the packed layout. Given a non-packed FP8 cache, its K load
    asserts on the device and the run aborts inside the kernel. The references
    call ``validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)``
    first, which raises ``NotImplementedError`` with a clear message instead
    (``validate`` lints a port before it runs it, so a port with this finding
    does not validate: ``validate/lint_gate.py``).

    "Before it" means: a guard call earlier in the same function or in an
    enclosing function, or, when the function is reached from other functions
    of the file, before the call that reaches it in every one of them. A
    guard in another branch of the same function counts (the references guard
    the plain chunked branch and reach ``segmented_attention_cp`` in the
    context-parallel branch of the same function); the rule does not follow
    conditions.

    Fix: ``fp8-segmented-guard`` calls the guard right before each reported
    kernel call, on the call's own ``k_cache`` (not packed); ``apply`` runs it
    as a repair step on a reference that breaks this rule (the real
    vllm_neuron qwen3 does), so its ports pass ``validate``'s lint gate.

    Example::

        if kv_segment_size:
            attn = NF.segmented_attention(q, k_cache=self.k_cache, ...)          # NRN009
        if kv_segment_size:
            validate_fp8_segmented_supported(self.k_cache.dtype in _FP8_DTYPES, fp8_packed=False)
            attn = NF.segmented_attention(q, k_cache=self.k_cache, ...)          # fine
    """

    CODE = "NRN009"
    NAME = "fp8-segmented-guard"
    MESSAGE = "segmented attention with a possibly FP8 KV cache and no validate_fp8_segmented_supported guard"
    SCOPE = "forward"
    FIX = "fp8-segmented-guard"
    REPAIR = True

    VALID = (
        Valid(
            """
            class Attention(nn.Module):
                def __init__(self, config):
                    self.k_scale = None

                def forward(self, q, attn_metadata):
                    kv_is_fp8 = self.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
                    if attn_metadata["kv_segment_size"] and self.dcp_size <= 1:
                        validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
                    if self.dcp_size > 1:
                        return NF.segmented_attention_cp(q, k_cache=self.k_cache)
                    return NF.segmented_attention(q, k_cache=self.k_cache)
            """,
            title="guarded earlier in the same function",
        ),
        Valid(
            """
            class Attention(nn.Module):
                def forward(self, q):
                    self.k_scale_float = 1.0
                    validate_fp8_segmented_supported(self.k_cache.dtype == torch.float8_e4m3fn, fp8_packed=False)
                    return self._segmented(q)

                def _segmented(self, q):
                    return NF.segmented_attention(q, k_cache=self.k_cache)
            """,
            title="guarded by the only caller",
        ),
        Valid(
            """
            class Attention(nn.Module):
                def forward(self, q, meta):
                    return NF.segmented_attention(q, k_cache=self.k_cache, kv_segment_size=meta.size)
            """,
            title="no FP8 cache in the module",
        ),
    )
    INVALID = (
        Invalid(
            """
            import torch


            class Attention(nn.Module):
                def __init__(self, config):
                    self.k_scale = None

                def forward(self, q, kv_segment_size):
                    if kv_segment_size:
                        attn = NF.segmented_attention(q, k_cache=self.k_cache)
                        validate_fp8_segmented_supported(True, fp8_packed=False)
                        return attn
                    return NF.flash_attention(q)
            """,
            at=((10, 20),),
            message="validate_fp8_segmented_supported",
            fixable=True,
            title="the guard comes after the kernel",
        ),
        Invalid(
            """
            import torch


            class Attention(nn.Module):
                def forward(self, q, kv_cache_dtype):
                    validate_fp8_segmented_supported(kv_cache_dtype == "fp8", fp8_packed=False)
                    return self._segmented(q)

                def forward_chunked(self, q):
                    return self._segmented(q)

                def _segmented(self, q):
                    return NF.segmented_attention_cp(q, k_cache=self.k_cache)
            """,
            at=((13, 16),),
            fixable=True,
            title="one caller guards, another does not",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        self.fp8_cache = False
        self.order: dict[int, int] = {}  # id(call) -> its rank in the traversal
        self.guards: dict[FunctionInfo, list[int]] = {}
        self.kernels: list[tuple[cst.Call, str, int, Site]] = []

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in FP8_CACHE_MARKERS:
            self.fp8_cache = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if string_value(node) in FP8_CACHE_MARKERS:
            self.fp8_cache = True

    def visit_Call(self, node: cst.Call) -> None:
        rank = len(self.order)
        self.order[id(node)] = rank
        fn = self.ctx.function
        if fn is None:
            return
        name = dotted(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last == GUARD:
            self.guards.setdefault(fn, []).append(rank)
        elif last in SEGMENTED and not name.startswith(("self.", "cls.")):
            self.kernels.append((node, name, rank, self.ctx.site()))

    def finish(self) -> None:
        if not self.fp8_cache or not self.kernels:
            return
        path = self.ctx.forward_path()
        for node, name, rank, site in self.kernels:
            fn = site.function
            if fn is None or fn not in path or self._guarded(fn, rank, path, frozenset()):
                continue
            self.report(
                node.func,
                f"`{name}` on the forward path of a module with an FP8 KV cache, and no "
                f"`{GUARD}(...)` before it: on the device the segmented kernel asserts on a "
                "non-packed FP8 K cache (call the guard first for a clear error)",
                site=site,
            )

    def _guarded(self, fn: FunctionInfo, before: int, path: set[FunctionInfo], seen: frozenset) -> bool:
        """Whether a guard runs before the call ranked ``before`` in ``fn``."""
        scope: FunctionInfo | None = fn
        while scope is not None:  # fn, then the functions it is nested in
            if any(rank < before for rank in self.guards.get(scope, ())):
                return True
            scope = scope.parent
        if fn in seen:
            return False
        index = self.ctx.index
        callers = [
            (caller, call) for caller in path for call in caller.calls if fn in index.resolve(caller, call)
        ]
        return bool(callers) and all(
            self._guarded(caller, self.order[id(call.node)], path, seen | {fn}) for caller, call in callers
        )
