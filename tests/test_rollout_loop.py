"""The shared rollout loop, its scripted policies and the shuffled-position sampler."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search.algos.rollouts.demonstrations import teacher_rollouts, turns_over_budget
from rllib_search.algos.rollouts.loop import roll_out
from rllib_search.algos.rollouts.policies import ScriptedPolicy
from rllib_search.algos.rollouts.sampler import ShuffledSampler
from rllib_search.algos.rollouts.scripted import run_scripted_rollouts
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import TeacherPolicy, hops_of


# --- ShuffledSampler ----------------------------------------------------------------------------------------
def test_every_epoch_is_a_fresh_permutation_of_all_indices():
    sampler = ShuffledSampler(7, np.random.default_rng(0))
    drawn = sampler.take(21)
    epochs = [drawn[0:7], drawn[7:14], drawn[14:21]]
    assert all(sorted(epoch) == list(range(7)) for epoch in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # reshuffled, not replayed
    assert sampler.epoch == 2 and sampler.position == 7


def test_a_restored_sampler_draws_what_the_original_would_have():
    original = ShuffledSampler(5, np.random.default_rng(1))
    original.take(3)
    state = original.get_state()
    restored = ShuffledSampler(5, np.random.default_rng(99))  # another seed: the state must win
    restored.set_state(state)
    assert restored.take(12) == original.take(12)
    assert restored.epoch == original.epoch


def test_restart_draws_from_the_new_size():
    sampler = ShuffledSampler(3, np.random.default_rng(0))
    sampler.take(2)
    sampler.restart(10)
    assert sorted(sampler.take(10)) == list(range(10))


# --- the loop with scripted policies ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["search_r1", "r1_searcher", "r_search"])
def test_teacher_demonstrations_carry_the_teachers_ids_once_tokenised(
    smollm2_tokenizer, world, world_retriever, protocol
):
    config = SearchEnvConfig(protocol=protocol, max_turns=4)
    records = world.train[:10]
    demos = teacher_rollouts(smollm2_tokenizer, world_retriever, records, config, batch_size=4)
    assert [d.group_id for d in demos] == [f"demo:{r.uid}" for r in records]
    teacher = TeacherPolicy(MultiTurnSearchEnv(smollm2_tokenizer, None, None, config).protocol)
    for demo, record in zip(demos, records):
        hops = len(hops_of(record))
        assert demo.terminated and not demo.truncated and demo.stats["searches"] == hops
        assert len(demo.turn_spans) == hops + 1  # a search per hop, then the answer
        ids = demo.token_ids.tolist()
        # Each search turn is the teacher's text tokenised once: those ids, unchanged, are the turn.
        for turn, (start, end) in enumerate(demo.turn_spans[:-1]):
            text = teacher.segment(record, turn, [])
            assert ids[start:end] == smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert demo.loss_mask.sum() == sum(end - start for start, end in demo.turn_spans)
        assert np.isnan(demo.logprobs).all()  # no sampler scored the teacher's tokens
    assert np.mean([d.answer == r.golden_answers[0] for d, r in zip(demos, records)]) == 1.0


def test_a_teacher_that_states_its_plan_names_every_hop_first_and_still_answers(
    smollm2_tokenizer, world, world_retriever
):
    config = SearchEnvConfig(protocol="search_r1", max_turns=4)
    records = [r for r in world.train if len(hops_of(r)) == 2][:3] + [
        r for r in world.train if len(hops_of(r)) == 1
    ][:3]
    plain = teacher_rollouts(smollm2_tokenizer, world_retriever, records, config)
    planned = teacher_rollouts(smollm2_tokenizer, world_retriever, records, config, state_plan=True)
    for record, without, with_plan in zip(records, plain, planned):
        hops = hops_of(record)
        first = smollm2_tokenizer.decode(with_plan.token_ids[slice(*with_plan.turn_spans[0])].tolist())
        if len(hops) == 2:
            relation = hops[1]["query"].removeprefix(hops[0]["answer"]).strip()
            assert f"I need to search for {hops[0]['query']}, then its {relation}." in first
            assert hops[0]["answer"] not in first  # the plan cannot know what hop 1 will find
        else:
            assert f"I need to search for {hops[0]['query']}." in first
            assert with_plan.token_ids.tolist() == without.token_ids.tolist()
        assert with_plan.answer == record.golden_answers[0]
        assert with_plan.stats["searches"] == len(hops)


def test_a_hesitant_teacher_answers_some_multi_hop_questions_after_the_first_hop(
    smollm2_tokenizer, world, world_retriever
):
    config = SearchEnvConfig(protocol="search_r1", max_turns=4)
    multi = [r for r in world.train if len(hops_of(r)) >= 2][:40]
    single = [r for r in world.train if len(hops_of(r)) == 1][:10]
    demos = teacher_rollouts(
        smollm2_tokenizer, world_retriever, multi + single, config, early_answer=0.5, seed=3
    )
    early = [d for d, r in zip(demos, multi) if d.stats["searches"] == 1]
    assert len(multi) >= 10 and len(early) == round(len(multi) / 2)  # exactly half (a hash decides which)
    for demo, record in zip(demos, multi):
        hops = hops_of(record)
        if demo.stats["searches"] == 1:  # stopped early: answers with what its one search found
            assert demo.answer == hops[0]["answer"] != record.golden_answers[0]
        else:
            assert demo.stats["searches"] == len(hops) and demo.answer == record.golden_answers[0]
    for demo, record in zip(demos[len(multi) :], single):  # 1-hop questions are never cut short
        assert demo.stats["searches"] == 1 and demo.answer == record.golden_answers[0]
    again = teacher_rollouts(smollm2_tokenizer, world_retriever, multi, config, early_answer=0.5, seed=3)
    assert [d.token_ids.tolist() for d in again] == [d.token_ids.tolist() for d in demos[: len(multi)]]
    other_seed = teacher_rollouts(smollm2_tokenizer, world_retriever, multi, config, early_answer=0.5, seed=4)
    assert [d.stats["searches"] for d in other_seed] != [d.stats["searches"] for d in demos[: len(multi)]]
    assert sum(d.stats["searches"] == 1 for d in other_seed) == len(early)
    draws = {}  # each question drawn alone, or with fix_early_answers exactly round(p x n) answer early
    for seed in range(8):
        teacher = TeacherPolicy(None, early_answer=0.3, seed=seed)
        independent = sum(teacher.answers_early(r) for r in multi)
        teacher.fix_early_answers(multi + single)
        draws[seed] = (independent, sum(teacher.answers_early(r) for r in multi))
    assert {fixed for _, fixed in draws.values()} == {round(0.3 * len(multi))}
    assert len({independent for independent, _ in draws.values()}) > 1
    with pytest.raises(ValueError, match="early_answer"):
        TeacherPolicy(MultiTurnSearchEnv(smollm2_tokenizer, None, None, config).protocol, early_answer=1.5)


def planned_demonstrations(tokenizer, world, retriever, config, **teacher):
    """12 two-hop then 4 one-hop training questions and a stated-plan teacher's episodes on them, half the
    two-hop ones answered early."""
    records = [r for r in world.train if len(hops_of(r)) == 2][:12]
    records += [r for r in world.train if len(hops_of(r)) == 1][:4]
    demos = teacher_rollouts(
        tokenizer, retriever, records, config, state_plan=True, early_answer=0.5, **teacher
    )
    return records, demos


def test_a_lazy_plan_says_where_it_stops_and_decision_tokens_are_where_plans_part(
    smollm2_tokenizer, world, world_retriever
):
    """The lazy plan: ", then answer." on the multi-hop questions the teacher answers early, the full plan on
    the others, "." on 1-hop ones. The decision tokens are where those plans part ("." or ",", then " its"
    or " answer"); with a stated plan, later turns carry it out and have none."""
    config = SearchEnvConfig(protocol="search_r1", max_turns=3)
    records, demos = planned_demonstrations(
        smollm2_tokenizer, world, world_retriever, config, lazy_plan=True, decision_weight=20.0
    )
    multi = [r for r in records if len(hops_of(r)) == 2]
    kinds = set()
    for demo, record in zip(demos, records):
        hops = hops_of(record)
        ids = demo.token_ids.tolist()
        plan = smollm2_tokenizer.decode(ids[slice(*demo.turn_spans[0])])
        decisions = np.flatnonzero(demo.nll_weights == 20.0)
        assert set(np.flatnonzero(demo.nll_weights == 1.0)) == set(np.flatnonzero(demo.loss_mask)) - set(
            decisions
        )
        assert np.all(demo.nll_weights[demo.loss_mask == 0] == 0)
        assert all(demo.turn_spans[0][0] <= p < demo.turn_spans[0][1] for p in decisions)
        chosen = [smollm2_tokenizer.decode(ids[p : p + 1]) for p in decisions]
        if len(hops) == 1:
            kinds.add("one hop")
            assert f"for {hops[0]['query']}." in plan and chosen == ["."]
        elif demo.stats["searches"] == 1:
            kinds.add("lazy")
            assert f"for {hops[0]['query']}, then answer." in plan and chosen == [",", " answer"]
            assert demo.answer == hops[0]["answer"]
        else:
            kinds.add("full")
            assert ", then its " in plan and chosen == [",", " its"]
            assert demo.answer == record.golden_answers[0]
    assert kinds == {"one hop", "lazy", "full"}
    plain = teacher_rollouts(smollm2_tokenizer, world_retriever, multi[:2], config, state_plan=True)
    assert all(d.nll_weights is None for d in plain)  # weight 1: no weights at all
    with pytest.raises(ValueError, match="state_plan"):
        TeacherPolicy(MultiTurnSearchEnv(smollm2_tokenizer, None, None, config).protocol, lazy_plan=True)


def turn_texts_and_decisions(tokenizer, demo, weight):
    """A demonstration's turns as text, and its decision tokens (NLL weight ``weight``) in order."""
    ids = demo.token_ids.tolist()
    turns = [tokenizer.decode(ids[slice(*span)]) for span in demo.turn_spans]
    return turns, [tokenizer.decode(ids[p : p + 1]) for p in np.flatnonzero(demo.nll_weights == weight)]


