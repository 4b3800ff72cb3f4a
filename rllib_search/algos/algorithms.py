"""The Algorithm classes of the configs in ``configs.py``: ``config.build_algo()`` builds them,
``tune.Tuner(SearchGRPO, param_space=config)`` trains them. All but :class:`SearchSFT` are
:class:`~rllib_search.algos.algorithm.SearchAlgorithm` with their own default config; SFT draws its batches
from demonstrations instead of sampling.

``configs.py`` imports this module (each config names its Algorithm class); the default configs are
imported when asked for, so the two modules load in either order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from ray.rllib.utils.metrics import LEARNER_RESULTS, LEARNER_UPDATE_TIMER, TIMERS

from rllib_search.algos.algorithm import SearchAlgorithm, train_batch
from rllib_search.algos.rollout import Rollout
from rllib_search.algos.shuffled_sampler import ShuffledSampler, StratifiedSampler

if TYPE_CHECKING:
    from rllib_search.algos.configs import (
        SearchGRPOConfig,
        SearchPPOConfig,
        SearchReinforcePPConfig,
        SearchSFTConfig,
    )


class SearchGRPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchGRPOConfig:
        from rllib_search.algos.configs import SearchGRPOConfig

        return SearchGRPOConfig()


class SearchPPO(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchPPOConfig:
        from rllib_search.algos.configs import SearchPPOConfig

        return SearchPPOConfig()


class SearchReinforcePP(SearchAlgorithm):
    @classmethod
    def get_default_config(cls) -> SearchReinforcePPConfig:
        from rllib_search.algos.configs import SearchReinforcePPConfig

        return SearchReinforcePPConfig()


class SearchSFT(SearchAlgorithm):
    """Masked SFT: each training step takes the next ``sft_batch_size`` demonstrations (reshuffled every
    epoch, seeded, position checkpointed; with ``sft(balance_by=...)`` each batch in the labels'
    proportions) through the same learner update as RL."""

    @classmethod
    def get_default_config(cls) -> SearchSFTConfig:
        from rllib_search.algos.configs import SearchSFTConfig

        return SearchSFTConfig()

    def setup(self, config: Any) -> None:
        super().setup(config)
        self._rng = np.random.default_rng(self.config.seed or 0)
        labels = self.config.sft_balance_by
        self._demonstrations: list[Rollout] = list(self.config.demonstrations)
        self._batch_size = int(self.config.sft_batch_size)
        self._sft_sampler: ShuffledSampler | StratifiedSampler = (
            ShuffledSampler(len(self._demonstrations), self._rng)
            if labels is None
            else StratifiedSampler(labels, self._rng, proportional=True)
        )

    def set_demonstrations(
        self, demonstrations: list[Rollout], batch_size: int | None = None, shuffle: bool = True
    ) -> None:
        """Train on ``demonstrations`` from the next step on, ``batch_size`` a step (default: the
        config's), reshuffled every epoch or, with ``shuffle=False``, in their order (so a batch keeps
        demonstrations that belong together, such as one question's two plans). A later phase of SFT
        (``fork_calibration.py``); the new pool is not part of checkpoints."""
        if not demonstrations:
            raise ValueError("set_demonstrations needs at least one demonstration")
        self._demonstrations = list(demonstrations)
        self._batch_size = int(batch_size or self._batch_size)
        self._sft_sampler = ShuffledSampler(len(self._demonstrations), self._rng, shuffle=shuffle)

    def next_demonstrations(self) -> list[Rollout]:
        chosen = self._sft_sampler.take(self._batch_size)
        return [self._demonstrations[i] for i in chosen]

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
