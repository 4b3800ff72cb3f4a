"""The embedded default: everything a recipe needs that ships with the package, ready on one machine.

- the synthetic multi-hop world (``data/synthetic.py``: a corpus and train/test questions whose answers
  cannot be known without retrieval), written once under ``cache_dir()/worlds``;
- a BM25 index of its passages, built once beside it (``synthetic_world_index`` of
  ``serve/retrieval/deployment.py``, which ``tuned_examples/serve_cpu.yaml`` serves too);
- the retriever (``serve/retrieval/deployment.py``) and, for R-Search, the evidence judge
  (``serve/judge/deployment.py``, the bundled Gemma-3-270M) as Ray Serve applications of their own, named
  for what they serve (``embedded-retriever-<index identity>``, ``embedded-judge-<model>``): a job reuses
  such an app when it runs already, and never reuses nor deletes a user's ``retriever`` or ``judge``;
- a warm start: masked SFT on teacher trajectories (zero-shot SmolLM2 never follows a search protocol,
  so RL from it alone gets no signal), exported as a Hugging Face directory that RL starts from.

Every function works in a job on an existing cluster (``ray job submit``) as well as on a local Ray.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllib_search.data.records import QARecord
from rllib_search.recipes.scales import CPU_JUDGE, CPU_JUDGE_EXAMPLES
from rllib_search.serve.http.ports import free_port

# The app names of a user's own deployment (tuned_examples/serve_*.yaml), which paper-scale runs reach.
# The embedded default serves its own apps (EMBEDDED_PREFIX...); given to stop_apps, these names stand for
# the embedded apps this process started in that role.
RETRIEVER_APP = "retriever"
JUDGE_APP = "judge"
EMBEDDED_PREFIX = "embedded-"
# Statuses of a found app that this process may use as it is (others are deployed again).
USABLE_STATUSES = ("RUNNING", "DEPLOYING")
_started_here: dict[str, list[str]] = {RETRIEVER_APP: [], JUDGE_APP: []}


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
    from rllib_search.serve.retrieval.deployment import synthetic_world_index

    paths, index = synthetic_world_index(seed)
    root = paths["world_json"].parent
    return EmbeddedWorld(root, paths["train_parquet"], paths["test_parquet"], paths["corpus_parquet"], index)


def running_apps() -> set[str]:
    """The Serve applications in the connected cluster, whatever their status (empty when Serve is not
    started)."""
    return set(_app_statuses())


def _app_statuses() -> dict[str, str]:
    from ray import serve

    try:
        applications = serve.status().applications
    except Exception:  # Serve not started in this cluster
        return {}
    return {name: str(getattr(app.status, "value", app.status)) for name, app in applications.items()}


def start_serve() -> None:
    """Start Serve with HTTP on 127.0.0.1 (a free port) unless it already runs in the cluster."""
    from ray import serve

    if running_apps():
        return
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def retriever_app_name(index_dir: str | Path) -> str:
    """The embedded retriever's app name for ``index_dir``: ``embedded-retriever-`` and a digest of the
    index's identity (kind, encoder, options, passage count, corpus checksum), so an app of that name
    serves this index."""
    from rllib_search.serve.retrieval.manifest import index_identity

    return f"{EMBEDDED_PREFIX}retriever-{_digest(index_identity(index_dir))}"


def judge_app_name(model: str) -> str:
    """The embedded judge's app name for ``model``: ``embedded-judge-`` and a digest of the model's name."""
    return f"{EMBEDDED_PREFIX}judge-{_digest(model)}"


def _ensure_app(role: str, name: str, build: Any, route_prefix: str) -> bool:
    """Run ``build()`` as the Serve app ``name`` under ``route_prefix`` unless an app of that name is
    running or deploying; returns whether this call deployed it."""
    from ray import serve

    if _app_statuses().get(name) in USABLE_STATUSES:
        return False
    start_serve()
    serve.run(build(), name=name, route_prefix=route_prefix)
    if name not in _started_here[role]:
        _started_here[role].append(name)
    return True


def serve_retriever(index_dir: str | Path, *, num_cpus: float = 0.0) -> tuple[dict[str, Any], bool]:
    """The retriever over ``index_dir`` as its own Serve app (:func:`retriever_app_name`, at the route
    prefix of that name), started unless it runs already; returns the env_config spec that reaches it
    in-cluster (its ``"app"`` is the app's name) and whether this call started it."""
    from rllib_search.serve.retrieval.deployment import build_retriever_app

    name = retriever_app_name(index_dir)

    def build() -> Any:
        return build_retriever_app(
            {"index_dir": str(index_dir), "num_replicas": 1, "ray_actor_options": {"num_cpus": num_cpus}}
        )

    started = _ensure_app(RETRIEVER_APP, name, build, f"/{name}")
    return {"type": "serve", "app": name, "timeout_s": 120}, started


def serve_judge(
    model: str = CPU_JUDGE, *, examples: int = CPU_JUDGE_EXAMPLES, num_cpus: float = 0.0
) -> tuple[dict[str, Any], bool]:
    """The evidence judge ``model`` as its own Serve app (:func:`judge_app_name`, at the route prefix of
    that name), started unless it runs already; returns the env_config spec that reaches it in-cluster
    (plain completions, greedy, ``examples`` worked examples before R-Search's template; its ``"app"`` is
    the app's name) and whether this call started it."""
    from rllib_search.serve.judge.deployment import build_judge_app

    name = judge_app_name(model)

    def build() -> Any:
        return build_judge_app(
            {"model": model, "num_replicas": 1, "ray_actor_options": {"num_cpus": num_cpus}}
        )

    started = _ensure_app(JUDGE_APP, name, build, f"/{name}")
    return {
        "type": "serve",
        "app": name,
        "api": "completions",
        "max_tokens": 32,
        "examples": examples,
        "timeout_s": 300,
    }, started


def stop_apps(names: list[str]) -> None:
    """Delete the Serve applications this job started (those it found running stay): names from the
    specs :func:`serve_retriever` and :func:`serve_judge` returned, or ``RETRIEVER_APP`` / ``JUDGE_APP``
    for the embedded apps of that role this process started. A user's apps of those names are never
    deleted."""
    from ray import serve

    for name in names:
        if name in _started_here:
            targets, _started_here[name][:] = list(_started_here[name]), []
        else:
            targets = [name]
            for started in _started_here.values():
                if name in started:
                    started.remove(name)
        for target in targets:
            serve.delete(target)


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
    so demonstrations have RL's token layout and masks) as a Ray Train ``TorchTrainer``
    (``algos/sft_trainer.py``; its run under ``<out_dir>_ray_train``), exported to ``out_dir``; returns
    the export.

    ``env_config`` holds the env settings (protocol, budgets); ``retriever`` is a retriever spec. With
    ``max_turn_tokens`` (RL's turn budget), a warning says how many demonstrated turns are longer: turns the
    policy learns here and RL's sampler will cut.
    """
    from ray.train import RunConfig

    from rllib_search.algos import SearchSFTConfig
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts, turns_over_budget
    from rllib_search.algos.sft_trainer import train_sft
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
    out = Path(out_dir).resolve()
    result = train_sft(
        config,
        demos,
        steps=steps,
        batch_size=batch,
        run_config=RunConfig(storage_path=str(out.parent), name=f"{out.name}_ray_train"),
    )
    if result.error is not None:
        raise result.error
    for row in result.metrics_dataframe.itertuples():
        say(f"sft step {int(row.step):3d}/{steps}  nll {row.sft_nll:.4f}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(result.checkpoint.path, out)
    return out
