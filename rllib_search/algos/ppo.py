"""PPO (Search-R1): a value head as critic, GAE over generated tokens, k1 KL penalty in the token rewards.

Search-R1's defaults: GAE gamma = lambda = 1, KL 0.001 in the reward, actor lr 1e-6, critic lr 1e-5, one
sample per prompt.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos.algorithm import SearchAlgorithm
from rllib_search.algos.config import SearchConfig


class SearchPPOConfig(SearchConfig):
    """PPO: a value head as critic, GAE over generated tokens, k1 KL penalty in the token rewards."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchPPO)
        self.advantage_estimator = "gae"
        self.group_size = 1
        self.kl_estimator = "k1"
        self.kl_in_reward = True
        self._model_config = {**self._model_config, "value_head": True}


class SearchPPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchPPOConfig:
        return SearchPPOConfig()
