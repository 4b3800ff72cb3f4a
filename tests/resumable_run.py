"""A tiny GRPO run with periodic checkpoints that resumes where a killed run stopped: the driver that
``test_learner.py``'s resume test and ``test_durable_runs.py`` kill with SIGKILL and start again.

``python -m tests.resumable_run OUT --model DIR --corpus FILE --questions FILE --iterations N [--resume]``
trains the config of ``tests.helpers.make_config`` (the in-process resume test's) until iteration N with a
checkpoint after every iteration (the last 2 kept) under ``OUT/checkpoints``, printing a line per
iteration; with ``--resume`` it first restores the newest complete checkpoint (``restore_latest``). At the
end it writes the policy weights to ``OUT/weights.pt``.

With ``--job`` it trains the same config the way the tuned examples do, through the recipe jobs'
:class:`~rllib_search.recipes.jobs.RecipeJob` (``--out OUT --data QUESTIONS --seed 11``, the job's own
checkpoint policy: ``--checkpoint-every`` when given, else its default; ``--resume`` passed on): a line
per iteration, ``OUT/history.jsonl``, ``OUT/summary.json`` and the final ``OUT/checkpoint``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--job", action="store_true", help="train through RecipeJob, as the tuned examples do"
    )
    parser.add_argument("--checkpoint-every", help="with --job: the job's --checkpoint-every")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import ray
    import torch

    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.data.formats import read_qa_file
    from tests.helpers import make_config, policy_weights

    torch.set_num_threads(1)  # as in the test session (conftest.py): the same floating-point sums
    out = Path(args.out)
    world = SimpleNamespace(train=read_qa_file(args.questions))
    config = make_config(
        SearchGRPOConfig, args.model, world, args.corpus, warmup_ratio=0.5, total_training_steps=4
    )
    if args.job:
        run_as_job(config, args)
        return
    config = config.checkpointing(directory=str(out / "checkpoints"), every_n_iterations=1, keep_last=2)
    start_ray()
    algo = config.build_algo()
    if args.resume:
        print(f"resumed from {algo.restore_latest()} at iteration {algo.iteration}", flush=True)
    while algo.iteration < args.iterations:
        result = algo.train()
        print(f"iteration {algo.iteration} checkpoint {result.get('checkpoint_path')}", flush=True)
    torch.save(policy_weights(algo), out / "weights.pt")
    algo.stop()
    ray.shutdown()


def run_as_job(config, args: argparse.Namespace) -> None:
    """Train ``config`` in a :class:`RecipeJob` (its own Ray started first: the job then joins it)."""
    import ray

    from rllib_search.recipes.jobs import RecipeJob, job_arguments

    argv = ["--out", args.out, "--data", args.questions, "--seed", "11", "--iterations", str(args.iterations)]
    argv += ["--checkpoint-every", args.checkpoint_every] if args.checkpoint_every else []
    argv += ["--resume"] if args.resume else []
    job_args = job_arguments("a tiny GRPO run", iterations=args.iterations).parse_args(argv)
    start_ray()
    with RecipeJob("tiny", job_args) as job:
        job.train(config)
    ray.shutdown()


def start_ray(attempts: int = 3) -> None:
    """Start this driver's private Ray, trying again after a failed start.

    The test runs this driver beside the test session's own Ray and Serve on 2 cores; there a fresh Ray's
    startup has failed once in many runs with the GCS's "Failed to get node info: Deadline Exceeded". That
    is the machine's load, not what the test checks (resuming), so a failed start is retried.
    """
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            return
        except Exception as error:
            ray.shutdown()
            if attempt == attempts:
                raise
            print(f"Ray start {attempt} of {attempts} failed ({error!r}); trying again", file=sys.stderr)
            time.sleep(5)


if __name__ == "__main__":
    main()
