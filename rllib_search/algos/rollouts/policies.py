"""Who writes a turn's segments in :func:`~rllib_search.algos.rollouts.loop.roll_out`: the policy kinds.

- :class:`EnginePolicy`: a model behind an engine of ``llm/engines`` (the EnvRunner's policy): ONE
  ``generate`` call for all running episodes, their token ids as prefixes, each row capped at
  ``min(max_new_tokens, env.remaining_tokens)``; the sampled ids and log-probs are the actions.
- :class:`ScriptedPolicy`: text written by a script, tokenised once into the turn's ids (the script is
  the sampler; log-probs unknown): ``teacher`` (searches once per hop of the question's chain, then
  answers; the warm start's demonstrations), ``noisy_teacher`` (the teacher, with 30% of its turns
  malformed), ``no_search`` (answers at once with a guess: another question's answer).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rllib_search.env.protocols import Protocol
from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.env.teacher import TeacherPolicy
from rllib_search.llm.engines import Engine, SamplingParams


class EnginePolicy:
    """A model engine's turns. ``turn_seed(turn)`` gives each turn's sampling seed (None: the
    ``sampling`` seed as it is); ``later_turns`` = (first turn, temperature) samples that turn and every
    later one at that temperature (the turns a loss does not credit; see ``rollouts(execution_temperature)``).
    Counts what it generated: ``generated_tokens``, ``generate_seconds``."""

    def __init__(
        self,
        engine: Engine,
        sampling: SamplingParams,
        turn_seed: Callable[[int], int] | None = None,
        later_turns: tuple[int, float] | None = None,
    ) -> None:
        self.engine = engine
        self.sampling = sampling
        self.turn_seed = turn_seed
        self.later_turns = later_turns
        self.generated_tokens = 0
        self.generate_seconds = 0.0

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[dict[str, list]]:
        prefixes = [env.trajectory.token_ids for env in envs]
        limits = [min(self.sampling.max_new_tokens, env.remaining_tokens) for env in envs]
        params = self.sampling
        if self.turn_seed is not None:
            params = replace(params, seed=self.turn_seed(turn))
        if self.later_turns is not None and turn >= self.later_turns[0]:
            params = replace(params, temperature=self.later_turns[1])
        started = time.perf_counter()
        segments = self.engine.generate(prefixes, params, limits)
        self.generate_seconds += time.perf_counter() - started
        self.generated_tokens += sum(len(s.token_ids) for s in segments)
        return [{"token_ids": s.token_ids, "logprobs": s.logprobs} for s in segments]


SCRIPTED_POLICIES = ("teacher", "noisy_teacher", "no_search")

_MALFORMED = (
    "{qo} unclosed query",
    "{qo} a {qo} nested {qc}",
    "{qc} misordered {qo}",
    "{qo}   {qc}",
    "I am not sure what to do next.",
    "{ao}",
)


class ScriptedPolicy:
    """A scripted policy's turns (see the module docstring). ``guesses`` are ``no_search``'s answers;
    ``seed`` seeds its choices and the noisy teacher's; ``teacher`` writes the (noisy) teacher's turns
    (default: a :class:`~rllib_search.env.teacher.TeacherPolicy` that searches once per hop)."""

    def __init__(
        self,
        name: str,
        protocol: Protocol,
        tokenizer: Any,
        guesses: Sequence[str] = (),
        seed: int = 0,
        teacher: TeacherPolicy | None = None,
    ) -> None:
        if name not in SCRIPTED_POLICIES:
            raise ValueError(f"unknown policy {name!r}; known: {SCRIPTED_POLICIES}")
        self.name = name
        self.protocol = protocol
        self.tokenizer = tokenizer
        self.teacher = teacher or TeacherPolicy(protocol, seed=seed)
        self.guesses = list(guesses)
        self.rng = random.Random(seed)

    def act(self, envs: Sequence[MultiTurnSearchEnv], turn: int) -> list[list[int]]:
        texts = [self.segment(env) for env in envs]
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]

    def segment(self, env: MultiTurnSearchEnv) -> str:
        """The text of the next segment of ``env``'s episode."""
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
