"""R-Search GRPO with answer, evidence and format rewards; the evidence is judged by a served model of
another family (``recipes/r_search.py``).

``config`` below is the paper's run: Qwen-2.5-7B-Instruct on 2WikiMultiHopQA, 5 samples a prompt, batch
256, lr 1e-6 (95% warmup), KL 0.001, γ_e = γ_a = 0.2, judged by Llama-3.2-3B-Instruct at temperature 0.1;
4 learners each sharing its GPU with a vLLM EnvRunner (``recipes/scales.py``).
Deploy the judge first (either way):

    rllib-search serve judge --engine vllm --model meta-llama/Llama-3.2-3B-Instruct --num-gpus 1 \\
        --temperature 0.1
    serve deploy tuned_examples/serve_gpu_llm.yaml       # Ray Serve LLM; then --judge-url .../judge/v1

    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python tuned_examples/r_search_grpo.py --data 2wiki_train.parquet --held-out test.parquet
    python tuned_examples/r_search_grpo.py --smoke       # SmolLM2 policy, Gemma-3-270M judge, minutes
    python tuned_examples/r_search_grpo.py --embedded    # warm start + 20 iterations on CPU

The same job as ``rllib-search train r_search_grpo`` (its flags: ``rllib_search/recipes/train_cli.py``).
"""

from __future__ import annotations

import sys

from rllib_search.recipes import r_search_grpo
from rllib_search.recipes.train_cli import train

config = r_search_grpo(dataset="2wiki_train.parquet")


def main(argv: list[str] | None = None) -> int:
    return train("r_search_grpo", argv)


if __name__ == "__main__":
    sys.exit(main())
