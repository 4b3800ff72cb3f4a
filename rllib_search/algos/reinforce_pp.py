"""REINFORCE++ (Hu, 2025), the algorithm R1-Searcher trains with: no critic, KL in the reward, returns
whitened over the batch.

Two estimators (``learners/advantages.py``):

- ``reinforce_pp`` (the default, REINFORCE++ as published; OpenRLHF's ``reinforce``): no baseline. The
  outcome reward on the last generated token minus ``kl_coeff * KL`` on every generated token, summed into
  returns-to-go with discount ``gamma``, whitened (mean and std) over the generated tokens of the whole
  batch, across learners;
- ``reinforce_pp_baseline`` (REINFORCE++-baseline; OpenRLHF's ``reinforce_baseline``): the same from the
  outcome reward minus its group's mean reward (not divided by the group's std, unlike GRPO):
  ``config.training(advantage_estimator="reinforce_pp_baseline")``.

R1-Searcher's defaults: discount 1, 16 samples per prompt, lr 2e-6.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos.algorithm import SearchAlgorithm
from rllib_search.algos.config import SearchConfig

REINFORCE_PP_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")


class SearchReinforcePPConfig(SearchConfig):
    """REINFORCE++ (``reinforce_pp``: no baseline) or REINFORCE++-baseline (``reinforce_pp_baseline``): KL
    in the reward, returns whitened over the batch."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchReinforcePP)
        self.advantage_estimator = "reinforce_pp"
        self.group_size = 16
        self.lr = 2e-6
        self.kl_estimator = "k1"
        self.kl_in_reward = True

    def validate(self) -> None:
        super().validate()
        if self.advantage_estimator not in REINFORCE_PP_ESTIMATORS:
            raise ValueError(
                f"SearchReinforcePPConfig trains with advantage_estimator in {REINFORCE_PP_ESTIMATORS} "
                f"(REINFORCE++, or REINFORCE++-baseline), got {self.advantage_estimator!r}"
            )


class SearchReinforcePP(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchReinforcePPConfig:
        return SearchReinforcePPConfig()