def test_an_echoed_plan_is_restated_after_each_search_and_its_copies_are_decisions(
    smollm2_tokenizer, world, world_retriever
):
    """With echo_plan every plan ends with ", then answer" and each thought after a search restates the plan's
    next clause, so what the teacher does after a search is the plan's word after "then": " its" and another
    search, or " answer" and the answer. Those words are its decision tokens, at the plan and at each echo."""
    config = SearchEnvConfig(protocol="search_r1_compact", max_turns=3)
    records, demos = planned_demonstrations(
        smollm2_tokenizer, world, world_retriever, config, echo_plan=True, decision_weight=5.0
    )
    kinds = set()
    for demo, record in zip(demos, records):
        hops = hops_of(record)
        turns, chosen = turn_texts_and_decisions(smollm2_tokenizer, demo, weight=5.0)
        if demo.stats["searches"] == 1:  # one hop, or a two-hop question answered early
            kinds.add("one search")
            assert f"for {hops[0]['query']}, then answer." in turns[0]
            assert f"The results say {hops[0]['answer']}, then answer." in turns[1]
            assert chosen == [" answer", " answer"] and demo.answer == hops[0]["answer"]
        else:
            kinds.add("two searches")
            relation = hops[1]["query"][len(hops[0]["answer"]) :].strip()
            assert f"for {hops[0]['query']}, then its {relation}, then answer." in turns[0]
            assert f"The results say {hops[0]['answer']}, then its {relation}. Next I need" in turns[1]
            assert f"The results say {hops[1]['answer']}, then answer." in turns[2]
            assert chosen == [" its", " its", " answer"] and demo.answer == record.golden_answers[0]
    assert kinds == {"one search", "two searches"}
    protocol = MultiTurnSearchEnv(smollm2_tokenizer, None, None, config).protocol
    with pytest.raises(ValueError, match="state_plan"):
        TeacherPolicy(protocol, echo_plan=True)


