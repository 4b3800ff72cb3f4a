"""The sampled-plan funnel: each plan kind read from the first turn, and the episodes counted per stage."""

from __future__ import annotations

from rllib_search.algos.demonstrations import teacher_rollouts
from rllib_search.algos.sampled_plans import (
    PLAN_KINDS,
    describe_funnel,
    hop_readings,
    plan_kind,
    sampled_funnel,
)
from rllib_search.env.protocols import get_protocol
from rllib_search.env.search_env import SearchEnvConfig
from rllib_search.env.teacher import hops_of
from rllib_search.serve.bm25 import BM25Retriever
from tests.helpers import ENV_SETTINGS


def test_the_plan_kinds_are_read_from_the_first_thought():
    need = "<think> I need to search for Taros founder"
    assert plan_kind(f"{need}. </think> <search> Taros founder </search>") == "stops"
    assert plan_kind(f"{need}, then answer. </think> <search> Taros founder </search>") == "hesitates"
    closed = f"{need}, then its country, then answer. </think> <search> Taros founder </search>"
    assert plan_kind(closed) == "goes_on_closed"
    assert plan_kind(f"{need}, then its country. </think> <search> Taros founder </search>") == "goes_on_open"
    assert plan_kind(f"{need}, then its alma mater. </think> <answer> then answer </answer>") == (
        "goes_on_open"  # what follows the thought is not the plan
    )
    assert plan_kind(f"{need}, then the city. </think>") == "other"


def test_a_hop_is_read_right_when_the_next_turn_names_its_answer():
    chain = [
        {"query": "Ulolisk Systems founder", "answer": "Lunnovik Korlisk"},
        {"query": "Lunnovik Korlisk birthplace", "answer": "Korador"},
    ]
    protocol = get_protocol("search_r1_compact")
    turns = [
        "<think> I need to search for Ulolisk Systems founder, then its birthplace, then answer. </think>\n"
        "<search> Ulolisk Systems founder </search>",
        "<think> The results say Lunnovik Korlisk, then its birthplace. </think>\n"
        "<search>  lunnovik korlisk BIRTHPLACE </search>",  # the teacher's query, spaced and cased otherwise
        "<think> The results say Nimkethar College, then answer. </think>\n"
        "<answer> Nimkethar College </answer>",
    ]
    assert hop_readings(turns, chain, protocol) == [(1, True), (2, False)]
    # A query in other words is not counted; the last turn has nothing after it to read with.
    other = [turns[0], "<think> x </think>\n<search> Korlisk born </search>", "<answer> Korador </answer>"]
    assert hop_readings(other, chain, protocol) == [(1, False)]
    assert hop_readings(turns[:1], chain, protocol) == []


def test_the_teachers_episodes_fall_where_their_plans_say(world, smollm2_tokenizer):
    """The lazy echo teacher's 1-hop episodes stop and are right, its 2-hop episodes that go on close their
    plan, search twice and are right, those that hesitate answer the first hop (wrong)."""
    questions = {h: [r for r in world.train + world.test if len(hops_of(r)) == h][:3] for h in (1, 2)}
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    retriever = BM25Retriever(world.passages)

    def teach(records, early):
        return teacher_rollouts(
            smollm2_tokenizer,
            retriever,
            records,
            config,
            state_plan=True,
            early_answer=early,
            lazy_plan=True,
            echo_plan=True,
        )

    rollouts = teach(questions[1], 0.0) + teach(questions[2], 0.0) + teach(questions[2][:1], 1.0)
    hops_by_uid = {r.uid: h for h in questions for r in questions[h]}
    chains_by_uid = {r.uid: hops_of(r) for h in questions for r in questions[h]}
    protocol = get_protocol(config.protocol)
    funnel = sampled_funnel(rollouts, smollm2_tokenizer, hops_by_uid, chains_by_uid, protocol)

    one, two = funnel[1], funnel[2]
    assert (one["episodes"], one["right"], one["searched_twice"]) == (3, 3, 0)
    assert one["plans"]["stops"] == {"episodes": 3, "searched_twice": 0, "right": 3}
    assert (two["episodes"], two["right"], two["searched_twice"]) == (4, 3, 3)
    assert two["plans"]["goes_on_closed"] == {"episodes": 3, "searched_twice": 3, "right": 3}
    assert two["plans"]["hesitates"] == {"episodes": 1, "searched_twice": 0, "right": 0}
    assert set(two["plans"]) == set(PLAN_KINDS)
    # The first 2-hop question has one right and one wrong sample: the one group with an advantage.
    assert (one["mixed_questions"], two["questions"], two["mixed_questions"]) == (0, 3, 1)
    # The teacher reads every hop it searched: the hesitating episode reads its first hop too.
    assert one["readings"] == {"1": {"asked": 3, "read": 3}}
    assert two["readings"] == {"1": {"asked": 4, "read": 4}, "2": {"asked": 3, "read": 3}}
    assert "readings" not in sampled_funnel(rollouts, smollm2_tokenizer, hops_by_uid)[2]
    line = describe_funnel(2, two)
    assert line.startswith("2-hop: 4 episodes, right 3, searched twice 3, partly right questions 1 of 3")
    assert "goes_on_closed 3 (3 twice, 3 right)" in line and "stops" not in line
    assert line.endswith("the teacher's queries read right: hop 1 4 of 4, hop 2 3 of 3")
