"""Off-policy guidance for GRPO groups in which no episode answered right (LUFFY, arXiv 2504.14945, in
miniature), as an EnvRunner group hook: ``rollouts(group_hook=TeacherGuidance(...))``.

A group whose episodes all failed has no advantage: GRPO learns nothing from it, and where a policy never
samples a right answer on a kind of question RL has nothing to lift. :class:`TeacherGuidance` re-runs one
episode of each such group guided: the teacher (``env/teacher.py``) writes its first ``turns`` turns and
the engine the rest, as it runs the later turns of every episode (at ``execution_temperature``). The guided
episode takes the place of the group's last sampled one. If it answers right, the group has an advantage
and the update raises the teacher's turns on a question the policy failed; if it fails too, the group
stays as it was sampled.

The teacher's tokens have no sampler log-probs: the runner scores them with its own weights
(:meth:`~rllib_search.algos.rollouts.env_runner.LLMEnvRunner.score_unsampled_tokens`), so a guided token's
PPO ratio starts at 1 as a sampled token's does. LUFFY's policy shaping (a reweighted ratio for the
off-policy tokens) is not applied: here the guide writes a turn or two the warm start was trained on, not
a long trace of another model.

Written by hand: no RL library guides multi-turn env rollouts with a scripted teacher (TRL, verl and
OpenRLHF mix off-policy traces only into single-turn completions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_search.algos.rollouts.policies import EnginePolicy, ScriptedPolicy
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.data.records import QARecord
from rllib_search.env.protocols import get_protocol
from rllib_search.env.rewards import exact_match
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import TeacherPolicy, hops_of


@dataclass(frozen=True)
class TeacherGuidance:
    """The group hook: in each group with no right answer, the last episode re-run with the teacher
    (``TeacherPolicy(protocol, **teacher)``) writing its first ``turns`` turns. Logs
    ``env_runners/guided_groups`` and ``guided_solved`` (those that answered right); the other
    ``env_runners`` metrics describe the sampled episodes alone."""

    turns: int = 1
    teacher: dict[str, Any] = field(default_factory=dict)

    def validate(self, config: Any) -> None:
        """Fail at config time on what would fail in the runner."""
        if int(self.turns) < 1:
            raise ValueError(f"guidance turns must be at least 1, got {self.turns}")
        protocol = dict(config.env_config or {}).get("protocol", SearchEnvConfig.protocol)
        try:  # the runner builds this teacher when a group needs it: a bad argument fails here, at once
            TeacherPolicy(get_protocol(protocol), **self.teacher)
        except (TypeError, ValueError) as error:
            raise ValueError(f"guidance teacher {self.teacher!r}: {error}") from None
        if int(config.group_size) < 2:
            raise ValueError("guidance replaces one episode of a group: group_size >= 2")
        if config.engine == "vllm" and config.old_logprobs == "sampler":
            raise ValueError(
                "guidance with vLLM needs training(old_logprobs='recompute'): a vLLM runner holds no HF "
                "model to score the teacher's tokens with"
            )

    def __call__(
        self, runner: Any, episodes: Sequence[tuple[QARecord, str]], rollouts: list[Rollout]
    ) -> list[Rollout]:
        group_size = int(runner.config.group_size)
        records = [record for record, _ in episodes]
        starts = unsolved_groups(records, rollouts, group_size)
        guided: list[Rollout] = []
        if starts:
            teacher = TeacherPolicy(runner.protocol, **self.teacher)
            policy = GuidedPolicy(
                ScriptedPolicy("teacher", runner.protocol, runner.tokenizer, teacher=teacher),
                runner.sampling_policy(),
                self.turns,
            )
            guided = runner.rerun([episodes[start] for start in starts], policy)
            for start, rollout in zip(starts, guided):
                rollouts[start + group_size - 1] = runner.score_unsampled_tokens(rollout)
        runner.metrics.log_value("guided_groups", len(guided), reduce="sum")
        runner.metrics.log_value("guided_solved", sum(answered_right(r) for r in guided), reduce="sum")
        return rollouts


class GuidedPolicy:
    """The teacher's segments for the first ``turns`` turns of each episode, the engine's after them."""

    def __init__(self, teacher: ScriptedPolicy, engine: EnginePolicy, turns: int) -> None:
        self.teacher = teacher
        self.engine = engine
        self.turns = int(turns)

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[Any]:
        if turn < self.turns:
            return self.teacher.act(envs, turn)
        return self.engine.act(envs, turn)

    @property
    def generated_tokens(self) -> int:
        return self.engine.generated_tokens

    @property
    def generate_seconds(self) -> float:
        return self.engine.generate_seconds


def answered_right(rollout: Rollout) -> bool:
    """Whether the episode's answer exactly matches one of the golden answers."""
    return exact_match(rollout.answer, rollout.golden_answers) > 0


def unsolved_groups(records: Sequence[QARecord], rollouts: Sequence[Rollout], group_size: int) -> list[int]:
    """The start index of every group (``group_size`` consecutive rollouts of ``records[start]``) in which
    no episode answered right and whose question the teacher can guide (it carries its hop chain)."""
    return [
        start
        for start in range(0, len(rollouts), group_size)
        if hops_of(records[start])
        and not any(answered_right(r) for r in rollouts[start : start + group_size])
    ]
