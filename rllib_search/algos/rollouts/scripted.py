"""Batched rollouts of scripted policies through MultiTurnSearchEnv, with per-protocol reward summaries.

A scripted policy (``algos/rollouts/policies.py``: ``teacher``, ``noisy_teacher``, ``no_search``) writes each
turn's text; its token ids are what the "sampler" produced. The episodes run through the same loop as a
model's rollout (``algos/rollouts/loop.py``: one retriever call per turn for the whole batch), so this
exercises the env, the protocols, the rewards and the retriever before any model is trained.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from rllib_search.algos.rollouts.loop import roll_out
from rllib_search.algos.rollouts.policies import ScriptedPolicy
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.rewards import exact_match, retrieval_hit, token_f1
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig


@dataclass
class RolloutSummary:
    """Means over the episodes of one (protocol, policy) pair."""

    protocol: str
    policy: str
    episodes: int
    reward: float
    exact_match: float
    f1: float
    searches: float
    invalid_actions: float
    format_valid: float
    retrieval_hit: float
    truncated: float
    generated_tokens: float
    observation_tokens: float
    seconds: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


def run_scripted_rollouts(
    tokenizer: Any,
    retriever: Retriever,
    records: Sequence[QARecord],
    env_config: SearchEnvConfig,
    policy: str,
    num_episodes: int,
    batch_size: int = 16,
    seed: int = 0,
    examples: list[str] | None = None,
) -> RolloutSummary:
    """Run ``num_episodes`` episodes of ``policy`` in batches; keep an example response in ``examples``."""
    rng = random.Random(seed)
    chosen = [records[rng.randrange(len(records))] for _ in range(num_episodes)]
    guesses = sorted({answer for r in records for answer in r.golden_answers[:1]})
    envs = [
        MultiTurnSearchEnv(tokenizer, retriever, None, env_config)
        for _ in range(min(batch_size, num_episodes))
    ]
    scripted = ScriptedPolicy(policy, envs[0].protocol, tokenizer, guesses, seed)
    totals: dict[str, float] = {}
    started = time.perf_counter()
    progress = tqdm(total=num_episodes, desc=f"{env_config.protocol}/{policy}", unit="ep", leave=False)
    for offset in range(0, num_episodes, len(envs)):
        batch = chosen[offset : offset + len(envs)]
        ends = roll_out(envs[: len(batch)], batch, scripted, retriever)
        for i in ends.order:  # in the order the episodes finished
            env = envs[i]
            _accumulate(totals, env, env.reward_breakdown.total, ends.truncated[i])
            # Show one episode, and for the noisy teacher one that needed a rethink.
            wanted = policy != "noisy_teacher" or env.stats["invalid_actions"] > 0
            if examples is not None and not examples and wanted:
                examples.append(env.trajectory.response_text())
        progress.update(len(batch))
    progress.close()
    n = max(1, num_episodes)
    means = {key: value / n for key, value in totals.items()}
    return RolloutSummary(
        protocol=envs[0].protocol.name,
        policy=policy,
        episodes=num_episodes,
        seconds=time.perf_counter() - started,
        **means,
    )


def _accumulate(totals: dict[str, float], env: MultiTurnSearchEnv, reward: float, truncated: bool) -> None:
    golds = env.record.golden_answers if env.record else []
    summary = env.summary()
    values = {
        "reward": reward,
        "exact_match": exact_match(env.answer, golds),
        "f1": token_f1(env.answer, golds),
        "searches": env.stats["searches"],
        "invalid_actions": env.stats["invalid_actions"],
        "format_valid": float(summary.format_valid),
        "retrieval_hit": float(retrieval_hit(env.retrieved_blocks, golds)),
        "truncated": float(truncated),
        "generated_tokens": env.trajectory.num_generated_tokens,
        "observation_tokens": env.trajectory.num_observation_tokens,
    }
    for key, value in values.items():
        totals[key] = totals.get(key, 0.0) + float(value)
