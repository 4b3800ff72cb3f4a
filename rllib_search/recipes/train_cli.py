"""The papers' recipes and the λ sweep as command-line jobs: ``rllib-search train RECIPE [flags]``.

Each recipe here has a parser (the flags every job shares, :func:`jobs.job_arguments`, and its own) and a
run that builds its config (``recipes/``) and trains it in a :class:`jobs.RecipeJob`. ``rllib-search
train`` and the scripts in ``tuned_examples/`` call the same :func:`train`. The CPU main job has its own
command line (``recipes/tiny_cpu/cli.py``).
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllib_search.recipes import r1_searcher_reinforce_pp, r_search_grpo, search_r1_grpo, search_r1_ppo
from rllib_search.recipes.jobs import RecipeJob, job_arguments
from rllib_search.recipes.sweeps import (
    SpecMismatch,
    check_spec,
    fit_or_restore,
    markdown_table,
    metric_curve,
    plot_mean_curves,
    resumable,
)

SEARCH_R1_GRPO = """\
Search-R1 GRPO (arXiv 2503.09516, section 4.3; rllib_search/recipes/search_r1.py holds the hyperparameters).

Paper scale: Qwen2.5-3B, 5 samples per prompt, 512 prompts an iteration, lr 1e-6 with 28.5% warmup, k3 KL
0.001, 4 FSDP2 learners each sharing a GPU with a vLLM EnvRunner (bf16 autocast over fp32 master weights;
`rllib-search plan search_r1_grpo` prints the GPUs and memory), the E5 retriever on Ray Serve
(`rllib-search serve retriever --index DIR`, or --retriever-url).

    # on a GPU cluster, the retriever served
    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train search_r1_grpo \\
        --data /data/nq_hotpotqa_train.parquet --held-out /data/test.parquet
    # the same code path on the embedded default (bundled SmolLM2, synthetic world, CPU), minutes
    rllib-search train search_r1_grpo --smoke
    rllib-search train search_r1_grpo --embedded --lambda-format 0.2   # warm start + 20 iterations
"""

SEARCH_R1_PPO = """\
Search-R1 PPO (arXiv 2503.09516, section 4.3; rllib_search/recipes/search_r1.py holds the hyperparameters).

Paper scale: Qwen2.5-3B with a value head, one response per prompt, 512 prompts an iteration, actor lr 1e-6
(95% warmup), critic lr 1e-5, GAE gamma = lambda = 1, KL 0.001 in the reward; 4 FSDP2 learners each
sharing a GPU with a vLLM EnvRunner.

    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train search_r1_ppo \\
        --data /data/nq_hotpotqa_train.parquet --held-out /data/test.parquet
    rllib-search train search_r1_ppo --smoke        # the embedded default, minutes
    rllib-search train search_r1_ppo --embedded     # warm start + 20 iterations on CPU
"""

R1_SEARCHER = """\
R1-Searcher: two-stage outcome RL with REINFORCE++ (arXiv 2503.05592; rllib_search/recipes/r1_searcher.py).

Paper scale: Qwen-2.5-7B-Base, 16 rollouts a question, 64 questions a rollout batch, lr 2e-6, FSDP2
learners, each sharing a GPU with a vLLM EnvRunner (4 of each); stage 1 (retrieval + format reward) for 6
iterations on its own questions, then stage 2 (answer F1, -2 for a broken format). The stage is in every
result (env_runners/reward_stage) and in checkpoints.

    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train r1_searcher \\
        --data /data/stage1.parquet --stage2-data /data/stage2.parquet --held-out /data/test.parquet
    rllib-search train r1_searcher --smoke       # 2 iterations: one per stage, minutes
    rllib-search train r1_searcher --embedded    # warm start + 20 iterations on CPU
"""

R_SEARCH_GRPO = """\
R-Search GRPO with answer, evidence and format rewards; the evidence is judged by a served model of another
family (rllib_search/recipes/r_search.py).

Paper scale: Qwen-2.5-7B-Instruct on 2WikiMultiHopQA, 5 samples a prompt, batch 256, lr 1e-6 (95% warmup),
KL 0.001, evidence and answer weights 0.2, judged by Llama-3.2-3B-Instruct at temperature 0.1; 4 FSDP2
learners each sharing a GPU with a vLLM EnvRunner. Deploy the judge first:

    rllib-search serve judge --engine vllm --model meta-llama/Llama-3.2-3B-Instruct --num-gpus 1 \\
        --temperature 0.1
    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train r_search_grpo \\
        --data /data/2wiki_train.parquet --held-out /data/test.parquet
    rllib-search train r_search_grpo --smoke       # SmolLM2 policy, Gemma-3-270M judge, minutes
    rllib-search train r_search_grpo --embedded    # warm start + 20 iterations on CPU
