"""Off-policy guidance for GRPO groups in which no episode answered right (LUFFY, arXiv 2504.14945, in
miniature).

A group whose episodes all failed has no advantage: GRPO learns nothing from it, and where a policy never
samples a right answer on a kind of question (the main job's 2-hop questions on some seeds) RL has nothing
to lift. With ``rollouts(guidance={...})`` the EnvRunner re-runs one episode of each such group guided:
the teacher (``env/teacher.py``) writes its first ``turns`` turns and the engine the rest, as it runs the
later turns of every episode (at ``execution_temperature``). The guided episode takes the place of the
group's last sampled one. If it answers right, the group has an advantage and the update raises the
teacher's turns on a question the policy failed; if it fails too, the group stays as it was sampled.

The teacher's tokens have no sampler log-probs. :func:`score_guided_tokens` scores them with the runner's
own policy (the weights that sampled the group), so a guided token's PPO ratio starts at 1 as a sampled
token's does. LUFFY's policy shaping (a reweighted ratio for the off-policy tokens) is not applied: here
the guide writes a turn or two the warm start was trained on, not a long trace of another model.

Written by hand: no RL library guides multi-turn env rollouts with a scripted teacher (TRL, verl and
OpenRLHF mix off-policy traces only into single-turn completions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rllib_search.algos.policies import EnginePolicy, ScriptedPolicy
from rllib_search.algos.rollout import Rollout
from rllib_search.data.records import QARecord
from rllib_search.env.rewards import exact_match
from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.env.teacher import hops_of


class GuidedPolicy:
    """The teacher's segments for the first ``turns`` turns of each episode, the engine's after them."""

    def __init__(self, teacher: ScriptedPolicy, engine: EnginePolicy, turns: int) -> None:
        self.teacher = teacher
        self.engine = engine
        self.turns = int(turns)

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[Any]:
        return (self.teacher if turn < self.turns else self.engine).act(envs, turn)

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


def score_guided_tokens(module: Any, rollout: Rollout) -> Rollout:
    """``rollout`` with the log-probs of its teacher-written tokens (generated, without a sampler log-prob)
    under ``module`` (an :class:`~rllib_search.algos.rl_module.LLMRLModule`) at temperature 1, the
    learner's: every generated token then has a finite log-prob."""
    import torch

    missing = (rollout.loss_mask > 0) & np.isnan(rollout.logprobs)
    if not missing.any():
        return rollout
    device = next(module.model.parameters()).device
    ids = torch.as_tensor(rollout.token_ids, device=device)[None]
    with torch.no_grad():
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        scored = module.sequence_logprobs(batch)[0].float().cpu().numpy()  # position t scores token t+1
    logprobs = rollout.logprobs.copy()
    logprobs[1:][missing[1:]] = scored[missing[1:]]
    rollout.logprobs = logprobs
    return rollout
