"""Soak: a long tiny-model GRPO run with the served retriever (and judge), every process's memory watched.

The run is a real one on a private local Ray: the synthetic world and its BM25 index served by the
``retriever`` Ray Serve app (``recipes/embedded.py``, as ``tuned_examples/tiny_cpu_grpo.py`` does), the
Search-R1 GRPO recipe at CPU scale (``--judge``: the R-Search recipe with the evidence judge served as the
``judge`` app, the bundled Gemma-3-270M unless ``--judge-model``), one remote EnvRunner and one remote
learner (``--env-runners``, ``--learners``). The policy is a tiny Llama built here from a config and taught,
in a child process, whole episodes of the env's own making: a search, the retriever's block, then an answer
(R-Search: an evidence box and an answer). Every episode then searches (``searches_per_episode`` near 1),
so every iteration goes through the served retriever (and the judge), samples and updates (``--model``:
another policy).

Every ``--sample-every`` iterations the resident memory (RSS, and USS: memory unique to the process) of
every process of the Ray node is sampled with psutil: this driver, the GCS and raylet, every worker
(EnvRunners, learners, Serve's controller, proxy and replicas, idle workers) and Ray's agents. From the
warm-up point on (the first sample at or after ``--warmup`` iterations, default a tenth of the run: model
loading, allocator pools and first-iteration caches are done by then) two checks:

- growth: a process's RSS at the end minus at the warm-up point; none may exceed ``--bound-mb``;
- trend: per process kind (learner, LLMEnvRunner, driver, the judge's replica, ...), a least-squares line
  through the kind's RSS (summed over its processes alive at every sample) over iterations; its slope, in
  MB per 100 iterations, may exceed ``--trend-bound-mb`` for no kind (default 10: 100 MB over a
  1,000-iteration run). A steady leak shows here even when the run is too short for it to reach the growth
  bound. The trend is judged over at least
  ``TREND_MIN_ITERATIONS`` iterations after the warm-up (``--quick``'s is reported, not judged).

A progress line per iteration; a final JSON line (``passed``, ``growth_passed``, ``trend_passed``, the
largest growth and the steepest trend with their bounds, ``searches_per_episode``) and
``benchmarks/results/soak.json`` (``soak_judge`` with ``--judge``, ``_quick`` with ``--quick``; with the
commit and the machine, ``benchmarks/results_file.py``) and ``soak.png``: RSS over iterations per process
group, and each kind's RSS after the warm-up with its fitted line and the trend bound.

    python benchmarks/soak.py                    # 500 iterations (minutes on 2 cores; --judge: longer)
    python benchmarks/soak.py --judge            # with the served evidence judge (R-Search)
    python benchmarks/soak.py --quick            # 12 iterations: the soak works, its trend not judged
    python benchmarks/soak.py --iterations 100 --warmup 10 --out-name soak_short
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.recipes.process_memory import process_label  # noqa: E402

MB = 1024 * 1024
QUICK_ITERATIONS, QUICK_WARMUP = 12, 4
TREND_MIN_ITERATIONS = 50  # the fewest iterations after the warm-up over which a trend is judged
# The policy is taught in a child process (python -c TEACH ROOT OUT PROTOCOL SEED; its last line: the path).
TEACH = (
    "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks.soak import build_world_policy; "
    "print(build_world_policy(sys.argv[2], sys.argv[3], int(sys.argv[4])))"
)
TEACH_STEPS, TEACH_LR = 300, 3e-3  # what the tiny policy needs to write both taught turns when sampled


class NodeMemory:
    """Samples the memory of this driver and every process it started (the local Ray node's processes)."""

    def __init__(self) -> None:
        import psutil

        self.root = psutil.Process(os.getpid())
        self.labels: dict[int, str] = {}
        self.samples: list[dict[str, Any]] = []

    def sample(self, iteration: int) -> dict[int, dict[str, float]]:
        """RSS and USS (MB) of every process now, recorded under ``iteration``."""
        import psutil

        processes = [self.root, *self.root.children(recursive=True)]
        found: dict[int, dict[str, float]] = {}
        for process in processes:
            try:
                memory = process.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            label = "driver" if process.pid == self.root.pid else process_label(process)
            # A worker's title names its current actor or task; an idle one keeps the label it had.
            if label not in ("IDLE", "gone") or process.pid not in self.labels:
                self.labels[process.pid] = label
            found[process.pid] = {"rss_mb": memory.rss / MB, "uss_mb": memory.uss / MB}
        self.samples.append({"iteration": iteration, "processes": found})
        return found

    def driver_rss_mb(self) -> float:
        return self.root.memory_info().rss / MB


class ScriptedTurns:
    """A turn policy for :func:`~rllib_search.algos.rollouts.loop.roll_out` that writes ``first`` as every
    episode's first turn and ``then`` as every later one (tokenised as the env's scripted policies are)."""

    def __init__(self, tokenizer: Any, first: str, then: str) -> None:
        self.turns = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in (first, then)]

    def act(self, envs: Any, turn: int) -> list[list[int]]:
        return [list(self.turns[min(turn, 1)]) for _ in envs]