"""

LAMBDA_SWEEP = """\
The empirical study's sweep of the format (λ_f) and retrieval (λ_r) rewards with Ray Tune.

The study (arXiv 2505.15117, section 4 and Appendix G) trained Search-R1's GRPO with λ_f in
{0.2, 0.4, 0.6, 0.8} at λ_r = 0, then λ_r in {0.1, 0.3, 0.5} at λ_f = 0.2 (0 is plain EM). --design
one-at-a-time (the default) does the same: each λ_f at λ_r = 0, then each λ_r at --fixed-lambda-format
(default 0.2 when it is among the λ_f values, else the first), the pair both share trained once; --design
grid trains every λ_f with every λ_r. Every ((λ_f, λ_r), seed) is a Tune trial of SearchGRPO
(tune.Tuner(SearchGRPO, param_space=config)), evaluated on held-out questions at its last iteration; the
Tune experiment ranks trials by that held-out EM (metric held_out_em, mode max; training_em, the training
episodes' EM, when there are no held-out questions), so ResultGrid.get_best_result() gives the best.

The run is resumable: run the same command again and it continues from the trials' checkpoints
(Tuner.restore). The experiment directory (OUT/tune) records the sweep's design, λ values, seeds,
iterations, scale and metric (sweep_spec.json); a run with the same --out and another of these is refused
with the differences named (--fresh starts over there; another --out keeps the earlier sweep). It writes,
under --out: results.md and results.csv (the design; per trial: final training reward, training and
held-out EM, format-valid rate, searches per episode; the means over seeds per (λ_f, λ_r); in results.md
the best trial, the best (λ_f, λ_r) and, one-at-a-time, the best λ_f and the best λ_r) and curves.png
(training reward per iteration, one line per (λ_f, λ_r), mean over seeds; its title names the design).

    # GPU cluster: the study's sweep at paper scale (Search-R1 GRPO, Qwen2.5-3B), 4 + 3 (λ_f, λ_r) pairs
    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train lambda_sweep \\
        --data /data/nq_hotpotqa_train.parquet --held-out /data/test.parquet --iterations 300
    rllib-search train lambda_sweep --smoke      # λ_f 0.2, 0.6 at λ_r = 0, 1 seed, 1 iteration, ~3 minutes
    rllib-search train lambda_sweep --embedded   # warm start, then 4 + 1 pairs x 3 seeds on CPU
    rllib-search train lambda_sweep --embedded --design grid   # 4 x 2 pairs x 3 seeds
"""


def train(name: str, argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """Run recipe ``name`` (a key of :data:`JOBS`) with the command-line flags ``argv`` (None: the
    process's own); ``prog`` is the command its help and errors name (default: the script's name)."""
    return JOBS[name][1](parser(name, prog).parse_args(argv))


def parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """Recipe ``name``'s flags."""
    built = JOBS[name][0]()
    if prog:
        built.prog = prog
    return built


def with_embedded_iterations(args: argparse.Namespace, iterations: int) -> argparse.Namespace:
    """``--embedded`` trains ``iterations`` unless ``--iterations`` says otherwise."""
    if args.embedded and args.iterations is None:
        args.iterations = iterations
    return args


# --- Search-R1 -------------------------------------------------------------------------------------------
def search_r1_grpo_parser() -> argparse.ArgumentParser:
    p = job_arguments(SEARCH_R1_GRPO, iterations=1005)
    p.add_argument("--lambda-format", type=float, default=0.0, help="the empirical study's λ_f")
    p.add_argument("--lambda-retrieval", type=float, default=0.0, help="the empirical study's λ_r")
    return p


def run_search_r1_grpo(args: argparse.Namespace) -> int:
    args = with_embedded_iterations(args, 20)
    with RecipeJob("search_r1_grpo", args) as job:
        retriever = job.retriever()
        recipe = search_r1_grpo(
            dataset=job.dataset,
            retriever=retriever,
            scale=job.scale,
            model=args.model,
            lambda_format=args.lambda_format,
            lambda_retrieval=args.lambda_retrieval,
        )
        job.train(job.prepared(recipe))
    return 0


def search_r1_ppo_parser() -> argparse.ArgumentParser:
    return job_arguments(SEARCH_R1_PPO, iterations=305)


def run_search_r1_ppo(args: argparse.Namespace) -> int:
    args = with_embedded_iterations(args, 20)
    with RecipeJob("search_r1_ppo", args) as job:
        recipe = search_r1_ppo(
            dataset=job.dataset, retriever=job.retriever(), scale=job.scale, model=args.model
        )
        job.train(job.prepared(recipe))
    return 0


# --- R1-Searcher -----------------------------------------------------------------------------------------
def r1_searcher_parser() -> argparse.ArgumentParser:
    p = job_arguments(R1_SEARCHER, iterations=150, smoke_iterations=2)
    p.add_argument("--stage2-data", help="stage-2 questions (default: the same as --data)")
    p.add_argument("--stage1-iterations", type=int, help="iterations of stage 1 (paper: 6; smoke: 1)")
    p.add_argument(
        "--stage1-threshold", type=float, help="leave stage 1 once env_runners/reward/retrieval reaches this"
    )
    return p


def run_r1_searcher(args: argparse.Namespace) -> int:
    args = with_embedded_iterations(args, 20)
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


# --- R-Search --------------------------------------------------------------------------------------------
def r_search_grpo_parser() -> argparse.ArgumentParser:
    p = job_arguments(R_SEARCH_GRPO, iterations=195)
    p.add_argument("--judge-url", help="an OpenAI-compatible judge base URL (default: the Serve app)")
    p.add_argument("--judge-model", help="the `model` name a --judge-url server expects")
    return p


def run_r_search_grpo(args: argparse.Namespace) -> int:
    args = with_embedded_iterations(args, 20)
    with RecipeJob("r_search_grpo", args) as job:
        judge = job.judge(args.judge_url)
        if args.judge_model:
            judge["model"] = args.judge_model
        recipe = r_search_grpo(
            dataset=job.dataset, retriever=job.retriever(), judge=judge, scale=job.scale, model=args.model
        )
        job.train(job.prepared(recipe))
    return 0


# --- the λ sweep -----------------------------------------------------------------------------------------
STUDY_LAMBDA_FORMAT = (0.2, 0.4, 0.6, 0.8)
STUDY_LAMBDA_RETRIEVAL = (0.0, 0.1, 0.3, 0.5)
#: The λ_f at which the study varied λ_r.
STUDY_FIXED_LAMBDA_FORMAT = 0.2
#: ``--design``: one λ at a time, as the study (the default), or the λ_f x λ_r cross product.
DESIGNS = ("one-at-a-time", "grid")
# --smoke: two trials that run side by side on a 2-core machine (add seeds with --seeds 0,1)
SMOKE_GRID = {"lambda_format": (0.2, 0.6), "lambda_retrieval": (0.0,), "seeds": (0,)}
EMBEDDED_GRID = {"lambda_format": STUDY_LAMBDA_FORMAT, "lambda_retrieval": (0.0, 0.1), "seeds": (0, 1, 2)}
PAPER_GRID = {"lambda_format": STUDY_LAMBDA_FORMAT, "lambda_retrieval": STUDY_LAMBDA_RETRIEVAL, "seeds": (0,)}
#: What every trial reports at the top of each result for the sweep to rank it by (NaN in an iteration
#: without it): the held-out EM of the evaluation at its last iteration, and the training episodes' EM.
HELD_OUT_EM = "held_out_em"
TRAINING_EM = "training_em"
#: ``TuneConfig(mode=...)``: the higher the EM, the better.
METRIC_MODE = "max"


@dataclass(frozen=True)
class LambdaSweep:
    """What a λ sweep runs: its design over the λ_f and λ_r values, the seeds, the iterations of each trial,
    the scale (``smoke``, ``embedded`` or ``paper``) and the metric its Tune experiment ranks trials by."""

    design: str
    lambda_format: tuple[float, ...]
    lambda_retrieval: tuple[float, ...]
    seeds: tuple[int, ...]
    iterations: int
    scale: str
    metric: str
    #: one-at-a-time: the λ_f at which λ_r varies (None under the grid design)
    fixed_lambda_format: float | None = None

    def points(self) -> list[tuple[float, float]]:
        """The (λ_f, λ_r) pairs, each once (:func:`sweep_points`)."""
        return sweep_points(self.design, self.lambda_format, self.lambda_retrieval, self.fixed_lambda_format)

    def spec(self) -> dict[str, Any]:
        """What the experiment directory records and a rerun must match to resume it."""
        return {
            "design": self.design,
            "lambda_format": list(self.lambda_format),
            "lambda_retrieval": list(self.lambda_retrieval),
            "fixed_lambda_format": self.fixed_lambda_format,
            "seeds": list(self.seeds),
            "iterations": self.iterations,
            "scale": self.scale,
            "metric": self.metric,
        }

    def describe(self) -> str:
        """The design in words, e.g. ``one-at-a-time: λ_f [0.2, 0.6] at λ_r = 0, then λ_r [0.0] at λ_f =
        0.2``."""
        if self.design == "grid":
            return f"grid: λ_f {list(self.lambda_format)} x λ_r {list(self.lambda_retrieval)}"
        return (
            f"one-at-a-time: λ_f {list(self.lambda_format)} at λ_r = 0, "
            f"then λ_r {list(self.lambda_retrieval)} at λ_f = {self.fixed_lambda_format}"
        )

    def parts(self) -> list[tuple[str, set[tuple[float, float]]]]:
        """What the sweep reports the best of, with its (λ_f, λ_r) pairs: all of them, and one-at-a-time
        also each part (λ_f at λ_r = 0; λ_r at the fixed λ_f)."""
        parts = [("best (λ_f, λ_r), mean over seeds", set(self.points()))]
        if self.design == "one-at-a-time":
            fixed = self.fixed_lambda_format
            parts.append(("best λ_f at λ_r = 0", {(float(f), 0.0) for f in self.lambda_format}))
            parts.append((f"best λ_r at λ_f = {fixed}", {(fixed, float(r)) for r in self.lambda_retrieval}))
        return parts

    @property
    def metric_name(self) -> str:
        return "held-out EM" if self.metric == HELD_OUT_EM else "training EM"


def sweep_points(
    design: str,
    lambdas_f: Sequence[float],
    lambdas_r: Sequence[float],
    fixed_lambda_format: float | None = None,
) -> list[tuple[float, float]]:
    """The (λ_f, λ_r) pairs a design trains, each once, in order. ``grid``: every λ_f with every λ_r.
    ``one-at-a-time`` (the study's): every λ_f at λ_r = 0, then every λ_r at ``fixed_lambda_format``
    (default :func:`default_fixed_lambda_format`); the pair both parts share is trained once."""
    if design == "grid":
        points = [(float(f), float(r)) for f in lambdas_f for r in lambdas_r]
    elif design == "one-at-a-time":
        fixed = default_fixed_lambda_format(lambdas_f) if fixed_lambda_format is None else fixed_lambda_format
        points = [(float(f), 0.0) for f in lambdas_f] + [(float(fixed), float(r)) for r in lambdas_r]
    else:
        raise ValueError(f"unknown design {design!r} (one of {', '.join(DESIGNS)})")
    return list(dict.fromkeys(points))


def default_fixed_lambda_format(lambdas_f: Sequence[float]) -> float:
    """The λ_f at which a one-at-a-time sweep varies λ_r: the study's 0.2 when it is among ``lambdas_f``,
    else the first of them."""
    return STUDY_FIXED_LAMBDA_FORMAT if STUDY_FIXED_LAMBDA_FORMAT in lambdas_f else float(lambdas_f[0])


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def lambda_sweep_parser() -> argparse.ArgumentParser:
    p = job_arguments(LAMBDA_SWEEP, iterations=300)
    p.add_argument("--lambda-format", type=floats, help="comma-separated λ_f values")
    p.add_argument("--lambda-retrieval", type=floats, help="comma-separated λ_r values")
    p.add_argument(
        "--design",
        choices=DESIGNS,
        default="one-at-a-time",
        help="one-at-a-time (default, as the study): each λ_f at λ_r = 0, then each λ_r at "
        "--fixed-lambda-format; grid: every λ_f with every λ_r",
    )
    p.add_argument(
        "--fixed-lambda-format",
        type=float,
        help=f"one-at-a-time: the λ_f at which λ_r varies (default {STUDY_FIXED_LAMBDA_FORMAT} when it is "
        "among the λ_f values, else the first of them)",
    )
    p.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), help="e.g. 0,1,2")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as resources allow)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over instead of resuming (also when --out holds a sweep of another grid)",
    )
    return p


