"""The companion files a port gets outside its package, made from one
template each for every reference.

A reference's manifest names its companions (``companions``: file name ->
output path); a name with a template here is made from the manifest (the
reference's package name, class prefix and architecture, and whether its
spec has experts), unless the reference ships a file of that name in its
``companions/`` directory. The text made is the reference's own companion:
``apply`` then sets a port's identity in it as in any file of the reference
(``set-constants``, ``rename-classes``).
"""

from __future__ import annotations

from string import Template
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from autoport_cst.apply.reference import Manifest

TP_SIZE = 2  # the default of a Trainium instance, in the run script's usage line too

# The example script (``run.py``): greedy generation through vLLM. The
# ``$ep_*`` pieces are the expert-parallel option, filled for an MoE reference.
_RUN_SCRIPT = Template('''\
# SPDX-License-Identifier: Apache-2.0
"""Generate text with the $class_prefix port on Trainium through vLLM.

Run on a Trainium instance with vLLM and the Neuron backend installed:

    python run.py --model /path/to/checkpoint --tp $tp_size$ep_usage

Greedy decoding of a few prompts; the output is printed for a quick look.
$ep_doc"""

import argparse
import json
import os

MODEL_NAME = "$model_name"  # package under vllm_neuron/model/
HF_ARCHITECTURE = "$architecture"  # config.json architectures[0]
TP_SIZE = $tp_size
MAX_MODEL_LEN = 2048  # at most; a checkpoint with fewer positions gets its own

PROMPTS = [
    "1, 2, 3, 4, 5,",
    "The capital of France is",
    "Once upon a time there was",
    "def fibonacci(n):",
]


def checkpoint_limits(model: str) -> tuple[int, int | None]:
    """The TP size and the positions of the checkpoint (its config.json, when
    --model is a directory): the largest TP up to TP_SIZE that divides the
    attention heads and that the KV heads divide or are divided by."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return TP_SIZE, None
    with open(path, encoding="utf-8") as file:
        config = json.load(file)
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads") or 1
    kv_heads = config.get("num_key_value_heads") or heads
    fits = [
        tp for tp in range(TP_SIZE, 0, -1) if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)
    ]
    return fits[0], config.get("max_position_embeddings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument(
        "--tp", type=int, default=None, help=f"tensor-parallel size (default: {TP_SIZE}, or what fits)"
    )
$ep_argument    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"context length (default: {MAX_MODEL_LEN}, or fewer positions)",
    )
    parser.add_argument("--max-tokens", type=int, default=10)
    args = parser.parse_args()
    tp, positions = checkpoint_limits(args.model)
    args.tp = args.tp or tp
    if args.max_model_len is None:
        args.max_model_len = min(MAX_MODEL_LEN, positions or MAX_MODEL_LEN)
    elif positions and args.max_model_len > positions:
        parser.error(f"--max-model-len {args.max_model_len} exceeds the checkpoint's {positions} positions")
$ep_check
    from vllm import LLM, SamplingParams

$ep_neuron_config    llm = LLM(
        model=args.model,
        tensor_parallel_size=args.tp,
$ep_enable        max_model_len=args.max_model_len,
        max_num_seqs=len(PROMPTS),
$additional_config
    )
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, sampling), strict=True):
        print(f"{prompt!r} -> {output.outputs[0].text!r}")


if __name__ == "__main__":
    main()
''')

_DENSE = {
    "ep_usage": "",
    "ep_doc": "Accuracy is checked on CPU by the logit test next to the model package.\n",
    "ep_argument": "",
    "ep_check": "",
    "ep_neuron_config": "",
    "ep_enable": "",
    "additional_config": """\
        additional_config={
            "neuron_config": {
                "num_batched_tokens_buckets": [args.max_model_len],
                "num_seqs_buckets": [len(PROMPTS)],
            }
        },""",
}

_EXPERT_PARALLEL = {
    "ep_usage": f" [--ep {TP_SIZE}]",
    "ep_doc": """\
With ``--ep`` the experts are split into that many partitions inside the TP
ranks (expert parallelism). Accuracy is checked on CPU by the logit test next
to the model package.
""",
    "ep_argument": """\
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree (1: off; must divide --tp)")
""",
    "ep_check": """\
    if args.ep < 1 or args.tp % args.ep != 0:
        parser.error(f"--ep {args.ep} must be at least 1 and divide --tp {args.tp}")
""",
    "ep_neuron_config": """\
    neuron_config = {
        "num_batched_tokens_buckets": [args.max_model_len],
        "num_seqs_buckets": [len(PROMPTS)],
    }
    if args.ep > 1:
        neuron_config["ep_degree"] = args.ep
""",
    "ep_enable": "        enable_expert_parallel=args.ep > 1,\n",
    "additional_config": '        additional_config={"neuron_config": neuron_config},',
}


def run_script(manifest: Manifest) -> str:
    """The example script of the reference ``manifest`` describes; with the
    expert-parallel option (``--ep``) when its spec has experts."""
    pieces = _EXPERT_PARALLEL if manifest.spec.moe is not None else _DENSE
    return _RUN_SCRIPT.substitute(
        pieces,
        class_prefix=manifest.class_prefix,
        model_name=manifest.name,
        architecture=manifest.architecture,
        tp_size=TP_SIZE,
    )


TEMPLATES: dict[str, Callable[[Manifest], str]] = {"run.py": run_script}
