"""Rollout: one finished episode as the learner consumes it (the EnvRunner's output).

RLlib's ``SingleAgentEpisode`` stores one array per env step and cannot turn ragged token arrays into
numpy; an episode here is one token sequence with per-token annotations, so the runner returns this record
instead (documented in docs/architecture.md). Everything is plain numpy and Python: cheap to pickle
between actors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllib_search.env.rewards import exact_match
from rllib_search.env.search_env import MultiTurnSearchEnv


@dataclass
class Rollout:
    """One episode: ``token_ids`` (prompt + response) with ``loss_mask`` (1 on generated tokens),
    ``logprobs`` (the sampler's, NaN off generated tokens), ``turn_spans`` ((start, end) of each generated
    segment), the reward and its components, the GRPO ``group_id`` (unique across datasets and draws) and
    the ``weights_version`` of the policy that sampled it. ``evidence_answer`` is what the evidence judge
    answered from the episode's evidence (R-Search), ``reward_notes`` why a reward term is 0,
    ``format_valid`` whether the response followed the protocol's format, ``nll_weights`` (demonstrations
    only; None means 1 everywhere) a weight per token on its NLL term in SFT and PPO-ptx."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    prompt_length: int
    turn_spans: list[tuple[int, int]]
    reward: float
    reward_components: dict[str, float]
    group_id: str
    uid: str
    data_source: str
    weights_version: int
    terminated: bool
    truncated: bool
    answer: str | None
    golden_answers: list[str]
    stats: dict[str, int] = field(default_factory=dict)
    evidence_answer: str | None = None
    reward_notes: dict[str, str] = field(default_factory=dict)
    format_valid: bool = False
    nll_weights: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_generated_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @classmethod
    def from_env(
        cls, env: MultiTurnSearchEnv, group_id: str, weights_version: int, terminated: bool, truncated: bool
    ) -> Rollout:
        """Freeze a finished env's trajectory into a Rollout."""
        trajectory, record = env.trajectory, env.record
        if record is None or env.reward_breakdown is None:
            raise ValueError("the env has no finished episode")
        return cls(
            token_ids=np.asarray(trajectory.token_ids, dtype=np.int64),
            loss_mask=np.asarray(trajectory.loss_mask, dtype=np.int8),
            logprobs=np.asarray(trajectory.logprobs, dtype=np.float32),
            prompt_length=trajectory.prompt_length,
            turn_spans=trajectory.turn_spans,
            reward=float(env.reward_breakdown.total),
            reward_components=dict(env.reward_breakdown.components),
            group_id=group_id,
            uid=record.uid,
            data_source=record.data_source,
            weights_version=weights_version,
            terminated=terminated,
            truncated=truncated,
            answer=env.answer,
            golden_answers=list(record.golden_answers),
            stats={"turns": env.turns, **env.stats},
            evidence_answer=env.evidence_answer,
            reward_notes=dict(env.reward_breakdown.notes),
            format_valid=env.response_summary.format_valid,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()}


def correct_logprob_mean(rollouts: Any) -> float | None:
    """The mean log-probability the sampling policy gave each generated token of the episodes whose answer
    is an exact match (per episode, then over episodes); None when no episode answered correctly."""
    means = [
        float(np.mean(r.logprobs[r.loss_mask.astype(bool)]))
        for r in rollouts
        if r.answer is not None and r.num_generated_tokens and exact_match(r.answer, r.golden_answers)
    ]
    return float(np.mean(means)) if means else None