def lambda_sweep(args: argparse.Namespace, iterations: int, *, held_out: bool) -> LambdaSweep:
    """The sweep ``args`` ask for, each trial ``iterations`` long, ranked by held-out EM when there are
    held-out questions (``held_out``), else by training EM."""
    grid = SMOKE_GRID if args.smoke else EMBEDDED_GRID if args.embedded else PAPER_GRID
    lambdas_f = tuple(args.lambda_format or grid["lambda_format"])
    design = args.design
    if design == "grid" and args.fixed_lambda_format is not None:
        raise SystemExit("lambda_sweep: --fixed-lambda-format is for --design one-at-a-time")
    fixed = None
    if design == "one-at-a-time":
        fixed = args.fixed_lambda_format
        fixed = default_fixed_lambda_format(lambdas_f) if fixed is None else float(fixed)
    return LambdaSweep(
        design=design,
        lambda_format=lambdas_f,
        lambda_retrieval=tuple(args.lambda_retrieval or grid["lambda_retrieval"]),
        seeds=tuple(args.seeds or grid["seeds"]),
        iterations=iterations,
        scale="smoke" if args.smoke else "embedded" if args.embedded else "paper",
        metric=HELD_OUT_EM if held_out else TRAINING_EM,
        fixed_lambda_format=fixed,
    )


