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

Counter-guidance (``guidance={..., "counter": "plan" | "fork"}``) is the mirror for the other failure, a
second search spreading to one-hop questions (docs/main_job.md, stops 84-85: the update that raises a
two-hop plan's "," raises it on one-hop questions too, and their groups seldom sample a plan that goes on,
so nothing pushes back). In each group of a one-hop question whose episodes all searched once and at
least one answered right, the last episode is re-run with the teacher's plan that goes on
(:meth:`~rllib_search.env.teacher.TeacherPolicy.going_on_plan`) and the engine's turns after it. When it
answers wrong, its advantage lowers that plan on that question: credited as a sampled plan would be
(``"plan"``), or at its fork alone (``"fork"``: where it departs from the plan that stops, leaving the
placeholder relation no policy writes untrained; but under ``sequence`` loss aggregation a one-token
sequence weighs a whole episode, and on seed 1 of the main job it took the second search from two-hop
questions too, stop 86).

Written by hand: no RL library guides multi-turn env rollouts with a scripted teacher (TRL, verl and
OpenRLHF mix off-policy traces only into single-turn completions).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rllib_search.algos.policies import EnginePolicy, ScriptedPolicy
from rllib_search.algos.rollout import Rollout
from rllib_search.data.records import QARecord
from rllib_search.env.rewards import exact_match
from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.env.teacher import TeacherPolicy, hops_of


class GuidedPolicy:
    """The teacher's segments for the first ``turns`` turns of each episode, the engine's after them; for
    the questions in ``going_on`` (uids, counter-guidance) the teacher writes the first turn alone."""

    def __init__(
        self, teacher: ScriptedPolicy, engine: EnginePolicy, turns: int, going_on: Collection[str] = ()
    ) -> None:
        self.teacher = teacher
        self.engine = engine
        self.turns = int(turns)
        self.going_on = frozenset(going_on)

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[Any]:
        scripted = [turn < (1 if env.record.uid in self.going_on else self.turns) for env in envs]
        by_teacher = iter(
            self.teacher.act([e for e, s in zip(envs, scripted) if s], turn) if any(scripted) else []
        )
        by_engine = iter(
            self.engine.act([e for e, s in zip(envs, scripted) if not s], turn) if not all(scripted) else []
        )
        return [next(by_teacher) if s else next(by_engine) for s in scripted]

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


class GoingOnTeacher:
    """``teacher``'s segments, but its plan that goes on (``going_on_plan``) as the first turn of the
    questions in ``going_on`` (uids)."""

    def __init__(self, teacher: TeacherPolicy, going_on: Collection[str]) -> None:
        self.teacher = teacher
        self.going_on = frozenset(going_on)

    def segment(self, record: QARecord, turn: int, retrieved_blocks: Sequence[str]) -> str:
        if turn == 0 and record.uid in self.going_on:
            return self.teacher.going_on_plan(record)
        return self.teacher.segment(record, turn, retrieved_blocks)


def stopped_groups(records: Sequence[QARecord], rollouts: Sequence[Rollout], group_size: int) -> list[int]:
    """The start index of every group of a one-hop question (its hop chain has one hop) in which every
    episode searched exactly once and at least one answered right: counter-guidance's groups."""
    starts = []
    for start in range(0, len(rollouts), group_size):
        group = rollouts[start : start + group_size]
        if (
            len(hops_of(records[start])) == 1
            and all(r.stats.get("searches", 0) == 1 for r in group)
            and any(answered_right(r) for r in group)
        ):
            starts.append(start)
    return starts


def plan_fork(stops: Sequence[int], goes_on: Sequence[int]) -> int | None:
    """The index of the first token where the plan that goes on (``goes_on``, token ids) departs from the
    plan that stops (``stops``), or None where it never does."""
    for index, token in enumerate(goes_on):
        if index >= len(stops) or stops[index] != token:
            return index
    return None


def credit_fork_only(rollout: Rollout, goes_on: Sequence[int], fork: int) -> Rollout | None:
    """``rollout`` (whose first turn is the plan ``goes_on``, token ids) with a loss mask on the plan's
    fork token alone; None when its first turn is not that plan."""
    start, end = rollout.turn_spans[0]
    if end - start < len(goes_on) or list(rollout.token_ids[start : start + len(goes_on)]) != list(goes_on):
        return None
    loss_mask = np.zeros_like(rollout.loss_mask)
    loss_mask[start + fork] = 1
    return replace(rollout, loss_mask=loss_mask)


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
