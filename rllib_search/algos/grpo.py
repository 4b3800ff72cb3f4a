"""GRPO (Search-R1): group-normalised outcome advantages, k3 KL to the reference in the loss.

Search-R1's defaults: 5 samples per prompt, lr 1e-6, KL coefficient 0.001.
``SearchGRPOConfig().environment(...).build_algo()`` builds :class:`SearchGRPO`; ``tune.Tuner(SearchGRPO,
param_space=config)`` sweeps it.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos.algorithm import SearchAlgorithm
from rllib_search.algos.config import SearchConfig


class SearchGRPOConfig(SearchConfig):
    """GRPO: group-normalised outcome advantages, k3 KL to the reference in the loss."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchGRPO)
        self.advantage_estimator = "grpo"
        self.group_size = 5
        self.kl_estimator = "k3"
        self.kl_in_reward = False


class SearchGRPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchGRPOConfig:
        return SearchGRPOConfig()
