"""``rllib-search serve retriever --index DIR``: run the retriever application on Ray Serve.

Connects to a running Ray cluster when there is one (``ray start`` / ``RAY_ADDRESS``), else starts a
local one; binds HTTP to 127.0.0.1 unless ``--host`` says otherwise; serves until interrupted.

``--high-throughput`` starts the local Ray with Ray's high-throughput Serve settings
(``RAY_SERVE_ENABLE_HA_PROXY=1``, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``): HAProxy on ``--port`` forwards
HTTP straight to each replica's own HTTP server (ports 30000-31000, which Ray binds on all interfaces so
HAProxy on other nodes can reach them) instead of through the Python proxy actor. On a cluster, export the
two variables before ``ray start`` on every node.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

# Ray's documented high-throughput Serve mode (Ray >= 2.55); read when Ray's processes start.
HIGH_THROUGHPUT_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def add_serve_commands(subparsers: Any) -> None:
    serve_parser = subparsers.add_parser("serve", help="run a service on Ray Serve")
    serve_sub = serve_parser.add_subparsers(dest="service", required=True)
    retriever = serve_sub.add_parser("retriever", help="the retrieval service (Search-R1 HTTP schema)")
    retriever.add_argument(
        "--index", required=True, help="index directory built by `rllib-search index build`"
    )
    retriever.add_argument("--encoder", help="expected encoder (checked against the index manifest)")
    retriever.add_argument("--host", default="127.0.0.1", help="HTTP host (default: loopback only)")
    retriever.add_argument("--port", type=int, default=8000)
    retriever.add_argument("--min-replicas", type=int, default=1)
    retriever.add_argument("--max-replicas", type=int, default=1)
    retriever.add_argument("--target-ongoing-requests", type=float, default=16)
    retriever.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica")
    retriever.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica")
    retriever.add_argument("--max-batch-queries", type=int, default=1024)
    retriever.add_argument("--batch-wait-ms", type=float, default=5.0)
    retriever.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="query encoder dtype (auto: fp16 on GPU, bf16 on CPUs with native bf16, else fp32)",
    )
    retriever.add_argument(
        "--high-throughput",
        action="store_true",
        help="start the local Ray with HAProxy ingress and Ray's throughput-optimised Serve settings",
    )
    retriever.add_argument(
        "--address",
        default=None,
        help="Ray address; 'local' starts a new local Ray (default: a running cluster if any, else local)",
    )
    retriever.add_argument(
        "--duration-s", type=float, help="stop after this many seconds (default: run forever)"
    )
    retriever.set_defaults(func=cmd_serve_retriever)


def retriever_app_args(args: argparse.Namespace) -> dict[str, Any]:
    """The application builder's arguments from the command line."""
    return {
        "index_dir": args.index,
        "encoder": args.encoder,
        "max_batch_queries": args.max_batch_queries,
        "batch_wait_timeout_s": args.batch_wait_ms / 1000,
        "dtype": args.dtype,
        "autoscaling_config": {
            "min_replicas": args.min_replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target_ongoing_requests,
        },
        "ray_actor_options": {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus},
    }


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from rllib_search.serve.retriever import APP_NAME, build_retriever_app

    if args.address == "local":
        address = None
    elif args.address is not None:
        address = args.address
    else:
        address = "auto" if _cluster_running() else None
    if args.high_throughput and address is None:
        os.environ.update(HIGH_THROUGHPUT_ENV)  # inherited by the Ray processes ray.init starts
    elif args.high_throughput:
        print(
            "[serve] --high-throughput only configures a Ray this command starts; on a running cluster "
            f"export {' and '.join(f'{k}=1' for k in HIGH_THROUGHPUT_ENV)} before `ray start`",
            flush=True,
        )
    ray.init(address=address, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_retriever_app(retriever_app_args(args)), name=APP_NAME, route_prefix="/")
    ingress = "HAProxy" if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "proxy actor"
    print(f"[serve] retriever ready ({ingress}): POST http://{args.host}:{args.port}/retrieve", flush=True)
    started = time.monotonic()
    try:
        while args.duration_s is None or time.monotonic() - started < args.duration_s:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    serve.delete(APP_NAME)
    return 0


def _cluster_running() -> bool:
    if os.environ.get("RAY_ADDRESS"):
        return True
    try:
        from ray._private.services import find_gcs_addresses

        return bool(find_gcs_addresses())
    except Exception:  # no cluster, or a Ray version without this helper: start a local one
        return False
