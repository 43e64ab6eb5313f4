# SPDX-License-Identifier: Apache-2.0
"""Generate text with the GptOss port on Trainium through vLLM.

Run on a Trainium instance with vLLM and the Neuron backend installed:

    python run.py --model /path/to/checkpoint --tp 8 [--ep 8]

Greedy decoding of a few prompts; the output is printed for a quick look.
With ``--ep`` the experts are split into that many partitions inside the TP
ranks (expert parallelism). Accuracy is checked on CPU by the logit test next
to the model package.
"""

import argparse

MODEL_NAME = "gpt_oss"  # package under vllm_neuron/model/
HF_ARCHITECTURE = "GptOssForCausalLM"  # config.json architectures[0]
TP_SIZE = 8
MAX_MODEL_LEN = 2048

PROMPTS = [
    "1, 2, 3, 4, 5,",
    "The capital of France is",
    "Once upon a time there was",
    "def fibonacci(n):",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument("--tp", type=int, default=TP_SIZE, help="tensor-parallel size")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree (1: off; must divide --tp)")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--max-tokens", type=int, default=10)
    args = parser.parse_args()
    if args.ep < 1 or args.tp % args.ep != 0:
        parser.error(f"--ep {args.ep} must be at least 1 and divide --tp {args.tp}")

    from vllm import LLM, SamplingParams

    neuron_config = {
        "num_batched_tokens_buckets": [args.max_model_len],
        "num_seqs_buckets": [len(PROMPTS)],
    }
    if args.ep > 1:
        neuron_config["ep_degree"] = args.ep
    llm = LLM(
        model=args.model,
        tensor_parallel_size=args.tp,
        enable_expert_parallel=args.ep > 1,
        max_model_len=args.max_model_len,
        max_num_seqs=len(PROMPTS),
        additional_config={"neuron_config": neuron_config},
    )
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, sampling)):
        print(f"{prompt!r} -> {output.outputs[0].text!r}")


if __name__ == "__main__":
    main()
