"""Evidence judge benchmark: the batched Serve deployment against one-at-a-time calls (R-Search's pattern).

One judge model (the bundled Gemma-3-270M, greedy, answers cut at the first newline, at most 32 tokens),
one deployment on 127.0.0.1 and the same evidences (R-Search's Table 5 prompt over the passages that answer
each hop of the synthetic world's questions), measured side by side in one run, alternating:

- ``one by one``: R-Search's own pattern, one HTTP request per evidence, each sent after the previous
  answer came back;
- ``batched``: what a training run sends, ``--clients`` concurrent EnvRunners each posting its sample's
  ``--sample-size`` evidences in ONE request (``/v1/completions`` with a list of prompts); Serve's
  ``@serve.batch`` merges the requests that arrive while a batch runs.

The figure is answered evidences per second, batched over one by one (medians of the repeats), and the p99
latency of one sample's judge call in batched mode. Also checked: both modes give the same answers.

Prints a final JSON line and writes ``benchmarks/results/judge.json`` and ``judge.png`` (``judge_quick.*``
with ``--quick``; ``--dtype bfloat16`` adds ``_bfloat16``), with the commit and the machine
(``benchmarks/results_file.py``).

    python benchmarks/judge_bench.py            # full run (about 6 minutes on 2 cores)
    python benchmarks/judge_bench.py --quick    # under 3 minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402

JUDGE = "gemma3-270m"


def evidence_prompts(count: int) -> list[str]:
    """R-Search evidence prompts: each question of the synthetic world with the passages (BM25 top-1 for each
    of its hops' queries) a perfect policy would quote as its evidence."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.env.judge import evidence_prompt
    from rllib_search.serve.retrieval.bm25 import BM25Retriever

    world = generate_world(
        SyntheticWorldConfig(seed=0, num_passages=2000, num_train=0, num_test=max(count, 20))
    )
    retriever = BM25Retriever(world.passages)
    prompts = []
    for record in world.test[:count]:
        queries = [hop["query"] for hop in record.extra["hops"]]
        evidence = " ".join(f"{p.title}: {p.text}" for hits in retriever.search(queries, 1) for p in hits)
        prompts.append(evidence_prompt(record.question, evidence))
    return prompts


def post(session, url: str, prompts: list[str]) -> tuple[list[str], float]:
    started = time.perf_counter()
    body = {"prompt": prompts, "max_tokens": 32, "temperature": 0.0, "stop": ["\n"]}
    response = session.post(url, json=body, timeout=600)
    response.raise_for_status()
    choices = sorted(response.json()["choices"], key=lambda c: c["index"])
    return [c["text"].strip() for c in choices], time.perf_counter() - started


def one_by_one(url: str, prompts: list[str]) -> dict:
    import requests

    session = requests.Session()
    started = time.perf_counter()
    answers, latencies = [], []
    for prompt in prompts:
        texts, seconds = post(session, url, [prompt])
        answers += texts
        latencies.append(seconds)
    wall = time.perf_counter() - started
    return {"prompts_per_s": len(prompts) / wall, "latencies": latencies, "answers": answers, "seconds": wall}


def batched(url: str, prompts: list[str], clients: int, sample_size: int) -> dict:
    """``clients`` threads, each posting its samples (``sample_size`` prompts a request) one after another."""
    import requests

    samples = [prompts[i : i + sample_size] for i in range(0, len(prompts), sample_size)]
    per_client = [samples[c::clients] for c in range(clients)]

    def client(own: list[list[str]]) -> list[tuple[list[str], float]]:
        session = requests.Session()
        return [post(session, url, sample) for sample in own]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(client, per_client))
    wall = time.perf_counter() - started
    answers: dict[str, str] = {}
    latencies = []
    for own, outcomes in zip(per_client, results):
        for sample, (texts, seconds) in zip(own, outcomes):
            answers.update(zip(sample, texts))
            latencies.append(seconds)
    ordered = [answers[p] for p in prompts]
    return {"prompts_per_s": len(prompts) / wall, "latencies": latencies, "answers": ordered, "seconds": wall}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    modes = ["one by one", "batched"]
    for repeat, row in enumerate(rows):
        ax.scatter(modes, [row["one_by_one_qps"], row["batched_qps"]], label=f"repeat {repeat + 1}")
    ax.set_ylabel("evidences judged per second")
    ax.set_title(f"{JUDGE} judge on Ray Serve (2 CPU cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer evidences and one repeat (< 3 minutes)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent EnvRunners in batched mode")
    parser.add_argument("--sample-size", type=int, default=16, help="evidences in one sample's judge call")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the judge replica")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="the judge's weights"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    import ray
    import requests
    from ray import serve

    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.judge.deployment import build_judge_app

    repeats = 1 if args.quick else 2
    serial_count = 12 if args.quick else 32
    batched_count = (2 if args.quick else 4) * args.clients * args.sample_size
    prompts = evidence_prompts(max(serial_count, batched_count))
    print(f"[bench] {len(prompts)} evidence prompts; loading {JUDGE} on Ray Serve", flush=True)

    ray.init(address="local", num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_judge_app(
        {
            "model": JUDGE,
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": args.threads},
            "batch_wait_timeout_s": 0.01,
            "dtype": args.dtype,
        }
    )
    serve.run(app, name="judge", route_prefix="/judge")
    url = f"http://127.0.0.1:{port}/judge/v1/completions"
    post(requests.Session(), url, prompts[:2])  # warm-up
    rows = []
    for repeat in range(repeats):
        serial = one_by_one(url, prompts[:serial_count])
        print(
            f"[bench] repeat {repeat + 1}: one by one {serial['prompts_per_s']:.2f} evidences/s", flush=True
        )
        batch = batched(url, prompts[:batched_count], args.clients, args.sample_size)
        print(f"[bench] repeat {repeat + 1}: batched {batch['prompts_per_s']:.2f} evidences/s", flush=True)
        agree = np.mean([a == b for a, b in zip(serial["answers"], batch["answers"][:serial_count])])
        rows.append(
            {
                "one_by_one_qps": serial["prompts_per_s"],
                "batched_qps": batch["prompts_per_s"],
                "ratio": batch["prompts_per_s"] / serial["prompts_per_s"],
                "one_by_one_p50_ms": 1000 * statistics.median(serial["latencies"]),
                "batched_call_p50_ms": 1000 * statistics.median(batch["latencies"]),
                "batched_call_p99_ms": 1000 * float(np.percentile(batch["latencies"], 99)),
                "answers_agree": float(agree),
            }
        )
    serve.shutdown()
    ray.shutdown()

    results = {
        "benchmark": "judge",
        "quick": args.quick,
        "judge_model": JUDGE,
        "judge_dtype": args.dtype,
        "judge_threads": args.threads,
        "clients": args.clients,
        "sample_size": args.sample_size,
        "evidences_one_by_one": serial_count,
        "evidences_batched": batched_count,
        "repeats": rows,
        "example_prompt": prompts[0],
        "example_answer": rows and serial["answers"][0],
        "judge_batched_vs_one_by_one_ratio": statistics.median(r["ratio"] for r in rows),
        "judge_p99_ms": statistics.median(r["batched_call_p99_ms"] for r in rows),
        "one_by_one_evidences_per_s": statistics.median(r["one_by_one_qps"] for r in rows),
        "batched_evidences_per_s": statistics.median(r["batched_qps"] for r in rows),
        "answers_agree": min(r["answers_agree"] for r in rows),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "judge" + ("_quick" if args.quick else "") + ("" if args.dtype == "auto" else f"_{args.dtype}")
    plot(rows, RESULTS / f"{name}.png")
    headline = {k: v for k, v in results.items() if k not in ("repeats", "example_prompt")}
    write_results(name, results, headline=headline)


if __name__ == "__main__":
    main()
