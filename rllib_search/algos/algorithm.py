"""SearchAlgorithm: the RLlib Algorithm whose ``training_step`` trains a search agent.

One training step:

1. **sample**: every EnvRunner (the local one when there are no remote ones) rolls out
   ``prompts_per_sample`` questions x ``group_size`` episodes (:class:`LLMEnvRunner`);
2. **rewards -> episode advantages**, over whole groups and before anything is sharded across learners
   (RLlib's sharding would split groups): GRPO's (r - mean_g) / (std_g + eps); REINFORCE++'s r - mean_g;
   PPO's raw outcome reward (its GAE needs the critic, so it runs in the learner);
3. **learner_group.update** on the padded batch: reference log-probs, values, token advantages and the
   masked loss happen in :class:`~rllib_search.algos.learner.SearchLearner`;
4. **weight sync** to the EnvRunners (in place; the new ``weights_version`` rides along; for vLLM the
   learner sends one flat buffer of merged, plainly named weights). With ``rollouts(colocate=True)`` every
   engine sleeps from the end of step 1 until the sync is done, so a learner sharing its GPU has the memory;
5. **metrics** through RLlib's MetricsLogger (``env_runners/...``, ``learners/...``) for Tune's loggers;
   after ``train()`` a callback publishes them as Ray metrics for the dashboard and Prometheus
   (``dashboard_metrics.py``, on unless ``config.dashboard_metrics(enabled=False)``);
6. **reward schedule** (when the config has one, R1-Searcher's two stages): the iteration's results decide
   whether the next iteration samples with the next stage's reward; the stage is checkpointed;
7. **held-out evaluation** every ``held_out_interval`` iterations when ``config.held_out(dataset=...)`` is
   set: greedy episodes on the held-out questions, results under ``evaluation/`` (and, with
   ``held_out(answers=True)``, each question's answer under ``evaluation_answers``, a JSON string).

``evaluate_questions`` rolls a fixed question list out greedily for held-out tables, and ``export`` writes
a Hugging Face directory (model + tokenizer; LoRA merged) that transformers and vLLM load.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from rllib_search.algos import dashboard_metrics
from rllib_search.algos.advantages import grpo_advantages, reinforce_pp_baseline
from rllib_search.algos.batching import pad_rollouts
from rllib_search.algos.reward_schedule import RewardSchedule
from rllib_search.algos.rollout import Rollout

logger = logging.getLogger(__name__)


def episode_advantages(rollouts: list[Rollout], config: Any) -> np.ndarray:
    """Per-episode advantage signal for the learner, computed over whole groups (see module docstring)."""
    rewards = np.asarray([r.reward for r in rollouts], dtype=np.float64)
    groups = [r.group_id for r in rollouts]
    estimator = config.advantage_estimator
    if estimator == "grpo":
        return grpo_advantages(rewards, groups, scale_by_std=config.scale_by_std)
    if estimator == "reinforce_pp":
        return reinforce_pp_baseline(rewards, groups)
    if estimator in ("gae", "sft"):
        return rewards
    raise ValueError(f"unknown advantage_estimator {estimator!r}")


def held_out_metrics(rollouts: list[Rollout]) -> dict[str, Any]:
    """Means over greedy held-out episodes: answer metrics, format validity, searches, turns, EM by source."""
    from rllib_search.env.rewards import cover_exact_match, exact_match, token_f1

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    em = [exact_match(r.answer, r.golden_answers) for r in rollouts]
    by_source: dict[str, list[float]] = {}
    for rollout, value in zip(rollouts, em):
        by_source.setdefault(rollout.data_source, []).append(value)
    return {
        "em": mean(em),
        "f1": mean([token_f1(r.answer, r.golden_answers) for r in rollouts]),
        "cover_em": mean([cover_exact_match(r.answer, r.golden_answers) for r in rollouts]),
        "format_valid": mean([float(r.format_valid) for r in rollouts]),
        "searches_per_episode": mean([r.stats["searches"] for r in rollouts]),
        "turns_per_episode": mean([r.stats["turns"] for r in rollouts]),
        "num_questions": len(rollouts),
        "em_by_source": {source: mean(values) for source, values in sorted(by_source.items())},
    }


def held_out_answers(records: list[Any], rollouts: list[Rollout]) -> str:
    """Each held-out question's answer beside its gold answers and hop count, as a JSON list (a string: Tune's
    loggers keep it as it is)."""
    import json

    return json.dumps(
        [
            {
                "uid": record.uid,
                "hops": record.extra.get("num_hops"),
                "data_source": rollout.data_source,
                "answer": rollout.answer,
                "golden_answers": list(rollout.golden_answers),
            }
            for record, rollout in zip(records, rollouts)
        ]
    )


def train_batch(rollouts: list[Rollout], config: Any, pad_token_id: int) -> MultiAgentBatch:
    """The learners' batch: padded token tensors plus ``episode_advantages`` (numpy, one row per episode)."""
    columns = {k: v.numpy() for k, v in pad_rollouts(rollouts, pad_token_id).items()}
    columns["episode_advantages"] = episode_advantages(rollouts, config).astype(np.float32)
    env_steps = sum(r.stats.get("turns", 1) for r in rollouts)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=env_steps)