def test_a_lazy_echo_parts_one_hop_plans_at_the_stop_and_multi_hop_plans_at_its(
    smollm2_tokenizer, world, world_retriever
):
    """echo_plan with lazy_plan: a one-hop plan ends after its query ("." is its decision token), multi-hop
    plans go on (",") and part at " its" or " answer", and every thought after a search restates the plan's
    next clause, the one-hop one none."""
    config = SearchEnvConfig(protocol="search_r1_compact", max_turns=3)
    records, demos = planned_demonstrations(
        smollm2_tokenizer, world, world_retriever, config, echo_plan=True, lazy_plan=True, decision_weight=5.0
    )
    kinds = set()
    for demo, record in zip(demos, records):
        hops = hops_of(record)
        turns, chosen = turn_texts_and_decisions(smollm2_tokenizer, demo, weight=5.0)
        if len(hops) == 1:
            kinds.add("one hop")
            assert f"for {hops[0]['query']}." in turns[0] and "then" not in turns[0] + turns[1]
            assert f"The results say {hops[0]['answer']}." in turns[1]
            assert chosen == [".", "."] and demo.answer == hops[0]["answer"]
        elif demo.stats["searches"] == 1:
            kinds.add("early")
            assert f"for {hops[0]['query']}, then answer." in turns[0]
            assert f"The results say {hops[0]['answer']}, then answer." in turns[1]
            assert chosen == [",", " answer", " answer"] and demo.answer == hops[0]["answer"]
        else:
            kinds.add("two searches")
            relation = hops[1]["query"][len(hops[0]["answer"]) :].strip()
            assert f"for {hops[0]['query']}, then its {relation}, then answer." in turns[0]
            assert f"The results say {hops[0]['answer']}, then its {relation}. Next I need" in turns[1]
            assert chosen == [",", " its", " its", " answer"] and demo.answer == record.golden_answers[0]
    assert kinds == {"one hop", "early", "two searches"}


