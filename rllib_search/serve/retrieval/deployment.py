"""The retriever as an autoscaled Ray Serve deployment, speaking Search-R1's HTTP schema.

``POST /retrieve`` takes ``{"queries": [...], "topk": k, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (no ``score`` when
``return_scores`` is false), so Search-R1's, verl's and SkyRL's clients work unchanged. In-cluster callers
skip HTTP and call ``search`` through a DeploymentHandle (see ``serve/retrieval/client.py``).

Query encoding dominates retrieval cost, so concurrent requests are batched: ``@serve.batch`` gathers the
requests that arrive while the previous batch runs (counting queries, not requests) and the index encodes
and searches all their queries together (on the CPU, as one single-threaded shard per CPU). Requests are
bounded (body bytes, read before the body is; queries per request, characters per query, topk range) and
answered with 4xx and a message when they break a bound.

For HTTP throughput on one node, start Ray with Ray's high-throughput Serve settings
(``RAY_SERVE_ENABLE_HA_PROXY=1`` and ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, or
``rllib-search serve retriever --high-throughput``): HAProxy forwards HTTP straight to the replicas instead
of through the Python proxy actor (measured in ``benchmarks/retriever_bench.py``).
"""

# No ``from __future__ import annotations`` here: FastAPI must see the request model's real type on the
# ingress methods to read it from the body.
import asyncio
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve

from rllib_search.data.retrieval import Passage
from rllib_search.metrics import record
from rllib_search.serve.http.validation import (
    RequestRefused,
    check_body_limit,
    check_length,
    default_body_bytes,
    invalid_unicode,
    parse_json_object,
    read_body,
    validate,
    validation_message,
)
from rllib_search.serve.replicas import GRACEFUL_SHUTDOWN_CHECK_S
from rllib_search.serve.retrieval.manifest import DENSE_KINDS

logger = logging.getLogger(__name__)

DEPLOYMENT_NAME = "Retriever"
APP_NAME = "retriever"
METRIC_TAGS = {"service": "retriever"}  # batch size and seconds as Ray metrics (rllib_search/metrics.py)


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one request; a request outside them gets a 4xx with a message. ``max_body_bytes`` (the
    HTTP body, checked before it is read in full) defaults to what the other bounds admit:
    ``max_queries`` queries of ``max_query_chars`` characters written as ``\\uXXXX`` escapes, plus 64 KiB
    (12.4 MB for the defaults; ``serve/http/validation.py``)."""

    max_queries: int = 1024
    max_query_chars: int = 2000
    max_topk: int = 100
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes is None:
            object.__setattr__(
                self, "max_body_bytes", default_body_bytes(self.max_queries, self.max_query_chars)
            )
        check_body_limit(self.max_body_bytes)

    def check(self, queries: Sequence[Any], topk: Any) -> str | None:
        """The reason ``queries``/``topk`` break a bound, or None."""
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= self.max_topk:
            return f"topk must be an integer in [1, {self.max_topk}], got {topk!r}"
        if len(queries) > self.max_queries:
            return f"at most {self.max_queries} queries per request, got {len(queries)}"
        for i, query in enumerate(queries):
            if not isinstance(query, str):
                return f"queries[{i}] must be a string, got {type(query).__name__}"
            if len(query) > self.max_query_chars:
                return f"queries[{i}] has {len(query)} characters, at most {self.max_query_chars} allowed"
        return invalid_unicode(queries, "queries")


class RetrieveRequest(BaseModel):
    """Search-R1's request body."""

    queries: list[str]
    topk: int = Field(default=3)
    return_scores: bool = False


def passage_to_json(passage: Passage, return_scores: bool) -> dict[str, Any]:
    """One result in Search-R1's response schema."""
    item: dict[str, Any] = {"document": {"id": passage.id, "contents": passage.contents}}
    if return_scores:
        item["score"] = passage.score
    return item


http_app = FastAPI(title="rllib-search retriever", description="Search-R1-compatible retrieval service")


