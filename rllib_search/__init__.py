"""rllib-search: train LLM search agents with reinforcement learning on Ray RLlib, Train and Serve.

Importing the package registers ``rllib_search/MultiTurnSearch-v0`` with RLlib and gymnasium. The
algorithms' configs (``from rllib_search import SearchGRPOConfig``) load RLlib on first use.
"""

from typing import Any

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage, Retriever
from rllib_search.env.protocols import (
    R1_SEARCHER,
    R_SEARCH,
    SEARCH_R1,
    Protocol,
    get_protocol,
    register_protocol,
)
from rllib_search.env.search_env import ENV_ID, MultiTurnSearchEnv, SearchEnvConfig, step_batch
from rllib_search.registration import make_env, register_envs

__version__ = "0.1.0"

register_envs()

_ALGORITHM_EXPORTS = (
    "SearchConfig",
    "SearchGRPOConfig",
    "SearchPPOConfig",
    "SearchReinforcePPConfig",
    "SearchSFTConfig",
)


def __getattr__(name: str) -> Any:
    if name in _ALGORITHM_EXPORTS:
        import rllib_search.algos

        return getattr(rllib_search.algos, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_ALGORITHM_EXPORTS,
    "ENV_ID",
    "R1_SEARCHER",
    "R_SEARCH",
    "SEARCH_R1",
    "MultiTurnSearchEnv",
    "Passage",
    "Protocol",
    "QARecord",
    "Retriever",
    "SearchEnvConfig",
    "get_protocol",
    "make_env",
    "register_envs",
    "register_protocol",
    "step_batch",
]