def policy_turns(protocol_name: str) -> tuple[str, str]:
    """The two turns the soak's policy is taught: a search, then (after the retriever's block) an answer,
    with R-Search's evidence box before it."""
    from rllib_search.env.protocols import get_protocol

    protocol = get_protocol(protocol_name)
    search = protocol.render_search("Velmora", thought="I need to search.")
    answer = protocol.render_answer(
        "Velmora", evidence="Velmora is a city." if protocol.evidence_open else None
    )
    return search, answer


def build_policy(out: Path, protocol_name: str, records: list[Any], retriever: Any, seed: int) -> Path:
    """A tiny Llama (built from a config) taught whole episodes of ``protocol_name`` on ``records``: a
    search, the retriever's block, then an answer (R-Search: an evidence box and an answer), so every
    iteration's episodes go through the served retriever (and the judge). The episodes are the env's own,
    rolled out with ``retriever`` (or the index in that directory) under the soak's env budgets: the model
    learns the very token layout it then samples from, observation tokens masked from the loss. Sampling
    at temperature 1 varies what it writes. Returns the policy's directory."""
    import torch

    from rllib_search.algos.rollouts.loop import roll_out
    from rllib_search.algos.rollouts.record import Rollout
    from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
    from rllib_search.llm.models import load_causal_lm
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
    from rllib_search.recipes.scales import CPU_ENV
    from rllib_search.serve.retrieval.load import load_index

    base = build_tiny_causal_lm(out / "base", build_tiny_tokenizer(out / "tok"), seed=seed)
    model, tokenizer = load_causal_lm(str(base))
    if isinstance(retriever, (str, Path)):
        retriever = load_index(retriever)
    env_config = SearchEnvConfig.from_dict({**CPU_ENV, "protocol": protocol_name})
    envs = [MultiTurnSearchEnv(tokenizer, retriever, None, env_config) for _ in records]
    ends = roll_out(envs, records, ScriptedTurns(tokenizer, *policy_turns(protocol_name)), retriever)
    episodes = [
        Rollout.from_env(env, "taught", 0, ends.terminated[i], ends.truncated[i])
        for i, env in enumerate(envs)
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=TEACH_LR)
        model.train()
        for step in range(TEACH_STEPS):
            episode = episodes[step % len(episodes)]
            ids = torch.tensor([episode.token_ids.tolist()])
            labels = ids.clone()
            labels[0, torch.from_numpy(episode.loss_mask == 0)] = -100
            optimizer.zero_grad()
            model(ids, labels=labels).loss.backward()
            optimizer.step()
    policy = out / "policy"
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    return policy


def build_world_policy(out: str | Path, protocol_name: str, seed: int) -> Path:
    """:func:`build_policy` on the first 16 training questions of the embedded world of ``seed``, with its
    BM25 index."""
    from rllib_search.recipes import embedded

    world = embedded.embedded_world(seed)
    return build_policy(Path(out), protocol_name, world.records("train")[:16], world.index, seed)


