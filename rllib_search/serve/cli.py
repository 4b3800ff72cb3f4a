"""``rllib-search serve retriever|judge``: run the retriever or the evidence judge on Ray Serve.

- ``serve retriever --index DIR``: Search-R1's ``POST /retrieve`` at ``/``;
- ``serve judge [--model gemma3-270m] [--engine hf|vllm]``: the OpenAI-compatible judge at
  ``/judge/v1/...`` (``--route-prefix``), so both can share one Serve instance.

Each connects to a running Ray cluster when there is one (``ray start`` / ``RAY_ADDRESS``), else starts a
local one; binds HTTP to 127.0.0.1 unless ``--host`` says otherwise; serves until interrupted.

``--high-throughput`` starts the local Ray with Ray's high-throughput Serve settings
(``RAY_SERVE_ENABLE_HA_PROXY=1``, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``): HAProxy on ``--port`` forwards
HTTP straight to each replica's own HTTP server (ports 30000-31000, which Ray binds on all interfaces so
HAProxy on other nodes can reach them: the command warns so) instead of through the Python proxy actor. On a
cluster, export the two variables before ``ray start`` on every node. See ``docs/security.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
logger = logging.getLogger(__name__)

# Ray's documented high-throughput Serve mode (Ray >= 2.55); read when Ray's processes start.
HIGH_THROUGHPUT_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def http_options(args: argparse.Namespace) -> dict[str, Any]:
    """Serve's ``http_options`` from the command line: 127.0.0.1 unless ``--host`` says otherwise."""
    return {"host": args.host, "port": args.port}


def exposure_warnings(host: str, high_throughput: bool) -> list[str]:
    """What a service started with these settings exposes beyond this machine's loopback interface."""
    lines = []
    if host not in LOOPBACK_HOSTS:
        lines.append(
            f"HTTP binds {host}: the service answers anyone who can reach this machine (there is no "
            "authentication on /retrieve or /v1/*); put it behind a firewall or an authenticating proxy"
        )
    if high_throughput:
        lines.append(
            "--high-throughput: each replica's own HTTP server binds ALL interfaces on ports 30000-31000 "
            "(Ray's HAProxy mode, so HAProxy on other nodes can reach it), whatever --host says; firewall "
            "those ports on machines reachable from outside the cluster"
        )
    return lines


def add_serve_commands(subparsers: Any) -> None:
    serve_parser = subparsers.add_parser("serve", help="run a service on Ray Serve")
    serve_sub = serve_parser.add_subparsers(dest="service", required=True)
    retriever = serve_sub.add_parser("retriever", help="the retrieval service (Search-R1 HTTP schema)")
    retriever.add_argument(
        "--index", required=True, help="index directory built by `rllib-search index build`"
    )
    retriever.add_argument("--encoder", help="expected encoder (checked against the index manifest)")
    _add_deployment_arguments(retriever, target_ongoing_requests=16, batch_wait_ms=5.0)
    retriever.add_argument("--max-batch-queries", type=int, default=1024)
    retriever.add_argument(
        "--concurrent-batches",
        type=int,
        default=1,
        help="batches a replica searches at once, each on an equal share of its --num-cpus as threads",
    )
    retriever.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="query encoder dtype (auto: fp16 on GPU, bf16 on CPUs where bf16 is native and pays, else fp32)",
    )
    retriever.add_argument(
        "--high-throughput",
        action="store_true",
        help="start the local Ray with HAProxy ingress and Ray's throughput-optimised Serve settings",
    )
    _add_cluster_arguments(retriever)
    retriever.set_defaults(func=cmd_serve_retriever)

    judge = serve_sub.add_parser("judge", help="the evidence judge (OpenAI-compatible completions)")
    judge.add_argument("--model", default="gemma3-270m", help="bundled alias, hub name or local path")
    judge.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="hf (CPU/GPU) or vllm (GPU)")
    judge.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    judge.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    judge.add_argument("--route-prefix", default="/judge", help="HTTP prefix (endpoints at PREFIX/v1/...)")
    _add_deployment_arguments(judge, target_ongoing_requests=8, batch_wait_ms=10.0)
    judge.add_argument("--max-batch-prompts", type=int, default=256)
    judge.add_argument("--max-tokens", type=int, default=32, help="default answer length in tokens")
    judge.add_argument("--temperature", type=float, default=0.0, help="default temperature (R-Search: 0.1)")
    _add_cluster_arguments(judge)
    judge.set_defaults(func=cmd_serve_judge)


