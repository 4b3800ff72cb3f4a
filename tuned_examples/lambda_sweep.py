"""The empirical study's sweep of the format (λ_f) and retrieval (λ_r) rewards with Ray Tune.

The study (arXiv 2505.15117, section 4 and Appendix G) trained Search-R1's GRPO with λ_f in
{0.2, 0.4, 0.6, 0.8} at λ_r = 0, then λ_r in {0.1, 0.3, 0.5} at λ_f = 0.2 (0 is plain EM); so does
``--design one-at-a-time`` (the default; ``--fixed-lambda-format`` picks the λ_f at which λ_r varies), and
``--design grid`` trains every λ_f with every λ_r. Every ((λ_f, λ_r), seed) is a Tune trial of
``SearchGRPO``, evaluated on held-out questions at its last iteration; the experiment ranks trials by that
held-out EM (``ResultGrid.get_best_result()``). Run the same command again and it resumes; the experiment
records its design, λ values, seeds and iterations, and a run into the same ``--out`` with others is refused
(``--fresh`` starts over). It writes, under ``--out``: ``results.md`` and ``results.csv`` (the design, per
trial and the means over seeds per (λ_f, λ_r), and the best) and ``curves.png``.

    # GPU cluster: the study's sweep at paper scale (Search-R1 GRPO, Qwen2.5-3B)
    RAY_AUTH_MODE=token ray job submit --working-dir . -- python tuned_examples/lambda_sweep.py \\
        --data nq_hotpotqa_train.parquet --held-out test.parquet --iterations 300
    python tuned_examples/lambda_sweep.py --smoke      # λ_f 0.2, 0.6 at λ_r = 0, 1 seed, 1 iteration
    python tuned_examples/lambda_sweep.py --embedded   # warm start, then 4 + 1 (λ_f, λ_r) x 3 seeds on CPU

The same job as ``rllib-search train lambda_sweep`` (its flags: ``rllib_search/recipes/train_cli.py``).
"""

from __future__ import annotations

import sys

from rllib_search.recipes import search_r1_grpo
from rllib_search.recipes.train_cli import train

config = search_r1_grpo(dataset="nq_hotpotqa_train.parquet")


def main(argv: list[str] | None = None) -> int:
    return train("lambda_sweep", argv)


if __name__ == "__main__":
    sys.exit(main())