@http_app.exception_handler(RequestValidationError)
async def _malformed_request(request: Request, error: RequestValidationError) -> JSONResponse:
    """A request FastAPI's own validation refuses (a route's parameters; ``/retrieve`` reads its body
    itself): 422 with the validator's words, not the input (which may not be encodable; FastAPI's default
    echoes it)."""
    return JSONResponse({"detail": validation_message(error)}, status_code=422)


# Defined before the deployment class: Serve pickles the ingress class (and the globals its methods use)
# when the decorator runs.
def synthetic_world_index(seed: int = 0) -> tuple[dict[str, Path], Path]:
    """The synthetic world of ``seed`` (``data/synthetic.py``) and a BM25 index of its passages, under
    ``cache_dir()/worlds``, generated on first use and cached: the world the recipes' embedded default
    trains on, and what a retriever app given ``synthetic_world_seed`` serves. Returns the world's files
    (by ``WORLD_FILES`` key) and the index directory. Safe to call from processes that start at once."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, ensure_world
    from rllib_search.llm.models import cache_dir
    from rllib_search.serve.retrieval.build import ensure_index

    root = cache_dir() / "worlds" / f"demo_seed{seed}"
    paths = ensure_world(root, SyntheticWorldConfig(seed=seed))
    index = ensure_index(paths["corpus_parquet"], root / "bm25_index", kind="bm25", progress=False)
    return paths, index


GPU_FAISS_KINDS = ("flat", "ivfpq")  # the kinds load_index shards over GPUs (faiss has no GPU HNSW)


# Defined before the deployment class: Serve's ingress copies the class by value when it is decorated,
# with the module globals that exist at that point.
def _replica_gpu_ids() -> list[str]:
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()] if ray.is_initialized() else []


def replica_cpus() -> float:
    """The CPUs Ray reserved for this replica (``ray_actor_options.num_cpus``); 1 outside a Ray worker."""
    import ray

    if not ray.is_initialized():
        return 1.0
    try:
        return float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)) or 1.0
    except AssertionError:  # the driver, not a worker
        return 1.0


def set_search_threads(threads: int, kind: str) -> None:
    """Give torch (the query encoder) and faiss ``threads`` threads for each search of a dense index; a
    BM25 or random index uses neither, and its replica does not import them (130 MB less each)."""
    if kind not in DENSE_KINDS:
        return
    import torch

    from rllib_search.serve.retrieval.faiss_module import faiss

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


def shard_rows(queries: Sequence[str], shards: int) -> list[list[int]]:
    """``queries``' positions dealt into at most ``shards`` shards of similar work: longest first, in
    turn, so every shard gets long and short queries alike."""
    order = sorted(range(len(queries)), key=lambda i: -len(queries[i]))
    return [rows for rows in (order[s::shards] for s in range(max(1, shards))) if rows]


def _submit_shards(
    index: Any, queries: list[str], topk: int, shards: int, workers: ThreadPoolExecutor
) -> list[tuple[list[int], Future]]:
    return [
        (rows, workers.submit(index.search, [queries[i] for i in rows], topk))
        for rows in shard_rows(queries, shards)
    ]


def _in_order(count: int, parts: list[tuple[list[int], list[list[Passage]]]]) -> list[list[Passage]]:
    results: list[list[Passage]] = [[] for _ in range(count)]
    for rows, part in parts:
        for i, passages in zip(rows, part):
            results[i] = passages
    return results


async def search_in_shards(
    index: Any, queries: list[str], topk: int, shards: int, workers: ThreadPoolExecutor
) -> list[list[Passage]]:
    """``index.search(queries, topk)``, the queries split into ``shards`` searched at once on ``workers``
    (each on one torch/faiss thread: small encoder products scale better over shards than over threads
    of one product), answered in the queries' order."""
    submitted = _submit_shards(index, queries, topk, shards, workers)
    return _in_order(len(queries), [(rows, await asyncio.wrap_future(f)) for rows, f in submitted])