def _add_deployment_arguments(
    parser: argparse.ArgumentParser, *, target_ongoing_requests: float, batch_wait_ms: float
) -> None:
    """HTTP address, replicas (autoscaling bounds and target), resources per replica, batch wait."""
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--max-replicas", type=int, default=1)
    parser.add_argument("--target-ongoing-requests", type=float, default=target_ongoing_requests)
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica")
    parser.add_argument("--batch-wait-ms", type=float, default=batch_wait_ms)


def _deployment_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Serve deployment options the command line sets (autoscaling and resources per replica)."""
    return {
        "autoscaling_config": {
            "min_replicas": args.min_replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target_ongoing_requests,
        },
        "ray_actor_options": {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus},
    }


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=None,
        help="Ray address; 'local' starts a new local Ray (default: a running cluster if any, else local)",
    )
    parser.add_argument("--duration-s", type=float, help="stop after this many seconds (default: forever)")


def retriever_app_args(args: argparse.Namespace) -> dict[str, Any]:
    """The application builder's arguments from the command line."""
    return {
        "index_dir": args.index,
        "encoder": args.encoder,
        "max_batch_queries": args.max_batch_queries,
        "batch_wait_timeout_s": args.batch_wait_ms / 1000,
        "dtype": args.dtype,
        "concurrent_batches": args.concurrent_batches,
        **_deployment_options(args),
    }


def judge_app_args(args: argparse.Namespace) -> dict[str, Any]:
    """The judge application builder's arguments from the command line."""
    return {
        "model": args.model,
        "engine": args.engine,
        "served_model_name": args.served_model_name,
        "dtype": args.dtype,
        "max_batch_prompts": args.max_batch_prompts,
        "batch_wait_timeout_s": args.batch_wait_ms / 1000,
        "default_max_tokens": args.max_tokens,
        "default_temperature": args.temperature,
        **_deployment_options(args),
    }


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from rllib_search.serve.retrieval.deployment import APP_NAME, build_retriever_app

    def app() -> Any:
        return build_retriever_app(retriever_app_args(args))

    return _serve(args, app, APP_NAME, "/", "retriever", "POST {url}/retrieve")


def cmd_serve_judge(args: argparse.Namespace) -> int:
    from rllib_search.serve.judge.deployment import APP_NAME, build_judge_app

    def app() -> Any:
        return build_judge_app(judge_app_args(args))

    prefix = "/" + args.route_prefix.strip("/") if args.route_prefix.strip("/") else "/"
    return _serve(args, app, APP_NAME, prefix, "judge", "OpenAI base URL {url}/v1")


def _serve(args: argparse.Namespace, build: Any, name: str, prefix: str, what: str, endpoint: str) -> int:
    """Connect to (or start) Ray, run the application ``build()`` under ``prefix``, serve until
    interrupted or ``--duration-s``."""
    import ray
    from ray import serve

    from rllib_search.serve.cluster import cluster_address, patient_serve_proxies

    if args.address == "local":
        address = None
    elif args.address is not None:
        address = args.address
    else:
        address = cluster_address()
    high_throughput = getattr(args, "high_throughput", False)
    for line in exposure_warnings(args.host, high_throughput):
        logger.warning(line)
        print(f"[serve] warning: {line}", flush=True)
    if high_throughput and address is None:
        os.environ.update(HIGH_THROUGHPUT_ENV)  # inherited by the Ray processes ray.init starts
    elif high_throughput:
        print(
            "[serve] --high-throughput only configures a Ray this command starts; on a running cluster "
            f"export {' and '.join(f'{k}=1' for k in HIGH_THROUGHPUT_ENV)} before `ray start`",
            flush=True,
        )
    # "local", not None: None would make ray.init try a cluster recorded by an earlier `ray start`, even dead.
    if not address:
        patient_serve_proxies()
    ray.init(address=address or "local", ignore_reinit_error=True)
    serve.start(http_options=http_options(args))
    serve.run(build(), name=name, route_prefix=prefix)
    ingress = "HAProxy" if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "proxy actor"
    url = f"http://{args.host}:{args.port}{prefix.rstrip('/')}"
    print(f"[serve] {what} ready ({ingress}): {endpoint.format(url=url)}", flush=True)
    started = time.monotonic()
    try:
        while args.duration_s is None or time.monotonic() - started < args.duration_s:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    serve.delete(name)
    return 0
