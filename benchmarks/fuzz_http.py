"""HTTP fuzzing: generated requests against the retriever's ``/retrieve`` and the judge's OpenAI subset.

One local Ray with Serve on 127.0.0.1: the retriever (a flat index of the bundled MiniLM over a small
synthetic corpus, the test suite's bounds) and the judge (a tiny Gemma-3 built here, as the judge tests use).
``--requests`` requests per endpoint (default 10,000: retriever ``/retrieve``, judge ``/v1/completions`` and
``/v1/chat/completions`` together) are drawn by hypothesis (``tests/http_fuzz.py``: wrong types, huge,
empty, unicode and lone-surrogate strings, NaN, huge integers, deep nesting, raw bytes, wrong methods,
paths and content types; seeded, drawn in a fresh interpreter) and sent 8 at a time. The figure that
matters: 0 responses 5xx (and 0 transport errors), and each server still answering a valid request
afterwards.

Prints a final JSON line and writes ``benchmarks/results/fuzz_http.json`` (``fuzz_http_quick.json`` with
``--quick``: 500 per endpoint).

    python benchmarks/fuzz_http.py            # 10,000 requests per endpoint
    python benchmarks/fuzz_http.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LIMITS = {"max_queries": 64, "max_query_chars": 500, "max_topk": 10}
JUDGE_LIMITS = {"max_prompts": 8, "max_prompt_chars": 4000, "max_prompt_tokens": 300, "max_tokens": 16}


def start_services(root: Path) -> tuple[str, str]:
    """Ray, Serve on 127.0.0.1, the retriever at ``/`` and the judge at ``/judge``; returns both base URLs."""
    import ray
    from ray import serve

    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.llm.tiny import build_tiny_tokenizer
    from rllib_search.serve.cluster import patient_serve_proxies
    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.judge.deployment import build_judge_app
    from rllib_search.serve.retrieval.build import build_index
    from rllib_search.serve.retrieval.deployment import build_retriever_app
    from tests.helpers import build_tiny_sliding_window_lm

    world = generate_world(SyntheticWorldConfig(seed=3, num_passages=300, num_train=0, num_test=5))
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    build_index(root / "corpus.jsonl", root / "flat", "flat", encoder="all-minilm-l6-v2", progress=False)
    judge_dir = build_tiny_sliding_window_lm(root / "judge", build_tiny_tokenizer(root / "tok"))

    patient_serve_proxies()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    retriever = {
        "index_dir": str(root / "flat"),
        "num_replicas": 1,
        "ray_actor_options": {"num_cpus": 1},
        "limits": LIMITS,
        "max_batch_queries": 256,
    }
    serve.run(build_retriever_app(retriever), name="retriever", route_prefix="/")
    judge = {
        "model": str(judge_dir),
        "served_model_name": "tiny-judge",
        "num_replicas": 1,
        "ray_actor_options": {"num_cpus": 1},
        "limits": JUDGE_LIMITS,
        "max_batch_prompts": 64,
        "default_max_tokens": 6,
    }
    serve.run(build_judge_app(judge), name="judge", route_prefix="/judge")
    return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/judge"


def still_answering(retriever_url: str, judge_url: str) -> dict[str, bool]:
    """Whether each server answers a valid request with 200 and a well-formed body."""
    import requests

    retrieve = requests.post(
        f"{retriever_url}/retrieve", json={"queries": ["lead singer"], "topk": 2}, timeout=60
    )
    completion = requests.post(
        f"{judge_url}/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=60
    )
    return {
        "retriever": retrieve.status_code == 200 and len(retrieve.json()["result"][0]) == 2,
        "judge": completion.status_code == 200 and len(completion.json()["choices"]) == 1,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="500 requests per endpoint")
    parser.add_argument("--requests", type=int, help="requests per endpoint (default 10000; --quick: 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=8, help="requests in flight at once")
    args = parser.parse_args()
    count = args.requests or (500 if args.quick else 10_000)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import ray
    from ray import serve

    from tests.http_fuzz import describe, draw_requests_isolated, send

    endpoints = {"retriever /retrieve": "retrieve", "judge /v1/*completions": "judge"}
    drawn = {}
    for name, kind in endpoints.items():
        started = time.perf_counter()
        drawn[name] = draw_requests_isolated(kind, count, args.seed)
        print(f"[fuzz] {name}: drew {count} requests in {time.perf_counter() - started:.0f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        retriever_url, judge_url = start_services(Path(tmp))
        rows = {}
        for (name, batch), base in zip(drawn.items(), (retriever_url, judge_url)):
            started = time.perf_counter()
            result = send(base, batch, workers=args.workers)
            seconds = time.perf_counter() - started
            rows[name] = {
                "requests": len(batch),
                "seconds": round(seconds, 1),
                "status_counts": {str(k): v for k, v in sorted(result.statuses.items())},
                "5xx": result.server_errors,
                "examples_5xx": [f"{status} {describe(r)} -> {text}" for r, status, text in result.failures],
            }
            print(
                f"[fuzz] {name}: {json.dumps({k: v for k, v in rows[name].items() if k != 'examples_5xx'})}"
            )
            for line in rows[name]["examples_5xx"]:
                print(f"[fuzz]   5xx: {line}", flush=True)
        answering = still_answering(retriever_url, judge_url)
        serve.shutdown()
        ray.shutdown()

    total_5xx = sum(row["5xx"] for row in rows.values())
    results = {
        "benchmark": "fuzz_http",
        "quick": args.quick,
        "seed": args.seed,
        "machine": f"{os.cpu_count()} CPU cores",
        "requests": sum(row["requests"] for row in rows.values()),
        "endpoints": rows,
        "5xx": total_5xx,
        "still_answering": answering,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "fuzz_http_quick.json" if args.quick else "fuzz_http.json"
    (RESULTS / name).write_text(json.dumps(results, indent=2) + "\n")
    summary = {
        "requests": results["requests"],
        "status_counts": {name: row["status_counts"] for name, row in rows.items()},
        "5xx": total_5xx,
        "still_answering": answering,
    }
    print(json.dumps(summary))
    return 0 if total_5xx == 0 and all(answering.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