def search_in_shards_blocking(
    index: Any, queries: list[str], topk: int, shards: int, workers: ThreadPoolExecutor
) -> list[list[Passage]]:
    """:func:`search_in_shards`, waited for in the calling thread; one query, or one shard, is searched
    in the calling thread itself."""
    if shards <= 1 or len(queries) <= 1:
        return index.search(queries, topk)
    submitted = _submit_shards(index, queries, topk, shards, workers)
    return _in_order(len(queries), [(rows, f.result()) for rows, f in submitted])


def faiss_gpu_problem(gpu_ids: Sequence[str], kind: str, device: str | None = None) -> str | None:
    """Why a replica given GPUs ``gpu_ids`` cannot search its ``kind`` index on them (a faiss build without
    GPU support: the CPU build won, see the README's install section), or None when it can (or need not)."""
    if not gpu_ids or kind not in GPU_FAISS_KINDS or str(device or "cuda").startswith("cpu"):
        return None
    from rllib_search.serve.retrieval.faiss_module import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        return None
    return (
        f"this retriever replica was given GPU(s) {list(gpu_ids)} for a {kind} index, but the installed "
        f"faiss sees {faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0} GPUs (a CPU build): "
        "`pip uninstall -y faiss-cpu && pip install faiss-gpu-cu12` on every GPU node (README, Install), or "
        "give the replicas no GPUs (ray_actor_options num_gpus: 0)"
    )


def replica_actor_options(ray_actor_options: dict[str, Any] | None) -> dict[str, Any]:
    """``ray_actor_options`` for a replica; one with no GPUs gets ``CUDA_VISIBLE_DEVICES=""``. Ray no
    longer hides the GPUs from an actor that asks for none (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``
    defaults to off), so a CPU replica would otherwise see every GPU of its node and shard its faiss index
    (and put its encoder) onto GPUs that training holds."""
    options = dict(ray_actor_options or {})
    if float(options.get("num_gpus") or 0) > 0:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars.setdefault("CUDA_VISIBLE_DEVICES", "")
    runtime_env["env_vars"] = env_vars
    options["runtime_env"] = runtime_env
    return options


