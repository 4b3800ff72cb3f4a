"""R1-Searcher: two-stage outcome RL with REINFORCE++ (arXiv 2503.05592; ``recipes/r1_searcher.py``).

``config`` below is the paper's run: Qwen-2.5-7B-Base, 16 rollouts a question, 64 questions a rollout
batch, lr 2e-6, DeepSpeed ZeRO-2, 4 vLLM EnvRunners and 4 learners with a GPU each; stage 1 (retrieval +
format reward) for 6 iterations on its own questions, then stage 2 (answer F1, -2 for a broken format).
The stage is in every result (``env_runners/reward_stage``) and in checkpoints.

    RAY_AUTH_MODE=token ray job submit --working-dir . -- python tuned_examples/r1_searcher.py \\
        --data stage1.parquet --stage2-data stage2.parquet --held-out test.parquet
    python tuned_examples/r1_searcher.py --smoke       # 2 iterations: one per stage, minutes
    python tuned_examples/r1_searcher.py --embedded    # warm start + 20 iterations on CPU
"""

from __future__ import annotations

import sys

from rllib_search.recipes import r1_searcher_reinforce_pp
from rllib_search.recipes.jobs import RecipeJob, job_arguments

config = r1_searcher_reinforce_pp(dataset="stage1.parquet", stage2_dataset="stage2.parquet")


def main(argv: list[str] | None = None) -> int:
    parser = job_arguments(__doc__, iterations=150, smoke_iterations=2)
    parser.add_argument("--stage2-data", help="stage-2 questions (default: the same as --data)")
    parser.add_argument("--stage1-iterations", type=int, help="iterations of stage 1 (paper: 6; smoke: 1)")
    parser.add_argument(
        "--stage1-threshold", type=float, help="leave stage 1 once env_runners/reward/retrieval reaches this"
    )
    args = parser.parse_args(argv)
    if args.embedded and args.iterations is None:
        args.iterations = 20
    with RecipeJob("r1_searcher", args) as job:
        recipe = r1_searcher_reinforce_pp(
            dataset=job.dataset,
            stage2_dataset=args.stage2_data,
            retriever=job.retriever(),
            scale=job.scale,
            model=args.model,
            stage1_iterations=args.stage1_iterations or (1 if args.smoke else None),
            stage1_threshold=args.stage1_threshold,
        )
        job.train(job.prepared(recipe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
