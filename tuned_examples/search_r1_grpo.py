"""Search-R1 GRPO (arXiv 2503.09516, section 4.3; ``recipes/search_r1.py`` holds the hyperparameters).

``config`` below is the paper's run: Qwen2.5-3B, 5 samples per prompt, 512 prompts an iteration, lr 1e-6
with 28.5% warmup, k3 KL 0.001, 4 learners each sharing its GPU with a vLLM EnvRunner (bf16 autocast over
fp32 master weights; ``recipes/scales.py``), the E5 retriever on Ray Serve.

    # on a GPU cluster (the retriever app deployed: serve deploy tuned_examples/serve_gpu.yaml)
    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python tuned_examples/search_r1_grpo.py --data nq_hotpotqa_train.parquet --held-out test.parquet
    # the same code path on the embedded default (bundled SmolLM2, synthetic world, CPU), minutes
    python tuned_examples/search_r1_grpo.py --smoke
    python tuned_examples/search_r1_grpo.py --embedded --lambda-format 0.2   # warm start + 20 iterations

The same job as ``rllib-search train search_r1_grpo`` (its flags: ``rllib_search/recipes/train_cli.py``).
"""

from __future__ import annotations

import sys

from rllib_search.recipes import search_r1_grpo
from rllib_search.recipes.train_cli import train

config = search_r1_grpo(dataset="nq_hotpotqa_train.parquet")


def main(argv: list[str] | None = None) -> int:
    return train("search_r1_grpo", argv)


if __name__ == "__main__":
    sys.exit(main())