# Requests above max_ongoing_requests wait in the caller's router, which re-offers them with backoff: with
# a low cap the replica sees few requests at a time and its batches stay tiny (measured: 7.7 q/s at 64 against
# 140 q/s at 1024 for 300 concurrent one-query requests). Waiting inside the batch queue is cheap.
@serve.deployment(
    name=DEPLOYMENT_NAME, max_ongoing_requests=1024, graceful_shutdown_wait_loop_s=GRACEFUL_SHUTDOWN_CHECK_S
)
@serve.ingress(http_app)
class RetrieverDeployment:
    """A replica: one index (dense faiss + encoder, BM25 or random) over a memory-mapped corpus."""

    def __init__(
        self,
        index_dir: str | None = None,
        encoder: str | None = None,
        max_batch_queries: int = 1024,
        batch_wait_timeout_s: float = 0.005,
        limits: dict[str, int] | None = None,
        device: str | None = None,
        dtype: str | None = "auto",
        synthetic_world_seed: int | None = None,
        concurrent_batches: int = 1,
        thread_min_queries: int = 16,
    ) -> None:
        from rllib_search.serve.retrieval.load import load_index

        self.limits = RequestLimits(**(limits or {}))
        if max_batch_queries < self.limits.max_queries:
            raise ValueError(
                "max_batch_queries must be at least limits.max_queries (one request fits a batch)"
            )
        if index_dir is None:  # built on this replica's node (once per node, cached)
            index_dir = str(synthetic_world_index(synthetic_world_seed or 0)[1])
        self.index = load_index(index_dir, encoder=encoder, device=device, dtype=dtype)
        problem = faiss_gpu_problem(_replica_gpu_ids(), str(self.index.manifest.get("kind")), device)
        if problem is not None:
            raise RuntimeError(problem)
        self.concurrent_batches = max(1, int(concurrent_batches))
        self.threads = max(1, int(replica_cpus()) // self.concurrent_batches)
        kind = str(self.index.manifest.get("kind"))
        encoder = getattr(self.index, "encoder", None)
        # A dense index on the CPU searches every batch as `threads` shards of one thread each.
        self.shards = self.threads if encoder is not None and encoder.device.type == "cpu" else 1
        set_search_threads(self.threads // self.shards, kind)
        self.thread_min_queries = thread_min_queries
        self._workers = ThreadPoolExecutor(self.concurrent_batches * self.shards, thread_name_prefix="search")
        self._search_batched = serve.batch(
            max_batch_size=max_batch_queries,
            batch_wait_timeout_s=batch_wait_timeout_s,
            max_concurrent_batches=self.concurrent_batches,
            batch_size_fn=lambda items: sum(len(q) for q, _ in items),
        )(self._search_batch)
        self.batches = 0
        self.batched_queries = 0
        self.busy_seconds = 0.0
        logger.info(
            "retriever replica ready: %s, %d batch(es) at once on %d thread(s) each, in %d shard(s)",
            kind,
            self.concurrent_batches,
            self.threads,
            self.shards,
        )

    # --- in-cluster API (DeploymentHandle) ---------------------------------------------------------------
    async def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` passages for each query; raises ValueError for a request outside the limits."""
        problem = self.limits.check(queries, topk)
        if problem is not None:
            raise ValueError(problem)
        if not queries:
            return []
        return await self._search_batched((list(queries), int(topk)))

    async def stats(self) -> dict[str, Any]:
        """Replica statistics: its id, resident memory, batches run, queries searched, seconds spent
        searching (summed over concurrent batches), threads, index manifest."""
        from rllib_search.serve.memory import resident_memory_mb

        mean = self.batched_queries / self.batches if self.batches else 0.0
        return {
            "replica_id": serve.get_replica_context().replica_id.unique_id,
            "rss_mb": resident_memory_mb(),
            "batches": self.batches,
            "queries": self.batched_queries,
            "mean_queries_per_batch": mean,
            "busy_seconds": self.busy_seconds,
            "concurrent_batches": self.concurrent_batches,
            "threads": self.threads,
            "shards": self.shards,
            "limits": asdict(self.limits),
            "manifest": self.index.manifest,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    async def _search_batch(self, requests: list[tuple[list[str], int]]) -> list[list[list[Passage]]]:
        """One search for the queries of every request in the batch. A batch of ``thread_min_queries`` or
        more runs on worker threads (on a CPU dense index, as ``shards`` shards of one thread each), so that
        the event loop keeps reading requests meanwhile; a smaller one (sharded alike) blocks the loop: the
        requests that arrive meanwhile wait in Serve's queues and all join the next batch, where in a thread
        they would trickle into small batches that each pay the search's fixed costs."""
        queries = [query for request_queries, _ in requests for query in request_queries]
        topk = max(k for _, k in requests)
        started = time.perf_counter()
        if len(queries) >= self.thread_min_queries:
            results = await search_in_shards(self.index, queries, topk, self.shards, self._workers)
        else:  # blocks the loop, on every thread
            results = search_in_shards_blocking(self.index, queries, topk, self.shards, self._workers)
        seconds = time.perf_counter() - started
        self.busy_seconds += seconds
        record("serve_batch_items", len(queries), METRIC_TAGS)
        record("serve_batch_seconds", seconds, METRIC_TAGS)
        self.batches += 1
        self.batched_queries += len(queries)
        split, start = [], 0
        for request_queries, k in requests:
            split.append([passages[:k] for passages in results[start : start + len(request_queries)]])
            start += len(request_queries)
        return split

    # --- HTTP API (Search-R1 schema) -----------------------------------------------------------------
    @http_app.post("/retrieve")
    async def retrieve(self, http_request: Request) -> JSONResponse:
        """Read the body under ``limits.max_body_bytes``, parse it, check the queries' count, then the
        schema, then the other bounds (``serve/http/validation.py``): a 4xx with a message at the first
        problem."""
        try:
            request = await self._read_request(http_request)
        except RequestRefused as refused:
            return JSONResponse({"detail": refused.message}, status_code=refused.status)
        results = await self.search(request.queries, request.topk)
        body = [[passage_to_json(p, request.return_scores) for p in passages] for passages in results]
        return JSONResponse({"result": body})

    @http_app.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    async def _read_request(self, http_request: Request) -> RetrieveRequest:
        limits = self.limits
        body = await read_body(http_request, limits.max_body_bytes)
        fields = parse_json_object(body, http_request.headers.get("content-type"), 422)
        too_many = "at most {bound} queries per request, got {length}"
        check_length(fields, "queries", limits.max_queries, too_many, 413)
        request = validate(RetrieveRequest, fields, 422)
        problem = limits.check(request.queries, request.topk)
        if problem is not None:
            raise RequestRefused(problem, 413 if len(request.queries) > limits.max_queries else 422)
        return request


def gpu_shortfall(num_gpus: float, cluster_gpus: float) -> str | None:
    """Why replicas asking for ``num_gpus`` GPUs each will not schedule on a cluster with ``cluster_gpus``
    GPUs in all, or None when they fit."""
    if num_gpus <= 0 or cluster_gpus >= num_gpus:
        return None
    return (
        f"the retriever asks for {num_gpus:g} GPU(s) per replica but the cluster has {cluster_gpus:g}: its "
        "replicas stay pending until GPU nodes join (on a CPU cluster set ray_actor_options.num_gpus: 0, "
        "as tuned_examples/serve_cpu.yaml does)"
    )


def build_retriever_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for ``serve build`` / ``serve deploy`` and ``rllib-search serve retriever``.

    ``args``: ``index_dir`` (an index directory on every node a replica may run on) or
    ``synthetic_world_seed`` (serve :func:`synthetic_world_index`, built by each replica), ``encoder``,
    ``max_batch_queries``, ``batch_wait_timeout_s``, ``limits`` (dict), ``device``, ``dtype`` (the query
    encoder's; default ``"auto"``: fp16 on a GPU, bf16 on a CPU where bf16 is native and pays, else fp32),
    ``concurrent_batches`` (batches a replica runs at once, default 1; each gets an equal share of the
    replica's CPUs as threads), ``thread_min_queries`` (a batch of at least this many queries is searched
    off the event loop, on a CPU dense index split into one single-threaded shard per thread; default 16),
    and deployment options ``autoscaling_config`` (dict: min_replicas, max_replicas,
    target_ongoing_requests, ...), ``num_replicas`` and ``ray_actor_options`` (num_cpus, num_gpus, ...).
    Built in a connected Ray, it logs a warning when replicas ask for more GPUs than the cluster has.
    Replicas without GPUs see none (``replica_actor_options``); a replica given GPUs for a flat or IVF-PQ
    index refuses to start on a faiss without GPU support (``faiss_gpu_problem``).
    """
    args = dict(args)
    if (args.get("index_dir") is None) == (args.get("synthetic_world_seed") is None):
        raise ValueError("the retriever app needs 'index_dir' or 'synthetic_world_seed' (one of them)")
    _warn_if_gpus_missing(args.get("ray_actor_options"))
    options: dict[str, Any] = {}
    for key in ("autoscaling_config", "num_replicas", "ray_actor_options", "max_ongoing_requests"):
        if args.get(key) is not None:
            options[key] = args.pop(key)
        else:
            args.pop(key, None)
    if "autoscaling_config" in options:
        options.pop("num_replicas", None)
    options["ray_actor_options"] = replica_actor_options(options.get("ray_actor_options"))
    deployment = RetrieverDeployment.options(**options)
    return deployment.bind(**args)


def _warn_if_gpus_missing(ray_actor_options: dict[str, Any] | None) -> None:
    import ray

    num_gpus = float((ray_actor_options or {}).get("num_gpus") or 0)
    if num_gpus <= 0 or not ray.is_initialized():
        return
    problem = gpu_shortfall(num_gpus, float(ray.cluster_resources().get("GPU", 0.0)))
    if problem is not None:
        logger.warning(problem)
