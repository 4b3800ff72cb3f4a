"""The algorithms' configs with the papers' defaults, and their Algorithm classes.

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

from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.utils.metrics import LEARNER_RESULTS, LEARNER_UPDATE_TIMER, TIMERS

from rllib_search.algos.algorithm import SearchAlgorithm, train_batch
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollout import Rollout
from rllib_search.algos.shuffled_sampler import ShuffledSampler


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

    def sft(
        self, *, demonstrations: list[Rollout] | Any = NotProvided, sft_batch_size: int | Any = NotProvided
    ) -> SearchSFTConfig:
        """``demonstrations`` (Rollout records) and ``sft_batch_size`` episodes per training step."""
        if demonstrations is not NotProvided:
            self.demonstrations = list(demonstrations)
        if sft_batch_size is not NotProvided:
            self.sft_batch_size = sft_batch_size
        return self

    def validate(self) -> None:
        super().validate()
        if self.advantage_estimator != "sft":
            raise ValueError("SearchSFTConfig trains with advantage_estimator='sft'")
        if not self.demonstrations:
            raise ValueError("SearchSFTConfig needs demonstrations: config.sft(demonstrations=[...])")
        if int(self.sft_batch_size) < 1:
            raise ValueError("sft_batch_size must be at least 1")


class SearchGRPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchGRPOConfig:
        return SearchGRPOConfig()


class SearchPPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchPPOConfig:
        return SearchPPOConfig()


class SearchReinforcePP(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchReinforcePPConfig:
        return SearchReinforcePPConfig()


class SearchSFT(SearchAlgorithm):
    """Masked SFT: each training step takes the next ``sft_batch_size`` demonstrations (reshuffled every
    epoch, seeded, position checkpointed) through the same learner update as RL."""

    @classmethod
    def get_default_config(cls) -> SearchSFTConfig:
        return SearchSFTConfig()

    def setup(self, config: Any) -> None:
        super().setup(config)
        demos = len(self.config.demonstrations)
        self._sft_sampler = ShuffledSampler(demos, np.random.default_rng(self.config.seed or 0))

    def next_demonstrations(self) -> list[Rollout]:
        chosen = self._sft_sampler.take(int(self.config.sft_batch_size))
        return [self.config.demonstrations[i] for i in chosen]

    def training_step(self) -> None:
        demonstrations = self.next_demonstrations()
        batch = train_batch(demonstrations, self.config, self._pad_token_id())
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                batch=batch, num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False
            )
        self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self.env_runner_group.sync_weights(
            from_worker_or_learner_group=self.learner_group, inference_only=True
        )

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["sft_position"] = self._sft_sampler.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "sft_position" in state:
            self._sft_sampler.set_state(state["sft_position"])
