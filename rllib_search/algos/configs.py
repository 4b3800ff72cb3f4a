"""The algorithms' configs with the papers' defaults (their Algorithm classes: ``algorithms.py``).

- :class:`SearchGRPOConfig`: Search-R1's GRPO (5 samples per prompt, lr 1e-6, k3 KL 0.001 in the loss).
- :class:`SearchPPOConfig`: Search-R1's PPO (critic value head, GAE gamma = lambda = 1, KL 0.001 in the
  reward, actor lr 1e-6, critic lr 1e-5, one sample per prompt).
- :class:`SearchReinforcePPConfig`: R1-Searcher's REINFORCE++ (group baseline, KL in the reward, discount
  1, 16 samples per prompt, lr 2e-6).
- :class:`SearchSFTConfig`: masked behaviour cloning on demonstration trajectories (warm start); same
  learner, masks and batching. Its Algorithm trains on ``demonstrations`` (Rollout records, e.g. from
  :func:`rllib_search.algos.demonstrations.teacher_rollouts`) instead of sampling.

Every config is an RLlib ``AlgorithmConfig``: ``config.build_algo()``, ``tune.Tuner(SearchGRPO,
param_space=config)`` and ``algo.save_to_path`` / ``Algorithm.from_checkpoint`` work as for RLlib's own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided

from rllib_search.algos.algorithms import SearchGRPO, SearchPPO, SearchReinforcePP, SearchSFT
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollout import Rollout


class SearchGRPOConfig(SearchConfig):
    """GRPO: group-normalised outcome advantages, k3 KL to the reference in the loss."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchGRPO)
        self.advantage_estimator = "grpo"
        self.group_size = 5
        self.kl_estimator = "k3"
        self.kl_in_reward = False


class SearchPPOConfig(SearchConfig):
    """PPO: a value head as critic, GAE over generated tokens, k1 KL penalty in the token rewards."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchPPO)
        self.advantage_estimator = "gae"
        self.group_size = 1
        self.kl_estimator = "k1"
        self.kl_in_reward = True
        self._model_config = {**self._model_config, "value_head": True}


class SearchReinforcePPConfig(SearchConfig):
    """REINFORCE++ with a group baseline (R1-Searcher): KL in the reward, returns whitened per batch."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchReinforcePP)
        self.advantage_estimator = "reinforce_pp"
        self.group_size = 16
        self.lr = 2e-6
        self.kl_estimator = "k1"
        self.kl_in_reward = True


class SearchSFTConfig(SearchConfig):
    """Masked SFT on demonstrations: the loss is the negative log-likelihood of the demonstrated
    (generated) tokens only; observations and prompts are masked exactly as in RL."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or SearchSFT)
        self.advantage_estimator = "sft"
        self.kl_coeff = 0.0
        self.lr = 5e-5
        self.demonstrations: list[Rollout] = []
        self.sft_batch_size = 8
        self.sft_balance_by: list[Hashable] | None = None

    def sft(
        self,
        *,
        demonstrations: list[Rollout] | Any = NotProvided,
        sft_batch_size: int | Any = NotProvided,
        balance_by: Sequence[Hashable] | Any | None = NotProvided,
    ) -> SearchSFTConfig:
        """``demonstrations`` (Rollout records) and ``sft_batch_size`` episodes per training step;
        ``balance_by``: a label per demonstration (e.g. its hop count and searches), and every batch then
        holds the labels in the demonstrations' proportions (see ``StratifiedSampler``); None: one shuffle."""
        if demonstrations is not NotProvided:
            self.demonstrations = list(demonstrations)
        if sft_batch_size is not NotProvided:
            self.sft_batch_size = sft_batch_size
        if balance_by is not NotProvided:
            self.sft_balance_by = None if balance_by is None else list(balance_by)
        return self

    def validate(self) -> None:
        super().validate()
        if self.advantage_estimator != "sft":
            raise ValueError("SearchSFTConfig trains with advantage_estimator='sft'")
        if not self.demonstrations:
            raise ValueError("SearchSFTConfig needs demonstrations: config.sft(demonstrations=[...])")
        if int(self.sft_batch_size) < 1:
            raise ValueError("sft_batch_size must be at least 1")
        if self.sft_balance_by is not None and len(self.sft_balance_by) != len(self.demonstrations):
            raise ValueError(
                f"sft(balance_by=...) needs one label per demonstration: {len(self.sft_balance_by)} labels, "
                f"{len(self.demonstrations)} demonstrations"
            )
