"""LLMEnvRunner: an RLlib EnvRunner that rolls out many multi-turn search episodes in lock step.

``config.env_runners(env_runner_cls=LLMEnvRunner)`` (the default of :class:`SearchConfig`). Each
``sample()`` draws ``prompts_per_sample`` questions from this runner's shard of the dataset, opens
``group_size`` episodes per question, then advances every active episode one turn at a time:

(the loop of ``algos/rollouts/loop.py`` with an :class:`~rllib_search.algos.rollouts.policies.EnginePolicy`)

1. ONE ``engine.generate`` call for all active episodes (their token ids as prefixes; the protocol's stop
   strings; each row capped at ``min(max_turn_tokens, env.remaining_tokens)``);
2. each env parses its segment; ONE retriever call carries every query of the turn (``step_batch``);
3. observations are appended (loss mask 0); finished episodes leave the batch;
4. when every episode has finished, ONE evidence-judge call scores all of the sample's evidences
   (R-Search; ``score_episodes``), and the episodes are scored.

It returns :class:`~rllib_search.algos.rollouts.record.Rollout` records (token ids, loss mask, sampled
log-probs, turn spans, reward breakdown, group id, weights version). ``set_state`` loads the learner's weights
into the engine in place and bumps the weights version; metrics go through RLlib's ``MetricsLogger``.

One policy copy per runner: with the HF engine the engine shares the runner's LLMRLModule (in bf16 on a
GPU: it only generates); with vLLM the runner builds no HF model at all (``self.module`` is None, the
tokenizer comes from the resolved model path) and the learner sends vLLM-ready weights
(:class:`~rllib_search.llm.weight_sync.FlatWeights`: LoRA merged, the plain model's own names, the engine's
dtype). ``release_engine`` / ``restore_engine`` put the engine to sleep while a colocated learner trains
(``config.rollouts(colocate=True)``).

With remote EnvRunners, RLlib still builds one in the driver (worker index 0). That one is hollow: it
loads the tokenizer only (the Algorithm pads batches with its pad id) and no policy, engine, retriever or
judge, and it drops the weights each sync hands it, so no weights stay in the driver and no engine there
asks for the GPU a remote runner holds. It samples nothing; the Algorithm samples and evaluates on the
remote runners.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rllib_search.algos.rollouts.loop import roll_out
from rllib_search.algos.rollouts.policies import EnginePolicy
from rllib_search.algos.rollouts.record import Rollout, correct_logprob_mean
from rllib_search.algos.rollouts.sampler import ShuffledSampler, StratifiedSampler
from rllib_search.data.records import QARecord
from rllib_search.env.protocols import get_protocol
from rllib_search.env.rewards import ResponseSummary
from rllib_search.env.search_env import JudgeReport, MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.llm.engines import Engine, SamplingParams
from rllib_search.llm.host_memory import release_free_heap
from rllib_search.serve.judge.client import build_judge, check_judge_family
from rllib_search.serve.retrieval.client import build_retriever

logger = logging.getLogger(__name__)
EVENTS_KEPT = 64  # the colocation events a runner keeps (sample, sleep, sync, wake), newest last


@dataclass(eq=False)
class HeldGroup:
    """A sampled group whose evidence judge failed, waiting in the runner to be judged again: its rollouts,
    what each episode's response said (the reward's input, ``MultiTurnSearchEnv.response_summary``) and
    the reward it was sampled under."""

    rollouts: list[Rollout]
    summaries: list[ResponseSummary]
    reward_fn: Callable[[ResponseSummary, list[str]], Any]
    attempts: int = 0

    def rescored(self, index: int, evidence_answer: str) -> Rollout:
        """Rollout ``index`` scored with the judge's ``evidence_answer``."""
        rollout = self.rollouts[index]
        summary = replace(self.summaries[index], evidence_answer=evidence_answer, judge_error=None)
        breakdown = self.reward_fn(summary, list(rollout.golden_answers))
        return replace(
            rollout,
            reward=float(breakdown.total),
            reward_components=dict(breakdown.components),
            reward_notes=dict(breakdown.notes),
            evidence_answer=evidence_answer,
        )


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples groups of multi-turn search episodes with an LLM engine (see the module docstring)."""

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.worker_index = self.worker_index or 0
        config.validate_rollouts()
        env_config = dict(self.config.env_config)
        self.module = None
        self.engine: Engine | None = None
        self._dropped_weights: list[tuple[str, torch.nn.Parameter, torch.Size]] = []
        # (event, time.monotonic_ns()) of sample, sleep, sync and wake, newest last (the colocation tests).
        self.events: deque[tuple[str, int]] = deque(maxlen=EVENTS_KEPT)
        # The driver's EnvRunner beside remote ones samples nothing (the remote ones do): it builds no policy,
        # engine, retriever or judge, and drops the weights every sync hands it.
        self.hollow = self.worker_index == 0 and int(self.num_workers or 0) > 0
        if self.hollow:
            self._build_hollow(env_config)
            return
        self.make_module()
        self.retriever = build_retriever(env_config.pop("retriever", None))
        judge_spec = env_config.pop("judge", None)
        self.judge = build_judge(judge_spec)
        if self.judge is not None:
            self._check_judge_family(judge_spec)
        self.records = self._shard(self._load_dataset(env_config.pop("dataset", None)))
        env_config.pop("tokenizer", None)  # the policy's own tokenizer is the only one that fits
        self.env_config = SearchEnvConfig.from_dict(env_config)
        self.envs: list[MultiTurnSearchEnv] = []
        self.engine = self._make_engine()
        self.protocol = get_protocol(self.env_config.protocol)
        self.sampling = SamplingParams(
            temperature=float(self.config.temperature),
            top_p=float(self.config.top_p),
            max_new_tokens=int(self.config.max_turn_tokens),
            stop=self.protocol.stop_strings,
        )
        self.weights_version = 0
        seed = self.config.seed if self.config.seed is not None else 0
        self._sampler = self._make_sampler(np.random.default_rng([seed, self.worker_index]))
        self._draws = 0
        self._sample_calls = 0
        self._retriever_retries = 0
        self._held: list[HeldGroup] = []  # groups whose evidence judge failed, to judge again
        self.reward_stage = 0
        if self.config.reward_stages:
            self._enter_reward_stage(0)

    # --- construction ---------------------------------------------------------------------------------
    def _build_hollow(self, env_config: dict[str, Any]) -> None:
        """The driver's runner when remote runners sample: the tokenizer (the batch's pad id) and the
        settings, nothing that holds weights or connects to a service."""
        from rllib_search.algos.model.rl_module import DEFAULT_MODEL_CONFIG
        from rllib_search.llm.models import load_tokenizer, resolve_model_path

        self.model_name = str(dict(self.config.model_config).get("model", DEFAULT_MODEL_CONFIG["model"]))
        self.tokenizer = load_tokenizer(resolve_model_path(self.model_name))
        self.retriever = self.judge = None
        for key in ("retriever", "judge", "dataset", "tokenizer"):
            env_config.pop(key, None)
        self.env_config = SearchEnvConfig.from_dict(env_config)
        self.envs = []
        self.records = []
        self.weights_version = 0
        self._sampler = ShuffledSampler(0, np.random.default_rng(0))
        self._draws = self._sample_calls = self._retriever_retries = 0
        self._held = []
        self.reward_stage = 0

    def make_module(self) -> None:
        """The policy: an LLMRLModule built from the config's RLModule spec (inference only), or, when vLLM
        generates, only its tokenizer (vLLM holds the weights; see the module docstring)."""
        from gymnasium import spaces

        from rllib_search.algos.model.rl_module import DEFAULT_MODEL_CONFIG
        from rllib_search.llm.models import (
            cpu_has_native_bf16,
            default_device,
            load_tokenizer,
            resolve_model_path,
        )

        model_config = dict(self.config.model_config)
        self.model_name = str(model_config.get("model", DEFAULT_MODEL_CONFIG["model"]))
        if self.config.engine == "vllm":
            self.module = None
            self.tokenizer = load_tokenizer(resolve_model_path(self.model_name))
            return
        on_cpu = str(model_config.get("device") or default_device()) == "cpu"
        if self.config.engine_dtype is not None:
            model_config["dtype"] = self.config.engine_dtype
            if on_cpu and self.config.engine_dtype == "bfloat16" and not cpu_has_native_bf16():
                logger.warning(
                    "engine_dtype='bfloat16' on a CPU without AVX512-BF16 or AMX: PyTorch emulates bf16 "
                    "and generation runs slower than in float32 (benchmarks/bf16_cpu_bench.py measures it)"
                )
        elif model_config.get("dtype") is None and not on_cpu:
            model_config["dtype"] = "bfloat16"  # the runner's copy only generates: bf16 on a GPU
        spec = self.config.get_default_rl_module_spec()
        spec.model_config = model_config
        vocab = len(load_tokenizer(self.model_name))
        spec.observation_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        spec.action_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        self.module = spec.build()
        self.module.eval()
        self.tokenizer = self.module.tokenizer

    def _check_judge_family(self, spec: Any) -> None:
        """R-Search's judge must be of another model family than the policy (see ``llm/family.py``)."""
        from rllib_search.llm.family import SameFamilyJudgeError

        model = self.model_name
        try:
            if self.module is not None:
                model_config = self.module.model.config
            else:
                from transformers import AutoConfig

                from rllib_search.llm.models import resolve_model_path

                model_config = AutoConfig.from_pretrained(resolve_model_path(model))
            warning = check_judge_family(self.judge, model_config, model, spec)
        except SameFamilyJudgeError:
            raise
        except Exception as error:  # an unreachable judge is the run's problem later (counted), not here
            warning = f"could not ask the evidence judge for its model ({error}): cross-family check skipped"
        if warning:
            logger.warning(warning)

    def _make_engine(self) -> Engine:
        options = dict(self.config.engine_options)
        if self.config.engine == "vllm":
            from rllib_search.llm.engines.vllm import VLLMEngine
            from rllib_search.llm.weight_sync import engine_dtype_of

            options["dtype"] = engine_dtype_of(self.config)  # the dtype the learner packs the weights in
            return VLLMEngine(options.pop("model", self.model_name), **options)  # it resolves aliases
        from rllib_search.llm.engines.hf import HFEngine
        from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine

        # Both share the module's weights. Keeping KV caches across turns is the default for rollouts
        # (models whose cache layers it does not know, such as linear attention's, use the plain engine).
        prefix_cache = options.pop("prefix_cache", True) and PrefixCachingHFEngine.supports(self.module.model)
        engine_cls = PrefixCachingHFEngine if prefix_cache else HFEngine
        return engine_cls(self.module.model, self.tokenizer, **options)

    @staticmethod
    def _load_dataset(dataset: Any) -> list[QARecord]:
        if dataset is None:
            raise ValueError("env_config needs 'dataset' (a QA file or a list of QARecord)")
        if isinstance(dataset, str):
            from rllib_search.data.formats import read_qa_file

            return read_qa_file(dataset)
        return list(dataset)

    def _shard(self, records: list[QARecord]) -> list[QARecord]:
        """This runner's share: remote runners (1..n) split the data; the local runner (0) sees it all."""
        count = max(1, int(self.num_workers or 0))
        shard = records if self.worker_index == 0 else records[self.worker_index - 1 :: count]
        if not shard:
            raise ValueError(
                f"EnvRunner {self.worker_index} got no questions ({len(records)} for {count} runners)"
            )
        return shard

    def new_env(self) -> MultiTurnSearchEnv:
        """A fresh env wired to this runner's tokenizer, retriever, env config and judge."""
        return MultiTurnSearchEnv(self.tokenizer, self.retriever, None, self.env_config, judge=self.judge)

    # --- sampling -------------------------------------------------------------------------------------
    def sample(
        self, *, num_prompts: int | None = None, reward_stage: int | None = None, **kwargs: Any
    ) -> list[Rollout]:
        """Roll out ``group_size`` episodes for each of ``num_prompts`` (default ``prompts_per_sample``)
        questions; returns them finished, grouped by question. ``reward_stage`` is the index of the
        config's reward schedule stage the Algorithm is in (a runner that was behind switches first)."""
        if reward_stage is not None and reward_stage != self.reward_stage:
            self._enter_reward_stage(reward_stage)
        self.events.append(("sample", time.monotonic_ns()))
        started = time.perf_counter()
        records = self._next_records(int(num_prompts or self.config.prompts_per_sample))
        group_size = int(self.config.group_size)
        episodes: list[tuple[QARecord, str]] = []
        for i, record in enumerate(records):
            group_id = f"{record.uid}@{self.worker_index}.{self._draws + i}"
            episodes.extend((record, group_id) for _ in range(group_size))
        self._draws += len(records)
        rollouts, generated, generate_seconds, judged = self._roll_out(
            episodes, self.sampling, seeded=True, policy=self.sampling_policy()
        )
        self._log_metrics(rollouts, generated, generate_seconds, time.perf_counter() - started, judged)
        released = self._judge_held_groups()
        episodes, rollouts = self._hold_unjudged_groups(episodes, rollouts)
        if self.config.group_hook is not None and rollouts:
            rollouts = list(self.config.group_hook(self, episodes, rollouts))
        self._sample_calls += 1
        return rollouts + released

    # --- the evidence judge's retry queue (``rollouts(judge_retries=N)``) ---------------------------
    def _hold_unjudged_groups(
        self, episodes: list[tuple[QARecord, str]], rollouts: list[Rollout]
    ) -> tuple[list[tuple[QARecord, str]], list[Rollout]]:
        """The sample without its groups whose evidence judge failed: those wait in the runner, with what
        their episodes said (the reward's input), to be judged again at the next samples."""
        group_size = int(self.config.group_size)
        if self.judge is None or not int(self.config.judge_retries):
            return episodes, rollouts
        starts = range(0, len(rollouts), group_size)
        failed = [
            any(r.reward_components.get("judge_error") for r in rollouts[s : s + group_size]) for s in starts
        ]
        kept_episodes: list[tuple[QARecord, str]] = []
        kept: list[Rollout] = []
        held = 0
        for start, unjudged in zip(starts, failed):
            group = rollouts[start : start + group_size]
            if unjudged:
                envs = self.envs[start : start + group_size]
                self._held.append(
                    HeldGroup(list(group), [env.response_summary for env in envs], envs[0].reward_fn)
                )
                held += 1
            else:
                kept_episodes += episodes[start : start + group_size]
                kept += group
        self.metrics.log_value("judge_held_groups", held, reduce="sum")
        return kept_episodes, kept

    def _judge_held_groups(self) -> list[Rollout]:
        """Ask the judge again, in one call, for every held group's failed episodes: the groups it answers
        (or that have waited ``judge_retries`` samples) are released, rescored."""
        if not self._held:
            return []
        waiting = [
            (group, index)
            for group in self._held
            for index, rollout in enumerate(group.rollouts)
            if rollout.reward_components.get("judge_error")
        ]
        summaries = [group.summaries[index] for group, index in waiting]
        self.metrics.log_value("judge_calls", 1, reduce="sum")
        self.metrics.log_value("judge_prompts", len(summaries), reduce="sum")
        try:
            answers = list(
                self.judge.answer_evidence(
                    [s.question for s in summaries], [s.evidence or "" for s in summaries]
                )
            )
            if len(answers) != len(summaries):
                raise RuntimeError(
                    f"the judge returned {len(answers)} answers for {len(summaries)} questions"
                )
        except Exception as error:  # still failing: the groups wait, or go as they are after their last try
            logger.warning("evidence judge failed again on %d held episodes: %s", len(summaries), error)
            self.metrics.log_value("judge_errors", len(summaries), reduce="sum")
            answers = None
        released: list[Rollout] = []
        recovered = unjudged = 0
        for group in list(self._held):
            group.attempts += 1
            if answers is None and group.attempts < int(self.config.judge_retries):
                continue
            self._held.remove(group)
            if answers is None:
                released += group.rollouts
                unjudged += 1
                continue
            for (owner, index), answer in zip(waiting, answers):
                if owner is group:
                    group.rollouts[index] = group.rescored(index, str(answer))
            released += group.rollouts
            recovered += 1
        self.metrics.log_value("judge_recovered_groups", recovered, reduce="sum")
        self.metrics.log_value("judge_unjudged_groups", unjudged, reduce="sum")
        return released

    # --- what a group hook may use (``rollouts(group_hook=...)``) -----------------------------------
    def sampling_policy(self) -> EnginePolicy:
        """The engine's policy as this sample draws it: the config's temperature and this sample's turn
        seeds, with the turns after ``trained_turns`` at ``execution_temperature`` where that is set."""
        later = None
        if self.config.execution_temperature is not None:
            later = (int(self.config.trained_turns), float(self.config.execution_temperature))
        turn_seed = self._turn_seed if self.config.seed is not None else None
        return EnginePolicy(self.engine, self.sampling, turn_seed, later)

    def rerun(self, episodes: Sequence[tuple[QARecord, str]], policy: Any) -> list[Rollout]:
        """Episodes of ``(record, group id)`` run again with ``policy`` writing the segments (a
        ``roll_out`` policy, e.g. a teacher for some turns and :meth:`sampling_policy` for the rest),
        scored as sampled ones. Tokens the engine did not sample carry no log-prob: see
        :meth:`score_unsampled_tokens`."""
        return self._roll_out(episodes, self.sampling, seeded=True, policy=policy)[0]

    def score_unsampled_tokens(self, rollout: Rollout) -> Rollout:
        """``rollout`` with a log-prob for each generated token that has none (written by another policy
        than the engine), under this runner's own weights at temperature 1, the learner's, so its PPO ratio
        starts at 1 as a sampled token's does. Unchanged where the learner recomputes old log-probs
        (``training(old_logprobs="recompute")``) or where the runner holds no HF model (vLLM)."""
        if self.module is None or self.config.old_logprobs != "sampler":
            return rollout
        import torch

        missing = (rollout.loss_mask > 0) & np.isnan(rollout.logprobs)
        if not missing.any():
            return rollout
        device = next(self.module.model.parameters()).device
        ids = torch.as_tensor(rollout.token_ids, device=device)[None]
        with torch.no_grad():
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            scored = self.module.sequence_logprobs(batch)[0].float().cpu().numpy()  # t scores token t+1
        logprobs = rollout.logprobs.copy()
        logprobs[1:][missing[1:]] = scored[missing[1:]]
        rollout.logprobs = logprobs
        return rollout

    def rollout_records(self, records: Sequence[QARecord], temperature: float = 0.0) -> list[Rollout]:
        """One episode per record at ``temperature`` (greedy by default), outside the training stream: no
        metrics, no change to the data position. For held-out evaluation."""
        params = replace(self.sampling, temperature=float(temperature), seed=None)
        episodes = [(record, f"eval:{record.uid}") for record in records]
        return self._roll_out(episodes, params, seeded=False)[0]

    def _roll_out(
        self,
        episodes: Sequence[tuple[QARecord, str]],
        sampling: SamplingParams,
        seeded: bool,
        later_turns: tuple[int, float] | None = None,
        policy: Any = None,
    ) -> tuple[list[Rollout], float, float, JudgeReport]:
        """Advance one env per (record, group id) turn by turn until all finish, then score them all (one
        judge call); returns the rollouts in order, the number of generated tokens, the seconds spent
        generating and what was asked of the judge. ``later_turns``: see ``EnginePolicy``; ``policy``
        (default: the engine's at ``sampling``) writes the segments."""
        if self.hollow:
            raise RuntimeError("the driver's EnvRunner rolls nothing out while remote EnvRunners exist")
        if self._dropped_weights:
            raise RuntimeError("the engine's weights were dropped for an update: sync them before a rollout")
        while len(self.envs) < len(episodes):
            self.envs.append(self.new_env())
        envs = self.envs[: len(episodes)]
        turn_seed = self._turn_seed if seeded and self.config.seed is not None else None
        if policy is None:
            policy = EnginePolicy(self.engine, sampling, turn_seed, later_turns)
        ends = roll_out(envs, [record for record, _ in episodes], policy, self.retriever)
        rollouts = [
            Rollout.from_env(env, group_id, self.weights_version, terminated, truncated)
            for env, (_, group_id), terminated, truncated in zip(
                envs, episodes, ends.terminated, ends.truncated
            )
        ]
        # Every episode has ended: no later call continues the engine's kept caches. Freed, and the batch's
        # memory handed back to the OS rather than kept at the largest batch's size.
        self.engine.reset_cache()
        release_free_heap()
        return rollouts, policy.generated_tokens, policy.generate_seconds, ends.judged

    def _enter_reward_stage(self, index: int) -> None:
        """Score episodes with stage ``index`` of the config's reward schedule (and draw its questions when
        it has its own dataset: a fresh seeded order over this runner's shard of them)."""
        from rllib_search.algos.rollouts.reward_schedule import RewardStage

        stage = RewardStage.coerce(self.config.reward_stages[index])
        self.env_config = replace(
            self.env_config, reward=stage.reward, reward_config=dict(stage.reward_config)
        )
        self.envs = []
        self.metrics.delete("reward", key_error=False)  # the old stage's reward components
        if stage.dataset is not None:
            self.records = self._shard(self._load_dataset(stage.dataset))
            self._sampler = self._make_sampler(self._sampler.rng)
        self.reward_stage = index

    def _turn_seed(self, turn: int) -> int:
        return (
            int(self.config.seed) * 1_000_003 + self.worker_index * 10_007 + self._sample_calls * 101 + turn
        )

    def _make_sampler(self, rng: np.random.Generator) -> ShuffledSampler | StratifiedSampler:
        """One shuffle over this shard's questions, or, with ``rollouts(balance_by=key)``, a shuffle per
        value of ``record.extra[key]`` drawn round-robin (a record without the key is its own kind: None)."""
        key = self.config.balance_by
        if not key:
            return ShuffledSampler(len(self.records), rng)
        return StratifiedSampler([r.extra.get(key) for r in self.records], rng)

    def _next_records(self, count: int) -> list[QARecord]:
        """The next ``count`` questions of this runner's shard, reshuffled every epoch."""
        return [self.records[i] for i in self._sampler.take(count)]

    def _log_metrics(
        self, rollouts: Sequence[Rollout], generated: float, gen_s: float, wall_s: float, judged: JudgeReport
    ) -> None:
        log = self.metrics.log_value
        n = len(rollouts)
        log("num_episodes", n, reduce="sum")
        log("num_env_steps_sampled", sum(r.stats["turns"] for r in rollouts), reduce="sum")
        turns = sum(r.stats["turns"] for r in rollouts)
        for key, value in {
            "episode_return_mean": np.mean([r.reward for r in rollouts]),
            "turns_per_episode": turns / n,
            "searches_per_episode": np.mean([r.stats["searches"] for r in rollouts]),
            "valid_action_rate": 1.0 - sum(r.stats["invalid_actions"] for r in rollouts) / max(1, turns),
            "answer_rate": np.mean([r.answer is not None for r in rollouts]),
            "format_valid_rate": np.mean([r.format_valid for r in rollouts]),
            "truncation_rate": np.mean([r.truncated for r in rollouts]),
            "generated_tokens_per_episode": np.mean([r.num_generated_tokens for r in rollouts]),
            "observation_tokens_per_episode": np.mean(
                [len(r) - r.prompt_length - r.num_generated_tokens for r in rollouts]
            ),
            "generation_tokens_per_s": generated / gen_s if gen_s else 0.0,
            "rollout_tokens_per_s": generated / wall_s if wall_s else 0.0,
            "weights_version": float(self.weights_version),
            "reward_stage": float(self.reward_stage),
        }.items():
            log(key, float(value), reduce="mean", window=1)
        correct = correct_logprob_mean(rollouts)
        if correct is not None:  # LLDS's quantity: how likely the policy finds its correct trajectories
            log("correct_logprob_mean", correct, reduce="mean", window=1)
        log("retriever_errors", sum(r.stats["retriever_errors"] for r in rollouts), reduce="sum")
        client_stats = getattr(self.retriever, "stats", None)  # a service client counts its retries
        if client_stats is not None and hasattr(client_stats, "retries"):
            log("retriever_retries", client_stats.retries - self._retriever_retries, reduce="sum")
            self._retriever_retries = client_stats.retries
        if self.judge is not None:
            log("judge_calls", judged.calls, reduce="sum")
            log("judge_prompts", judged.prompts, reduce="sum")
            log("judge_errors", judged.errors, reduce="sum")
            log("judge_seconds", judged.seconds, reduce="mean", window=1)
        for name in rollouts[0].reward_components:
            value = np.mean([r.reward_components.get(name, 0.0) for r in rollouts])
            log(("reward", name), float(value), reduce="mean", window=1)

    def get_metrics(self) -> dict[str, Any]:
        return self.metrics.reduce()

    # --- weights and state -------------------------------------------------------------------------
    def set_state(self, state: dict[str, Any]) -> None:
        """Take the learner's weights (``{COMPONENT_RL_MODULE: {module_id: weights}}`` or the weights
        themselves) into the module and engine in place; ``weights_version`` in ``state`` wins, else +1."""
        weights = state.get(COMPONENT_RL_MODULE)
        if isinstance(weights, ray.ObjectRef):  # RLlib puts the weights in the object store once for all
            weights = ray.get(weights)
        if isinstance(weights, dict) and DEFAULT_MODULE_ID in weights:
            weights = weights[DEFAULT_MODULE_ID]
        if weights is not None and self.hollow:  # the driver's runner: nothing to load the weights into
            weights = None
        if weights is not None:
            self.events.append(("sync", time.monotonic_ns()))
            if self.module is not None:
                self._reallocate_weights(weights)
                self.module.set_state(weights)
                self.engine.reset_cache()  # the HF engine shares the module's tensors: only drop its caches
            else:
                self.engine.load_weights(self._engine_weights(weights))
            version = state.get("weights_version", state.get(WEIGHTS_SEQ_NO))
            self.weights_version = int(version) if version is not None else self.weights_version + 1
        if self.hollow:
            self.reward_stage = int(state.get("reward_stage", self.reward_stage))
            return
        if "reward_stage" in state and int(state["reward_stage"]) != self.reward_stage:
            self._enter_reward_stage(int(state["reward_stage"]))  # before the data position: its questions
        position = state.get("data_position")
        # A data position belongs to the runner that drew it: RLlib sends the local runner's state to remote
        # ones (after a restart, on restore); that leaves their own positions alone.
        if position is not None and position.get("worker_index", self.worker_index) == self.worker_index:
            self._sampler.set_state(position)
            self._draws = position["draws"]
            self._sample_calls = int(position.get("sample_calls", self._sample_calls))

    @staticmethod
    def _engine_weights(weights: Any) -> Any:
        """What vLLM loads: the learner's FlatWeights (see ``SearchTorchLearner.get_state``)."""
        from rllib_search.llm.weight_sync import FlatWeights

        if not isinstance(weights, FlatWeights):
            raise TypeError(
                "a vLLM EnvRunner takes FlatWeights (the learner's get_state(inference_only=True) with "
                f"engine='vllm', or rllib_search.llm.models.engine_weights(model)), got {type(weights)}"
            )
        return weights

    def release_engine(self, level: int | None = None) -> None:
        """Free the engine's accelerator memory for a colocated learner update (vLLM: sleep at ``level``,
        default its ``sleep_level``; the next weight sync wakes the weights only, see
        ``llm/engines/vllm.py``)."""
        self.events.append(("sleep", time.monotonic_ns()))
        if self.engine is not None:
            if level is None:
                self.engine.sleep()
            else:
                self.engine.sleep(level=level)

    def drop_weights(self) -> bool:
        """Free the HF engine's weights until the next weight sync writes new ones (a learner updating in
        this process then does not hold them beside its own): the parameters keep their shapes, not their
        storage. Only where every sync carries every weight (no LoRA: its syncs carry the adapters);
        returns whether it dropped them."""
        if self.module is None or getattr(self.module, "uses_lora", True) or self._dropped_weights:
            return False
        self.engine.reset_cache()
        names = {id(param): name for name, param in self.module.named_parameters()}
        for param in self.module.model.parameters():
            self._dropped_weights.append((names[id(param)], param, param.shape))
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        release_free_heap()
        return True

    def _reallocate_weights(self, weights: dict[str, Any]) -> None:
        """Storage again for the weights :meth:`drop_weights` freed, which ``weights`` must all cover."""
        if not self._dropped_weights:
            return
        missing = [name for name, _, _ in self._dropped_weights if name not in weights]
        if missing:
            raise ValueError(f"the engine's weights were dropped and this sync lacks {missing[:3]}")
        for _, param, shape in self._dropped_weights:
            param.data = torch.empty(shape, dtype=param.dtype, device=param.device)
        self._dropped_weights = []

    def restore_engine(self) -> None:
        """Take the accelerator memory back once the update, the weight sync and the learner's offload are
        done (vLLM: the KV cache wakes up)."""
        self.events.append(("wake", time.monotonic_ns()))
        if self.engine is not None:
            self.engine.wake_up()

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Weights version, reward stage and data position (the weights live in the learner's checkpoint)."""
        return {
            "weights_version": self.weights_version,
            "reward_stage": self.reward_stage,
            "data_position": {
                **self._sampler.get_state(),
                "worker_index": self.worker_index,
                "draws": self._draws,
                "sample_calls": self._sample_calls,
            },
        }

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        return (), {"config": self.config}

    def get_spaces(self) -> dict[str, Any]:
        env = self.envs[0] if self.envs else self.new_env()
        return {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}

    def assert_healthy(self) -> None:
        assert self.hollow or (self.engine is not None and self.records), "LLMEnvRunner is not set up"

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.sleep()
