"""Soak: a long tiny-model GRPO run with the served retriever (and judge), every process's memory watched.

The run is a real one on a private local Ray: the synthetic world and its BM25 index served by the
``retriever`` Ray Serve app (``recipes/embedded.py``, as ``tuned_examples/tiny_cpu_grpo.py`` does), the
Search-R1 GRPO recipe at CPU scale (``--judge``: the R-Search recipe with the evidence judge served as the
``judge`` app, the bundled Gemma-3-270M unless ``--judge-model``), one remote EnvRunner and one remote
learner (``--env-runners``, ``--learners``). The policy is a tiny Llama built here from a config and taught
for a few steps to open each episode with a search (R-Search: with an evidence box and an answer), so every
iteration goes through the served retriever (judge), samples and updates (``--model``: another policy).

Every ``--sample-every`` iterations the resident memory (RSS, and USS: memory unique to the process) of
every process of the Ray node is sampled with psutil: this driver, the GCS and raylet, every worker
(EnvRunners, learners, Serve's controller, proxy and replicas, idle workers) and Ray's agents. A process's
growth is its RSS at the end minus its RSS at the warm-up point (the first sample at or after
``--warmup`` iterations: model loading, allocator pools and first-iteration caches are done by then), and
its trend a least-squares slope over the samples from then on (MB per 100 iterations: a steady leak, apart
from allocator noise at either end); the run passes when no process grew by more than ``--bound-mb``.

A progress line per iteration; a final JSON line (``iterations``, ``rss_growth_mb``: max and per process,
``rss_growth_bound_mb``, ``passed``) and ``benchmarks/results/soak.json`` and ``soak.png`` (RSS over
iterations per process group).

    python benchmarks/soak.py                    # 100 iterations (minutes)
    python benchmarks/soak.py --judge            # with the served evidence judge (R-Search)
    python benchmarks/soak.py --iterations 20 --warmup 5 --out-name soak_short
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MB = 1024 * 1024

# Ray's own processes, told apart by their command line (workers by their process title, "ray::Class").
_SERVICES = (
    ("gcs_server", "gcs_server"),
    ("raylet", "raylet"),
    ("dashboard/agent.py", "dashboard agent"),
    ("runtime_env/agent/main.py", "runtime env agent"),
    ("dashboard/dashboard.py", "dashboard"),
    ("log_monitor.py", "log monitor"),
    ("autoscaler/_private/monitor.py", "autoscaler monitor"),
)


def process_label(process: Any) -> str:
    """What a process of the node is: a Ray worker's class (``ray::LLMEnvRunner.sample`` -> LLMEnvRunner),
    ``IDLE`` for a worker with no task, or one of Ray's services."""
    try:
        cmdline = process.cmdline()
    except Exception:
        return "gone"
    title = cmdline[0] if cmdline else process.name()
    if title.startswith("ray::"):
        name = title[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] or "worker"
        return "learner" if name == "_WrappedExecutable" else name  # RLlib's wrapper of a Learner actor
    joined = " ".join(cmdline)
    for needle, label in _SERVICES:
        if needle in joined:
            return label
    return Path(title).name


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


def build_policy(out: Path, protocol_name: str, questions: list[str], seed: int) -> Path:
    """A tiny Llama (built from a config) taught to open every episode the way the soak needs: with a search
    (Search-R1: every iteration goes through the served retriever), or with R-Search's evidence box and an
    answer (every iteration goes through the served judge). A model this small learns one such turn
    reliably, not a mix of two; sampling at temperature 1 varies the rest of each episode."""
    from rllib_search.env.protocols import get_protocol
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit

    protocol = get_protocol(protocol_name)
    messages = [protocol.prompt_messages(q) for q in questions]
    system = messages[0][0]["content"] if messages[0][0]["role"] == "system" else None
    users = [m[-1]["content"] for m in messages]
    if protocol.evidence_open:
        text = protocol.render_answer("Velmora", evidence="Velmora is a city in Dravenia.")
    else:
        text = protocol.render_search("lead singer", thought="I need to search.")
    base = build_tiny_causal_lm(out / "base", build_tiny_tokenizer(out / "tok"), seed=seed)
    return teach_to_emit(base, out / "policy", users, text, steps=160, system=system)


