"""The lock-step multi-turn rollout loop, shared by the EnvRunner, the teacher's demonstrations and the
scripted policies.

One env per episode; every turn, ONE policy call writes a segment for every active episode, ONE
``step_batch`` parses them and sends all of the turn's queries to the retriever together, and the
episodes that ended leave the batch. Episodes are scored at the end, all at once (``score_episodes``:
one evidence-judge call for all of them, R-Search). What varies is only who writes the segments: a
:class:`TurnPolicy` (``algos/rollouts/policies.py``: a model engine, the teacher, a scripted policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.search_env import JudgeReport, MultiTurnSearchEnv, score_episodes, step_batch


class TurnPolicy(Protocol):
    """Writes one segment for each running episode of a turn."""

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[Any]:
        """One action per env, in order: the segment's token ids, or ``{"token_ids", "logprobs"}``
        (what ``MultiTurnSearchEnv.submit`` takes). ``turn`` counts the loop's turns from 0."""
        ...


@dataclass
class EpisodeEnds:
    """How each episode ended (``terminated``/``truncated`` by env index), in which order the episodes
    finished (``order``: turn by turn, by env index within a turn) and what was asked of the judge."""

    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    judged: JudgeReport = field(default_factory=JudgeReport)


def roll_out(
    envs: Sequence[MultiTurnSearchEnv],
    records: Sequence[QARecord],
    policy: TurnPolicy,
    retriever: Retriever | None,
) -> EpisodeEnds:
    """Reset ``envs[i]`` to ``records[i]`` and run every episode to its end in lock step (see the module
    docstring); afterwards each env holds its finished, scored episode."""
    if len(envs) != len(records):
        raise ValueError(f"{len(envs)} envs for {len(records)} records")
    for env, record in zip(envs, records):
        env.reset(options={"record": record})
    ends: dict[int, tuple[bool, bool]] = {}
    active = list(range(len(envs)))
    turn = 0
    while active:
        running = [envs[i] for i in active]
        results = step_batch(running, policy.act(running, turn), retriever, score=False)
        for i, result in zip(active, results):
            if result.terminated or result.truncated:
                ends[i] = (result.terminated, result.truncated)
        active = [i for i in active if i not in ends]
        turn += 1
    judged = score_episodes(envs)
    return EpisodeEnds(
        terminated=[ends[i][0] for i in range(len(envs))],
        truncated=[ends[i][1] for i in range(len(envs))],
        order=list(ends),
        judged=judged,
    )