def run_lambda_sweep(args: argparse.Namespace) -> int:
    args = with_embedded_iterations(args, 10)
    job = RecipeJob("lambda_sweep", args)
    # Refused before Ray starts when --out holds a sweep of another spec (the embedded default has held-out
    # questions of its own: RecipeJob.held_out); fit_or_restore checks again with the job's own.
    expected_held_out = bool(args.held_out or args.smoke or args.embedded)
    refuse_another_spec(job, lambda_sweep(args, job.iterations, held_out=expected_held_out))
    with job:
        sweep = lambda_sweep(args, job.iterations, held_out=job.held_out is not None)
        recipe = search_r1_grpo(
            dataset=job.dataset, retriever=job.retriever(), scale=job.scale, model=args.model
        )
        recipe = job.prepared(recipe)
        if job.held_out is not None:  # evaluated once, at each trial's last iteration
            recipe = recipe.held_out(dataset=job.held_out, interval=job.iterations)
        points = sweep.points()
        job.say(
            f"sweep ({sweep.describe()}): {len(points)} (λ_f, λ_r) pairs x seeds {list(sweep.seeds)}, "
            f"{job.iterations} iterations each, ranked by {sweep.metric_name}"
        )
        results = run_sweep(job, recipe, sweep, args)
        rows = trial_rows(results, sweep)
        write_tables(rows, job.out, sweep, best_lines(results, rows, sweep))
        plot_curves(results, job.out / "curves.png", sweep)
        for line in markdown_table(mean_over_seeds(rows)).splitlines():
            job.say(line)
        job.say(f"wrote {job.out / 'results.md'}, {job.out / 'results.csv'} and {job.out / 'curves.png'}")
    return 0