class SearchAlgorithm(Algorithm):
    """Sample -> group advantages -> masked learner update -> weight sync (see the module docstring)."""

    def setup(self, config: Any) -> None:
        stages = config.reward_stages
        self.reward_schedule = RewardSchedule(stages) if stages else None
        super().setup(config)
        if getattr(self.config, "dashboard_metrics_enabled", True):
            dashboard_metrics.install(self)

    def training_step(self) -> None:
        rollouts = self.sample_rollouts()
        if self.config.colocate:  # the learners get the GPU memory until the new weights are in the engines
            self._foreach_runner(lambda runner: runner.release_engine())
        batch = train_batch(rollouts, self.config, self._pad_token_id())
        self.metrics.log_value(
            (LEARNER_RESULTS, "batch_tokens"), int(sum(len(r) for r in rollouts)), reduce="sum"
        )
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            started = time.perf_counter()
            results = self.learner_group.update(
                batch=batch,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                    )
                },
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            seconds = time.perf_counter() - started
        self.metrics.aggregate(results, key=LEARNER_RESULTS)
        trained = sum(int(r.loss_mask.sum()) for r in rollouts) * self.config.num_epochs
        self.metrics.log_value(
            (LEARNER_RESULTS, "trained_tokens_per_s"), trained / max(seconds, 1e-9), window=1
        )
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.env_runner_group.sync_weights(
                from_worker_or_learner_group=self.learner_group, inference_only=True
            )
        if self.config.colocate:
            self._foreach_runner(lambda runner: runner.restore_engine())
        self._advance_reward_schedule()
        if (
            self.config.held_out_dataset is not None
            and (self.iteration + 1) % self.config.held_out_interval == 0
        ):
            self.metrics.log_dict(self.evaluate_held_out(), key="evaluation", window=1)

    def evaluate_held_out(self) -> dict[str, Any]:
        """Roll the config's held-out questions out greedily with the current weights; their EM, F1,
        cover-EM, format-valid rate, searches and turns per episode, and EM per data source."""
        if not hasattr(self, "_held_out_records"):
            from rllib_search.algos.env_runner import LLMEnvRunner

            self._held_out_records = LLMEnvRunner._load_dataset(self.config.held_out_dataset)
        rollouts = self.evaluate_questions(self._held_out_records)
        if getattr(self.config, "held_out_answers", False):
            self._held_out_answers = held_out_answers(self._held_out_records, rollouts)
        return held_out_metrics(rollouts)

    def step(self) -> dict[str, Any]:
        """RLlib's step, plus the held-out answers of this iteration's evaluation when asked for."""
        result = super().step()
        answers = getattr(self, "_held_out_answers", None)
        if answers is not None:
            result["evaluation_answers"] = answers
            self._held_out_answers = None
        return result

    def _advance_reward_schedule(self) -> None:
        """Tell the reward schedule what this iteration measured; the next sample uses its stage."""
        schedule = self.reward_schedule
        if schedule is None:
            return

        def metric(name: str) -> float | None:
            value = self.metrics.peek(tuple(name.split("/")), default=None)
            return None if value is None or isinstance(value, dict) else float(value)

        if schedule.observe(metric):
            logger.info(
                "reward schedule: stage %d (%s) from the next iteration",
                schedule.index,
                schedule.stage.reward,
            )

    def _foreach_runner(self, func: Any) -> list[Any]:
        """``func`` on every sampling EnvRunner (the local one when there are no remote ones), waited for."""
        group = self.env_runner_group
        return group.foreach_env_runner(func, local_env_runner=group.num_remote_env_runners() == 0)

    def sample_rollouts(self) -> list[Rollout]:
        """One ``sample()`` from every EnvRunner (in the reward schedule's current stage); their metrics go
        under ``env_runners``."""
        group = self.env_runner_group
        local = group.num_remote_env_runners() == 0
        stage = self.reward_schedule.index if self.reward_schedule is not None else None
        sampled = getattr(self, "_sampled_stage", None)
        if stage is not None and sampled is not None and stage != sampled:
            self.metrics.delete(ENV_RUNNER_RESULTS, "reward", key_error=False)  # the old stage's components
        self._sampled_stage = stage
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            per_runner = group.foreach_env_runner(
                lambda runner: runner.sample(reward_stage=stage), local_env_runner=local
            )
            metrics = group.foreach_env_runner(lambda runner: runner.get_metrics(), local_env_runner=local)
        self.metrics.aggregate(metrics, key=ENV_RUNNER_RESULTS)
        steps = sum(r.stats.get("turns", 1) for rollouts in per_runner for r in rollouts)
        self.metrics.log_value(
            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), steps, reduce="lifetime_sum"
        )
        return [rollout for rollouts in per_runner for rollout in rollouts]

    def cleanup(self) -> None:
        dashboard_metrics.uninstall(self)
        super().cleanup()

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if self.reward_schedule is not None:
            state["reward_schedule"] = self.reward_schedule.get_state()
            state["reward_stage_sampled"] = getattr(self, "_sampled_stage", None)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self.reward_schedule is not None and "reward_schedule" in state:
            self.reward_schedule.set_state(state["reward_schedule"])
            self._sampled_stage = state.get("reward_stage_sampled")

    def _pad_token_id(self) -> int:
        tokenizer = self.env_runner.tokenizer if self.env_runner is not None else None
        pad = getattr(tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    # --- evaluation and export --------------------------------------------------------------------
    def evaluate_questions(self, records: list[Any], temperature: float = 0.0) -> list[Rollout]:
        """One episode per record with the current weights (greedy by default), on the local EnvRunner."""
        runner = self.env_runner
        if runner is None:
            raise RuntimeError("evaluate_questions needs a local EnvRunner (num_env_runners=0)")
        return runner.rollout_records(records, temperature=temperature)

    def export(self, path: str | Path) -> Path:
        """Write the trained policy as a Hugging Face directory (model + tokenizer, LoRA merged)."""
        from rllib_search.algos.export import export_module

        target = str(Path(path).resolve())

        def write(learner: Any) -> str:
            return str(export_module(learner.module[DEFAULT_MODULE_ID].unwrapped(), target))

        options = {} if self.learner_group.is_local else {"remote_actor_ids": [0]}
        results = self.learner_group.foreach_learner(write, **options)
        return Path(next(iter(results)).get())
