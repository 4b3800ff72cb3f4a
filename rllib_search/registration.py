"""Register MultiTurnSearchEnv with RLlib (Tune's registry) and gymnasium under one id.

``import rllib_search`` runs :func:`register_envs`. Then ``config.environment(ENV_ID, env_config={...})``
in RLlib, ``gymnasium.make(ENV_ID, **env_config)`` or ``gymnasium.make("rllib_search:" + ENV_ID, ...)``
build the env from plain configuration:

- ``tokenizer``: a hub name, a local path or a bundled alias (``smollm2-135m-instruct``), or a tokenizer;
- ``retriever``: an object with ``search(queries, topk)``, or a spec (``serve.client.build_retriever``):
  the Serve deployment, an HTTP URL, an index directory, or BM25 over a corpus file;
- ``dataset``: a QA file (Search-R1 parquet or FlashRAG jsonl) or a list of ``QARecord``;
- ``judge``: the evidence judge for ``r_search`` (optional): an object, a callable, or a spec
  (``{"type": "serve"}`` or ``{"type": "url", ...}``; ``serve.judge_client.build_judge``);
- every field of :class:`~rllib_search.env.search_env.SearchEnvConfig` (``protocol``, ``max_turns``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllib_search.env.search_env import ENV_ID, MultiTurnSearchEnv, SearchEnvConfig

_BUILD_KEYS = ("tokenizer", "retriever", "dataset", "judge")


def make_env(**env_config: Any) -> MultiTurnSearchEnv:
    """Build a MultiTurnSearchEnv from plain configuration (see the module docstring)."""
    config = dict(env_config)
    if "tokenizer" not in config:
        raise ValueError("env_config needs 'tokenizer' (a hub name, a local path or a bundled alias)")
    tokenizer = config.pop("tokenizer")
    if isinstance(tokenizer, str):
        from rllib_search.llm.models import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    from rllib_search.serve.retrieval.client import build_retriever

    retriever = build_retriever(config.pop("retriever", None))
    dataset = config.pop("dataset", None)
    if isinstance(dataset, str):
        from rllib_search.data.formats import read_qa_file

        dataset = read_qa_file(dataset)
    from rllib_search.serve.judge.client import build_judge

    judge = build_judge(config.pop("judge", None))
    env_fields = {k: v for k, v in config.items() if k in SearchEnvConfig.__dataclass_fields__}
    unknown = set(config) - set(env_fields)
    if unknown:
        raise ValueError(f"unknown env_config keys {sorted(unknown)}; known: {sorted(_known_keys())}")
    return MultiTurnSearchEnv(tokenizer, retriever, dataset, SearchEnvConfig(**env_fields), judge=judge)


def _known_keys() -> set[str]:
    return set(_BUILD_KEYS) | set(SearchEnvConfig.__dataclass_fields__)


def _rllib_env_creator(env_config: Mapping[str, Any]) -> MultiTurnSearchEnv:
    # RLlib passes an EnvContext (a dict with worker_index etc. as attributes): only its items matter.
    return make_env(**dict(env_config))


def register_envs() -> None:
    """Register ``rllib_search/MultiTurnSearch-v0`` with gymnasium and RLlib (idempotent), through their
    public APIs only (``gymnasium.register``, ``ray.tune.registry.register_env``).

    Tune's registry lives in the running cluster and is gone with it; gymnasium's lives in each process
    that imports ``rllib_search`` (every Ray worker that unpickles a config does). RLlib resolves an env id
    that Tune's registry lacks through gymnasium (``gymnasium.make(ENV_ID, **env_config)``), so the env is
    found in every Ray session, a second one in the same process included, without any hook into Ray.
    """
    import gymnasium as gym
    from ray.tune.registry import register_env

    register_env(ENV_ID, _rllib_env_creator)
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="rllib_search.registration:make_env", disable_env_checker=True)