def refuse_another_spec(job: RecipeJob, sweep: LambdaSweep) -> None:
    """Stop (SystemExit) when ``--out`` holds a resumable sweep whose recorded spec is not ``sweep``'s, unless
    ``--fresh``."""
    experiment = job.out / "tune"
    if job.args.fresh or not resumable(experiment):
        return
    try:
        check_spec(experiment, sweep.spec(), what="λ sweep")
    except SpecMismatch as error:
        raise SystemExit(f"lambda_sweep: {error}") from None


def run_sweep(job: RecipeJob, recipe: Any, sweep: LambdaSweep, args: Any) -> Any:
    """Fit (or resume) the Tune experiment of one trial per ((λ_f, λ_r), seed) of ``sweep``: one grid search
    over the design's pairs, one over the seeds; ranked by ``sweep.metric`` (max) at each trial's last
    iteration."""
    from ray import tune

    from rllib_search.algos import SearchGRPO

    recipe.env_config["reward_config"] = tune.grid_search(
        [{"lambda_format": f, "lambda_retrieval": r} for f, r in sweep.points()]
    )
    recipe = recipe.debugging(seed=tune.grid_search(list(sweep.seeds)))
    existing = recipe.callbacks_on_train_result  # kept: the sweep's callback runs after them
    existing = [] if existing is None else existing if isinstance(existing, list | tuple) else [existing]
    recipe = recipe.callbacks(on_train_result=[*existing, report_sweep_metrics])
    try:
        return fit_or_restore(
            SearchGRPO,
            recipe,
            storage=job.out,
            name="tune",
            iterations=job.iterations,
            fresh=args.fresh,
            max_concurrent=args.max_concurrent,
            say=job.say,
            what="λ sweep",
            metric=sweep.metric,
            mode=METRIC_MODE,
            spec=sweep.spec(),
        )
    except SpecMismatch as error:
        raise SystemExit(f"lambda_sweep: {error}") from None


