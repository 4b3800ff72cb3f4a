"""Demonstrations for the warm start: teacher trajectories recorded as Rollout records.

The synthetic world's questions carry their chain of hops, so the teacher (``env/teacher.py``) writes
protocol-correct turns. They run through the rollout loop RL uses (``algos/rollout_loop.py``) with the
same envs and retriever: the teacher's text of each turn is tokenised once and becomes the turn's
"generated" token ids (the teacher is the sampler, ``ScriptedPolicy("teacher")``), and the env appends
real observations, so a demonstration has the very token layout and loss mask an RL episode has.
Log-probs are NaN (no sampler scored them); SFT does not use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllib_search.algos.policies import ScriptedPolicy
from rllib_search.algos.rollout import Rollout
from rllib_search.algos.rollout_loop import roll_out
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig


def teacher_rollouts(
    tokenizer: Any,
    retriever: Retriever,
    records: Sequence[QARecord],
    env_config: SearchEnvConfig,
    batch_size: int = 32,
    state_plan: bool = False,
    early_answer: float = 0.0,
    seed: int = 0,
) -> list[Rollout]:
    """One teacher episode per record (in order), as Rollouts with group id ``demo:<uid>``;
    ``state_plan``: the teacher's first thought names every hop; ``early_answer``: the fraction of
    multi-hop questions it answers after the first hop (chosen by uid and ``seed``; see ``TeacherPolicy``)."""
    rollouts: list[Rollout] = []
    for offset in range(0, len(records), batch_size):
        batch = list(records[offset : offset + batch_size])
        envs = [MultiTurnSearchEnv(tokenizer, retriever, None, env_config) for _ in batch]
        teacher = ScriptedPolicy(
            "teacher",
            envs[0].protocol,
            tokenizer,
            seed=seed,
            state_plan=state_plan,
            early_answer=early_answer,
        )
        ends = roll_out(envs, batch, teacher, retriever)
        rollouts.extend(
            Rollout.from_env(env, f"demo:{record.uid}", 0, ends.terminated[i], ends.truncated[i])
            for i, (env, record) in enumerate(zip(envs, batch))
        )
    return rollouts
