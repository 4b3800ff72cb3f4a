"""The embedded default: everything a recipe needs that ships with the package, ready on one machine.

- the synthetic multi-hop world (``data/synthetic.py``: a corpus and train/test questions whose answers
  cannot be known without retrieval), written once under ``cache_dir()/worlds``;
- a BM25 index of its passages, built once beside it;
- the retriever (``serve/retrieval/deployment.py``) and, for R-Search, the evidence judge
(``serve/judge/deployment.py``, the
  bundled Gemma-3-270M) as Ray Serve applications on 127.0.0.1, started only if they are not running;
- a warm start: masked SFT on teacher trajectories (zero-shot SmolLM2 never follows a search protocol,
  so RL from it alone gets no signal), exported as a Hugging Face directory that RL starts from.

Every function works in a job on an existing cluster (``ray job submit``) as well as on a local Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllib_search.data.records import QARecord
from rllib_search.recipes.scales import CPU_JUDGE
from rllib_search.serve.http.ports import free_port

RETRIEVER_APP = "retriever"
JUDGE_APP = "judge"


@dataclass(frozen=True)
class EmbeddedWorld:
    """The synthetic world's files and its BM25 index directory."""

    root: Path
    train: Path
    test: Path
    corpus: Path
    index: Path

    def records(self, split: str, hops: int | None = None) -> list[QARecord]:
        """The ``train`` or ``test`` questions (those with ``hops`` hops when given)."""
        from rllib_search.data.formats import read_qa_file

        records = read_qa_file(self.train if split == "train" else self.test)
        return [r for r in records if hops is None or r.extra["num_hops"] == hops]


def embedded_world(seed: int = 0) -> EmbeddedWorld:
    """The synthetic world of ``seed`` and its BM25 index, generated on first use and cached."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, ensure_world
    from rllib_search.llm.models import cache_dir
    from rllib_search.serve.retrieval.build import ensure_index

    root = cache_dir() / "worlds" / f"demo_seed{seed}"
    paths = ensure_world(root, SyntheticWorldConfig(seed=seed))
    index = root / "bm25_index"
    ensure_index(paths["corpus_parquet"], index, kind="bm25", progress=False)
    return EmbeddedWorld(root, paths["train_parquet"], paths["test_parquet"], paths["corpus_parquet"], index)


def running_apps() -> set[str]:
    """The Serve applications running in the connected cluster (empty when Serve is not started)."""
    from ray import serve

    try:
        return set(serve.status().applications)
    except Exception:  # Serve not started in this cluster
        return set()


def start_serve() -> None:
    """Start Serve with HTTP on 127.0.0.1 (a free port) unless it already runs in the cluster."""
    from ray import serve

    if running_apps():
        return
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})


def serve_retriever(index_dir: str | Path, *, num_cpus: float = 0.0) -> tuple[dict[str, Any], bool]:
    """The retriever over ``index_dir`` as the Serve app ``retriever`` (started unless already running);
    returns the env_config spec that reaches it in-cluster and whether this call started it."""
    from ray import serve

    from rllib_search.serve.retrieval.deployment import build_retriever_app

    started = RETRIEVER_APP not in running_apps()
    if started:
        start_serve()
        app = build_retriever_app(
            {"index_dir": str(index_dir), "num_replicas": 1, "ray_actor_options": {"num_cpus": num_cpus}}
        )
        serve.run(app, name=RETRIEVER_APP, route_prefix="/")
    return {"type": "serve", "app": RETRIEVER_APP, "timeout_s": 120}, started


def serve_judge(model: str = CPU_JUDGE, *, num_cpus: float = 0.0) -> tuple[dict[str, Any], bool]:
    """The evidence judge ``model`` as the Serve app ``judge`` (started unless already running); returns the
    env_config spec that reaches it in-cluster (plain completions, greedy) and whether this call started
    it."""
    from ray import serve

    from rllib_search.serve.judge.deployment import ROUTE_PREFIX, build_judge_app

    started = JUDGE_APP not in running_apps()
    if started:
        start_serve()
        app = build_judge_app(
            {"model": model, "num_replicas": 1, "ray_actor_options": {"num_cpus": num_cpus}}
        )
        serve.run(app, name=JUDGE_APP, route_prefix=ROUTE_PREFIX)
    return {
        "type": "serve",
        "app": JUDGE_APP,
        "api": "completions",
        "max_tokens": 32,
        "timeout_s": 300,
    }, started


def stop_apps(names: list[str]) -> None:
    """Delete the Serve applications this job started (those it found running stay)."""
    from ray import serve

    for name in names:
        serve.delete(name)


def warm_start(
    model: str,
    records: list[QARecord],
    retriever: Any,
    env_config: dict[str, Any],
    out_dir: str | Path,
    *,
    steps: int = 8,
    batch: int = 8,
    lr: float = 8e-5,
    seed: int = 0,
    max_turn_tokens: int | None = None,
    say: Any = print,
) -> Path:
    """Masked SFT of ``model`` on teacher trajectories of ``records`` (through the real retriever and envs,
    so demonstrations have RL's token layout and masks), exported to ``out_dir``; returns the export.

    ``env_config`` holds the env settings (protocol, budgets); ``retriever`` is a retriever spec. With
    ``max_turn_tokens`` (RL's turn budget), a warning says how many demonstrated turns are longer: turns the
    policy learns here and RL's sampler will cut.
    """
    from rllib_search.algos import SearchSFTConfig
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts, turns_over_budget
    from rllib_search.env.search_env import ENV_ID, SearchEnvConfig
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.serve.retrieval.client import build_retriever

    demos = teacher_rollouts(
        load_tokenizer(model), build_retriever(retriever), records, SearchEnvConfig.from_dict(env_config)
    )
    say(f"warm start: {len(demos)} teacher trajectories, {steps} SFT steps")
    if max_turn_tokens is not None and (over := turns_over_budget(demos, max_turn_tokens)):
        say(
            f"warning: {len(over)} demonstrated turns are longer than the {max_turn_tokens}-token turn "
            f"budget (up to {max(over)} tokens); RL's sampler cuts them (raise max_turn_tokens)"
        )
    config = (
        SearchSFTConfig()
        .environment(ENV_ID, env_config={"retriever": retriever, "dataset": records, **env_config})
        .rl_module(model_config={"model": model})
        .training(lr=lr, micro_batch_size=4)
        .sft(demonstrations=demos, sft_batch_size=batch)
        .debugging(seed=seed)
    )
    algo = config.build_algo()
    try:
        for step in range(1, steps + 1):
            nll = algo.train()["learners"]["default_policy"]["sft_nll"]
            say(f"sft step {step:3d}/{steps}  nll {nll:.4f}")
        return algo.export(out_dir)
    finally:
        algo.stop()
        del algo
        release_freed_memory()


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    The warm start trains in the driver, and glibc keeps the policy's, optimizer's and activations' freed
    blocks in its arenas: measured after 2 SFT steps of SmolLM2-135M, the driver's resident memory was
    6.8 GB before the trim and 1.4 GB after, memory the findings study's trials beside it need. Nothing in
    torch or Ray returns it; ``malloc_trim`` is the libc call that does."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