def test_turns_over_budget_counts_the_demonstrated_turns_a_budget_cuts(
    smollm2_tokenizer, world, world_retriever
):
    """turns_over_budget returns the token count of every demonstrated turn longer than the budget (each
    turn's span, as the sampler would generate it), and nothing at the longest turn's length."""
    config = SearchEnvConfig(protocol="search_r1_compact", max_turns=3)
    _, demos = planned_demonstrations(
        smollm2_tokenizer, world, world_retriever, config, lazy_plan=True, echo_plan=True
    )
    lengths = sorted(end - start for demo in demos for start, end in demo.turn_spans)
    longest = lengths[-1]
    assert turns_over_budget(demos, longest) == []
    assert turns_over_budget(demos, longest - 1) == [longest] * lengths.count(longest)
    budget = lengths[len(lengths) // 2]
    assert sorted(turns_over_budget(demos, budget)) == [n for n in lengths if n > budget]


def test_without_a_plan_the_decision_tokens_follow_each_search(smollm2_tokenizer, world, world_retriever):
    """No stated plan: the first search is the same for every question, and after each search the decision
    is the turn's first token past "The results say <found>." (" Next" when it searches again)."""
    config = SearchEnvConfig(protocol="search_r1", max_turns=3)
    records = [r for r in world.train if len(hops_of(r)) == 2][:3] + [
        r for r in world.train if len(hops_of(r)) == 1
    ][:3]
    demos = teacher_rollouts(smollm2_tokenizer, world_retriever, records, config, decision_weight=5.0)
    for demo, record in zip(demos, records):
        ids = demo.token_ids.tolist()
        decisions = np.flatnonzero(demo.nll_weights == 5.0)
        assert len(decisions) == len(demo.turn_spans) - 1  # one per turn after a search
        for (start, end), position in zip(demo.turn_spans[1:], decisions):
            assert start <= position < end
            assert smollm2_tokenizer.decode(ids[start:position]).strip().endswith(".")
        if len(hops_of(record)) == 2:
            assert smollm2_tokenizer.decode(ids[decisions[0] : decisions[0] + 1]) == " Next"


def test_episodes_finish_turn_by_turn_and_are_all_scored(smollm2_tokenizer, world, world_retriever):
    config = SearchEnvConfig(protocol="search_r1", max_turns=4)
    records = world.train[:8]
    envs = [MultiTurnSearchEnv(smollm2_tokenizer, world_retriever, None, config) for _ in records]
    teacher = ScriptedPolicy("teacher", envs[0].protocol, smollm2_tokenizer)
    ends = roll_out(envs, records, teacher, world_retriever)
    turns = [envs[i].turns for i in ends.order]
    assert sorted(ends.order) == list(range(len(records)))
    assert turns == sorted(turns) and len(set(turns)) > 1  # the world mixes 1- and 2-hop questions
    assert all(env.reward_breakdown is not None for env in envs) and ends.judged.calls == 0
    assert ends.terminated == [True] * len(records) and ends.truncated == [False] * len(records)
    with pytest.raises(ValueError, match="envs for"):
        roll_out(envs, records[:2], teacher, world_retriever)


def test_scripted_policies_rank_as_expected_and_are_seeded(smollm2_tokenizer, world, world_retriever):
    config = SearchEnvConfig(protocol="search_r1", max_turns=4)

    def run(policy, seed=0):
        return run_scripted_rollouts(
            smollm2_tokenizer, world_retriever, world.test, config, policy, 12, batch_size=5, seed=seed
        )

    teacher, noisy, no_search = run("teacher"), run("noisy_teacher"), run("no_search")
    assert teacher.exact_match == 1.0 and teacher.invalid_actions == 0 and teacher.format_valid == 1.0
    assert noisy.invalid_actions > 0 and noisy.reward < teacher.reward
    assert no_search.searches == 0 and no_search.exact_match < teacher.exact_match
    again = run("noisy_teacher")
    assert {**again.row(), "seconds": 0} == {**noisy.row(), "seconds": 0}
    with pytest.raises(ValueError, match="unknown policy"):
        ScriptedPolicy("oracle", MultiTurnSearchEnv(smollm2_tokenizer, None, None, config).protocol, None)
