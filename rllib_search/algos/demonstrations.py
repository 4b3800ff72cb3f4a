"""Demonstrations for the warm start: teacher trajectories recorded as Rollout records.

The synthetic world's questions carry their chain of hops, so the teacher (``env/teacher.py``)
writes protocol-correct turns. They run through the same envs and retriever as RL: the teacher's text of
each turn is tokenised once and becomes the turn's "generated" token ids (the teacher is the sampler), and
the env appends real observations, so a demonstration has the very token layout and loss mask an RL
episode has. Log-probs are NaN (no sampler scored them); SFT does not use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllib_search.algos.rollout import Rollout
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig, step_batch
from rllib_search.env.teacher import TeacherPolicy


def teacher_rollouts(
    tokenizer: Any,
    retriever: Retriever,
    records: Sequence[QARecord],
    env_config: SearchEnvConfig,
    batch_size: int = 32,
) -> list[Rollout]:
    """One teacher episode per record (in order), as Rollouts with group id ``demo:<uid>``."""
    rollouts: list[Rollout] = []
    for offset in range(0, len(records), batch_size):
        batch = list(records[offset : offset + batch_size])
        envs = [MultiTurnSearchEnv(tokenizer, retriever, None, env_config) for _ in batch]
        teacher = TeacherPolicy(envs[0].protocol)
        for env, record in zip(envs, batch):
            env.reset(options={"record": record})
        finished: dict[int, Rollout] = {}
        active = list(range(len(envs)))
        while active:
            texts = [
                teacher.segment(envs[i].record, envs[i].stats["searches"], envs[i].retrieved_blocks)
                for i in active
            ]
            ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
            results = step_batch([envs[i] for i in active], ids, retriever)
            for i, result in zip(active, results):
                if result.terminated or result.truncated:
                    uid = envs[i].record.uid
                    finished[i] = Rollout.from_env(
                        envs[i], f"demo:{uid}", 0, result.terminated, result.truncated
                    )
            active = [i for i in active if i not in finished]
        rollouts.extend(finished[i] for i in range(len(envs)))
    return rollouts
