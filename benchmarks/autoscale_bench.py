"""Autoscaling benchmark: the served retriever under a load ramp (up, hold, down, idle).

The retriever (``serve/retrieval/deployment.py``, the embedded world's BM25 index unless ``--index``) runs as
a Ray Serve app with an ``autoscaling_config`` (min 1, max ``--max-replicas`` replicas of ``--replica-cpus``
logical CPUs, ``--target`` ongoing requests per replica, short upscale/downscale delays) on a local Ray, and
closed-loop HTTP clients on 127.0.0.1 (one one-query request in flight each) follow a ramp: idle, then
more and more clients, a hold at the peak, fewer clients, then idle until the deployment is back to one
replica. Every second the running replica count is sampled from ``serve.status()``; every request's
latency is recorded.

Serve's handles push their request counts to the controller every 10 s by default; this benchmark's own
Ray sets ``RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S`` (and the replica's) to 1 s so that the
figure shows the autoscaler's decisions rather than the push period (``--push-interval-s``).

Prints a final JSON line (``max_replicas_reached``, ``final_replicas``, p99 latency per phase, seconds
from the load's start to a second replica and the clients then, seconds from the peak's end to one replica)
and writes ``benchmarks/results/autoscale.json`` and ``autoscale.png`` (replicas, clients, p99 and
requests/s over time); ``--quick`` (under 3 minutes) writes ``autoscale_quick.json`` and ``.png``. Both
record the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/autoscale_bench.py            # full ramp (about 5 minutes)
    python benchmarks/autoscale_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402

APP = "retriever"

# (phase, concurrent clients, seconds). The last idle phase lasts until the deployment is back at its
# minimum (plus a few seconds), at most --idle-timeout-s.
RAMP_FULL = [
    ("idle", 0, 10),
    ("up", 2, 20),
    ("up", 8, 20),
    ("up", 16, 20),
    ("hold", 32, 60),
    ("down", 8, 20),
    ("down", 2, 20),
]
RAMP_QUICK = [("idle", 0, 5), ("up", 4, 10), ("up", 16, 10), ("hold", 32, 30), ("down", 4, 10)]
BIN_S = 5.0  # latency percentiles over time are taken over bins of this width


def start_service(args: argparse.Namespace, index_dir: Path) -> tuple[str, dict[str, Any]]:
    """A local Ray with Serve on 127.0.0.1 and the autoscaled retriever; returns its URL and autoscaling
    config."""
    import ray
    from ray import serve

    from rllib_search.serve.cluster import patient_serve_proxies
    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.retrieval.deployment import build_retriever_app

    # Read by Serve's handles and replicas when their processes start: set before Ray starts them.
    for name in (
        "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
    ):
        os.environ.setdefault(name, str(args.push_interval_s))
    patient_serve_proxies()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    autoscaling = {
        "min_replicas": 1,
        "initial_replicas": 1,
        "max_replicas": args.max_replicas,
        "target_ongoing_requests": args.target,
        "upscale_delay_s": args.upscale_delay_s,
        "downscale_delay_s": args.downscale_delay_s,
        "look_back_period_s": args.look_back_period_s,
    }
    app = build_retriever_app(
        {
            "index_dir": str(index_dir),
            "batch_wait_timeout_s": args.batch_wait_ms / 1000,
            "autoscaling_config": autoscaling,
            "ray_actor_options": {"num_cpus": args.replica_cpus},
        }
    )
    serve.run(app, name=APP, route_prefix="/")
    return f"http://127.0.0.1:{port}/retrieve", autoscaling


class ReplicaSampler(threading.Thread):
    """Samples the running replica count every ``period_s`` into ``samples`` as (seconds, replicas)."""

    def __init__(self, t0: float, period_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.t0, self.period_s = t0, period_s
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        from rllib_search.serve.replicas import running_replicas
        from rllib_search.serve.retrieval.deployment import DEPLOYMENT_NAME

        while not self.stopped.is_set():
            try:
                count = running_replicas(APP, DEPLOYMENT_NAME)
            except Exception as error:  # a status call timing out under load: skip this sample
                print(f"[bench] replica sample failed: {error!r}", flush=True)
            else:
                self.samples.append((time.monotonic() - self.t0, count))
            self.stopped.wait(self.period_s)

    def latest(self) -> int | None:
        return self.samples[-1][1] if self.samples else None


async def run_ramp(
    url: str, queries: list[str], ramp: list[tuple[str, int, float]], sampler: ReplicaSampler, args: Any
) -> tuple[list[dict[str, Any]], list[tuple[float, int]]]:
    """Drive the ramp with closed-loop clients; returns every request (start, latency, phase, ok) and the
    client count over time."""
    import aiohttp

    t0 = sampler.t0
    requests: list[dict[str, Any]] = []
    clients_over_time: list[tuple[float, int]] = []
    state = {"active": 0, "phase": "idle", "done": False}
    peak = max(clients for _, clients, _ in ramp)

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        i = k
        while not state["done"]:
            if k >= state["active"]:
                await asyncio.sleep(0.05)
                continue
            body = {"queries": [queries[i % len(queries)]], "topk": 3}
            phase, started = state["phase"], time.monotonic()
            try:
                async with session.post(url, json=body) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            requests.append(
                {"t": started - t0, "latency_s": time.monotonic() - started, "phase": phase, "ok": ok}
            )
            i += peak

    def set_clients(phase: str, clients: int) -> None:
        state["phase"], state["active"] = phase, clients
        clients_over_time.append((time.monotonic() - t0, clients))
        print(
            f"[bench] {time.monotonic() - t0:6.1f}s  {phase:>4}: {clients:2d} clients, "
            f"{sampler.latest()} replicas",
            flush=True,
        )

    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=peak + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = [asyncio.create_task(client(k, session)) for k in range(peak)]
        for phase, clients, seconds in ramp:
            set_clients(phase, clients)
            await asyncio.sleep(seconds)
        set_clients("idle", 0)
        idle_started = time.monotonic()
        at_min_since = None
        while time.monotonic() - idle_started < args.idle_timeout_s:
            await asyncio.sleep(1.0)
            if sampler.latest() == 1:
                at_min_since = at_min_since or time.monotonic()
                if time.monotonic() - at_min_since >= 5.0:
                    break
            else:
                at_min_since = None
        clients_over_time.append((time.monotonic() - t0, 0))
        state["done"] = True
        await asyncio.gather(*tasks)
    return requests, clients_over_time


def percentile_ms(latencies: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(latencies) * 1000, q)) if latencies else None


def scaling_times(replicas: list[tuple[float, int]], clients: list[tuple[float, int]]) -> dict[str, Any]:
    """When the deployment first scaled up (seconds after load began, and how many clients there were
    then) and how long after the peak load ended it was back to one replica."""

    def clients_at(t: float) -> int:
        return [n for start, n in clients if start <= t][-1] if clients[0][0] <= t else 0

    load_start = next(t for t, n in clients if n > 0)
    first_up = next((t for t, n in replicas if t >= load_start and n >= 2), None)
    peak = max(n for _, n in clients)
    peak_start = next(t for t, n in clients if n == peak)
    peak_end = next((t for t, n in clients if t > peak_start and n < peak), None)
    back_to_one = next((t for t, n in replicas if peak_end is not None and t >= peak_end and n == 1), None)
    return {
        "seconds_load_to_first_upscale": None if first_up is None else round(first_up - load_start, 1),
        "clients_at_first_upscale": None if first_up is None else clients_at(first_up),
        "seconds_peak_end_to_one_replica": (
            None if back_to_one is None else round(back_to_one - peak_end, 1)
        ),
    }


def summarize(
    requests: list[dict[str, Any]],
    replicas: list[tuple[float, int]],
    clients: list[tuple[float, int]],
) -> dict[str, Any]:
    """Per-phase latency, replica counts, scale-up and scale-down times, and the binned series."""
    phases: dict[str, dict[str, Any]] = {}
    for name in ("up", "hold", "down"):
        done = [r for r in requests if r["phase"] == name]
        ok = [r["latency_s"] for r in done if r["ok"]]
        phases[name] = {
            "requests": len(done),
            "failures": len(done) - len(ok),
            "p50_ms": percentile_ms(ok, 50),
            "p99_ms": percentile_ms(ok, 99),
        }
    timing = scaling_times(replicas, clients)
    end = max(t for t, _ in replicas)
    bins = []
    for start in np.arange(0.0, end, BIN_S):
        inside = [r["latency_s"] for r in requests if start <= r["t"] < start + BIN_S and r["ok"]]
        bins.append(
            {"t": float(start + BIN_S / 2), "p99_ms": percentile_ms(inside, 99), "qps": len(inside) / BIN_S}
        )
    return {
        "max_replicas_reached": max(n for _, n in replicas),
        "final_replicas": replicas[-1][1],
        **timing,
        "p99_ms": {name: phase["p99_ms"] for name, phase in phases.items()},
        "phases": phases,
        "requests": len(requests),
        "failures": sum(not r["ok"] for r in requests),
        "series": {
            "replicas": [[round(t, 2), n] for t, n in replicas],
            "clients": [[round(t, 2), n] for t, n in clients],
            "latency_bins": bins,
        },
    }


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    """Top: running replicas and concurrent clients over time; bottom: p99 latency and throughput per bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = summary["series"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t, n = zip(*series["replicas"])
    end = max(t)
    top.step(t, n, where="post", color="tab:blue", linewidth=2, label="running replicas")
    top.set_ylabel("replicas")
    top.set_ylim(0, max(n) + 0.5)
    clients = top.twinx()
    ct, cn = zip(*series["clients"], (end, series["clients"][-1][1]))
    clients.step(ct, cn, where="post", color="tab:gray", linestyle="--", label="HTTP clients")
    clients.set_ylabel("concurrent clients")
    clients.set_ylim(0, max(cn) * 1.1 + 1)
    handles = top.get_legend_handles_labels()[0] + clients.get_legend_handles_labels()[0]
    top.legend(handles, [h.get_label() for h in handles], loc="upper left")
    top.set_title(title, fontsize=10)
    bins = [b for b in series["latency_bins"] if b["p99_ms"] is not None]
    bottom.plot([b["t"] for b in bins], [b["p99_ms"] for b in bins], "o-", color="tab:red", label="p99")
    bottom.set_ylabel(f"p99 latency, ms ({BIN_S:.0f} s bins)")
    bottom.set_ylim(bottom=0)
    rate = bottom.twinx()
    rate.plot([b["t"] for b in bins], [b["qps"] for b in bins], "s:", color="tab:green", label="requests/s")
    rate.set_ylabel("requests/s")
    rate.set_ylim(bottom=0)
    handles = bottom.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    bottom.legend(handles, [h.get_label() for h in handles], loc="upper left")
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter ramp (under 3 minutes)")
    parser.add_argument("--index", help="an index directory (default: the embedded world's BM25 index)")
    parser.add_argument("--max-replicas", type=int, default=4)
    parser.add_argument("--target", type=float, default=4.0, help="target ongoing requests per replica")
    parser.add_argument("--upscale-delay-s", type=float, default=3.0)
    parser.add_argument("--downscale-delay-s", type=float, default=10.0)
    parser.add_argument(
        "--look-back-period-s", type=float, default=11.0, help="window (Serve wants it above 10 s)"
    )
    parser.add_argument("--push-interval-s", type=float, default=1.0, help="handle/replica metric pushes")
    parser.add_argument("--replica-cpus", type=float, default=0.5, help="logical CPUs per replica")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="the deployment's batch wait")
    parser.add_argument("--idle-timeout-s", type=float, default=90.0, help="longest final idle phase")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    from rllib_search.recipes.embedded import embedded_world

    world = embedded_world(0)
    index_dir = Path(args.index) if args.index else world.index
    queries = [hop["query"] for record in world.records("test") for hop in record.extra["hops"]]
    ramp = RAMP_QUICK if args.quick else RAMP_FULL
    started = time.monotonic()
    url, autoscaling = start_service(args, index_dir)
    print(f"[bench] retriever up at {url} in {time.monotonic() - started:.0f}s: {autoscaling}", flush=True)
    sampler = ReplicaSampler(time.monotonic())
    sampler.start()
    try:
        requests, clients = asyncio.run(run_ramp(url, queries, ramp, sampler, args))
    finally:
        sampler.stopped.set()
        sampler.join(timeout=30)
        ray.shutdown()
    summary = summarize(requests, sampler.samples, clients)
    name = "autoscale_quick" if args.quick else "autoscale"
    results = {
        "benchmark": "autoscale",
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "index": str(index_dir),
        "autoscaling_config": autoscaling,
        "replica_cpus": args.replica_cpus,
        "metrics_push_interval_s": args.push_interval_s,
        "batch_wait_ms": args.batch_wait_ms,
        "ramp": [{"phase": p, "clients": c, "seconds": s} for p, c, s in ramp],
        **summary,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(
        summary,
        RESULTS / f"{name}.png",
        f"Retriever autoscaling on {os.cpu_count()} CPU cores: BM25, target {args.target:g} ongoing "
        f"requests/replica, max {args.max_replicas}; closed-loop HTTP clients on 127.0.0.1",
    )
    write_results(name, results, headline={k: v for k, v in results.items() if k != "series"})


if __name__ == "__main__":
    main()
