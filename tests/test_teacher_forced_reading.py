"""Teacher-forced reading: the probability a model gives each hop's answer where the teacher reads it."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_search.algos.demonstrations import teacher_rollouts
from rllib_search.algos.teacher_forced_reading import reading_probabilities, summarize_readings
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import TeacherPolicy, hops_of
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm

CONFIG = SearchEnvConfig(protocol="search_r1_compact", max_turns=3, topk=2)
LAZY_ECHO = {"state_plan": True, "lazy_plan": True, "echo_plan": True}


@pytest.fixture(scope="module")
def reading_model(tmp_path_factory, smollm2_tokenizer):
    root = tmp_path_factory.mktemp("reading")
    smollm2_tokenizer.save_pretrained(root / "tok")
    model, _ = load_causal_lm(str(build_tiny_causal_lm(root / "lm", root / "tok", seed=2)))
    return model.eval()


def test_each_hop_is_read_where_the_teacher_reads_it_as_a_prefix_would_score_it(
    reading_model, smollm2_tokenizer, world, world_retriever
):
    """One row per turn after a search (1-hop: turn 1; 2-hop going on: turns 1 and 2), and each row's
    probability and greedy flag are those of feeding the trajectory up to each of the answer's tokens."""
    records = [r for r in world.test if len(hops_of(r)) == 1][:2] + [
        r for r in world.test if len(hops_of(r)) == 2
    ][:2]
    episodes = teacher_rollouts(smollm2_tokenizer, world_retriever, records, CONFIG, **LAZY_ECHO)
    protocol = MultiTurnSearchEnv(smollm2_tokenizer, None, None, CONFIG).protocol
    teacher = TeacherPolicy(protocol, **LAZY_ECHO)
    rows = reading_probabilities(reading_model, smollm2_tokenizer, episodes, records, teacher)
    assert [(r["hops"], r["turn"]) for r in rows] == [(1, 1), (1, 1), (2, 1), (2, 2), (2, 1), (2, 2)]
    row = iter(rows)
    for episode, record in zip(episodes, records):
        for turn, hop in enumerate(hops_of(record), start=1):
            start, end = episode.turn_spans[turn]
            ids = episode.token_ids[start:end].tolist()
            answer = smollm2_tokenizer(f" {hop['answer']}", add_special_tokens=False)["input_ids"]
            at = start + next(k for k in range(len(ids)) if ids[k : k + len(answer)] == answer)
            probability, greedy = 1.0, True
            for offset, token in enumerate(answer):
                with torch.no_grad():
                    logits = reading_model(torch.tensor([episode.token_ids[: at + offset].tolist()])).logits[
                        0, -1
                    ]
                probability *= float(torch.softmax(logits.float(), -1)[token])
                greedy &= int(logits.argmax()) == token
            got = next(row)
            assert math.isclose(got["probability"], probability, rel_tol=1e-3)
            assert got["greedy"] == greedy
    assert next(row, None) is None


def test_readings_are_summarised_per_hop_count_and_turn():
    rows = [
        {"hops": 2, "turn": 2, "probability": 0.2, "greedy": False},
        {"hops": 1, "turn": 1, "probability": 0.9, "greedy": True},
        {"hops": 2, "turn": 2, "probability": 0.6, "greedy": True},
    ]
    summary = summarize_readings(rows)
    assert list(summary) == ["1-hop turn 1", "2-hop turn 2"]
    assert summary["2-hop turn 2"] == {"mean": pytest.approx(0.4), "greedy_right": 1, "count": 2}
    assert summary["1-hop turn 1"] == {"mean": pytest.approx(0.9), "greedy_right": 1, "count": 1}
