"""Retrieval service benchmark: Ray Serve with dynamic batching against a naive one-request-at-a-time server.

Both serve the same MiniLM Flat index over a synthetic corpus (100k passages; ``--quick``: 10k) on
127.0.0.1, with the same query encoder dtype, and are measured side by side in one run: queries/s and
p50/p99 latency at concurrency 1, 8 and 32 (one query per request, as a rollout's per-sample search would
send). Each system gets the whole machine:

- Serve: ``--replicas`` replicas of one CPU (default: one per core) with dynamic batching, behind
  ``--ingress haproxy`` (default: Ray's high-throughput mode, HAProxy straight to the replicas) or
  ``proxy`` (Serve's Python proxy actor). In-cluster DeploymentHandle calls are measured too.
- naive: Search-R1's design, a FastAPI app on one uvicorn worker whose synchronous endpoint encodes and
  searches each request alone (its thread pool runs several requests at once), run with one torch/faiss
  thread and with one per core; the baseline at each level is the faster of the two. It runs at the
  niceness Ray gives its workers, as the replicas do, so the load generator takes its CPU from either alike.

Like for like, the ratio Serve / naive is reported at every level (``serve_vs_naive_qps_ratio``): at
concurrency 1 there is nothing to batch and the naive server, with no proxy hop, is the faster. Then the
load as rollouts send it (``batched``): an EnvRunner sends ONE request per turn carrying every query of
its sample (``--batch-queries``, default 32: 8 prompts x G=4), from 1 runner and from ``--runners``
(default 4) at once; the naive server encodes such a request in one batch too.

Also measured: HNSW recall@3 against Flat, the query dtype's recall@3 against fp32 queries, and the
resident memory of a replica.

Prints a final JSON line and writes ``benchmarks/results/retriever.json`` and ``retriever.png``
(``--quick``: ``retriever_quick.json`` and ``retriever_quick.png``, never the full run's files), with the
commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/retriever_bench.py            # full run (the first run builds the index: minutes)
    python benchmarks/retriever_bench.py --quick    # under 3 minutes
    python benchmarks/retriever_bench.py --ingress proxy --dtype float32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402

ENCODER = "all-minilm-l6-v2"


def build_corpus_and_index(num_passages: int, cache: Path) -> tuple[Path, list[str]]:
    """A synthetic corpus of ``num_passages`` passages (worlds of several seeds) and its Flat index."""
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.retrieval import Passage
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.serve.retrieval.build import build_index

    per_world = 2000
    passages, queries = [], []
    for seed in range(max(1, num_passages // per_world)):
        world = generate_world(
            SyntheticWorldConfig(seed=seed, num_passages=per_world, num_train=0, num_test=50)
        )
        passages += [Passage(f"{seed}-{p.id}", p.title, p.text) for p in world.passages]
        queries += [hop["query"] for record in world.test for hop in record.extra["hops"]]
    index_dir = cache / f"flat-{len(passages)}"
    if not (index_dir / "manifest.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        corpus = cache / f"corpus-{len(passages)}.jsonl"
        write_corpus_jsonl(passages, corpus)
        print(f"[bench] building a Flat index of {len(passages)} passages with {ENCODER}", flush=True)
        build_index(corpus, index_dir, kind="flat", encoder=ENCODER, progress=True)
    return index_dir, queries


def hnsw_recall_at_3(index_dir: Path, queries: list[str], num_queries: int) -> float:
    """Recall@3 of an HNSW index (the project's default parameters) against the exact Flat index, built
    from the Flat index's own vectors so both search the same embeddings."""
    import faiss

    from rllib_search.serve.retrieval.load import load_index
    from rllib_search.serve.retrieval.manifest import KIND_OPTIONS

    flat = load_index(index_dir, mmap=False)
    vectors = flat.faiss_index.reconstruct_n(0, flat.faiss_index.ntotal)
    hnsw = faiss.IndexHNSWFlat(vectors.shape[1], KIND_OPTIONS["hnsw"]["m"], faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = KIND_OPTIONS["hnsw"]["ef_construction"]
    hnsw.add(vectors)
    hnsw.hnsw.efSearch = KIND_OPTIONS["hnsw"]["ef_search"]
    sample = queries[:num_queries]
    query_vectors = flat.encoder.encode_queries(sample)
    _, exact = flat.faiss_index.search(query_vectors, 3)
    _, approx = hnsw.search(query_vectors, 3)
    hits = sum(len(set(e) & set(a)) for e, a in zip(exact.tolist(), approx.tolist()))
    return hits / (3 * len(sample))


def query_dtype_recall_at_3(index_dir: Path, queries: list[str], dtype: str, num_queries: int) -> float:
    """Recall@3 on the Flat index of queries encoded in ``dtype`` against the same queries in fp32."""
    from rllib_search.serve.retrieval.load import load_index

    exact = load_index(index_dir, dtype="float32")
    reduced = load_index(index_dir, dtype=dtype)
    sample = queries[:num_queries]
    _, want = exact.faiss_index.search(exact.encoder.encode_queries(sample), 3)
    _, got = exact.faiss_index.search(reduced.encoder.encode_queries(sample), 3)
    hits = sum(len(set(w) & set(g)) for w, g in zip(want.tolist(), got.tolist()))
    return hits / (3 * len(sample))


def _summary(latencies: list[float], wall: float, failures: int, batch: int = 1) -> dict[str, float]:
    ms = np.asarray(latencies) * 1000
    return {
        "qps": len(latencies) * batch / wall,  # queries/s: requests x queries a request
        "queries_per_request": batch,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "failures": failures,
        "requests": len(latencies),
        "wall_s": wall,
    }


async def load_http(
    url: str, queries: list[str], concurrency: int, num_requests: int, batch: int = 1
) -> dict[str, float]:
    """``num_requests`` HTTP requests of ``batch`` queries each, ``concurrency`` in flight; throughput
    (queries/s) and latency (of a request)."""
    import aiohttp

    latencies: list[float] = []
    failures = 0
    counter = iter(range(num_requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        for i in counter:
            chosen = [queries[(i * batch + k) % len(queries)] for k in range(batch)]
            body = {"queries": chosen, "topk": 3, "return_scores": True}
            started = time.perf_counter()
            async with session.post(url, json=body) as response:
                await response.read()
                failures += response.status != 200
            latencies.append(time.perf_counter() - started)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return _summary(latencies, time.perf_counter() - started, failures, batch)


async def load_handle(handle, queries: list[str], concurrency: int, num_requests: int) -> dict[str, float]:
    """The same load through a DeploymentHandle: the in-cluster path rollouts use (no HTTP proxy)."""
    latencies: list[float] = []
    counter = iter(range(num_requests))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            await handle.search.remote([queries[i % len(queries)]], 3)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _summary(latencies, time.perf_counter() - started, 0)


def wait_http(url: str, timeout_s: float = 180) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.post(url, json={"queries": ["warm up"], "topk": 1}, timeout=30).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not come up")


def replica_counters(handle, replicas: int) -> dict[str, dict[str, float]]:
    """Each replica's cumulative batches, queries and busy seconds, by replica id: stats calls go to
    whichever replica the router picks, so call until every replica has answered."""
    seen: dict[str, dict[str, float]] = {}
    for _ in range(50 * replicas):
        stats = handle.stats.remote().result()
        seen[stats["replica_id"]] = {k: stats[k] for k in ("batches", "queries", "busy_seconds")}
        if len(seen) == replicas:
            return seen
    raise RuntimeError(f"only {len(seen)} of {replicas} replicas answered a stats call")


def replica_phase(before: dict, after: dict, wall_s: float) -> list[dict[str, float]]:
    """What each replica did in one phase of ``wall_s`` seconds: batches, mean queries a batch, busy
    seconds and the fraction of the phase it was busy."""
    rows = []
    for replica, end in sorted(after.items()):
        start = before.get(replica, {"batches": 0, "queries": 0, "busy_seconds": 0.0})
        batches = end["batches"] - start["batches"]
        busy = end["busy_seconds"] - start["busy_seconds"]
        rows.append(
            {
                "batches": batches,
                "mean_queries_per_batch": (end["queries"] - start["queries"]) / batches if batches else 0.0,
                "busy_s": busy,
                "busy_fraction": busy / wall_s,
            }
        )
    return rows


def start_serve(
    index_dir: Path, port: int, ingress: str, dtype: str, replicas: int, cpus: int, concurrent_batches: int
):
    import ray
    from ray import serve

    from rllib_search.serve.cli import HIGH_THROUGHPUT_ENV, exposure_warnings
    from rllib_search.serve.retrieval.deployment import APP_NAME, build_retriever_app

    if ingress == "haproxy":  # read by Ray's processes when they start
        os.environ.update(HIGH_THROUGHPUT_ENV)
        for line in exposure_warnings("127.0.0.1", high_throughput=True):
            print(f"[bench] warning: {line}", flush=True)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    # Access logs off, as the naive server runs with warnings only: per-request logging costs both alike.
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    app = build_retriever_app(
        {
            "index_dir": str(index_dir),
            "encoder": ENCODER,
            "dtype": dtype,
            "num_replicas": replicas,
            "ray_actor_options": {"num_cpus": cpus},
            "concurrent_batches": concurrent_batches,
        }
    )
    return serve.run(app, name=APP_NAME, route_prefix="/", logging_config=quiet)


def ray_worker_niceness() -> int:
    """The scheduling niceness Ray gives its worker processes (Serve's replicas among them)."""
    import ray

    return ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())


def start_naive(index_dir: Path, port: int, dtype: str, threads: int, niceness: int) -> subprocess.Popen:
    """The naive server on ``threads`` torch/faiss threads, at the replicas' ``niceness``: the load
    generator competes with either server alike."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "naive_retrieval_server.py"),
        str(index_dir),
        str(port),
        dtype,
    ]
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.nice(niceness - os.nice(0)),
    )


def _row(r: dict) -> str:
    text = f"{r['qps']:6.1f} q/s p99 {r['p99_ms']:6.0f} ms"
    if "replicas" in r:  # busy fraction and mean batch of each replica
        text += (
            " ["
            + " ".join(f"{x['busy_fraction']:.0%}/{x['mean_queries_per_batch']:.0f}q" for x in r["replicas"])
            + "]"
        )
    return text


def plot(levels: list[int], systems: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in systems.items():
        left.plot(levels, [r["qps"] for r in rows], "o-", label=name)
        right.plot(levels, [r["p99_ms"] for r in rows], "o-", label=name)
    left.set(xlabel="concurrent one-query requests", ylabel="queries / s", title="throughput", xscale="log")
    right.set(
        xlabel="concurrent one-query requests", ylabel="ms", title="p99 latency", xscale="log", yscale="log"
    )
    for ax in (left, right):
        ax.set_xticks(levels, [str(c) for c in levels])
    left.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k passages and fewer requests (< 3 minutes)")
    parser.add_argument("--passages", type=int, help="corpus size (default 100k; 10k with --quick)")
    parser.add_argument(
        "--requests", type=int, help="requests per concurrency level (default 400; 150 quick)"
    )
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "rllib_search" / "bench"))
    parser.add_argument(
        "--ingress",
        choices=["haproxy", "proxy"],
        default="haproxy",
        help="Serve's HTTP ingress: Ray's high-throughput HAProxy mode (default) or the Python proxy actor",
    )
    parser.add_argument(
        "--dtype", default="auto", help="query encoder dtype of both systems (auto: bf16 on CPUs with it)"
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="Serve replicas, sharing the cores (default 1: all of them)"
    )
    parser.add_argument("--batch-queries", type=int, default=32, help="queries a rollout's turn request")
    parser.add_argument("--replica-cpus", type=int, help="CPUs a replica (default: the cores / --replicas)")
    parser.add_argument("--concurrent-batches", type=int, default=1, help="batches a replica runs at once")
    parser.add_argument("--runners", type=int, default=4, help="runners sending batched requests at once")
    args = parser.parse_args()
    args.replica_cpus = args.replica_cpus or max(1, (os.cpu_count() or 1) // args.replicas)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    num_passages = args.passages or (10_000 if args.quick else 100_000)
    num_requests = args.requests or (150 if args.quick else 400)
    levels = [1, 8, 32]

    index_dir, queries = build_corpus_and_index(num_passages, Path(args.cache))
    random.Random(0).shuffle(queries)
    recall = hnsw_recall_at_3(index_dir, queries, 200 if args.quick else 500)
    print(f"[bench] HNSW recall@3 vs Flat: {recall:.3f}", flush=True)
    import torch

    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.retrieval.encoders import resolve_dtype

    query_dtype = str(resolve_dtype(args.dtype, torch.device("cpu"))).removeprefix("torch.")
    dtype_recall = query_dtype_recall_at_3(index_dir, queries, query_dtype, 200 if args.quick else 500)
    print(f"[bench] {query_dtype} queries: recall@3 vs fp32 queries {dtype_recall:.3f}", flush=True)

    serve_port = free_port()
    handle = start_serve(
        index_dir,
        serve_port,
        args.ingress,
        query_dtype,
        args.replicas,
        args.replica_cpus,
        args.concurrent_batches,
    )
    serve_url = f"http://127.0.0.1:{serve_port}/retrieve"
    # The naive server on one thread and on every core: the baseline is the faster at each level.
    naive_threads = sorted({1, os.cpu_count() or 1})
    naive_ports = {threads: free_port() for threads in naive_threads}
    niceness = ray_worker_niceness()
    naives = [start_naive(index_dir, naive_ports[t], query_dtype, t, niceness) for t in naive_threads]
    naive_urls = {t: f"http://127.0.0.1:{port}/retrieve" for t, port in naive_ports.items()}
    serve_rows, handle_rows, naive_rows = [], [], {t: [] for t in naive_threads}

    def on_replicas(load) -> dict:
        """Run one phase of load against Serve; its row gains what each replica did meanwhile."""
        before = replica_counters(handle, args.replicas)
        row = asyncio.run(load)
        row["replicas"] = replica_phase(before, replica_counters(handle, args.replicas), row["wall_s"])
        return row

    try:
        wait_http(serve_url)
        for url in naive_urls.values():
            wait_http(url)
        for concurrency in levels:  # side by side: every system at a level before the next level
            n = max(num_requests // 4, 40) if concurrency == 1 else num_requests
            serve_rows.append(on_replicas(load_http(serve_url, queries, concurrency, n)))
            handle_rows.append(on_replicas(load_handle(handle, queries, concurrency, n)))
            for threads, url in naive_urls.items():
                naive_rows[threads].append(asyncio.run(load_http(url, queries, concurrency, n)))
            naive_text = " | ".join(f"naive/{t}t {_row(rows[-1])}" for t, rows in naive_rows.items())
            print(
                f"[bench] c={concurrency:<3d} serve/http {_row(serve_rows[-1])} | serve/handle "
                f"{_row(handle_rows[-1])} | {naive_text}",
                flush=True,
            )
        # As rollouts send them: one request a turn with every query of a sample, 1 and several runners.
        batched_levels = sorted({1, args.runners})
        batched_serve, batched_naive = [], {t: [] for t in naive_threads}
        for runners in batched_levels:
            n = runners * (12 if args.quick else 25)  # a few seconds a system: enough for quick to agree
            batched_serve.append(on_replicas(load_http(serve_url, queries, runners, n, args.batch_queries)))
            for threads, url in naive_urls.items():
                batched_naive[threads].append(
                    asyncio.run(load_http(url, queries, runners, n, args.batch_queries))
                )
            naive_text = " | ".join(f"naive/{t}t {_row(rows[-1])}" for t, rows in batched_naive.items())
            print(
                f"[bench] {runners} runner(s) x {args.batch_queries}-query requests: serve/http "
                f"{_row(batched_serve[-1])} | {naive_text}",
                flush=True,
            )
        replica_stats = [handle.stats.remote().result() for _ in range(4 * args.replicas)]
        replica_setup = {k: replica_stats[0][k] for k in ("concurrent_batches", "threads", "shards")}
    finally:
        for naive in naives:
            naive.terminate()
        from ray import serve

        serve.shutdown()
    best_naive = [
        max((rows[i] for rows in naive_rows.values()), key=lambda r: r["qps"]) for i in range(len(levels))
    ]
    best_batched_naive = [
        max((rows[i] for rows in batched_naive.values()), key=lambda r: r["qps"])
        for i in range(len(batched_levels))
    ]

    results = {
        "benchmark": "retriever",
        "quick": args.quick,
        "passages": num_passages,
        "encoder": ENCODER,
        "index": "flat",
        "cpus": os.cpu_count(),
        "ingress": args.ingress,
        "replicas": args.replicas,
        "replica_cpus": args.replica_cpus,
        "server_niceness": niceness,  # both servers' (Ray's workers'); the load generator runs at 0
        "query_dtype": query_dtype,
        "query_dtype_recall_at_3_vs_fp32": dtype_recall,
        # Both over HTTP, the like-for-like comparison (Search-R1's clients call HTTP; the ingress named
        # above carries Serve's HTTP), at every concurrency of one-query requests: Serve loses at 1.
        "serve_vs_naive_qps_ratio": {
            str(c): serve_rows[i]["qps"] / best_naive[i]["qps"] for i, c in enumerate(levels)
        },
        # As rollouts send them: one request of --batch-queries queries a turn, from 1 and --runners runners.
        "batched_queries_per_request": args.batch_queries,
        "batched_serve_vs_naive_qps_ratio": {
            str(r): batched_serve[i]["qps"] / best_batched_naive[i]["qps"]
            for i, r in enumerate(batched_levels)
        },
        "batched": {
            str(r): {
                "serve_http": batched_serve[i],
                "naive_http": best_batched_naive[i],
                **{f"naive_http_{t}_threads": rows[i] for t, rows in batched_naive.items()},
            }
            for i, r in enumerate(batched_levels)
        },
        "serve_vs_naive_qps_ratio_c32": serve_rows[-1]["qps"] / best_naive[-1]["qps"],
        "serve_p99_ms_c32": serve_rows[-1]["p99_ms"],
        # The in-cluster path our rollouts use: a DeploymentHandle, no HTTP proxy.
        "serve_handle_vs_naive_qps_ratio_c32": handle_rows[-1]["qps"] / best_naive[-1]["qps"],
        "serve_handle_p99_ms_c32": handle_rows[-1]["p99_ms"],
        "hnsw_recall_at_3": recall,
        "replica_rss_mb": max(stats["rss_mb"] for stats in replica_stats),
        "replica_mean_queries_per_batch": max(stats["mean_queries_per_batch"] for stats in replica_stats),
        # Per replica: batches at once, threads per batch (from its CPUs) and the shards a big batch is split
        # into (one thread each).
        "replica_setup": replica_setup,
        "levels": {
            str(c): {
                "serve_http": serve_rows[i],
                "serve_handle": handle_rows[i],
                "naive_http": best_naive[i],
                **{f"naive_http_{t}_threads": rows[i] for t, rows in naive_rows.items()},
            }
            for i, c in enumerate(levels)
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "retriever_quick" if args.quick else "retriever"
    plot(
        levels,
        {
            f"Serve + batching (HTTP, {args.ingress})": serve_rows,
            "Serve + batching (handle)": handle_rows,
            **{f"naive, one request at a time (HTTP, {t} thread(s))": rows for t, rows in naive_rows.items()},
        },
        RESULTS / f"{name}.png",
        f"Retriever on {os.cpu_count()} CPU cores: MiniLM ({query_dtype} queries) + faiss Flat, "
        f"{num_passages:,} passages",
    )
    write_results(name, results)


if __name__ == "__main__":
    main()
