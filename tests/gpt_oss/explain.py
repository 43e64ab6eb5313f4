"""Why a bf16 validation of the gpt_oss reference fails on a tiny checkpoint.

The tiny random GPT-OSS checkpoints are hard on bf16: the experts' outputs
are about twenty times the embeddings, so whatever reaches them from the
rounding of the layers before is scaled up, and an expert chosen on a
near-tie flips the token's output. End to end, the port's bf16 run and
transformers' each carry their own rounding through that, and a per-token or
per-component gate can fail for a correct port. The gates are never changed
here; a failing run stays "not equivalent". ``explain_bf16_failure`` checks
that the failure is one of:

- **routing near-tie**: at the worst token, the float32 reference's k-th and
  (k+1)-th expert scores of an MoE layer up to the failing component differ
  by less than ``TIE_MARGIN`` (as for the qwen3_moe ports,
  ``tests/coverage_moe/ties.py``; GPT-OSS's router bias is part of the
  logits, so the scores here are softmax(x W^T + b));
- **propagated rounding**: every block of the port, fed the input that
  transformers' float32 run gives that block (rounded to bf16), errs no
  more than transformers' own bf16 block on the same input: R-ratio below
  the bf16 gate for the attention (prefill) and the MoE (prefill and decode
  kernels, tokens with a near-tie expert choice left out) of every layer
  (``isolated_r_ratios``, the equivalence skill's component test). The end-to-end failure then comes from how the two runs'
  rounding travels through the model, not from a block of the port.

It raises AssertionError when neither holds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autoport_cst.validate.metrics import R_RATIO_TOLERANCE
from autoport_cst.validate.reference import greedy_teacher, load_reference, run_reference
from autoport_cst.validate.report import ValidationReport
from autoport_cst.validate.scenario import Scenario
from tests.moe.report_rows import aligned as _aligned
from tests.moe.report_rows import scenario_of

TIE_MARGIN = 1e-2  # gap between the k-th and (k+1)-th expert score (float32 reference)
ISOLATION_TOKENS = 40
BLOCK_SIZE = 32


def _port_rows(output, name: str, phase: str) -> torch.Tensor:
    if name == "logits":
        rows = output.prefill_logits if phase == "prefill" else output.decode_logits
    else:
        rows = (output.prefill_records if phase == "prefill" else output.decode_records)[name]
    return torch.cat(rows).double()


def _ref(output, name: str, scenario: Scenario, phase: str, port) -> torch.Tensor:
    source = output.logits if name == "logits" else output.records[name]
    return _aligned(source, name, scenario, phase, port)


def _margins(model, scenario: Scenario, teacher) -> dict[int, list[torch.Tensor]]:
    """layer -> per sequence, the float32 reference's gap between its k-th
    and (k+1)-th expert score, softmax(x W^T + b), at each position."""
    top_k = model.config.num_experts_per_tok
    inputs: dict[int, list[torch.Tensor]] = {}
    handles = []
    for index, layer in enumerate(model.model.layers):
        inputs[index] = []
        handles.append(
            layer.mlp.router.register_forward_pre_hook(
                lambda module, args, index=index: inputs[index].append(
                    args[0].detach().reshape(-1, args[0].shape[-1])
                )
            )
        )
    try:
        run_reference(model, scenario.prompts, teacher)
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for index, layer in enumerate(model.model.layers):
        router = layer.mlp.router
        rows = []
        for x in inputs[index]:
            scores = torch.softmax(
                x.float() @ router.weight.detach().float().T + router.bias.detach().float(), dim=-1
            )
            ordered = scores.sort(dim=-1, descending=True).values
            rows.append((ordered[:, top_k - 1] - ordered[:, top_k]).unsqueeze(-1))
        found[index] = rows
    return found


def _worst_token(report: ValidationReport, ref32, ref16, scenario: Scenario) -> tuple[str, str, int]:
    """(component, phase, row) of the token behind the first failure: the
    worst row of a failing component, or for the logit gates the row with the
    largest port / transformers error ratio."""
    first = report.first_diverging
    name = first.component if first is not None else "logits"
    phases = (
        [first.phase] if first is not None and first.phase in ("prefill", "decode") else ["prefill", "decode"]
    )
    best = (-1.0, phases[0], 0)
    for phase in phases:
        port = _port_rows(report.port_output, name, phase)
        f = _ref(ref32, name, scenario, phase, report.port_output)
        error = (port - f).norm(dim=-1)
        if name == "logits":
            error = error / (
                (_ref(ref16, name, scenario, phase, report.port_output) - f).norm(dim=-1) + 1e-12
            )
        if float(error.max()) > best[0]:
            best = (float(error.max()), phase, int(error.argmax()))
    return name, best[1], best[2]


def _block_inputs(model, ids: torch.Tensor) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """(block, layer) -> (the block's input, its output) in transformers'
    float32 run: the attention takes the input norm's output, the MoE block
    the residual stream before its post-attention norm."""
    found: dict[tuple[str, int], list] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(
            layer.self_attn.register_forward_hook(
                lambda m, args, kwargs, out, i=i: found.__setitem__(
                    ("attention", i),
                    [kwargs.get("hidden_states", args[0] if args else None)[0].detach(), out[0][0].detach()],
                ),
                with_kwargs=True,
            )
        )
        hooks.append(
            layer.post_attention_layernorm.register_forward_hook(
                lambda m, args, out, i=i: found.__setitem__(("moe", i), [args[0][0].detach(), None])
            )
        )
        hooks.append(
            layer.mlp.register_forward_hook(
                lambda m, args, out, i=i: found[("moe", i)].__setitem__(1, out[0][0].detach())
            )
        )
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for hook in hooks:
            hook.remove()
    return {key: (value[0], value[1]) for key, value in found.items()}


def _transformers_bf16_attention(model16, layer: int, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """transformers' bf16 attention of ``layer`` with its input replaced by ``x``."""
    captured = []

    def replace(module, args, kwargs):
        kwargs = dict(kwargs)
        if "hidden_states" in kwargs:
            kwargs["hidden_states"] = x.unsqueeze(0)
            return args, kwargs
        return (x.unsqueeze(0), *args[1:]), kwargs

    attention = model16.model.layers[layer].self_attn
    pre = attention.register_forward_pre_hook(replace, with_kwargs=True)
    post = attention.register_forward_hook(lambda m, a, out: captured.append(out[0][0].detach()))
    try:
        with torch.no_grad():
            model16(input_ids=ids)
    finally:
        pre.remove()
        post.remove()
    return captured[0]


def isolated_r_ratios(package_dir: Path, checkpoint: Path, seed: int = 0) -> dict[str, float]:
    """R-ratio of each block of the port fed transformers' float32 inputs
    (rounded to bf16): ``layers.N.attention`` (prefill), ``layers.N.moe``
    (prefill kernels) and ``layers.N.moe_decode`` (the fused decode kernel),
    against transformers' bf16 block on the same input."""
    from autoport_cst.validate.driver import port_hf_config
    from autoport_cst.validate.package import imported_package
    from autoport_cst.validate.standin import standin_installed

    model32 = load_reference(checkpoint, torch.float32)
    model16 = load_reference(checkpoint, torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model32.config.vocab_size, (1, ISOLATION_TOKENS), generator=generator)
    blocks = _block_inputs(model32, ids)
    ratios: dict[str, float] = {}
    positions = torch.arange(ISOLATION_TOKENS, dtype=torch.int32)
    with standin_installed(model=str(checkpoint)), imported_package(package_dir) as package:
        with torch.device("meta"):
            port = package.factory.from_configs(port_hf_config(checkpoint, torch.bfloat16), None)
        blocks_needed = -(-ISOLATION_TOKENS // BLOCK_SIZE)
        caches = {}
        for spec in port.get_kv_spec().layers:
            shape = (blocks_needed + 1, spec.num_kv_heads, BLOCK_SIZE, spec.head_size)
            caches[spec.name] = (torch.zeros(shape, dtype=spec.dtype), torch.zeros(shape, dtype=spec.dtype))
        port.bind_kv_cache(caches)
        port.load_weights(str(checkpoint), torch.device("cpu"), None)
        cos_sin = port.model.rotary_emb(positions, device=torch.device("cpu"), dtype=torch.bfloat16)
        for (block, i), (x, f) in sorted(blocks.items()):
            f = f.double()
            layer = port.model.layers[i]
            with torch.no_grad():
                if block == "attention":
                    meta = {
                        f"layers.{i}.self_attn": {
                            "max_query_len": ISOLATION_TOKENS,
                            "decode_token_threshold": 1,
                            "slot_mapping": torch.arange(ISOLATION_TOKENS) + BLOCK_SIZE,
                            "block_size": BLOCK_SIZE,
                            "block_table_tensor": torch.arange(1, blocks_needed + 1, dtype=torch.int32)[None],
                        }
                    }
                    t = layer.self_attn.forward_prefill(x.bfloat16(), positions, cos_sin, meta).double()
                    b = _transformers_bf16_attention(model16, i, ids, x.bfloat16()).double()
                    ratios[f"layers.{i}.attention"] = float((t - f).norm() / (b - f).norm())
                else:
                    l32, l16 = model32.model.layers[i], model16.model.layers[i]
                    b = l16.mlp(l16.post_attention_layernorm(x.bfloat16()[None]))[0][0].double()
                    # tokens whose expert choice is a near-tie go either way on either side
                    router = l32.mlp.router
                    scores = torch.softmax(
                        l32.post_attention_layernorm(x) @ router.weight.T + router.bias, dim=-1
                    )
                    ordered = scores.sort(dim=-1, descending=True).values
                    k = model32.config.num_experts_per_tok
                    clear = (ordered[:, k - 1] - ordered[:, k]) >= TIE_MARGIN
                    for name, is_decode in ((f"layers.{i}.moe", False), (f"layers.{i}.moe_decode", True)):
                        t = layer.mlp(x.bfloat16(), positions, is_decode=is_decode).double()
                        ratios[name] = float((t - f)[clear].norm() / (b - f)[clear].norm())
    return ratios


def explain_bf16_failure(report: ValidationReport, package_dir: Path, checkpoint: Path, steps: int) -> str:
    """Explain a failed bf16 validation of the gpt_oss reference (see the
    module docstring); returns the explanation, raises AssertionError if the
    failure is neither a routing near-tie nor propagated rounding."""
    assert not report.equivalent and report.failure is None, report.summary()
    scenario = scenario_of(report, checkpoint, steps)
    model32 = load_reference(checkpoint, torch.float32)
    teacher = greedy_teacher(model32, scenario.prompts, steps)
    margins = _margins(model32, scenario, teacher)
    ref32 = run_reference(model32, scenario.prompts, teacher)
    ref16 = run_reference(load_reference(checkpoint, torch.bfloat16), scenario.prompts, teacher)
    name, phase, row = _worst_token(report, ref32, ref16, scenario)
    upstream = [i for i in sorted(margins) if not name.startswith("layers.") or i <= int(name.split(".")[1])]
    gaps = {i: _aligned(margins[i], name, scenario, phase, report.port_output).reshape(-1) for i in upstream}
    ties = [i for i in upstream if float(gaps[i][row]) < TIE_MARGIN]
    if ties:
        return f"{name} ({phase}) row {row}: routing near-tie in layer(s) {ties}"
    ratios = isolated_r_ratios(package_dir, checkpoint)
    failing = {block: round(r, 3) for block, r in ratios.items() if not r < R_RATIO_TOLERANCE}
    assert not failing, (
        f"{name} ({phase}) row {row}: no near-tie (margins "
        f"{[round(float(gaps[i][row]), 4) for i in upstream]}), and blocks of the port err more "
        f"than transformers' on the same input: {failing}; {report.summary()}"
    )
    worst = max(ratios, key=ratios.get)
    return (
        f"{name} ({phase}) row {row}: no near-tie; every block in isolation keeps the gate "
        f"(largest R-ratio {ratios[worst]:.2f}, {worst})"
    )
