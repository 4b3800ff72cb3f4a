"""RLlib algorithms that train search agents: one file per algorithm (its config and Algorithm together).

- ``config.py`` / ``algorithm.py``: :class:`SearchConfig` and :class:`SearchAlgorithm`, the base of all;
- ``grpo.py``, ``ppo.py``, ``reinforce_pp.py``, ``sft.py``: the papers' algorithms and the warm start;
- ``learners/``: the RLModule, the learners and their losses, advantages and batching;
- ``rollouts/``: the EnvRunner, the multi-turn rollout loop, policies and the Rollout record;
- ``evaluation/``: scoring answers and evaluating a policy on a QA set (``rllib-search eval``);
- ``checkpoints/``: periodic checkpoints, checking and exporting them.

The configs and Algorithms are importable from here (``from rllib_search.algos import SearchGRPOConfig``);
they load on first use, so importing a submodule does not load RLlib's algorithms.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SearchConfig": "config",
    "SearchAlgorithm": "algorithm",
    "SearchGRPOConfig": "grpo",
    "SearchGRPO": "grpo",
    "SearchPPOConfig": "ppo",
    "SearchPPO": "ppo",
    "SearchReinforcePPConfig": "reinforce_pp",
    "SearchReinforcePP": "reinforce_pp",
    "SearchSFTConfig": "sft",
    "SearchSFT": "sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
