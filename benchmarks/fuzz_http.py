"""HTTP fuzzing: generated requests against the retriever's ``/retrieve`` and the judge's ``/v1/completions``
and ``/v1/chat/completions`` at the shipped request bounds, through Serve's proxy actor and through HAProxy.

For each ingress a local Ray in a subprocess serves, on 127.0.0.1, the retriever (BM25 over a 300-passage
synthetic corpus, as ``tuned_examples/serve_cpu.yaml`` serves BM25) at ``/`` and the judge (a tiny Gemma-3)
at ``/judge``, with the bounds of the shipped Serve configs (``tests/http_fuzz.py``: ``shipped_limits``)
and Serve's proxy actor (``proxy``) or Ray's high-throughput HAProxy mode (``haproxy``, what
``rllib-search serve --high-throughput`` starts). The same ``--requests`` requests per endpoint go through
each (``tests/http_fuzz.py``: mostly well-formed JSON objects with one to three fields mutated at and past
their bounds, a minority of bodies past ``max_body_bytes``, bodies that are not JSON objects, other content
types, methods and paths), 8 at a time. The figures that matter: 0 responses 5xx (and 0 transport errors),
the share of requests the endpoint parsed (``share_parsed``: answered, or refused by the schema or the
endpoint's bounds), and each service still answering a valid request afterwards.

Prints a final JSON line and writes ``benchmarks/results/fuzz_http.json`` (``fuzz_http_quick.json`` with
``--quick``: 300 per endpoint and ingress), with the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/fuzz_http.py            # 5,000 per endpoint and ingress: 10,000 per endpoint
    python benchmarks/fuzz_http.py --quick
    python benchmarks/fuzz_http.py --ingress haproxy --requests 1000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.* and tests.*

from benchmarks.results_file import write_results  # noqa: E402


def totals(rows: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per endpoint, the sums over ingresses: requests, status and stage counts, shares, 5xx."""
    out: dict[str, dict] = {}
    for by_endpoint in rows.values():
        for endpoint, row in by_endpoint.items():
            total = out.setdefault(
                endpoint, {"requests": 0, "status_counts": Counter(), "stage_counts": Counter(), "5xx": 0}
            )
            total["requests"] += row["requests"]
            total["status_counts"].update(row["status_counts"])
            total["stage_counts"].update(row["stage_counts"])
            total["5xx"] += row["5xx"]
    for total in out.values():
        stages, count = total["stage_counts"], max(total["requests"], 1)
        total["status_counts"] = dict(sorted(total["status_counts"].items(), key=lambda kv: int(kv[0])))
        total["stage_counts"] = dict(stages)
        total["share_parsed"] = round(
            sum(stages.get(s, 0) for s in ("schema", "bounds", "answered")) / count, 4
        )
        total["share_past_schema"] = round(sum(stages.get(s, 0) for s in ("bounds", "answered")) / count, 4)
        total["share_answered"] = round(stages.get("answered", 0) / count, 4)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="300 requests per endpoint and ingress")
    parser.add_argument("--requests", type=int, help="requests per endpoint and ingress (default 5000)")
    parser.add_argument("--ingress", nargs="+", choices=["proxy", "haproxy"], default=["proxy", "haproxy"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=8, help="requests in flight at once")
    args = parser.parse_args()
    count = args.requests or (300 if args.quick else 5000)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from tests.http_fuzz import (
        ENDPOINTS,
        SERVICE,
        build_assets,
        generate,
        send,
        shipped_limits,
        start_services,
        still_answering,
    )

    limits = shipped_limits()
    print(f"[fuzz] bounds: {json.dumps(limits)}", flush=True)
    rows: dict[str, dict[str, dict]] = {}
    answering: dict[str, dict[str, bool]] = {}
    started_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        assets = build_assets(Path(tmp) / "assets")
        for ingress in args.ingress:
            started = time.perf_counter()
            services = start_services(assets, limits, ingress, Path(tmp) / f"{ingress}.log")
            print(f"[fuzz] {ingress}: services up in {time.perf_counter() - started:.0f} s", flush=True)
            rows[ingress] = {}
            try:
                for endpoint in ENDPOINTS:
                    base = services.retriever if SERVICE[endpoint] == "retriever" else services.judge
                    result = send(base, generate(endpoint, count, args.seed, limits), workers=args.workers)
                    rows[ingress][endpoint] = result.summary()
                    shown = {
                        k: v
                        for k, v in rows[ingress][endpoint].items()
                        if not k.startswith("examples") and k != "slowest"
                    }
                    print(f"[fuzz] {ingress} {endpoint}: {json.dumps(shown)}", flush=True)
                    for line in rows[ingress][endpoint]["examples_5xx"]:
                        print(f"[fuzz]   5xx: {line}", flush=True)
                answering[ingress] = still_answering(services.retriever, services.judge)
            finally:
                services.stop()

    by_endpoint = totals(rows)
    total_5xx = sum(row["5xx"] for row in by_endpoint.values())
    all_answering = all(all(flags.values()) for flags in answering.values())
    results = {
        "benchmark": "fuzz_http",
        "quick": args.quick,
        "seed": args.seed,
        "seconds": round(time.perf_counter() - started_all, 1),
        "limits": limits,
        "requests_per_endpoint_and_ingress": count,
        "requests": sum(row["requests"] for row in by_endpoint.values()),
        "endpoints": by_endpoint,
        "ingresses": rows,
        "5xx": total_5xx,
        "still_answering": answering,
    }
    headline = {
        "benchmark": "fuzz_http",
        "requests": results["requests"],
        "endpoints": {
            endpoint: {
                k: row[k] for k in ("requests", "share_parsed", "share_answered", "status_counts", "5xx")
            }
            for endpoint, row in by_endpoint.items()
        },
        "5xx": total_5xx,
        "still_answering": all_answering,
    }
    write_results("fuzz_http_quick" if args.quick else "fuzz_http", results, headline=headline)
    return 0 if total_5xx == 0 and all_answering else 1


if __name__ == "__main__":
    sys.exit(main())
