"""REINFORCE++ (R1-Searcher): a group baseline, KL in the reward, returns whitened per batch.

R1-Searcher's defaults: discount 1, 16 samples per prompt, lr 2e-6.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos.algorithm import SearchAlgorithm
from rllib_search.algos.config import SearchConfig


class SearchReinforcePPConfig(SearchConfig):
    """REINFORCE++ with a group baseline (R1-Searcher): KL in the reward, returns whitened per batch."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchReinforcePP)
        self.advantage_estimator = "reinforce_pp"
        self.group_size = 16
        self.lr = 2e-6
        self.kl_estimator = "k1"
        self.kl_in_reward = True


class SearchReinforcePP(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchReinforcePPConfig:
        return SearchReinforcePPConfig()
