"""Demonstrations for the warm start: teacher trajectories recorded as Rollout records.

The synthetic world's questions carry their chain of hops, so the teacher (``env/teacher.py``) writes
protocol-correct turns. They run through the rollout loop RL uses (``algos/rollout_loop.py``) with the
same envs and retriever: the teacher's text of each turn is tokenised once and becomes the turn's
"generated" token ids (the teacher is the sampler, ``ScriptedPolicy("teacher")``), and the env appends
real observations, so a demonstration has the very token layout and loss mask an RL episode has.
Log-probs are NaN (no sampler scored them); SFT does not use them.

``decision_weight`` up-weights the NLL of decision tokens: the first token where a demonstration's turn
departs from another turn the teacher writes for a question needing a different number of hops
(``TeacherPolicy.alternatives``: "." or ", then" at a stated plan, " Next" or "</think>" after a search
where no plan was stated). A
turn has a few hundred tokens of which one or two say whether to search again; under a plain mean NLL the
model learns those from the base rate of the demonstrations rather than from the question. Measured with
SmolLM2-135M, 12 steps, scoring the plan's "," against "." in the teacher's own words on 30 held-out
questions of each kind: plain NLL gave about the same chance of "," for 1-hop and 2-hop questions (0.83 /
0.98); weight 20 gave 0.14 / 1.00. In the main job's sampled first turns the model rewrites the query in
its own words, and there the separation did not hold (``tuned_examples/tiny_cpu_grpo.py`` has the runs).
``plan_weight`` weighs the plan's first decision token ("." or ",": whether it goes on) apart from the
others. Measured in the main job (lazy echo, 60 + 60 demonstrations, 12 steps, the others at 5): weight
15 took P(",") on held-out 2-hop questions to 0.89-0.98 for seeds 0 and 1 (0.42-0.70 at 5), and on 1-hop
ones to 0.28-0.33 (0.05-0.06). ``reading_weight`` weighs what each thought after a search reads from the
observations (the tokens of X in "The results say X"): with two passages an observation, a warm start's
2-hop episodes read the second hop's answer wrong about 4 times in 10 (they answer with a passage of the
first observation; ``docs/main_job.md``, stop 56), and those few tokens are what decides it. The weights
ride on the Rollout as ``nll_weights``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rllib_search.algos.policies import ScriptedPolicy
from rllib_search.algos.rollout import Rollout
from rllib_search.algos.rollout_loop import roll_out
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
    plan_weight: float | None = None,
    hesitate_by_kind: bool = False,
    reading_weight: float = 1.0,
) -> list[Rollout]:
    """One teacher episode per record (in order), as Rollouts with group id ``demo:<uid>``;
    ``state_plan``: the teacher's first thought names every hop; ``early_answer``: the fraction of the
    records' multi-hop questions it answers after the first hop (exactly round(p x n), chosen by uid and
    ``seed``; ``hesitate_by_kind``: spread over the kinds of question, see ``TeacherPolicy.hesitate_on``);
    ``lazy_plan``: its plan says so and ``echo_plan``: each thought after an observation
    restates the plan's next clause (see ``TeacherPolicy``); ``decision_weight``: the NLL weight of
    decision tokens (1: plain); ``plan_weight``: that of the first turn's first decision token instead,
    where a stated plan says whether it goes on ("." or ",") (None: ``decision_weight``);
    ``reading_weight``: that of the tokens each thought after a search reads (``reading_tokens``)."""
    protocol = MultiTurnSearchEnv(tokenizer, None, None, env_config).protocol
    teacher = TeacherPolicy(
        protocol, state_plan, early_answer, seed, lazy_plan=lazy_plan, echo_plan=echo_plan
    )
    teacher.hesitate_on(records, by_kind=hesitate_by_kind)
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
    if decision_weight != 1.0 or plan_weight is not None or reading_weight != 1.0:
        for rollout, record in zip(rollouts, records):
            positions = decision_tokens(rollout, record, teacher, tokenizer)
            rollout.nll_weights = rollout.loss_mask.astype(np.float32)
            rollout.nll_weights[reading_tokens(rollout, record, teacher, tokenizer)] = reading_weight
            rollout.nll_weights[positions] = decision_weight
            if plan_weight is not None:
                start, end = rollout.turn_spans[0]
                plan_fork = next((p for p in positions if start <= p < end), None)  # positions are sorted
                if plan_fork is not None:
                    rollout.nll_weights[plan_fork] = plan_weight
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


def reading_tokens(rollout: Rollout, record: QARecord, teacher: TeacherPolicy, tokenizer: Any) -> list[int]:
    """Positions in ``rollout.token_ids`` of what each turn after a search reads: the tokens of
    ``teacher.reading`` (the hop's answer) where they first appear in the turn, as " X" is tokenised (a word
    after a space starts a pre-token, so the turn's ids hold the same run). Raises ValueError where a turn
    lacks them (a teacher trajectory always has them)."""
    positions: list[int] = []
    for turn, (start, end) in enumerate(rollout.turn_spans):
        read = teacher.reading(record, turn)
        if read is None:
            continue
        ids = rollout.token_ids[start:end].tolist()
        entity = tokenizer(f" {read}", add_special_tokens=False)["input_ids"]
        at = next((k for k in range(len(ids) - len(entity) + 1) if ids[k : k + len(entity)] == entity), None)
        if at is None:
            raise ValueError(f"{rollout.uid}: turn {turn} does not read {read!r} in the teacher's words")
        positions.extend(range(start + at, start + at + len(entity)))
    return positions


def turns_over_budget(rollouts: Sequence[Rollout], max_turn_tokens: int) -> list[int]:
    """The token counts of demonstrated turns longer than ``max_turn_tokens``: turns a policy sampling
    under that budget can never write whole (the sampler cuts them, the env reads an invalid action).
    Measured on the embedded world with the lazy echo and SmolLM2's tokenizer: the teacher's search turn
    after a 2-hop question's first observation takes 49-60 tokens on 101 of 400 training questions."""
    return [
        end - start
        for rollout in rollouts
        for start, end in rollout.turn_spans
        if end - start > max_turn_tokens
    ]
