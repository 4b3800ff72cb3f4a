"""Demonstrations for the warm start: teacher trajectories recorded as Rollout records.

The synthetic world's questions carry their chain of hops, so the teacher (``env/teacher.py``) writes
protocol-correct turns. They run through the rollout loop RL uses (``algos/rollouts/loop.py``) with the
same envs and retriever: the teacher's text of each turn is tokenised once and becomes the turn's
"generated" token ids (the teacher is the sampler, ``ScriptedPolicy("teacher")``), and the env appends
real observations, so a demonstration has the very token layout and loss mask an RL episode has.
Log-probs are NaN (no sampler scored them); SFT does not use them.

``decision_weight`` up-weights the NLL of decision tokens: the first token where a demonstration's turn
departs from another turn the teacher writes for a question needing a different number of hops
(``TeacherPolicy.alternatives``: "." or ", then" at a stated plan, " Next" or "</think>" after a search
where no plan was stated). A turn has a few hundred tokens of which one or two say whether to search again;
under a plain mean NLL the model learns those from the base rate of the demonstrations rather than from the
question. The weights ride on the Rollout as ``nll_weights``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rllib_search.algos.rollouts.loop import roll_out
from rllib_search.algos.rollouts.policies import ScriptedPolicy
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import TeacherPolicy


def teacher_rollouts(
    tokenizer: Any,
    retriever: Retriever,
    records: Sequence[QARecord],
    env_config: SearchEnvConfig,
    batch_size: int = 32,
    state_plan: bool = False,
    early_answer: float = 0.0,
    seed: int = 0,
    lazy_plan: bool = False,
    decision_weight: float = 1.0,
    echo_plan: bool = False,
) -> list[Rollout]:
    """One teacher episode per record (in order), as Rollouts with group id ``demo:<uid>``;
    ``state_plan``: the teacher's first thought names every hop; ``early_answer``: the fraction of the
    records' multi-hop questions it answers after the first hop (exactly round(p x n), chosen by uid and
    ``seed``); ``lazy_plan``: its plan says so and ``echo_plan``: each thought after an observation
    restates the plan's next clause (see ``TeacherPolicy``); ``decision_weight``: the NLL weight of
    decision tokens (1: plain)."""
    protocol = MultiTurnSearchEnv(tokenizer, None, None, env_config).protocol
    teacher = TeacherPolicy(
        protocol, state_plan, early_answer, seed, lazy_plan=lazy_plan, echo_plan=echo_plan
    )
    teacher.fix_early_answers(records)
    policy = ScriptedPolicy("teacher", protocol, tokenizer, seed=seed, teacher=teacher)
    rollouts: list[Rollout] = []
    for offset in range(0, len(records), batch_size):
        batch = list(records[offset : offset + batch_size])
        envs = [MultiTurnSearchEnv(tokenizer, retriever, None, env_config) for _ in batch]
        ends = roll_out(envs, batch, policy, retriever)
        rollouts.extend(
            Rollout.from_env(env, f"demo:{record.uid}", 0, ends.terminated[i], ends.truncated[i])
            for i, (env, record) in enumerate(zip(envs, batch))
        )
    if decision_weight != 1.0:
        for rollout, record in zip(rollouts, records):
            rollout.nll_weights = rollout.loss_mask.astype(np.float32)
            rollout.nll_weights[decision_tokens(rollout, record, teacher, tokenizer)] = decision_weight
    return rollouts


def decision_tokens(rollout: Rollout, record: QARecord, teacher: TeacherPolicy, tokenizer: Any) -> list[int]:
    """Positions in ``rollout.token_ids`` of its decision tokens: in each turn, the first token where the
    turn's ids and those of one of ``teacher.alternatives`` differ (the alternatives are tokenised the way
    the teacher's turns were; the trajectory's own ids are read as they are)."""
    positions: set[int] = set()
    for turn, (start, end) in enumerate(rollout.turn_spans):
        ids = rollout.token_ids[start:end].tolist()
        for text in teacher.alternatives(record, turn):
            other = tokenizer(text, add_special_tokens=False)["input_ids"]
            first = next((k for k, (a, b) in enumerate(zip(ids, other)) if a != b), None)
            if first is not None:
                positions.add(start + first)
    return sorted(positions)


def turns_over_budget(rollouts: Sequence[Rollout], max_turn_tokens: int) -> list[int]:
    """The token counts of demonstrated turns longer than ``max_turn_tokens``: turns a policy sampling
    under that budget can never write whole (the sampler cuts them, the env reads an invalid action).
    On the embedded world with SmolLM2's tokenizer the teacher's longest turn takes 60 tokens."""
    return [
        end - start
        for rollout in rollouts
        for start, end in rollout.turn_spans
        if end - start > max_turn_tokens
    ]
