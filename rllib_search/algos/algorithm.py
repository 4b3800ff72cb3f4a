"""SearchAlgorithm: the RLlib Algorithm whose ``training_step`` trains a search agent.

One training step:

1. **sample**: every EnvRunner (the local one when there are no remote ones) rolls out
   ``prompts_per_sample`` questions x ``group_size`` episodes (:class:`LLMEnvRunner`); with
   ``rollouts(dynamic_sampling_rounds=N)`` groups of equal rewards are dropped and the runners sample again,
   up to N rounds, until the iteration holds a round's worth of groups with differing rewards
   (DAPO's dynamic sampling, ``dynamic_sampling.py``);
2. **rewards -> episode advantages**, over whole groups and before anything is sharded across learners
   (RLlib's sharding would split groups): GRPO's (r - mean_g) / (std_g + eps); REINFORCE++-baseline's
   r - mean_g; REINFORCE++'s and PPO's raw outcome reward (their token advantages, whitened or from GAE
   with the critic, are made in the learner);
3. **learner_group.update** on the padded batch: reference log-probs, values, token advantages and the
   masked loss happen in :class:`~rllib_search.algos.learners.search_learner.SearchLearner`;
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

Faults (docs/architecture.md, "Faults"): a remote EnvRunner that dies mid-sample is restarted by RLlib
(``restart_failed_env_runners``); the step waits for it, gives it the learner's weights and the data
position it had before the lost sample, and samples it again (``sample_retries``), so its questions are
drawn once and trained once. Every remote runner's data position is in the Algorithm's checkpoints, and
``config.checkpointing(...)`` writes periodic, atomic checkpoints that ``restore_latest`` resumes from.

``evaluate_questions`` rolls a fixed question list out greedily for held-out tables, and ``export`` writes
a Hugging Face directory (model + tokenizer; LoRA merged) that transformers and vLLM load.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import ray
import tree
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from rllib_search.algos import dashboard_metrics
from rllib_search.algos.checkpoints.check import check_checkpoint
from rllib_search.algos.checkpoints.periodic import (
    PeriodicCheckpoints,
    checkpoint_iteration,
    checkpoints,
    latest_checkpoint,
)
from rllib_search.algos.colocation import (
    check_pairs,
    pair_bundle,
    paired_runner_groups,
    pairs_of,
    reserve_pairs,
)
from rllib_search.algos.learners.advantages import episode_signals, overlong_penalty
from rllib_search.algos.learners.batching import keep_first_turns, pad_rollouts
from rllib_search.algos.learners.offload import EVENTS_KEPT, OFFLOAD, ONLOAD
from rllib_search.algos.rollouts.dynamic_sampling import informative_groups
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.algos.rollouts.reward_schedule import RewardSchedule
from rllib_search.algos.rollouts.sampler import ShuffledSampler

T = TypeVar("T")
logger = logging.getLogger(__name__)


def _detached(leaf: Any) -> Any:
    """A weight leaf no live tensor shares: numpy views are copied, arrays owning their data kept."""
    if isinstance(leaf, np.ndarray):
        return leaf if leaf.flags.owndata else leaf.copy()
    return copy.deepcopy(leaf)


IN_FLIGHT = "one_step_off_sample"  # the tag of a launched one-step-off sample


def episode_advantages(rollouts: list[Rollout], config: Any) -> np.ndarray:
    """Per-episode advantage signal for the learner, computed over whole groups (see module docstring), from
    the episodes' rewards plus DAPO's overlong penalty where ``overlong_buffer_fraction`` is set."""
    rewards = np.asarray([r.reward for r in rollouts], dtype=np.float64)
    if config.overlong_buffer_fraction > 0:
        budget = config.response_token_budget()
        buffer = max(1, round(budget * config.overlong_buffer_fraction))
        rewards = rewards + overlong_penalty([r.num_generated_tokens for r in rollouts], budget, buffer)
    groups = [r.group_id for r in rollouts]
    return episode_signals(config.advantage_estimator, rewards, groups, scale_by_std=config.scale_by_std)


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


def train_batch(
    rollouts: list[Rollout],
    config: Any,
    pad_token_id: int,
    demonstrations: list[Rollout] | None = None,
) -> MultiAgentBatch:
    """The learners' batch: padded token tensors plus ``episode_advantages`` (numpy, one row per episode).
    ``demonstrations`` (PPO-ptx, ``config.ptx``) follow the episodes as rows with no advantage and a
    ``ptx`` column of 1 (0 for the episodes), which the learner trains with the NLL instead. With
    ``config.trained_turns`` the episodes' loss masks keep only their first turns."""
    demonstrations = demonstrations or []
    if config.trained_turns is not None:
        rollouts = [keep_first_turns(rollout, int(config.trained_turns)) for rollout in rollouts]
    rows = rollouts + demonstrations
    columns = {k: v.numpy() for k, v in pad_rollouts(rows, pad_token_id).items()}
    advantages = episode_advantages(rollouts, config) if rollouts else np.zeros(0)
    columns["episode_advantages"] = np.concatenate([advantages, np.zeros(len(demonstrations))]).astype(
        np.float32
    )
    if demonstrations:
        columns["ptx"] = np.repeat(np.float32([0.0, 1.0]), [len(rollouts), len(demonstrations)])
    env_steps = sum(r.stats.get("turns", 1) for r in rollouts)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=env_steps)


