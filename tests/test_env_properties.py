"""Property-based and fuzz tests: whatever the model generates, the env ends in time, keeps observation
tokens out of the loss and raises nothing."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_search import MultiTurnSearchEnv, step_batch
from rllib_search.env.protocols import get_protocol, protocol_names
from tests.helpers import RECORDS

FRAGMENTS = [
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
    "<observation>",
    "</observation>",
    "<original_evidence>",
    "</original_evidence>",
    "<|begin_of_query|>",
    "<|end_of_query|>",
    "<|begin_of_documents|>",
    "<|end_of_documents|>",
    "Velmora",
    "Tarquin Oskaley",
    " ",
    "\n",
    "\x00",
    "\ufffd",
    "☃",
    "<",
    ">",
    "/",
    "x" * 200,
]

segment_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=30)), max_size=12).map("".join)


def _check_trajectory(env: MultiTurnSearchEnv, emitted: list[tuple[str, list[int]]]) -> None:
    assert env.trajectory.token_ids == [i for _, chunk in emitted for i in chunk]
    for span in env.trajectory.spans:
        expected = 1 if span.kind == "generated" else 0
        assert set(env.trajectory.loss_mask[span.start : span.end]) <= {expected}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    segments=st.lists(segment_text, min_size=1, max_size=10),
    protocol=st.sampled_from(["search_r1", "r1_searcher", "r_search"]),
    max_turns=st.integers(1, 4),
)
def test_any_generation_ends_within_max_turns_with_observations_masked(
    tiny_tokenizer, retriever, segments, protocol, max_turns
):
    env = MultiTurnSearchEnv(
        tiny_tokenizer, retriever, RECORDS, {"protocol": protocol, "max_turns": max_turns}
    )
    prompt, _ = env.reset(seed=0)
    emitted = [("prompt", list(prompt))]
    done = False
    steps = 0
    while not done:
        text = segments[steps % len(segments)]
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        obs, _, terminated, truncated, _ = env.step(ids)
        emitted += [("generated", list(ids)), ("observation", list(obs))]
        steps += 1
        done = terminated or truncated
        assert steps <= max_turns
    _check_trajectory(env, emitted)


def test_ten_thousand_random_and_malformed_generations_raise_nothing(tiny_tokenizer, retriever):
    rng = random.Random(0)
    vocab = len(tiny_tokenizer)
    envs = [
        MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS, {"protocol": name, "max_turns": 3})
        for name in protocol_names()
        for _ in range(4)
    ]
    emitted = {id(env): [("prompt", list(env.reset(seed=i)[0]))] for i, env in enumerate(envs)}
    generations = 0
    while generations < 10_000:
        actions = []
        for env in envs:
            protocol = get_protocol(env.protocol.name)
            kind = rng.random()
            if kind < 0.4:  # random token ids from the vocabulary
                ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
            else:  # malformed tag soup, odd bytes, empty or huge queries
                parts = rng.choices(FRAGMENTS, k=rng.randrange(0, 10))
                if kind > 0.9:
                    parts = [protocol.query_open, "q" * 10_000, protocol.query_close]
                ids = tiny_tokenizer("".join(parts), add_special_tokens=False)["input_ids"]
            actions.append(ids)
        for env, result, ids in zip(envs, step_batch(envs, actions), actions):
            generations += 1
            emitted[id(env)] += [("generated", ids), ("observation", list(result.observation))]
            if result.terminated or result.truncated:
                _check_trajectory(env, emitted[id(env)])
                emitted[id(env)] = [("prompt", list(env.reset()[0]))]
