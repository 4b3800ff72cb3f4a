"""Retrieval service benchmark: Ray Serve with dynamic batching against a naive one-request-at-a-time server.

Both serve the same MiniLM Flat index over a synthetic corpus (100k passages; ``--quick``: 10k) on
127.0.0.1, and are measured side by side in one run: queries/s and p50/p99 latency at concurrency 1, 8
and 32 (one query per request, as a rollout's per-sample search would send). The naive server is
Search-R1's design: a FastAPI app on one uvicorn worker whose synchronous endpoint encodes and searches each
request alone. Also measured: HNSW recall@3 against Flat, and the resident memory of a Serve replica.

Prints a final JSON line and writes ``benchmarks/results/retriever.json`` and ``retriever.png``.

    python benchmarks/retriever_bench.py            # full run (the first run builds the index: minutes)
    python benchmarks/retriever_bench.py --quick    # under 3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ENCODER = "all-minilm-l6-v2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_corpus_and_index(num_passages: int, cache: Path) -> tuple[Path, list[str]]:
    """A synthetic corpus of ``num_passages`` passages (worlds of several seeds) and its Flat index."""
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.env.retrieval import Passage
    from rllib_search.serve.indexes import build_index

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

    from rllib_search.serve.indexes import KIND_OPTIONS, load_index

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


def _summary(latencies: list[float], wall: float, failures: int) -> dict[str, float]:
    ms = np.asarray(latencies) * 1000
    return {
        "qps": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "failures": failures,
        "requests": len(latencies),
    }


async def load_http(url: str, queries: list[str], concurrency: int, num_requests: int) -> dict[str, float]:
    """``num_requests`` one-query HTTP requests, ``concurrency`` in flight; throughput and latency."""
    import aiohttp

    latencies: list[float] = []
    failures = 0
    counter = iter(range(num_requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        for i in counter:
            body = {"queries": [queries[i % len(queries)]], "topk": 3, "return_scores": True}
            started = time.perf_counter()
            async with session.post(url, json=body) as response:
                await response.read()
                failures += response.status != 200
            latencies.append(time.perf_counter() - started)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return _summary(latencies, time.perf_counter() - started, failures)


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


def start_serve(index_dir: Path, port: int):
    import ray
    from ray import serve

    from rllib_search.serve.retriever import APP_NAME, build_retriever_app

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Access logs off, as the naive server runs with warnings only: per-request logging costs both alike.
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    app = build_retriever_app(
        {
            "index_dir": str(index_dir),
            "encoder": ENCODER,
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 1},
        }
    )
    return serve.run(app, name=APP_NAME, route_prefix="/", logging_config=quiet)


def start_naive(index_dir: Path, port: int) -> subprocess.Popen:
    # One thread, as Ray gives the one-CPU Serve replica: both systems get the same compute.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "naive_retrieval_server.py"),
        str(index_dir),
        str(port),
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _row(r: dict[str, float]) -> str:
    return f"{r['qps']:6.1f} q/s p99 {r['p99_ms']:6.0f} ms"


def plot(levels: list[int], systems: dict[str, list[dict]], path: Path) -> None:
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
    fig.suptitle("Retriever on 2 CPU cores: MiniLM + faiss Flat")
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
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    num_passages = args.passages or (10_000 if args.quick else 100_000)
    num_requests = args.requests or (150 if args.quick else 400)
    levels = [1, 8, 32]

    index_dir, queries = build_corpus_and_index(num_passages, Path(args.cache))
    random.Random(0).shuffle(queries)
    recall = hnsw_recall_at_3(index_dir, queries, 200 if args.quick else 500)
    print(f"[bench] HNSW recall@3 vs Flat: {recall:.3f}", flush=True)

    serve_port, naive_port = free_port(), free_port()
    handle = start_serve(index_dir, serve_port)
    naive = start_naive(index_dir, naive_port)
    serve_url = f"http://127.0.0.1:{serve_port}/retrieve"
    naive_url = f"http://127.0.0.1:{naive_port}/retrieve"
    serve_rows, handle_rows, naive_rows = [], [], []
    try:
        wait_http(serve_url)
        wait_http(naive_url)
        for concurrency in levels:  # side by side: every system at a level before the next level
            n = max(num_requests // 4, 40) if concurrency == 1 else num_requests
            serve_rows.append(asyncio.run(load_http(serve_url, queries, concurrency, n)))
            handle_rows.append(asyncio.run(load_handle(handle, queries, concurrency, n)))
            naive_rows.append(asyncio.run(load_http(naive_url, queries, concurrency, n)))
            print(
                f"[bench] c={concurrency:<3d} serve/http {_row(serve_rows[-1])} | serve/handle "
                f"{_row(handle_rows[-1])} | naive {_row(naive_rows[-1])}",
                flush=True,
            )
        replica_stats = handle.stats.remote().result()
    finally:
        naive.terminate()
        from ray import serve

        serve.shutdown()

    results = {
        "benchmark": "retriever",
        "quick": args.quick,
        "passages": num_passages,
        "encoder": ENCODER,
        "index": "flat",
        "cpus": os.cpu_count(),
        # Both over HTTP: the like-for-like comparison (Search-R1's clients call HTTP).
        "serve_vs_naive_qps_ratio_c32": serve_rows[-1]["qps"] / naive_rows[-1]["qps"],
        "serve_p99_ms_c32": serve_rows[-1]["p99_ms"],
        # The in-cluster path our rollouts use: a DeploymentHandle, no HTTP proxy.
        "serve_handle_vs_naive_qps_ratio_c32": handle_rows[-1]["qps"] / naive_rows[-1]["qps"],
        "serve_handle_p99_ms_c32": handle_rows[-1]["p99_ms"],
        "hnsw_recall_at_3": recall,
        "replica_rss_mb": replica_stats["rss_mb"],
        "replica_mean_queries_per_batch": replica_stats["mean_queries_per_batch"],
        "levels": {
            str(c): {"serve_http": s, "serve_handle": h, "naive_http": n}
            for c, s, h, n in zip(levels, serve_rows, handle_rows, naive_rows)
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "retriever.json").write_text(json.dumps(results, indent=2))
    plot(
        levels,
        {
            "Serve + batching (HTTP)": serve_rows,
            "Serve + batching (handle)": handle_rows,
            "naive, one request at a time (HTTP)": naive_rows,
        },
        RESULTS / "retriever.png",
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