def growth(memory: Any, warmup: int, key: str) -> dict[str, Any]:
    """Per process (``label#pid``): its ``key`` at the end minus at the warm-up sample (or at its first
    sample, for a process started later), and the max over processes."""
    first = warmup_sample(memory, warmup)
    last = memory.samples[-1]
    per_process: dict[str, float] = {}
    late: list[str] = []
    for pid, end in last["processes"].items():
        start = first["processes"].get(pid)
        name = f"{memory.labels[pid]}#{pid}"
        if start is None:
            start = next(s["processes"][pid] for s in memory.samples if pid in s["processes"])
            late.append(name)
        per_process[name] = round(end[key] - start[key], 2)
    worst = max(per_process, key=per_process.get)
    return {
        "max": per_process[worst],
        "max_process": worst,
        "per_process": dict(sorted(per_process.items(), key=lambda kv: -kv[1])),
        "started_after_warmup": late,
        "from_iteration": first["iteration"],
        "to_iteration": last["iteration"],
    }


def warmup_sample(memory: Any, warmup: int) -> dict[str, Any]:
    """The first sample at or after iteration ``warmup`` (the last one if the run ended before)."""
    return next((s for s in memory.samples if s["iteration"] >= warmup), memory.samples[-1])


def trends(memory: Any, warmup: int, key: str) -> dict[str, Any]:
    """A least-squares line through ``key`` over iterations, per process kind (label), from the warm-up
    sample on: the summed ``key`` of the kind's processes alive at every one of those samples (a process
    started or ended in between is listed in ``left_out``, not fitted). Per kind: the slope in MB per 100
    iterations, the line's value at the first and last fitted iteration, and the processes summed; and the
    steepest kind. No line under 3 samples."""
    window = [s for s in memory.samples if s["iteration"] >= warmup_sample(memory, warmup)["iteration"]]
    steady = set(window[0]["processes"]).intersection(*(s["processes"] for s in window[1:]))
    seen = set().union(*(s["processes"] for s in window))
    kinds: dict[str, list[int]] = {}
    for pid in sorted(steady):
        kinds.setdefault(memory.labels[pid], []).append(pid)
    iterations = np.array([s["iteration"] for s in window], dtype=float)
    per_kind: dict[str, dict[str, Any]] = {}
    if len(window) >= 3:
        for kind, pids in kinds.items():
            values = np.array([sum(s["processes"][pid][key] for pid in pids) for s in window])
            slope, intercept = np.polyfit(iterations, values, 1)
            per_kind[kind] = {
                "mb_per_100_iterations": round(float(slope) * 100, 2),
                "line_mb": [round(float(intercept + slope * x), 2) for x in (iterations[0], iterations[-1])],
                "processes": len(pids),
            }
    ordered = dict(sorted(per_kind.items(), key=lambda kv: -kv[1]["mb_per_100_iterations"]))
    steepest = next(iter(ordered), None)
    return {
        "max_mb_per_100_iterations": ordered[steepest]["mb_per_100_iterations"] if steepest else None,
        "max_kind": steepest,
        "per_kind": ordered,
        "left_out": sorted(f"{memory.labels[pid]}#{pid}" for pid in seen - steady),
        "from_iteration": window[0]["iteration"],
        "to_iteration": window[-1]["iteration"],
        "samples": len(window),
    }


def group_series(memory: NodeMemory, key: str) -> dict[str, list[tuple[int, float]]]:
    """Summed ``key`` of each process group (label) at every sample."""
    series: dict[str, list[tuple[int, float]]] = {}
    for sample in memory.samples:
        totals: dict[str, float] = {}
        for pid, values in sample["processes"].items():
            label = memory.labels[pid]
            totals[label] = totals.get(label, 0.0) + values[key]
        for label, total in totals.items():
            series.setdefault(label, []).append((sample["iteration"], round(total, 1)))
    return series


def process_series(memory: NodeMemory, key: str) -> dict[str, list[tuple[int, float]]]:
    """``key`` of each process (``label#pid``) at every sample where it was alive."""
    series: dict[str, list[tuple[int, float]]] = {}
    for sample in memory.samples:
        for pid, values in sample["processes"].items():
            series.setdefault(f"{memory.labels[pid]}#{pid}", []).append(
                (sample["iteration"], round(values[key], 1))
            )
    return series


