"""Masked SFT on demonstration trajectories: the warm start, on the same learner, masks and batching as RL.

The loss is the negative log-likelihood of the demonstrated (generated) tokens only; observations and
prompts are masked exactly as in RL. Demonstrations are Rollout records, e.g. from
:func:`rllib_search.algos.rollouts.demonstrations.teacher_rollouts`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.utils.metrics import LEARNER_RESULTS, LEARNER_UPDATE_TIMER, TIMERS

from rllib_search.algos.algorithm import SearchAlgorithm, train_batch
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.algos.rollouts.sampler import ShuffledSampler, StratifiedSampler


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


class SearchSFT(SearchAlgorithm):
    """Masked SFT: each training step takes the next ``sft_batch_size`` demonstrations (reshuffled every
    epoch, seeded, position checkpointed; with ``sft(balance_by=...)`` each batch in the labels'
    proportions) through the same learner update as RL."""

    @classmethod
    def get_default_config(cls) -> SearchSFTConfig:
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
        demonstrations that belong together, such as one question's two plans): a later phase of SFT. The
        new pool is not part of checkpoints."""
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
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)), self.engine_weights_dropped():
            results = self.learner_group.update(
                batch=batch, num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False
            )
        self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self.sync_runner_weights()

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["sft_position"] = self._sft_sampler.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "sft_position" in state:
            self._sft_sampler.set_state(state["sft_position"])
