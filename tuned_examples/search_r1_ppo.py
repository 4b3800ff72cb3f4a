"""Search-R1 PPO (arXiv 2503.09516, section 4.3; ``recipes/search_r1.py`` holds the hyperparameters).

``config`` below is the paper's run: Qwen2.5-3B with a value head, one response per prompt, 512 prompts an
iteration, actor lr 1e-6 (95% warmup), critic lr 1e-5, GAE gamma = lambda = 1, KL 0.001 in the reward; 4
learners each sharing its GPU with a vLLM EnvRunner (``recipes/scales.py``).

    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python tuned_examples/search_r1_ppo.py --data nq_hotpotqa_train.parquet --held-out test.parquet
    python tuned_examples/search_r1_ppo.py --smoke        # the embedded default, minutes
    python tuned_examples/search_r1_ppo.py --embedded     # warm start + 20 iterations on CPU

The same job as ``rllib-search train search_r1_ppo`` (its flags: ``rllib_search/recipes/train_cli.py``).
"""

from __future__ import annotations

import sys

from rllib_search.recipes import search_r1_ppo
from rllib_search.recipes.train_cli import train

config = search_r1_ppo(dataset="nq_hotpotqa_train.parquet")


def main(argv: list[str] | None = None) -> int:
    return train("search_r1_ppo", argv)


if __name__ == "__main__":
    sys.exit(main())
