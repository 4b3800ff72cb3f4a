"""Plan forks: one forward pass reads both forks, at the tokens where the teacher's plans part."""

from __future__ import annotations

import pytest
import torch

from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import TeacherPolicy, hops_of
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm
from rllib_search.recipes.tiny_cpu.plan_forks import (
    FORKS,
    ForkWindow,
    batch_fork_probabilities,
    fork_contexts,
    fork_probabilities,
    mean_forks,
)


@pytest.fixture(scope="module")
def questions(world):
    records = world.test
    return {h: [r for r in records if len(hops_of(r)) == h][:3] for h in (1, 2)}


def test_the_contexts_end_where_the_teachers_plans_part(smollm2_tokenizer, questions):
    env = MultiTurnSearchEnv(smollm2_tokenizer, None, None, SearchEnvConfig(protocol="search_r1_compact"))
    lazy = TeacherPolicy(env.protocol, state_plan=True, lazy_plan=True)
    for hops, records in questions.items():
        for record, context in zip(records, fork_contexts(records, env, smollm2_tokenizer), strict=True):
            assert context.prompt_ids == env.render_prompt(record.question)[1]
            plan = smollm2_tokenizer.decode(context.plan_ids)
            assert plan.endswith(f"I need to search for {hops_of(record)[0]['query']}")
            # The lazy teacher's own plan goes on with "." (1 hop) or ", then" (2 hops) right there.
            rest = lazy.segment(record, 0, [])[len(plan) :]
            assert rest.startswith("." if hops == 1 else ", then")
            assert smollm2_tokenizer.decode(context.then_ids) == ", then"


def test_one_forward_pass_reads_both_forks_as_two_would(tmp_path, smollm2_tokenizer, questions):
    smollm2_tokenizer.save_pretrained(tmp_path / "tok")
    model, _ = load_causal_lm(str(build_tiny_causal_lm(tmp_path / "lm", tmp_path / "tok", seed=1)))
    model.eval()
    env = MultiTurnSearchEnv(smollm2_tokenizer, None, None, SearchEnvConfig(protocol="search_r1_compact"))

    def first_id(text):
        return smollm2_tokenizer(text, add_special_tokens=False)["input_ids"][0]

    def two_passes(context):  # each fork's context fed alone, the way plan_forks.py read it before
        result = {}
        for fork, ids in (
            ("goes_on", context.prompt_ids + context.plan_ids),
            ("its", context.prompt_ids + context.plan_ids + context.then_ids),
        ):
            with torch.no_grad():
                probs = torch.softmax(model(torch.tensor([ids])).logits[0, -1], -1)
            chosen, other = (first_id(text) for text in FORKS[fork])
            result[fork] = float(probs[chosen] / (probs[chosen] + probs[other]))
        return result

    contexts = {h: fork_contexts(records, env, smollm2_tokenizer) for h, records in questions.items()}
    for rows in contexts.values():
        for context in rows:
            one = fork_probabilities(model, smollm2_tokenizer, context)
            assert one == pytest.approx(two_passes(context), abs=1e-5)
            assert all(0.0 < p < 1.0 for p in one.values())
    # Padded batches of contexts of different lengths read what each context reads alone.
    every = [c for rows in contexts.values() for c in rows]
    assert len({len(c.prompt_ids + c.plan_ids) for c in every}) > 1
    batched = batch_fork_probabilities(model, smollm2_tokenizer, every, batch_size=4)
    for context, row in zip(every, batched, strict=True):
        assert row == pytest.approx(fork_probabilities(model, smollm2_tokenizer, context), abs=1e-4)

    model.train()
    means = mean_forks(model, smollm2_tokenizer, contexts)
    assert model.training  # left as it was
    for hops, rows in contexts.items():
        singles = [fork_probabilities(model, smollm2_tokenizer, c) for c in rows]
        for fork in FORKS:
            assert means[hops][fork] == pytest.approx(sum(s[fork] for s in singles) / len(singles), abs=1e-5)


def test_the_window_holds_the_kinds_apart_and_the_second_fork_open():
    window = ForkWindow()
    inside = {1: {"goes_on": 0.07, "its": 0.40}, 2: {"goes_on": 0.59, "its": 0.44}}
    assert window.contains(inside)
    assert not window.contains({**inside, 1: {"goes_on": 0.40, "its": 0.4}})  # 1-hop plans go on
    assert not window.contains({**inside, 2: {"goes_on": 0.42, "its": 0.44}})  # 2-hop plans stop
    assert not window.contains({**inside, 2: {"goes_on": 0.9, "its": 0.93}})  # already searches twice
    assert not window.contains({**inside, 2: {"goes_on": 0.9, "its": 0.05}})  # RL would sample no 2nd hop
    assert ForkWindow(its=(0.0, 1.0)).contains({**inside, 2: {"goes_on": 0.9, "its": 0.93}})
