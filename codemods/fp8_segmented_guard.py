"""fp8-segmented-guard: a non-packed FP8 KV cache is refused before the segmented prefill kernel."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, dotted, keyword_arg, nodes_of
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.moe import module_imports_name
from autoport_cst.transform.edit.tree import preceded_under_its_comments, rewrite, with_comment

RULE = "NRN009"
GUARD = "validate_fp8_segmented_supported"
GUARD_MODULE = "vllm_neuron.utils.dtype_utils"
FP8_DTYPES = "(torch.float8_e4m3fn, torch.float8_e5m2)"
COMMENT = (
    "<-- QUANTIZATION: a non-packed FP8 K cache is refused here; the segmented kernel would assert on it"
)


class Fp8SegmentedGuard(Codemod):
    """Call ``validate_fp8_segmented_supported`` before each segmented
    attention kernel that lint rule NRN009 finds unguarded.

    The segmented (chunked or prefix-cached) prefill kernels
    (``NF.segmented_attention``, ``NF.segmented_attention_cp``) read an FP8 K
    cache only in the packed layout; given a non-packed one they assert on the
    device. The guard raises ``NotImplementedError`` with a clear message
    instead. The real vllm_neuron qwen3 calls the kernel without it, so every
    port written from it failed the lint gate of ``validate`` on an error its
    reference carries; ``apply`` runs this codemod as a repair step on such a
    reference.

    Each call NRN009 reports (on the forward path of a module that may run
    with an FP8 KV cache, with no guard before it in its function, an
    enclosing one or every caller) gets, right before its statement,
    ``validate_fp8_segmented_supported(<k_cache>.dtype in
    (torch.float8_e4m3fn, torch.float8_e5m2), fp8_packed=False)``, where
    ``<k_cache>`` is the call's own ``k_cache=`` argument; the guard is
    imported from ``vllm_neuron.utils.dtype_utils``. Nothing is computed
    differently on any run that does not use an FP8 cache with that kernel:
    those runs now stop with the guard's message where the device asserted.

    Preconditions (refused, positioned, naming the call): the call is the whole
    value of its statement (an expression, assignment or ``return``: a guard
    before the statement then runs exactly when the kernel does); it passes
    ``k_cache=``; the module imports ``torch``; and the module names no
    ``fp8_packed`` (a module that may pack its FP8 cache needs the guard told
    so, which this codemod cannot know).
    """

    ID = "fp8-segmented-guard"
    PURPOSE = "repair"
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="an unguarded segmented prefill in a module with an FP8 cache",
            before="""
                import torch
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX


                class Qwen3Attention(nn.Module):
                    def forward_prefill(self, q, kv_segment_size):
                        if self.k_cache.dtype in [torch.float8_e4m3fn, torch.float8_e5m2]:
                            q = q * FP8_CLAMP_MAX
                        if kv_segment_size:
                            attn_output = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        return attn_output

                    def forward(self, q, kv_segment_size):
                        return self.forward_prefill(q, kv_segment_size)
            """,
            after="""
                import torch
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX, validate_fp8_segmented_supported


                class Qwen3Attention(nn.Module):
                    def forward_prefill(self, q, kv_segment_size):
                        if self.k_cache.dtype in [torch.float8_e4m3fn, torch.float8_e5m2]:
                            q = q * FP8_CLAMP_MAX
                        if kv_segment_size:
                            # <-- QUANTIZATION: a non-packed FP8 K cache is refused here; the segmented kernel would assert on it
                            validate_fp8_segmented_supported(self.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2), fp8_packed=False)
                            attn_output = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        return attn_output

                    def forward(self, q, kv_segment_size):
                        return self.forward_prefill(q, kv_segment_size)
            """,
        ),
        Example(
            title="already guarded: unchanged",
            before="""
                import torch
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.dtype_utils import validate_fp8_segmented_supported


                class Attention(nn.Module):
                    def forward(self, q):
                        kv_is_fp8 = self.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
                        validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
                        return NF.segmented_attention(q, k_cache=self.k_cache)
            """,
            after="""
                import torch
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.dtype_utils import validate_fp8_segmented_supported


                class Attention(nn.Module):
                    def forward(self, q):
                        kv_is_fp8 = self.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
                        validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
                        return NF.segmented_attention(q, k_cache=self.k_cache)
            """,
        ),
        Example(
            title="the kernel inside a larger expression: a guard before the statement would run when it does not",
            before="""
                import torch


                class Attention(nn.Module):
                    def forward(self, q, segmented):
                        self.k_scale = None
                        return NF.segmented_attention(q, k_cache=self.k_cache) if segmented else NF.flash_attention(q)
            """,
            raises="is not the whole value of its statement",
        ),
        Example(
            title="a module that may pack its FP8 cache",
            before="""
                import torch


                class Attention(nn.Module):
                    def forward(self, q):
                        fp8_packed = self.k_cache.dtype == torch.float8_e4m3fn
                        return NF.segmented_attention(q, k_cache=self.k_cache)
            """,
            raises="names fp8_packed",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        calls = _unguarded_calls(module, ctx.path)
        if not calls:
            return module
        _check_module(module, ctx, calls[0])
        edits = {}
        for call in calls:
            statement = _statement_of(module, call, ctx)
            k_cache = keyword_arg(call, "k_cache")
            if k_cache is None:
                raise ctx.refuse(
                    f"{dotted(call.func)}(...) passes no k_cache=: the guard's FP8 test reads that cache",
                    call,
                    module,
                )
            guard = parse_statement(
                f"{GUARD}({code_of(k_cache.value)}.dtype in {FP8_DTYPES}, fp8_packed=False)", module
            )
            edits[id(statement)] = preceded_under_its_comments(with_comment(guard, COMMENT))
        return ensure_import_from(rewrite(module, edits), GUARD_MODULE, GUARD)


def _unguarded_calls(module: cst.Module, path: str) -> list[cst.Call]:
    """The kernel calls NRN009 reports in ``module``, found by the rule itself
    (its positions matched to the calls' ``func``)."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    from autoport_cst.lint import lint_source

    found = {(d.line, d.column) for d in lint_source(module.code, path, select=[RULE], module=module)}
    if not found:
        return []
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    calls = []
    for call in nodes_of(module, cst.Call):
        where = positions.get(call.func)
        if where is not None and (where.start.line, where.start.column + 1) in found:
            calls.append(call)
    return calls


def _check_module(module: cst.Module, ctx: FileContext, first: cst.Call) -> None:
    keywords = {id(arg.keyword) for arg in nodes_of(module, cst.Arg) if arg.keyword is not None}
    names = {node.value for node in nodes_of(module, cst.Name) if id(node) not in keywords}
    if "fp8_packed" in names:  # a guard's own fp8_packed= keyword does not count
        raise ctx.refuse(
            "the module names fp8_packed: it may pack its FP8 cache, and the guard would be told it does not",
            first,
            module,
        )
    if not module_imports_name(module, "torch"):
        raise ctx.refuse(
            "the module does not import torch (the guard's FP8 test names torch dtypes)", first, module
        )


def _statement_of(module: cst.Module, call: cst.Call, ctx: FileContext) -> cst.SimpleStatementLine:
    """The statement whose whole value is ``call``; refused otherwise."""
    for line in nodes_of(module, cst.SimpleStatementLine):
        if len(line.body) != 1:
            continue
        small = line.body[0]
        value = small.value if isinstance(small, cst.Expr | cst.Assign | cst.AnnAssign | cst.Return) else None
        if value is call:
            return line
    raise ctx.refuse(
        f"{dotted(call.func)}(...) is not the whole value of its statement: a guard before the statement "
        "would also run when the kernel does not",
        call,
        module,
    )