def report_sweep_metrics(*, result: dict[str, Any], **_: Any) -> None:
    """RLlib's ``on_train_result``: the figures the sweep ranks trials by, at the top of every result (Tune
    needs its metric in each one): ``held_out_em`` (the held-out evaluation's EM, NaN in an iteration that
    does not evaluate) and ``training_em`` (the training episodes' EM, NaN when the reward has no EM)."""
    evaluation = result.get("evaluation") or {}
    reward = (result.get("env_runners") or {}).get("reward") or {}
    result[HELD_OUT_EM] = float(evaluation.get("em", float("nan")))
    result[TRAINING_EM] = float(reward.get("em", float("nan")))


def trial_rows(results: Any, sweep: LambdaSweep) -> list[dict[str, Any]]:
    """One row per trial: the design, its λs and seed, final training reward and EM, held-out figures."""
    nan = float("nan")
    rows = []
    for result in results:
        metrics, config = result.metrics, result.config
        lambdas = config["env_config"]["reward_config"]
        evaluation = metrics.get("evaluation", {})
        rows.append(
            {
                "design": sweep.design,
                "lambda_format": lambdas["lambda_format"],
                "lambda_retrieval": lambdas["lambda_retrieval"],
                "seed": config.get("seed"),
                "iterations": metrics.get("training_iteration"),
                "final_reward": metrics["env_runners"]["episode_return_mean"],
                "training_em": float(metrics.get(TRAINING_EM, nan)),
                "held_out_em": evaluation.get("em", nan),
                "format_valid": evaluation.get("format_valid", nan),
                "searches_per_episode": evaluation.get("searches_per_episode", nan),
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
        for key in ("final_reward", "training_em", "held_out_em", "format_valid", "searches_per_episode"):
            mean[key] = float(np.mean([m[key] for m in members]))
        means.append(mean)
    return means


def best_lines(results: Any, rows: list[dict[str, Any]], sweep: LambdaSweep) -> list[str]:
    """The best of the sweep by its metric (max): the best trial (``ResultGrid.get_best_result()``, the
    TuneConfig's metric at each trial's last iteration), the best (λ_f, λ_r) by the mean over seeds and,
    one-at-a-time, the best λ_f (at λ_r = 0) and the best λ_r (at the fixed λ_f)."""
    import math

    name = sweep.metric_name
    lines = []
    try:
        best = results.get_best_result()
    except (RuntimeError, ValueError):  # every trial's metric NaN: nothing to rank
        lines.append(f"- best trial: none (no trial reported a {name})")
    else:
        lambdas = best.config["env_config"]["reward_config"]
        lines.append(
            f"- best trial (`ResultGrid.get_best_result()`): λ_f = {lambdas['lambda_format']}, "
            f"λ_r = {lambdas['lambda_retrieval']}, seed {best.config.get('seed')}: {name} "
            f"{float(best.metrics.get(sweep.metric, float('nan'))):.3f}"
        )
    column = sweep.metric
    means = [m for m in mean_over_seeds(rows) if not math.isnan(m[column])]
    for label, points in sweep.parts():
        candidates = [m for m in means if (m["lambda_format"], m["lambda_retrieval"]) in points]
        if not candidates:
            lines.append(f"- {label}: none (no {name} to rank)")
            continue
        top = max(candidates, key=lambda m: m[column])
        seeds = f"{top['seeds']} seed{'' if top['seeds'] == 1 else 's'}"
        tied = sum(m[column] == top[column] for m in candidates) - 1
        lines.append(
            f"- {label}: λ_f = {top['lambda_format']}, λ_r = {top['lambda_retrieval']}: {name} "
            f"{top[column]:.3f} ({seeds}{f'; tied with {tied} more' if tied else ''})"
        )
    return lines


def write_tables(rows: list[dict[str, Any]], out: Path, sweep: LambdaSweep, best: Sequence[str]) -> None:
    """``results.csv`` (a row per trial, the design in each) and ``results.md`` (the design, the best, the
    rows and their means over seeds)."""
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    iterations = f"{sweep.iterations} iteration{'' if sweep.iterations == 1 else 's'}"
    text = f"# λ sweep\n\nDesign: {sweep.describe()}; seeds {list(sweep.seeds)}, {iterations} each; "
    text += f"trials ranked by {sweep.metric_name} (`{sweep.metric}`, {METRIC_MODE}) at their last "
    text += "iteration.\n\n"
    text += f"## Best ({sweep.design} design)\n\n" + "\n".join(best)
    text += "\n\n## Per trial\n\n" + markdown_table(rows)
    text += "\n\n## Mean over seeds\n\n" + markdown_table(mean_over_seeds(rows)) + "\n"
    (out / "results.md").write_text(text)


def plot_curves(results: Any, path: Path, sweep: LambdaSweep) -> None:
    """Training reward per iteration, one line per (λ_f, λ_r), the mean over seeds; the title names the
    design."""
    curves: dict[tuple[float, float], list[Any]] = {}
    for result in results:
        lambdas = result.config["env_config"]["reward_config"]
        rewards = metric_curve(result, ["env_runners/episode_return_mean"])
        curves.setdefault((lambdas["lambda_format"], lambdas["lambda_retrieval"]), []).append(rewards)
    labelled = {f"λ_f={lf}, λ_r={lr}": runs for (lf, lr), runs in sorted(curves.items())}
    plot_mean_curves(labelled, path, title=f"λ sweep ({sweep.design} design): Search-R1 GRPO")


#: Each recipe's parser and run, by the name ``rllib-search train`` knows it by.
JOBS: dict[str, tuple[Callable[[], argparse.ArgumentParser], Callable[[argparse.Namespace], int]]] = {
    "search_r1_grpo": (search_r1_grpo_parser, run_search_r1_grpo),
    "search_r1_ppo": (search_r1_ppo_parser, run_search_r1_ppo),
    "r1_searcher": (r1_searcher_parser, run_r1_searcher),
    "r_search_grpo": (r_search_grpo_parser, run_r_search_grpo),
    "lambda_sweep": (lambda_sweep_parser, run_lambda_sweep),
}


# --- rllib-search plan -----------------------------------------------------------------------------------
#: Each recipe's config at paper scale (the policy ``model``, None: the paper's), by the name ``rllib-search
#: plan`` knows it by; the λ sweep plans one trial (Search-R1's GRPO: its trials run side by side only on a
#: cluster with the GPUs of several).
PAPER_CONFIGS: dict[str, Callable[[str | None], Any]] = {
    "search_r1_grpo": lambda model: search_r1_grpo(dataset=None, model=model),
    "search_r1_ppo": lambda model: search_r1_ppo(dataset=None, model=model),
    "r1_searcher": lambda model: r1_searcher_reinforce_pp(dataset=None, model=model),
    "r_search_grpo": lambda model: r_search_grpo(dataset=None, model=model),
    "lambda_sweep": lambda model: search_r1_grpo(dataset=None, model=model),
}
#: The Serve config the papers' recipes run beside (their retriever and judge on GPUs), in a source checkout.
DEFAULT_SERVICES = Path(__file__).resolve().parents[2] / "tuned_examples" / "serve_gpu.yaml"


def plan(args: argparse.Namespace) -> int:
    """``rllib-search plan``: print recipe ``args.recipe``'s plan at paper scale on ``args.gpus`` GPUs of
    ``args.gpu_memory_gib`` beside the services of ``args.services``; 0 when it fits, 1 when not."""
    from rllib_search.algos.plan import make_plan

    config = PAPER_CONFIGS[args.recipe](args.model)
    services: Path | None = None
    if args.services != "none":
        services = Path(args.services) if args.services else DEFAULT_SERVICES
        if not services.is_file():
            raise SystemExit(f"rllib-search plan: no Serve config at {services} (--services FILE, or none)")
    result = make_plan(
        config,
        gpus=args.gpus,
        gpu_memory_gib=args.gpu_memory_gib,
        services=services,
        host_memory_gib=args.host_memory_gib,
        name=args.recipe,
    )
    if services is not None:
        shown = os.path.relpath(services) if services.is_relative_to(Path.cwd()) else services
        result.notes.append(f"services: {shown}")
    print(result)
    return 0 if result.fits else 1
