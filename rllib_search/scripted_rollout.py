"""Batched rollouts of scripted policies through MultiTurnSearchEnv, with per-protocol reward summaries.

A scripted policy writes each turn's text; its token ids are what the "sampler" produced. This exercises
the env, the protocols, the rewards and the retriever exactly as a model's rollout does (one retriever
call per turn for the whole batch), before any model is trained. Policies:

- ``teacher``: searches once per hop of the question's chain, then answers (see ``env/teacher.py``);
- ``noisy_teacher``: the teacher, but 30% of its turns are malformed (unclosed, nested or missing tags);
- ``no_search``: answers at once with a guess (another question's answer), never searching.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Retriever
from rllib_search.env.rewards import exact_match, retrieval_hit, token_f1
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig, step_batch
from rllib_search.env.teacher import TeacherPolicy

POLICIES = ("teacher", "noisy_teacher", "no_search")

_MALFORMED = (
    "{qo} unclosed query",
    "{qo} a {qo} nested {qc}",
    "{qc} misordered {qo}",
    "{qo}   {qc}",
    "I am not sure what to do next.",
    "{ao}",
)


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


class ScriptedPolicy:
    """Produces the next segment's text for an env mid-episode."""

    def __init__(self, name: str, env_protocol, guesses: Sequence[str], seed: int) -> None:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; known: {POLICIES}")
        self.name = name
        self.protocol = env_protocol
        self.teacher = TeacherPolicy(env_protocol)
        self.guesses = list(guesses)
        self.rng = random.Random(seed)

    def segment(self, env: MultiTurnSearchEnv) -> str:
        record = env.record
        assert record is not None
        if self.name == "no_search":
            guess = self.rng.choice(self.guesses)
            return self.protocol.render_answer(guess, thought="I think I know this.")
        if self.name == "noisy_teacher" and self.rng.random() < 0.3:
            template = self.rng.choice(_MALFORMED)
            return template.format(
                qo=self.protocol.query_open, qc=self.protocol.query_close, ao=self.protocol.answer_open
            )
        # The teacher moves to the next hop only once the previous search was answered.
        return self.teacher.segment(record, env.stats["searches"], env.retrieved_blocks)


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
    scripted = ScriptedPolicy(policy, envs[0].protocol, guesses, seed)
    totals: dict[str, float] = {}
    started = time.perf_counter()
    progress = tqdm(total=num_episodes, desc=f"{env_config.protocol}/{policy}", unit="ep", leave=False)
    for offset in range(0, num_episodes, len(envs)):
        batch = chosen[offset : offset + len(envs)]
        active = envs[: len(batch)]
        for env, record in zip(active, batch):
            env.reset(options={"record": record})
        while active:
            texts = [scripted.segment(env) for env in active]
            ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
            results = step_batch(active, ids, retriever)
            for env, result in zip(active, results):
                if result.terminated or result.truncated:
                    _accumulate(totals, env, result.reward, result.truncated)
                    # Show one episode, and for the noisy teacher one that needed a rethink.
                    wanted = policy != "noisy_teacher" or env.stats["invalid_actions"] > 0
                    if examples is not None and not examples and wanted:
                        examples.append(env.trajectory.response_text())
                    progress.update(1)
            active = [env for env in active if not env.done]
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
