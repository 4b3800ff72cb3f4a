"""R1-Searcher: two-stage outcome RL with REINFORCE++ (arXiv 2503.05592; ``recipes/r1_searcher.py``).

``config`` below is the paper's run: Qwen-2.5-7B-Base, 16 rollouts a question, 64 questions a rollout
batch, lr 2e-6, 4 FSDP2-sharded learners each sharing its GPU with a vLLM EnvRunner; stage 1 (retrieval
+ format reward) for 6 iterations on its own questions, then stage 2 (answer F1, -2 for a broken format).
The stage is in every result (``env_runners/reward_stage``) and in checkpoints.

    RAY_AUTH_MODE=token ray job submit --working-dir . -- python tuned_examples/r1_searcher.py \\
        --data stage1.parquet --stage2-data stage2.parquet --held-out test.parquet
    python tuned_examples/r1_searcher.py --smoke       # 2 iterations: one per stage, minutes
    python tuned_examples/r1_searcher.py --embedded    # warm start + 20 iterations on CPU

The same job as ``rllib-search train r1_searcher`` (its flags: ``rllib_search/recipes/train_cli.py``).
"""

from __future__ import annotations

import sys

from rllib_search.recipes import r1_searcher_reinforce_pp
from rllib_search.recipes.train_cli import train

config = r1_searcher_reinforce_pp(dataset="stage1.parquet", stage2_dataset="stage2.parquet")


def main(argv: list[str] | None = None) -> int:
    return train("r1_searcher", argv)


if __name__ == "__main__":
    sys.exit(main())