def growth(memory: NodeMemory, warmup: int, key: str) -> dict[str, Any]:
    """Per process (``label#pid``): its ``key`` at the end minus at the warm-up sample (or at its first
    sample, for a process started later), and the max over processes."""
    first = next(s for s in memory.samples if s["iteration"] >= warmup)
    last = memory.samples[-1]
    per_process: dict[str, float] = {}
    slopes: dict[str, float] = {}
    late: list[str] = []
    for pid, end in last["processes"].items():
        start = first["processes"].get(pid)
        name = f"{memory.labels[pid]}#{pid}"
        if start is None:
            start = next(s["processes"][pid] for s in memory.samples if pid in s["processes"])
            late.append(name)
        per_process[name] = round(end[key] - start[key], 2)
        points = [
            (s["iteration"], s["processes"][pid][key])
            for s in memory.samples
            if s["iteration"] >= first["iteration"] and pid in s["processes"]
        ]
        if len(points) >= 3:  # a least-squares trend: steady growth, apart from one noisy end point
            slopes[name] = round(float(np.polyfit(*zip(*points), 1)[0]) * 100, 2)
    worst = max(per_process, key=per_process.get)
    return {
        "max": per_process[worst],
        "max_process": worst,
        "per_process": dict(sorted(per_process.items(), key=lambda kv: -kv[1])),
        "trend_mb_per_100_iterations": dict(sorted(slopes.items(), key=lambda kv: -kv[1])),
        "started_after_warmup": late,
        "from_iteration": first["iteration"],
        "to_iteration": last["iteration"],
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
    series: dict[str, list[tuple[int, float]]], warmup: int, bound: float, path: Path, title: str
) -> None:
    """RSS per process group over iterations (left) and its change from the warm-up point (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    ordered = sorted(series.items(), key=lambda kv: -max(v for _, v in kv[1]))
    colors = plt.get_cmap("tab20")
    for k, (label, points) in enumerate(ordered):
        iterations, values = zip(*points)
        style = {"marker": ".", "label": label, "color": colors(k % 20)}
        left.plot(iterations, values, **style)
        after = [(i, v) for i, v in points if i >= warmup]
        if after:
            right.plot([i for i, _ in after], [v - after[0][1] for _, v in after], **style)
    for axis in (left, right):
        axis.axvline(warmup, color="gray", linestyle=":", linewidth=1)
        axis.set_xlabel("iteration")
    left.set_ylabel("RSS, MB (summed over the group's processes)")
    left.set_yscale("log")
    left.set_title(title, fontsize=9)
    right.axhline(bound, color="tab:red", linestyle="--", linewidth=1, label=f"bound {bound:g} MB")
    right.axhline(-bound, color="tab:red", linestyle="--", linewidth=1)
    right.set_ylabel("RSS change from the warm-up point, MB")
    right.set_ylim(-1.2 * bound, 1.2 * bound)
    right.set_title("growth after warm-up (per group)", fontsize=9)
    right.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10, help="growth is measured from this iteration on")
    p.add_argument("--sample-every", type=int, default=2, help="iterations between memory samples")
    p.add_argument("--bound-mb", type=float, default=64.0, help="most RSS growth allowed to any process")
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
    return p.parse_args(argv)


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
    workdir = Path(tempfile.mkdtemp(prefix="soak_"))
    model = args.model or str(
        build_policy(workdir, protocol, [r.question for r in train[:8]], seed=args.seed)
    )
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

    rss, uss = growth(memory, args.warmup, "rss_mb"), growth(memory, args.warmup, "uss_mb")
    series = group_series(memory, "rss_mb")
    passed = rss["max"] <= args.bound_mb
    name = args.out_name or ("soak_judge" if args.judge else "soak")
    results = {
        "benchmark": "soak",
        "iterations": args.iterations,
        "warmup_iteration": rss["from_iteration"],
        "rss_growth_mb": rss,
        "uss_growth_mb": uss,
        "rss_growth_bound_mb": args.bound_mb,
        "passed": passed,
        "setup": {
            "protocol": protocol,
            "policy": "tiny Llama built from a config" if args.model is None else args.model,
            "judge": (args.judge_model or CPU_JUDGE) if args.judge else None,
            "env_runners": args.env_runners,
            "learners": args.learners,
            "prompts_per_iteration": args.prompts * max(1, args.env_runners),
            "group_size": args.group_size,
            "sample_every": args.sample_every,
            "cpus": os.cpu_count(),
        },
        "reward_first_last": [history[0]["reward"], history[-1]["reward"]],
        "searches_mean": sum(r["searches"] for r in history) / len(history),
        "seconds": round(time.perf_counter() - started, 1),
        "rss_mb_by_group": series,
        "rss_mb_by_process": process_series(memory, "rss_mb"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))
    plot(
        series,
        rss["from_iteration"],
        args.bound_mb,
        RESULTS / f"{name}.png",
        f"Soak: {args.iterations} GRPO iterations ({protocol}, tiny policy, served retriever"
        f"{' and judge' if args.judge else ''}), RSS per process group",
    )
    headline = {
        "benchmark": "soak",
        "iterations": args.iterations,
        "rss_growth_mb": rss["max"],
        "rss_growth_max_process": rss["max_process"],
        "rss_trend_max_mb_per_100_iterations": max(rss["trend_mb_per_100_iterations"].values(), default=None),
        "uss_growth_mb": uss["max"],
        "rss_growth_bound_mb": args.bound_mb,
        "passed": passed,
        "seconds": results["seconds"],
    }
    print(json.dumps(headline))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