def plot(
    series: dict[str, list[tuple[int, float]]],
    trend: dict[str, Any],
    memory: Any,
    trend_bound: float,
    path: Path,
    title: str,
) -> None:
    """RSS per process group over iterations (left); right: from the warm-up point on, each kind's RSS
    (summed over its fitted processes) as a change from its fitted line's start, with that line dashed,
    beside the trend bound (a line of the bound's slope)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    ordered = sorted(series.items(), key=lambda kv: -max(v for _, v in kv[1]))
    colors = plt.get_cmap("tab20")
    color = {label: colors(k % 20) for k, (label, _) in enumerate(ordered)}
    for label, points in ordered:
        iterations, values = zip(*points)
        left.plot(iterations, values, marker=".", label=label, color=color[label])
    start, end = trend["from_iteration"], trend["to_iteration"]
    fitted = fitted_series(memory, trend)
    for kind, fit in trend["per_kind"].items():
        points = fitted[kind]
        base = fit["line_mb"][0]
        style = {"color": color.get(kind, "black")}
        right.plot([i for i, _ in points], [v - base for _, v in points], marker=".", linewidth=0.8, **style)
        slope = fit["mb_per_100_iterations"]
        right.plot(
            [start, end],
            [0.0, fit["line_mb"][1] - base],
            linestyle="--",
            label=f"{kind}: {slope:+.1f} MB/100 it.",
            **style,
        )
    right.plot(
        [start, end],
        [0.0, trend_bound * (end - start) / 100],
        color="tab:red",
        linestyle=":",
        label=f"trend bound {trend_bound:g} MB/100 it.",
    )
    for axis in (left, right):
        axis.set_xlabel("iteration")
    left.axvline(start, color="gray", linestyle=":", linewidth=1)
    left.set_ylabel("RSS, MB (summed over the group's processes)")
    left.set_yscale("log")
    left.set_title(title, fontsize=9)
    left.legend(fontsize=6, loc="lower right", ncol=2)
    right.set_ylabel("RSS change from the fitted line's start, MB")
    right.set_title(f"after warm-up (iteration {start}): RSS per kind and its least-squares line", fontsize=9)
    right.legend(fontsize=6, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fitted_series(memory: Any, trend: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Per fitted kind of ``trend``: (iteration, summed RSS of its fitted processes) over the fit's window."""
    left_out = {int(name.rsplit("#", 1)[1]) for name in trend["left_out"]}
    series: dict[str, list[tuple[int, float]]] = {kind: [] for kind in trend["per_kind"]}
    for sample in memory.samples:
        if not trend["from_iteration"] <= sample["iteration"] <= trend["to_iteration"]:
            continue
        totals: dict[str, float] = {}
        for pid, values in sample["processes"].items():
            kind = memory.labels[pid]
            if pid not in left_out and kind in series:
                totals[kind] = totals.get(kind, 0.0) + values["rss_mb"]
        for kind, total in totals.items():
            series[kind].append((sample["iteration"], round(total, 2)))
    return series


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ITERATIONS} iterations, warm-up {QUICK_WARMUP}, a sample every iteration; results "
        "*_quick (the trend is reported, not judged)",
    )
    p.add_argument("--warmup", type=int, help="growth and trend from this iteration on (default: a tenth)")
    p.add_argument("--sample-every", type=int, default=5, help="iterations between memory samples")
    p.add_argument("--bound-mb", type=float, default=64.0, help="most RSS growth allowed to any process")
    p.add_argument(
        "--trend-bound-mb",
        type=float,
        default=10.0,
        help="steepest RSS trend allowed to any process kind, MB per 100 iterations",
    )
    p.add_argument("--model", help="policy to train (default: a tiny Llama built and taught here)")
    p.add_argument("--judge", action="store_true", help="R-Search with the served evidence judge")
    p.add_argument("--judge-model", default=None, help="the judge's model (default: bundled Gemma-3-270M)")
    p.add_argument("--env-runners", type=int, default=1, help="remote EnvRunner actors (0: in the driver)")
    p.add_argument("--learners", type=int, default=1, help="remote learner actors (0: in the driver)")
    p.add_argument("--prompts", type=int, default=2, help="questions per iteration (per EnvRunner)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-name", default=None, help="results name (default: soak, soak_judge with --judge)")
    args = p.parse_args(argv)
    if args.quick:
        args.iterations, args.warmup, args.sample_every = QUICK_ITERATIONS, QUICK_WARMUP, 1
    if args.warmup is None:
        args.warmup = max(1, args.iterations // 10)
    if not 0 <= args.warmup < args.iterations:
        p.error(f"--warmup must be below --iterations ({args.iterations}), got {args.warmup}")
    return args


def verdict(rss: dict[str, Any], trend: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The checks: no process grew by more than ``--bound-mb`` after the warm-up, and no process kind's
    trend is steeper than ``--trend-bound-mb`` per 100 iterations; the trend is judged only over at least
    ``TREND_MIN_ITERATIONS`` iterations after the warm-up (a shorter window's slope is allocator noise
    scaled up), else ``trend_passed`` is None."""
    growth_passed = rss["max"] <= args.bound_mb
    span = trend["to_iteration"] - trend["from_iteration"]
    trend_passed = None
    if span >= TREND_MIN_ITERATIONS and trend["max_mb_per_100_iterations"] is not None:
        trend_passed = trend["max_mb_per_100_iterations"] <= args.trend_bound_mb
    return {
        "growth_passed": growth_passed,
        "trend_passed": trend_passed,
        "trend_judged_over_iterations": span,
        "passed": growth_passed and trend_passed is not False,
    }


def report(
    memory: Any,
    history: list[dict[str, Any]],
    args: argparse.Namespace,
    setup: dict[str, Any],
    seconds: float,
    directory: Path | None = None,
) -> dict[str, Any]:
    """Growth, trends, checks and searches of a finished soak: ``<name>.json`` (through
    ``write_results``, with the commit and the machine) and ``<name>.png`` under ``directory`` (default
    ``benchmarks/results``), and the final JSON line. Returns the results."""
    rss, uss = growth(memory, args.warmup, "rss_mb"), growth(memory, args.warmup, "uss_mb")
    rss_trend, uss_trend = trends(memory, args.warmup, "rss_mb"), trends(memory, args.warmup, "uss_mb")
    checks = verdict(rss, rss_trend, args)
    series = group_series(memory, "rss_mb")
    searches = [row["searches"] for row in history]
    components = sorted({k for row in history for k in row.get("reward_components", {})})
    name = args.out_name or ("soak_judge" if args.judge else "soak") + ("_quick" if args.quick else "")
    results = {
        "benchmark": "soak",
        "quick": args.quick,
        "iterations": args.iterations,
        "warmup_iteration": rss["from_iteration"],
        **checks,
        "rss_growth_bound_mb": args.bound_mb,
        "rss_trend_bound_mb_per_100_iterations": args.trend_bound_mb,
        "rss_growth_mb": rss,
        "rss_trend": rss_trend,
        "uss_growth_mb": uss,
        "uss_trend": uss_trend,
        "setup": setup,
        "searches_per_episode": {
            "mean": round(float(np.mean(searches)), 3),
            "min": round(float(np.min(searches)), 3),
            "first": searches[0],
            "last": searches[-1],
        },
        "reward_first_last": [history[0]["reward"], history[-1]["reward"]],
        "reward_components_mean": {
            k: round(float(np.mean([r["reward_components"].get(k, 0.0) for r in history])), 4)
            for k in components
        },
        "judge_errors": sum(row.get("judge_errors") or 0.0 for row in history),
        "seconds": round(seconds, 1),
        "rss_mb_by_group": series,
        "rss_mb_by_process": process_series(memory, "rss_mb"),
    }
    out = directory if directory is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    plot(
        series,
        rss_trend,
        memory,
        args.trend_bound_mb,
        out / f"{name}.png",
        f"Soak: {args.iterations} GRPO iterations ({setup['protocol']}, {setup['policy']},\n"
        f"served retriever{' and judge' if args.judge else ''}): RSS per process group; growth bound "
        f"{args.bound_mb:g} MB a process",
    )
    headline = {
        "benchmark": "soak",
        "iterations": args.iterations,
        **checks,
        "rss_growth_mb": rss["max"],
        "rss_growth_max_process": rss["max_process"],
        "rss_growth_bound_mb": args.bound_mb,
        "rss_trend_max_mb_per_100_iterations": rss_trend["max_mb_per_100_iterations"],
        "rss_trend_max_kind": rss_trend["max_kind"],
        "rss_trend_bound_mb_per_100_iterations": args.trend_bound_mb,
        "uss_growth_mb": uss["max"],
        "searches_per_episode": results["searches_per_episode"]["mean"],
        "seconds": results["seconds"],
    }
    write_results(name, results, headline=headline, directory=out)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import ray
    import torch

    from rllib_search.recipes import embedded
    from rllib_search.recipes.jobs import iteration_row
    from rllib_search.recipes.r_search import r_search_grpo
    from rllib_search.recipes.scales import CPU_JUDGE
    from rllib_search.recipes.search_r1 import search_r1_grpo
    from rllib_search.serve.cluster import patient_serve_proxies

    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", flush=True)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    world = embedded.embedded_world(args.seed)
    train = world.records("train")
    protocol = "r_search" if args.judge else "search_r1"
    model = args.model
    if model is None:
        # Taught in a child process: the driver, whose memory is watched, never holds the teaching's
        # model, optimizer and index.
        workdir = Path(tempfile.mkdtemp(prefix="soak_"))
        command = [sys.executable, "-c", TEACH, str(ROOT), str(workdir), protocol, str(args.seed)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"teaching the soak's policy failed:\n{done.stderr[-3000:]}")
        model = done.stdout.strip().splitlines()[-1]
    say(f"policy: {model}")

    # A private Ray (never a cluster found on the machine): its processes are this driver's descendants,
    # which is what NodeMemory watches.
    patient_serve_proxies()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    retriever, _ = embedded.serve_retriever(world.index)
    if args.judge:
        judge, _ = embedded.serve_judge(args.judge_model or CPU_JUDGE)
        config = r_search_grpo(dataset=train, retriever=retriever, judge=judge, scale="cpu", model=model)
    else:
        config = search_r1_grpo(dataset=train, retriever=retriever, scale="cpu", model=model)
    config = (
        config.rollouts(group_size=args.group_size, prompts_per_sample=args.prompts, max_turn_tokens=48)
        .env_runners(num_env_runners=args.env_runners)
        .learners(num_learners=args.learners)
        .debugging(seed=args.seed)
        .dashboard_metrics(run_name="soak")
    )
    algo = config.build_algo()
    memory = NodeMemory()
    memory.sample(0)
    say(f"built: {len(memory.samples[0]['processes'])} processes on the node")
    history = []
    try:
        for iteration in range(1, args.iterations + 1):
            row = iteration_row(iteration, algo.train())
            history.append(row)
            line = (
                f"iter {iteration:3d}/{args.iterations}  reward {row['reward']:.3f}  "
                f"searches {row['searches']:.2f}  driver RSS {memory.driver_rss_mb():.0f} MB"
            )
            if iteration % args.sample_every == 0 or iteration == args.iterations:
                found = memory.sample(iteration)
                total = sum(p["rss_mb"] for p in found.values())
                line += f"  node RSS {total:.0f} MB over {len(found)} processes"
            say(line)
    finally:
        algo.stop()
        ray.shutdown()

    setup = {
        "protocol": protocol,
        "policy": "tiny Llama taught to search" if args.model is None else args.model,
        "judge": (args.judge_model or CPU_JUDGE) if args.judge else None,
        "env_runners": args.env_runners,
        "learners": args.learners,
        "prompts_per_iteration": args.prompts * max(1, args.env_runners),
        "group_size": args.group_size,
        "sample_every": args.sample_every,
    }
    results = report(memory, history, args, setup, time.perf_counter() - started)
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