class SearchAlgorithm(Algorithm):
    """Sample -> group advantages -> masked learner update -> weight sync (see the module docstring)."""

    def setup(self, config: Any) -> None:
        # Each remote EnvRunner's state after its last sample it returned (data position, reward stage):
        # what it gets back after a restart, and what checkpoints carry (RLlib saves the local runner's only).
        self._runner_states: dict[int, dict[str, Any]] = {}
        self._sample_in_flight = False  # a one-step-off sample launched and not yet collected
        stages = config.reward_stages
        self.reward_schedule = RewardSchedule(stages) if stages else None
        # The driver's side of the colocated order: ("update", time.monotonic_ns()), the last ones.
        self.colocation_events: deque[tuple[str, int]] = deque(maxlen=EVENTS_KEPT)
        self._pairs = None
        if pairs_of(config) and ray.util.get_current_placement_group() is None:
            check_pairs(config)
            self._pairs = reserve_pairs(config)
        with paired_runner_groups(self._pairs):
            super().setup(config)
        if self.config.colocate:  # the engines hold the GPUs first: sampling comes first
            self._learners_colocation(OFFLOAD)
        self._ptx_sampler = None
        if self.config.ptx_coeff > 0:
            count = len(self.config.ptx_demonstrations)
            self._ptx_sampler = ShuffledSampler(count, np.random.default_rng(self.config.seed or 0))
        if getattr(self.config, "dashboard_metrics_enabled", True):
            dashboard_metrics.install(self)

    def training_step(self) -> None:
        rollouts = (
            self.sample_informative_rollouts()
            if self.config.dynamic_sampling_rounds
            else self.sample_rollouts()
        )
        if self.config.colocate:  # the engines sleep, the learners come back (learners/offload.py)
            self._foreach_runner(lambda runner: runner.release_engine())
            self._learners_colocation(ONLOAD)
        batch = train_batch(
            rollouts,
            self.config,
            self._pad_token_id(),
            self.next_ptx_demonstrations(),
        )
        # The tokens the update trains (episodes first in the batch; with trained_turns, only those credited).
        episode_loss_mask = np.asarray(batch.policy_batches[DEFAULT_MODULE_ID]["loss_mask"][: len(rollouts)])
        self.metrics.log_value(
            (LEARNER_RESULTS, "batch_tokens"), int(sum(len(r) for r in rollouts)), reduce="sum"
        )
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)), self.engine_weights_dropped():
            started = time.perf_counter()
            results = self.learner_group.update(
                batch=batch,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                    )
                },
                num_epochs=self.config.num_epochs,
                minibatch_size=self._minibatch_size(len(batch.policy_batches[DEFAULT_MODULE_ID])),
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            seconds = time.perf_counter() - started
        if self.config.colocate:
            self.colocation_events.append(("update", time.monotonic_ns()))
        self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self.log_batch_weights_lag(rollouts)
        trained = int(episode_loss_mask.sum()) * self.config.num_epochs
        self.metrics.log_value(
            (LEARNER_RESULTS, "trained_tokens_per_s"), trained / max(seconds, 1e-9), window=1
        )
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.sync_runner_weights()
        if self.config.colocate:  # the learners leave the GPU, then the engines take their KV caches back
            # RLlib's sync does not wait for the runners' set_state: a call queued behind it on every runner
            # does, so that each engine holds the new weights before its learner leaves.
            self._foreach_runner(lambda runner: runner.weights_version)
            self._learners_colocation(OFFLOAD)
            self._foreach_runner(lambda runner: runner.restore_engine())
        self._advance_reward_schedule()
        if (
            self.config.held_out_dataset is not None
            and (self.iteration + 1) % self.config.held_out_interval == 0
        ):
            self.metrics.log_dict(self.evaluate_held_out(), key="evaluation", window=1)

    def _minibatch_size(self, rows: int) -> int | None:
        """The configured mini-batch size; under dynamic sampling, whose batches vary in size, the size
        that splits ``rows`` into as many mini-batches as the configured size would need, as even as they
        go (RLlib's iterator cycles to fill a mini-batch: 24 rows in sixteens would train 8 of them twice;
        in twelves, none)."""
        size = self.config.minibatch_size
        if not size or not self.config.dynamic_sampling_rounds:
            return size
        count = -(-rows // int(size))
        return -(-rows // count)

    def next_ptx_demonstrations(self) -> list[Rollout]:
        """The next ``ptx_batch_size`` PPO-ptx demonstrations (none without ``config.ptx``)."""
        if self._ptx_sampler is None:
            return []
        chosen = self._ptx_sampler.take(int(self.config.ptx_batch_size))
        return [self.config.ptx_demonstrations[i] for i in chosen]

    def log_batch_weights_lag(self, rollouts: list[Rollout]) -> None:
        """``learners/batch_weights_lag``: how many updates the learner had made beyond the oldest weights
        that sampled this batch, when it started updating on it (0 in lock-step, 1 one-step-off)."""
        after = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, WEIGHTS_SEQ_NO), default=None)
        if after is None or not rollouts:
            return
        lag = int(after) - 1 - min(int(r.weights_version) for r in rollouts)
        self.metrics.log_value((LEARNER_RESULTS, "batch_weights_lag"), lag, window=1)

    def evaluate_held_out(self) -> dict[str, Any]:
        """Roll the config's held-out questions out greedily with the current weights; their EM, F1,
        cover-EM, format-valid rate, searches and turns per episode, and EM per data source."""
        if not hasattr(self, "_held_out_records"):
            from rllib_search.algos.rollouts.env_runner import LLMEnvRunner

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

    def _learners_colocation(self, phase: str) -> None:
        """``phase`` (offload or onload, ``learners/offload.py``) on every learner, waited for."""
        for result in self.learner_group.foreach_learner(lambda learner: learner.colocation(phase)):
            result.get()

    def _foreach_runner(self, func: Any) -> list[Any]:
        """``func`` on every sampling EnvRunner (the local one when there are no remote ones), waited for."""
        group = self.env_runner_group
        return group.foreach_env_runner(func, local_env_runner=group.num_remote_env_runners() == 0)

    def sample_rollouts(self) -> list[Rollout]:
        """One ``sample()`` from every EnvRunner (in the reward schedule's current stage); their metrics go
        under ``env_runners``. Where the runners held back every group for the evidence judge
        (``rollouts(judge_retries=N)``), they sample again: held groups come back within N samples."""
        for _ in range(int(self.config.judge_retries) + 1):
            rollouts = self._sample_once()
            if rollouts:
                return rollouts
        return self._sample_once()

    def _sample_once(self) -> list[Rollout]:
        group = self.env_runner_group
        stage = self.reward_schedule.index if self.reward_schedule is not None else None
        sampled = getattr(self, "_sampled_stage", None)
        if stage is not None and sampled is not None and stage != sampled:
            self.metrics.delete(ENV_RUNNER_RESULTS, "reward", key_error=False)  # the old stage's components
        self._sampled_stage = stage
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if group.num_remote_env_runners() == 0:
                runner = self.env_runner
                per_runner, metrics = [runner.sample(reward_stage=stage)], [runner.get_metrics()]
            else:
                if self.config.one_step_off:
                    samples = self._sample_one_step_off(stage)
                else:
                    samples = self._sample_remote_runners(stage)
                per_runner, metrics = [rollouts for rollouts, _ in samples], [m for _, m in samples]
        self.metrics.aggregate(metrics, key=ENV_RUNNER_RESULTS)
        steps = sum(r.stats.get("turns", 1) for rollouts in per_runner for r in rollouts)
        self.metrics.log_value(
            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), steps, reduce="lifetime_sum"
        )
        return [rollout for rollouts in per_runner for rollout in rollouts]

    def sample_informative_rollouts(self) -> list[Rollout]:
        """DAPO's dynamic sampling: ``sample_rollouts`` rounds (at most ``dynamic_sampling_rounds``) until
        the groups whose rewards differ number one round's groups; those groups (the first ones, whole), or
        the last round as sampled when no round gave one."""
        rounds = int(self.config.dynamic_sampling_rounds)
        wanted = int(self.config.prompts_per_sample) * max(1, self.env_runner_group.num_remote_env_runners())
        kept: list[list[Rollout]] = []
        sampled: list[Rollout] = []
        taken = 0
        while taken < rounds and len(kept) < wanted:
            sampled = self.sample_rollouts()
            taken += 1
            kept.extend(informative_groups(sampled))
        kept = kept[:wanted]
        self.metrics.log_value((ENV_RUNNER_RESULTS, "sample_rounds"), taken, window=1)
        self.metrics.log_value((ENV_RUNNER_RESULTS, "informative_groups"), len(kept), window=1)
        return [rollout for group in kept for rollout in group] if kept else sampled

    def _remote_runner_ids(self) -> list[int]:
        return list(range(1, self.env_runner_group.num_remote_env_runners() + 1))  # = worker indices

    @staticmethod
    def _runner_sample(stage: int | None) -> Any:
        """The function a remote EnvRunner runs to sample: (worker index, rollouts, metrics, its state)."""

        def sample(runner: Any) -> tuple[int, list[Rollout], dict[str, Any], dict[str, Any]]:
            rollouts = runner.sample(reward_stage=stage)
            return runner.worker_index, rollouts, runner.get_metrics(), runner.get_state()

        return sample

    def _sample_one_step_off(self, stage: int | None) -> list[tuple[list[Rollout], dict[str, Any]]]:
        """One-step-off sampling: collect the sample launched during the last iteration's update (sampled
        with the weights the runners held then, one version behind the learner's), then launch the next
        one at once, so that it runs during this iteration's update. The new weights reach each runner
        after that sample (Ray runs an actor's calls in order). The first iteration, and any runner whose
        launched sample was lost (it died), is sampled synchronously, with the usual retries."""
        group = self.env_runner_group
        got: dict[int, tuple[list[Rollout], dict[str, Any]]] = {}
        if self._sample_in_flight:
            for index, rollouts, metrics, state in (
                result for _, result in group.fetch_ready_async_reqs(tags=IN_FLIGHT, timeout_seconds=None)
            ):
                got[index] = (rollouts, metrics)
                self._runner_states[index] = state
            self._sample_in_flight = False
        samples = self._sample_remote_runners(stage, got)
        group.foreach_env_runner_async(self._runner_sample(stage), tag=IN_FLIGHT)
        self._sample_in_flight = True
        return samples

    def _drain_sample_in_flight(self) -> None:
        """Wait for, and drop, a launched one-step-off sample (before a restore moves the runners)."""
        if self._sample_in_flight:
            self.env_runner_group.fetch_ready_async_reqs(tags=IN_FLIGHT, timeout_seconds=None)
            self._sample_in_flight = False

    def _sample_remote_runners(
        self, stage: int | None, got: dict[int, tuple[list[Rollout], dict[str, Any]]] | None = None
    ) -> list[tuple[list[Rollout], dict[str, Any]]]:
        """(rollouts, metrics) of every remote EnvRunner, in worker-index order; those in ``got`` (collected
        already, one-step-off) are not sampled again. A runner that dies is waited for (RLlib restarts
        it), brought back to its last state and sampled again, ``sample_retries`` times at most; one still
        missing is left out of this iteration (counted) and keeps its questions."""
        group = self.env_runner_group
        wanted = self._remote_runner_ids()
        sample = self._runner_sample(stage)
        got = dict(got or {})
        retried = 0
        for attempt in range(int(self.config.sample_retries) + 1):
            missing = [index for index in wanted if index not in got]
            if not missing:
                break
            if attempt:
                logger.warning("EnvRunners %s returned no sample: waiting for their restart", missing)
                retried += len(missing)
                self._await_env_runners(missing)
            for index, rollouts, metrics, state in group.foreach_env_runner(
                sample, local_env_runner=False, remote_worker_ids=missing
            ):
                got[index] = (rollouts, metrics)
                self._runner_states[index] = state
        missing = [index for index in wanted if index not in got]
        self.metrics.log_value((ENV_RUNNER_RESULTS, "runner_sample_retries"), retried, reduce="sum")
        self.metrics.log_value((ENV_RUNNER_RESULTS, "runner_samples_missing"), len(missing), reduce="sum")
        if missing:
            logger.error("EnvRunners %s missing from this iteration after %d retries", missing, retried)
        if not got:
            raise RuntimeError(f"no EnvRunner returned a sample (retried {retried} times)")
        return [got[index] for index in sorted(got)]

    def _await_env_runners(self, indices: list[int]) -> None:
        """Probe until the remote EnvRunners ``indices`` are healthy again (or
        ``env_runner_restore_timeout_s`` passes); :meth:`restore_env_runners` restores each one's state."""
        group = self.env_runner_group
        deadline = time.monotonic() + float(self.config.env_runner_restore_timeout_s)
        while True:
            self.restore_env_runners(group)
            healthy = set(group.healthy_env_runner_ids())
            if all(index in healthy for index in indices) or time.monotonic() > deadline:
                return
            time.sleep(1.0)  # each probe waits up to env_runner_health_probe_timeout_s for a ping

    def restore_env_runners(self, env_runner_group: Any) -> list[int]:
        """RLlib's restore (a ping brings a restarted runner back into service), then the restored runners
        get the learner's weights and their own last data position (RLlib would give them the local
        runner's state, which carries neither)."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group:
            self._push_to_remote_runners(restored, weights=True)
        return restored

    def _push_to_remote_runners(self, indices: list[int] | None = None, *, weights: bool) -> None:
        """Give remote EnvRunners (all by default) their recorded state and, with ``weights``, the learner's
        weights and version; waits until each has them (RLlib's weight sync may drop a request)."""
        group = self.env_runner_group
        if group.num_remote_env_runners() == 0:
            return
        indices = indices if indices is not None else list(range(1, group.num_remote_env_runners() + 1))
        sync: dict[str, Any] = {}
        if weights:
            learner = self.learner_group.get_state(
                components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
            )[COMPONENT_LEARNER]
            sync = {COMPONENT_RL_MODULE: ray.put(learner[COMPONENT_RL_MODULE])}
            sync[WEIGHTS_SEQ_NO] = learner.get(WEIGHTS_SEQ_NO)
        states = {
            index: {k: v for k, v in self._runner_states[index].items() if k != "weights_version"}
            for index in indices
            if index in self._runner_states
        }
        if not sync and not states:
            return

        def apply(runner: Any) -> None:
            runner.set_state({**states.get(runner.worker_index, {}), **sync})

        group.foreach_env_runner(apply, local_env_runner=False, remote_worker_ids=indices)

    def cleanup(self) -> None:
        dashboard_metrics.uninstall(self)
        super().cleanup()
        if getattr(self, "_pairs", None) is not None:
            ray.util.remove_placement_group(self._pairs)
            self._pairs = None

    @classmethod
    def default_resource_request(cls, config: Any) -> Any:
        """RLlib's request to Tune; with colocated pairs, the driver's bundle and then one bundle per
        learner/EnvRunner pair (``algos/colocation.py``): RLlib puts EnvRunner i on bundle i and the
        learners into the trial's group, where each fits only beside a runner."""
        request = super().default_resource_request(config)
        if isinstance(config, dict):
            config = cls.get_default_config().update_from_dict(config)
        if not pairs_of(config):
            return request
        check_pairs(config)
        from ray.tune.execution.placement_groups import PlacementGroupFactory

        bundles = [request.bundles[0]] + [pair_bundle(config)] * pairs_of(config)
        return PlacementGroupFactory(bundles=bundles, strategy=config.placement_strategy)

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if self.reward_schedule is not None:
            state["reward_schedule"] = self.reward_schedule.get_state()
            state["reward_stage_sampled"] = getattr(self, "_sampled_stage", None)
        if self._runner_states:
            state["remote_env_runners"] = dict(self._runner_states)
        if self._ptx_sampler is not None:
            state["ptx_position"] = self._ptx_sampler.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self._drain_sample_in_flight()
        super().set_state(state)
        if self.reward_schedule is not None and "reward_schedule" in state:
            self.reward_schedule.set_state(state["reward_schedule"])
            self._sampled_stage = state.get("reward_stage_sampled")
        if self._ptx_sampler is not None and "ptx_position" in state:
            self._ptx_sampler.set_state(state["ptx_position"])
        if "remote_env_runners" in state:
            self._runner_states = {int(k): v for k, v in state["remote_env_runners"].items()}
            self._push_to_remote_runners(weights=False)

    def restore_from_path(self, path: Any, *args: Any, **kwargs: Any) -> None:
        """RLlib's restore, then every remote EnvRunner gets the restored weights and its own data position
        (RLlib sends remote runners the local runner's state, and its weight sync may be dropped). The
        directory is checked file by file first (``check_checkpoint``: a truncated or corrupt file is named,
        nothing is unpickled before its structure is read)."""
        if not kwargs.get("component"):
            check_checkpoint(path)
        self._drain_sample_in_flight()
        with self.learners_onloaded():
            super().restore_from_path(path, *args, **kwargs)
            self._push_to_remote_runners(weights=True)

    def save_to_path(self, *args: Any, **kwargs: Any) -> Any:
        """RLlib's save, with colocated learners on their GPUs while their state is read
        (:meth:`learners_onloaded`)."""
        with self.learners_onloaded():
            return super().save_to_path(*args, **kwargs)

    @contextlib.contextmanager
    def learners_onloaded(self) -> Iterator[None]:
        """With ``rollouts(colocate=True)``, the learners back on their GPUs for what reads or writes their
        whole state outside an update (a checkpoint, a restore, an export, a weight snapshot): the engines
        sleep at vLLM level 1 (their weights wait in host memory, so waking needs no new ones), the learners
        come back, and afterwards leave again and the engines wake. Nothing happens without colocation, or
        inside another such block."""
        if not self.config.colocate or getattr(self, "_onloaded_depth", 0):
            yield
            return
        self._onloaded_depth = 1
        self._foreach_runner(lambda runner: runner.release_engine(level=1))
        self._learners_colocation(ONLOAD)
        try:
            yield
        finally:
            self._learners_colocation(OFFLOAD)
            self._foreach_runner(lambda runner: runner.restore_engine())
            self._onloaded_depth = 0

    # --- periodic checkpoints (algos/checkpoints/periodic.py) ----------------------------------------------
    def train(self) -> dict[str, Any]:
        """RLlib's ``train()``; then the collapse monitors and their guard (``algos/collapse.py``: the
        result's ``collapse/``; a breach warns, stops or rolls back), and, when ``config.checkpointing(...)``
        asks for it, a checkpoint of this iteration (its path under ``checkpoint_path`` in the result)."""
        result = super().train()
        cfg = self.config
        if getattr(self, "_collapse_guard", None) is None:
            self._collapse_guard = cfg.make_collapse_guard()
        guard = self._collapse_guard
        action = guard.check(result, self.iteration)
        if action == "rollback":
            action = self._roll_back(result, guard)
        if action == "stop":
            result["done"] = True  # Tune ends the trial; a recipe's loop stops
        saver = PeriodicCheckpoints(
            cfg.checkpoint_dir or "", cfg.checkpoint_every_n_iterations, cfg.checkpoint_keep_last
        )
        # Under a rollback guard, a checkpoint is written only while every monitor holds: it must be good.
        holding = cfg.collapse_on_breach != "rollback" or guard.first_bad_iteration is None
        rolled_back = "rolled_back_to" in result["collapse"]
        if cfg.checkpoint_dir and saver.due(self.iteration) and holding and not rolled_back:
            result["checkpoint_path"] = str(saver.save(self, self.iteration))
        return result

    def _roll_back(self, result: dict[str, Any], guard: Any) -> str | None:
        """Restore the newest periodic checkpoint saved before the breach began; "stop" when there is none."""
        before = guard.first_bad_iteration
        candidates = [
            path
            for path in checkpoints(self.config.checkpoint_dir)
            if (iteration := checkpoint_iteration(path)) is not None
            and before is not None
            and iteration < before
        ]
        if not candidates:
            logger.warning("collapse guard: no checkpoint saved before iteration %s to roll back to", before)
            return "stop"
        self.restore_from_path(str(candidates[-1]))
        guard.rolled_back()
        result["collapse"]["rolled_back_to"] = str(candidates[-1])
        logger.warning("collapse guard: rolled back to %s", candidates[-1])
        return None

    def restore_latest(self, directory: str | Path | None = None) -> Path | None:
        """Restore the newest complete checkpoint under ``directory`` (default: the config's checkpoint
        directory): weights, optimizer, iteration count and every EnvRunner's data position. Returns its
        path, or None when there is none (a fresh start)."""
        root = directory or self.config.checkpoint_dir
        path = latest_checkpoint(root) if root else None
        if path is not None:
            self.restore_from_path(str(path))
        return path

    def _pad_token_id(self) -> int:
        tokenizer = self.env_runner.tokenizer if self.env_runner is not None else None
        pad = getattr(tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    # --- evaluation and export --------------------------------------------------------------------
    def evaluate_questions(self, records: list[Any], temperature: float = 0.0) -> list[Rollout]:
        """One episode per record with the current weights (greedy by default), in the records' order: on
        the local EnvRunner, or spread over the remote ones where they exist (the driver's holds no
        policy)."""
        group = self.env_runner_group
        if group.num_remote_env_runners() == 0:
            return self.env_runner.rollout_records(records, temperature=temperature)
        indices = [index for index in self._remote_runner_ids() if index in group.healthy_env_runner_ids()]
        shares = {index: records[n :: len(indices)] for n, index in enumerate(indices)}
        shares = {index: share for index, share in shares.items() if share}

        def evaluate(runner: Any) -> tuple[int, list[Rollout]]:
            share = shares[runner.worker_index]
            return runner.worker_index, runner.rollout_records(share, temperature=temperature)

        done = dict(
            group.foreach_env_runner(evaluate, local_env_runner=False, remote_worker_ids=list(shares))
        )
        if set(done) != set(shares):
            raise RuntimeError(f"EnvRunners {sorted(set(shares) - set(done))} failed to evaluate their share")
        rollouts: list[Rollout] = list(records)  # placeholders, each replaced by its record's episode
        for n, index in enumerate(indices):
            rollouts[n :: len(indices)] = done.get(index, [])
        return rollouts

    def on_policy_module(self, fn: Callable[[Any], T]) -> T:
        """``fn(module)`` on the first learner's policy RLModule (unwrapped), where the trained weights
        live (sharded learners: on an unsharded copy, ``learners/fsdp.py``); its result returned. ``fn`` must
        not change the weights."""
        sharded = getattr(self.learner_group, "on_policy_module", None)

        def call(learner: Any) -> T:
            return fn(learner.module[DEFAULT_MODULE_ID].unwrapped())

        options = {} if self.learner_group.is_local else {"remote_actor_ids": [0]}
        with self.learners_onloaded():
            if sharded is not None:
                return sharded(fn)
            return next(iter(self.learner_group.foreach_learner(call, **options))).get()

    def policy_weights(self) -> dict[str, Any]:
        """A copy of the policy's weights as the learners hold them (``load_policy_weights`` puts it back):
        a snapshot, e.g. of the iteration a validation reading prefers."""
        # A local learner's state may hold numpy views of the live tensors: those are copied, or the next
        # update changes them; arrays that own their data are copies already (RLlib casts floats anew).
        with self.learners_onloaded():
            return tree.map_structure(_detached, self.learner_group.get_weights())

    @contextlib.contextmanager
    def engine_weights_dropped(self) -> Iterator[None]:
        """For an update, where the EnvRunner's HF engine lives in the learner's process (no remote
        runner, a local learner, no colocation, which has its own sleep): the engine's weights are freed
        (``LLMEnvRunner.drop_weights``) so that the update's peak does not hold them, and come back with
        the weight sync that follows the update (at once, if the update raises)."""
        group = self.env_runner_group
        shared = (  # a vLLM runner has no module to drop: drop_weights says so
            not self.config.colocate
            and group.local_env_runner is not None
            and group.num_remote_env_runners() == 0
            and self.learner_group.is_local
        )
        dropped = shared and group.local_env_runner.drop_weights()
        try:
            yield
        except BaseException:
            if dropped:
                self.sync_runner_weights()
            raise

    def sync_runner_weights(self) -> None:
        """The learners' weights to every EnvRunner (RLlib's ``sync_weights``, inference-only). With no
        remote runner they go straight to the local one: RLlib's sync would also ``ray.put`` them, a
        policy-sized write into the object store that nothing reads."""
        group = self.env_runner_group
        if group.num_remote_env_runners() or group.local_env_runner is None:
            group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True)
            return
        component = f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}"
        state = self.learner_group.get_state(components=component, inference_only=True)
        group.local_env_runner.set_state(state[COMPONENT_LEARNER])

    def load_policy_weights(self, weights: dict[str, Any]) -> None:
        """Put ``policy_weights()`` back on every learner and EnvRunner (the optimizer state is kept)."""
        self._drain_sample_in_flight()
        with self.learners_onloaded():
            self.learner_group.set_weights(weights)
            self.sync_runner_weights()
            self._push_to_remote_runners(weights=True)

    def retune_optimizer(self, lr: float | None = None, momentum: bool = True) -> None:
        """On every learner: the base learning rate ``lr`` (None: unchanged) and whether AdamW keeps its
        first moments between steps (``SearchTorchLearner.retune_optimizer``)."""
        for result in self.learner_group.foreach_learner(
            lambda learner: learner.retune_optimizer(lr, momentum)
        ):
            result.get()

    def export(self, path: str | Path) -> Path:
        """Write the trained policy as a Hugging Face directory (model + tokenizer, LoRA merged)."""
        from rllib_search.algos.checkpoints.export import export_module

        target = str(Path(path).resolve())
        return Path(self.on_policy_module(lambda module: str(export_module(module, target))))
