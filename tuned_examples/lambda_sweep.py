"""The empirical study's sweep of the format (λ_f) and retrieval (λ_r) rewards with Ray Tune.

The study (arXiv 2505.15117, section 4 and Appendix G) trained Search-R1's GRPO with λ_f in
{0.2, 0.4, 0.6, 0.8} and then λ_r in {0.1, 0.3, 0.5} (0 is plain EM). Here every (λ_f, λ_r, seed) is a
Tune trial of ``SearchGRPO`` (``tune.Tuner(SearchGRPO, param_space=config)``), evaluated on held-out
questions at its last iteration. The run is resumable: run the same command again and it continues from
the trials' checkpoints (``Tuner.restore``; ``--fresh`` starts over). It writes, under ``--out``:
``results.md`` and ``results.csv`` (per trial: final training reward, held-out EM, format-valid rate,
searches per episode; and the means over seeds per (λ_f, λ_r)) and ``curves.png`` (training reward per
iteration, one line per (λ_f, λ_r), mean over seeds).

    # GPU cluster: the study's grid at paper scale (Search-R1 GRPO, Qwen2.5-3B)
    RAY_AUTH_MODE=token ray job submit --working-dir . -- python tuned_examples/lambda_sweep.py \\
        --data nq_hotpotqa_train.parquet --held-out test.parquet --iterations 300
    python tuned_examples/lambda_sweep.py --smoke      # 2 x 1 lambdas x 1 seed, 1 iteration, ~3 minutes
    python tuned_examples/lambda_sweep.py --embedded   # warm start, then 4 x 2 lambdas x 3 seeds on CPU
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

from rllib_search.recipes import search_r1_grpo
from rllib_search.recipes.jobs import RecipeJob, job_arguments
from rllib_search.recipes.sweeps import fit_or_restore, markdown_table, metric_curve, plot_mean_curves

STUDY_LAMBDA_FORMAT = (0.2, 0.4, 0.6, 0.8)
STUDY_LAMBDA_RETRIEVAL = (0.0, 0.1, 0.3, 0.5)
# --smoke: two trials that run side by side on a 2-core machine (add seeds with --seeds 0,1)
SMOKE_GRID = {"lambda_format": (0.2, 0.6), "lambda_retrieval": (0.0,), "seeds": (0,)}
EMBEDDED_GRID = {"lambda_format": STUDY_LAMBDA_FORMAT, "lambda_retrieval": (0.0, 0.1), "seeds": (0, 1, 2)}
PAPER_GRID = {"lambda_format": STUDY_LAMBDA_FORMAT, "lambda_retrieval": STUDY_LAMBDA_RETRIEVAL, "seeds": (0,)}

config = search_r1_grpo(dataset="nq_hotpotqa_train.parquet")


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = job_arguments(__doc__, iterations=300)
    parser.add_argument("--lambda-format", type=floats, help="comma-separated λ_f values")
    parser.add_argument("--lambda-retrieval", type=floats, help="comma-separated λ_r values")
    parser.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), help="e.g. 0,1,2")
    parser.add_argument("--max-concurrent", type=int, help="trials at once (default: as resources allow)")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    args = parser.parse_args(argv)
    if args.embedded and args.iterations is None:
        args.iterations = 10
    grid = SMOKE_GRID if args.smoke else EMBEDDED_GRID if args.embedded else PAPER_GRID
    lambdas_f = args.lambda_format or grid["lambda_format"]
    lambdas_r = args.lambda_retrieval or grid["lambda_retrieval"]
    seeds = args.seeds or grid["seeds"]

    with RecipeJob("lambda_sweep", args) as job:
        recipe = search_r1_grpo(
            dataset=job.dataset, retriever=job.retriever(), scale=job.scale, model=args.model
        )
        recipe = job.prepared(recipe)
        if job.held_out is not None:  # evaluated once, at each trial's last iteration
            recipe = recipe.held_out(dataset=job.held_out, interval=job.iterations)
        job.say(
            f"sweep: λ_f {list(lambdas_f)} x λ_r {list(lambdas_r)} x seeds {list(seeds)}, "
            f"{job.iterations} iterations each"
        )
        results = run_sweep(job, recipe, lambdas_f, lambdas_r, seeds, args)
        rows = trial_rows(results)
        write_tables(rows, job.out)
        plot_curves(results, job.out / "curves.png")
        for line in markdown_table(mean_over_seeds(rows)).splitlines():
            job.say(line)
        job.say(f"wrote {job.out / 'results.md'}, {job.out / 'results.csv'} and {job.out / 'curves.png'}")
    return 0


def run_sweep(job: RecipeJob, recipe: Any, lambdas_f: Any, lambdas_r: Any, seeds: Any, args: Any) -> Any:
    """Fit (or resume) the Tune experiment of one trial per (λ_f, λ_r, seed)."""
    from ray import tune

    from rllib_search.algos import SearchGRPO

    recipe.env_config["reward_config"] = {
        "lambda_format": tune.grid_search(list(lambdas_f)),
        "lambda_retrieval": tune.grid_search(list(lambdas_r)),
    }
    recipe = recipe.debugging(seed=tune.grid_search(list(seeds)))
    return fit_or_restore(
        SearchGRPO,
        recipe,
        storage=job.out,
        name="tune",
        iterations=job.iterations,
        fresh=args.fresh,
        max_concurrent=args.max_concurrent,
        say=job.say,
        what="sweep",
    )


def trial_rows(results: Any) -> list[dict[str, Any]]:
    """One row per trial: its λs and seed, final training reward and held-out figures."""
    rows = []
    for result in results:
        metrics, config = result.metrics, result.config
        lambdas = config["env_config"]["reward_config"]
        evaluation = metrics.get("evaluation", {})
        rows.append(
            {
                "lambda_format": lambdas["lambda_format"],
                "lambda_retrieval": lambdas["lambda_retrieval"],
                "seed": config.get("seed"),
                "iterations": metrics.get("training_iteration"),
                "final_reward": metrics["env_runners"]["episode_return_mean"],
                "held_out_em": evaluation.get("em", float("nan")),
                "format_valid": evaluation.get("format_valid", float("nan")),
                "searches_per_episode": evaluation.get("searches_per_episode", float("nan")),
            }
        )
    return sorted(rows, key=lambda r: (r["lambda_format"], r["lambda_retrieval"], r["seed"]))


def mean_over_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows averaged per (λ_f, λ_r), with the number of seeds."""
    import numpy as np

    groups: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["lambda_format"], row["lambda_retrieval"]), []).append(row)
    means = []
    for (lf, lr), members in sorted(groups.items()):
        mean = {"lambda_format": lf, "lambda_retrieval": lr, "seeds": len(members)}
        for key in ("final_reward", "held_out_em", "format_valid", "searches_per_episode"):
            mean[key] = float(np.mean([m[key] for m in members]))
        means.append(mean)
    return means


def write_tables(rows: list[dict[str, Any]], out: Path) -> None:
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = "# λ sweep\n\n## Per trial\n\n" + markdown_table(rows)
    text += "\n\n## Mean over seeds\n\n" + markdown_table(mean_over_seeds(rows)) + "\n"
    (out / "results.md").write_text(text)


def plot_curves(results: Any, path: Path) -> None:
    """Training reward per iteration, one line per (λ_f, λ_r), the mean over seeds."""
    curves: dict[tuple[float, float], list[Any]] = {}
    for result in results:
        lambdas = result.config["env_config"]["reward_config"]
        rewards = metric_curve(result, ["env_runners/episode_return_mean"])
        curves.setdefault((lambdas["lambda_format"], lambdas["lambda_retrieval"]), []).append(rewards)
    labelled = {f"λ_f={lf}, λ_r={lr}": runs for (lf, lr), runs in sorted(curves.items())}
    plot_mean_curves(labelled, path, title="λ sweep: Search-R1 GRPO")


if __name__ == "__main__":
    sys.exit(main())
