"""SearchLearner: the framework-agnostic learner of PPO, GRPO, REINFORCE++ and masked SFT over tokens.

As RLlib's ``PPOLearner`` holds what does not depend on the framework and ``PPOTorchLearner`` the loss,
this class holds the schedule and the advantage preparation;
:class:`~rllib_search.algos.learners.torch_learner.
SearchTorchLearner` holds the loss (``compute_loss_for_module``), gradient accumulation and the optimizers.

``update`` is RLlib's, preceded by one documented preparation step (:meth:`prepare_batch`) on the
learner's whole shard: the Algorithm hands a padded batch of whole episodes with one
``episode_advantages`` value per episode (computed over whole groups before sharding). Preparation
scores the shard once (:meth:`score_batch`, framework-specific: reference log-probs, critic values,
recomputed old log-probs) and turns the episode values into token advantages with ``advantages.py``:

- GRPO: the episode's advantage on each of its generated tokens (``batching.broadcast_to_tokens``);
- PPO: GAE over generated tokens on rewards that carry the outcome on the last generated token and, as in
  Search-R1, ``-kl_coeff * KL`` on every generated token; optionally whitened;
- REINFORCE++ (``reinforce_pp``, no baseline) and REINFORCE++-baseline (``reinforce_pp_baseline``, the
  episode value already centred on its group's mean): the same rewards summed into returns-to-go, then
  whitened over the generated tokens of every learner's shard (``reinforce_pp_advantages``).

Whitening moments are summed over all learners (:meth:`reduce_sums`), so 2 learners whiten like 1.
A learner connector is not used: RLlib runs it only on episodes, and this batch is built from rollouts.

Learning rate: one writer, :class:`~rllib_search.algos.learners.lr_warmup.LearningRateWarmup` (RLlib's
``Scheduler`` keyed by optimizer steps); RLlib's own per-optimizer schedule is disabled. The optimizer step
count is part of the learner's checkpointed state.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner import Learner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_search.algos.learners.advantages import (
    gae,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
)
from rllib_search.algos.learners.batching import broadcast_to_tokens
from rllib_search.algos.learners.lr_warmup import LearningRateWarmup
from rllib_search.llm.host_memory import release_free_heap

POLICY_OPTIMIZER = "policy"
CRITIC_OPTIMIZER = "critic"


class SearchLearner(Learner, abc.ABC):
    """Schedules and advantage preparation; the framework-specific subclass adds scoring and the loss."""

    @override(Learner)
    def build(self) -> None:
        self.optimizer_steps = 0
        self.warmup = LearningRateWarmup(
            self.config.warmup_ratio, self.config.total_training_steps, self.config.lr_decay
        )
        super().build()

    # --- the learning-rate schedule (one writer) ----------------------------------------------------
    def learning_rate_factor(self) -> float:
        """The multiplier of every param group's base learning rate for the next optimizer step."""
        return self.warmup.factor(self.optimizer_steps)

    def loss_mask_key(self) -> str:
        """The batch column that masks every loss term (generated tokens, or all response tokens)."""
        return "loss_mask" if self.config.mask_retrieved_tokens else "response_mask"

    def split_ptx(self, columns: dict[str, Any]) -> tuple[Any, Any]:
        """(the RL terms' mask, the PPO-ptx NLL's mask or None): the loss mask with the demonstration rows
        (``ptx`` column 1) taken out of the first and kept in the second. Works on numpy and torch."""
        mask = columns[self.loss_mask_key()]
        if "ptx" not in columns:
            return mask, None
        ptx = columns["ptx"][:, None]
        return mask * (1 - ptx), mask * ptx

    # --- update = prepare the shard once, then RLlib's epochs and mini-batches ------------------------
    @override(Learner)
    def update(self, batch: MultiAgentBatch | None = None, *, training_data: Any = None, **kwargs: Any):
        if training_data is not None:  # the LearnerGroup's remote call
            training_data.solve_refs()
            batch, training_data = training_data.batch, None
        if batch is not None:
            batch = self.prepare_batch(batch)
        results = super().update(batch=batch, **kwargs)
        release_free_heap()  # the update's activations, freed: back to the OS between updates
        return results

    def prepare_batch(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        """Add ``ref_logprobs``, ``old_values``, ``advantages`` and ``returns`` (all (B, T-1)) to the
        module's batch as needed by the estimator (see the module docstring)."""
        columns = {k: np.asarray(v) for k, v in batch.policy_batches[DEFAULT_MODULE_ID].items()}
        if self.config.advantage_estimator != "sft":
            columns.update(self.score_batch(columns))
            columns.update(self.token_advantages(columns))
        return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=batch.env_steps())

    @abc.abstractmethod
    def score_batch(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """(B, T-1) float32 arrays, computed without gradients: ``ref_logprobs`` when ``kl_coeff > 0``,
        ``old_values`` when the module has a critic, ``old_logprobs`` when they are recomputed."""

    @abc.abstractmethod
    def token_kl(self, logprobs: np.ndarray, ref_logprobs: np.ndarray) -> np.ndarray:
        """Per-token KL estimate (``config.kl_estimator``) between the policy and the reference."""

    def reduce_sums(self, sums: np.ndarray) -> np.ndarray:
        """Sum ``sums`` over all learners (identity for one learner)."""
        return sums

    def token_advantages(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Token-level ``advantages`` (and ``returns`` for PPO) from ``episode_advantages``."""
        cfg = self.config
        mask, _ = self.split_ptx(columns)  # demonstrations get no advantage and stay out of whitening
        episode = columns["episode_advantages"].astype(np.float64)
        if cfg.advantage_estimator == "grpo":
            return {"advantages": broadcast_to_tokens(episode, mask).astype(np.float32)}
        penalty = None
        if cfg.kl_in_reward and cfg.kl_coeff > 0:
            penalty = cfg.kl_coeff * self.token_kl(columns["old_logprobs"], columns["ref_logprobs"])
        if cfg.advantage_estimator == "gae":
            rewards = outcome_token_rewards(episode, mask, penalty)
            advantages, returns = gae(rewards, columns["old_values"], mask, cfg.gamma, cfg.lambda_)
            if cfg.whiten_advantages:
                advantages = masked_whiten(advantages, mask, reduce_sums=self.reduce_sums)
            return {"advantages": advantages.astype(np.float32), "returns": returns.astype(np.float32)}
        if cfg.advantage_estimator in ("reinforce_pp", "reinforce_pp_baseline"):
            advantages = reinforce_pp_advantages(
                episode, mask, penalty, gamma=cfg.gamma, reduce_sums=self.reduce_sums
            )
            return {"advantages": advantages.astype(np.float32)}
        raise ValueError(f"unknown advantage_estimator {cfg.advantage_estimator!r}")

    # --- state: the optimizer step count drives the schedule ------------------------------------------
    @override(Learner)
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["optimizer_steps"] = self.optimizer_steps
        return state

    @override(Learner)
    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "optimizer_steps" in state:
            self.optimizer_steps = int(state["optimizer_steps"])
