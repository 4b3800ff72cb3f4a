"""``rllib-search serve retriever --index DIR``: run the retriever application on Ray Serve.

Connects to a running Ray cluster when there is one (``ray start`` / ``RAY_ADDRESS``), else starts a
local one; binds HTTP to 127.0.0.1 unless ``--host`` says otherwise; serves until interrupted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


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
    retriever.add_argument("--batch-wait-ms", type=float, default=20.0)
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
    ray.init(address=address, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_retriever_app(retriever_app_args(args)), name=APP_NAME, route_prefix="/")
    print(f"[serve] retriever ready: POST http://{args.host}:{args.port}/retrieve", flush=True)
    started = time.monotonic()
    try:
        while args.duration_s is None or time.monotonic() - started < args.duration_s:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    serve.delete(APP_NAME)
    return 0


def _cluster_running() -> bool:
    import os

    if os.environ.get("RAY_ADDRESS"):
        return True
    try:
        from ray._private.services import find_gcs_addresses

        return bool(find_gcs_addresses())
    except Exception:  # no cluster, or a Ray version without this helper: start a local one
        return False
