"""Off-policy guidance (``rollouts(guidance=...)``, algos/guidance.py): in each group with no right answer
the last episode is re-run with the teacher's first turns, scored with the runner's weights, and trained;
with ``"counter"``, a one-hop group whose episodes all stopped after one search gets an episode whose plan
goes on, its fork alone credited."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rllib_search.algos.configs import SearchGRPOConfig
from rllib_search.algos.env_runner import LLMEnvRunner
from rllib_search.algos.guidance import answered_right, plan_fork, stopped_groups, unsolved_groups
from rllib_search.env.protocols import get_protocol
from rllib_search.env.teacher import TeacherPolicy, hops_of
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import make_config, policy_weights

# The teacher writes every turn (search, search, answer): in the env's three turns and 700 tokens its
# guided episodes of 1- and 2-hop questions answer right.
WHOLE_EPISODE = {"turns": 3, "teacher": {"state_plan": True}}
LAZY_ECHO = {"state_plan": True, "lazy_plan": True, "echo_plan": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("guidance_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def test_guidance_config_is_checked(model_dir, world, corpus):
    config = make_config(SearchGRPOConfig, model_dir, world, corpus)
    for bad, message in [
        ({"turn": 1}, "dict with 'turns', 'teacher', 'counter' and 'counter_from'"),
        ({"turns": 0}, "at least 1"),
        ({"teacher": "state_plan"}, "keyword arguments"),
        ({"teacher": {"plan": True}}, "unexpected keyword argument 'plan'"),
        ({"teacher": {"lazy_plan": True}}, "needs state_plan=True"),
        ({"counter": "fork"}, "its teacher needs state_plan=True"),
        ({"teacher": LAZY_ECHO, "counter": True}, "None, 'plan' or 'fork'"),
        ({"teacher": LAZY_ECHO, "counter": "plan", "counter_from": 0}, "counter_from must be at least 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            config.copy(copy_frozen=False).rollouts(guidance=bad).validate()
    with pytest.raises(ValueError, match="group_size >= 2"):
        config.copy(copy_frozen=False).rollouts(guidance={}, group_size=1).validate()
    with pytest.raises(ValueError, match="old_logprobs='recompute'"):
        config.copy(copy_frozen=False).rollouts(guidance={}, engine="vllm").validate_guidance()
    config.copy(copy_frozen=False).rollouts(guidance={}).validate()  # defaults: one turn, plain teacher
    for counter in ("plan", "fork"):
        guidance = {"teacher": LAZY_ECHO, "counter": counter}
        config.copy(copy_frozen=False).rollouts(guidance=guidance).validate()


def test_the_plan_that_goes_on_departs_from_the_one_that_stops_at_its_fork(smollm2_tokenizer, world):
    """going_on_plan: a one-hop question's plan with a placeholder second hop, a two-hop question's full
    plan (never hesitating); the fork is the first token where it leaves the plan that stops."""
    teacher = TeacherPolicy(get_protocol("search_r1_compact"), early_answer=1.0, seed=0, **LAZY_ECHO)
    one_hop = next(r for r in world.train if len(hops_of(r)) == 1)
    two_hop = next(r for r in world.train if len(hops_of(r)) == 2)
    query = hops_of(one_hop)[0]["query"]
    goes_on = teacher.going_on_plan(one_hop)
    assert f"I need to search for {query}, then its next relation, then answer." in goes_on
    assert f"I need to search for {query}." in teacher.segment(one_hop, 0, [])
    assert goes_on in teacher.alternatives(one_hop, 0)
    relation = hops_of(two_hop)[1]["query"][len(hops_of(two_hop)[0]["answer"]) :].strip()
    assert f", then its {relation}, then answer." in teacher.going_on_plan(two_hop)
    assert ", then answer." in teacher.segment(two_hop, 0, []) and teacher.answers_early(two_hop)

    def ids(text):
        return smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]

    stops, going = ids(teacher.segment(one_hop, 0, [])), ids(goes_on)
    fork = plan_fork(stops, going)
    assert going[:fork] == stops[:fork] and smollm2_tokenizer.decode(going[fork]) == ","
    assert smollm2_tokenizer.decode(stops[fork]) == "."
    assert plan_fork(going, going) is None and plan_fork(going[:3], going) == 3
    with pytest.raises(ValueError, match="state_plan"):
        TeacherPolicy(get_protocol("search_r1")).going_on_plan(one_hop)


@pytest.mark.slow
def test_each_unsolved_group_ends_with_a_guided_episode_scored_by_the_runner(model_dir, world, corpus):
    """A tiny random model never answers right, so every group is guided: its last episode's first turn is
    the teacher's, its answer right (within the env's budgets), every generated token's log-prob the
    runner's own (temperature 1)."""
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=3, prompts_per_sample=4, guidance=WHOLE_EPISODE
    )
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    metrics = {key: float(value) for key, value in runner.get_metrics().items() if key != "reward"}
    groups = [rollouts[start : start + 3] for start in range(0, len(rollouts), 3)]
    assert len(groups) == 4 and metrics["guided_groups"] == 4
    teacher = TeacherPolicy(get_protocol("search_r1"), state_plan=True)
    by_uid = {record.uid: record for record in world.train}
    model = runner.module.model.eval()
    solved = 0
    for group in groups:
        *sampled, guided = group
        assert not any(answered_right(r) for r in sampled)
        if len(hops_of(by_uid[guided.uid])) <= 2:
            assert answered_right(guided) and guided.reward > max(r.reward for r in sampled)  # an advantage
            solved += 1
        assert len({r.group_id for r in group}) == 1 and guided.uid == sampled[0].uid
        start, end = guided.turn_spans[0]
        plan = teacher.segment(by_uid[guided.uid], 0, [])
        assert runner.tokenizer.decode(guided.token_ids[start:end]) == plan
        generated = guided.loss_mask.astype(bool)
        assert np.isfinite(guided.logprobs[generated]).all()
        with torch.no_grad():
            logits = model(torch.as_tensor(guided.token_ids)[None]).logits[0].float()
        expected = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.as_tensor(guided.token_ids[1:, None]))
        np.testing.assert_allclose(
            guided.logprobs[1:][generated[1:]], expected[:, 0].numpy()[generated[1:]], atol=1e-4
        )
    assert solved >= 2 and metrics["guided_solved"] == sum(answered_right(group[-1]) for group in groups)
    assert metrics["episode_return_mean"] == pytest.approx(0.0)  # the sampled episodes' metrics alone


def test_a_group_with_a_right_answer_or_no_hop_chain_is_not_guided(model_dir, world, corpus):
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=2, prompts_per_sample=3
    )
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    records = [next(r for r in world.train if r.uid == rollout.uid) for rollout in rollouts]
    assert unsolved_groups(records, rollouts, 2) == [0, 2, 4]
    rollouts[3] = replace(rollouts[3], answer=rollouts[3].golden_answers[0])  # the second group solved
    records[4] = replace(records[4], extra={})  # the third question without its hop chain
    records[5] = records[4]
    assert unsolved_groups(records, rollouts, 2) == [0]


@pytest.mark.slow
def test_a_guided_iteration_trains_where_an_unguided_one_has_no_advantage(
    ray_cluster, model_dir, world, corpus
):
    """The same seeded iteration with and without guidance: unguided, every group's rewards are equal (no
    advantage: the weights barely move, 0.03 in summed absolute change when measured); guided, the
    solved groups have one (they moved by 119)."""
    moved = {}
    for name, guidance in (("plain", None), ("guided", WHOLE_EPISODE)):
        algo = (
            make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(guidance=guidance).build_algo()
        )
        before = policy_weights(algo)
        result = algo.train()
        after = policy_weights(algo)
        algo.stop()
        moved[name] = sum(float((after[k] - before[k]).abs().sum()) for k in before)
        if guidance:
            assert result["env_runners"]["guided_groups"] == 2 and result["env_runners"]["guided_solved"] >= 1
    assert moved["guided"] > 100 * moved["plain"]


@pytest.mark.parametrize("counter", ["plan", "fork"])
def test_a_one_hop_group_that_always_stopped_gets_a_plan_that_goes_on(model_dir, world, corpus, counter):
    """Counter-guidance: of a one-hop group whose episodes all searched once, one answering right, the last
    episode is re-run with the teacher's plan that goes on, scored with the runner's weights and credited
    as a sampled plan ("plan") or at its "," alone ("fork"). A one-hop group with a second search, a two-hop
    group and a group with no right answer (guided as before, in the same batch) are not countered."""
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=3, guidance={"turns": 1, "teacher": LAZY_ECHO, "counter": counter}
    )
    runner = LLMEnvRunner(config=config)
    one_hop = [r for r in world.train if len(hops_of(r)) == 1][:3]
    records = [*one_hop, next(r for r in world.train if len(hops_of(r)) == 2)]
    episodes = [(record, f"{record.uid}@test") for record in records for _ in range(3)]
    sampled = runner._roll_out(episodes, runner.sampling, seeded=True)[0]

    def stopped(rollout, right):
        answer = rollout.golden_answers[0] if right else "nobody"
        return replace(rollout, answer=answer, stats={**rollout.stats, "searches": 1})

    sampled = [stopped(rollout, right=i in (0, 3, 9)) for i, rollout in enumerate(sampled)]
    sampled[4] = replace(sampled[4], stats={**sampled[4].stats, "searches": 2})  # the second group went on
    episode_records = [record for record, _ in episodes]
    assert stopped_groups(episode_records, sampled, 3) == [0]
    assert unsolved_groups(episode_records, sampled, 3) == [6]  # the third group answered nothing right
    after = runner._guide_groups(episodes, list(sampled), None)
    metrics = {key: float(value) for key, value in runner.get_metrics().items() if key != "reward"}
    assert metrics["counter_groups"] == 1 and metrics["guided_groups"] == 1
    assert all(after[i] is sampled[i] for i in range(12) if i not in (2, 8))
    countered = after[2]
    teacher = TeacherPolicy(runner.protocol, **LAZY_ECHO)
    start, end = countered.turn_spans[0]
    assert runner.tokenizer.decode(countered.token_ids[start:end]) == teacher.going_on_plan(one_hop[0])
    if counter == "fork":
        (credited,) = np.flatnonzero(countered.loss_mask)
        assert start < credited < end and runner.tokenizer.decode(countered.token_ids[credited]) == ","
    else:  # every generated token, as in a sampled episode (the learner keeps the trained turns)
        assert countered.loss_mask[start:end].all()
        credited = int(np.flatnonzero(countered.loss_mask)[-1])
        assert countered.loss_mask.sum() > end - start  # the engine's turns after the plan too
    with torch.no_grad():
        logits = runner.module.model(torch.as_tensor(countered.token_ids)[None]).logits[0].float()
    expected = torch.log_softmax(logits[credited - 1], -1)[countered.token_ids[credited]]
    assert countered.logprobs[credited] == pytest.approx(float(expected), abs=1e-4)
    assert np.isfinite(countered.logprobs[countered.loss_mask.astype(bool)]).all()
    assert metrics["counter_right"] == float(answered_right(countered))
    guided = after[8]  # the unsolved group's: the teacher's own plan, every token of it credited
    plan_start, plan_end = guided.turn_spans[0]
    assert runner.tokenizer.decode(guided.token_ids[plan_start:plan_end]) == teacher.segment(
        one_hop[2], 0, []
    )
    assert guided.loss_mask[plan_start:plan_end].all()


def test_counter_guidance_starts_at_the_runners_counter_from_th_sample(model_dir, world, corpus):
    """``counter_from``: before the runner's N-th sample a one-hop group that always stopped is left as
    sampled (an unsolved group is still guided); from that sample on it is countered."""
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=2, guidance={"turns": 1, "teacher": LAZY_ECHO, "counter": "plan", "counter_from": 3}
    )
    runner = LLMEnvRunner(config=config)
    one_hop = [r for r in world.train if len(hops_of(r)) == 1][:2]
    episodes = [(record, f"{record.uid}@test") for record in one_hop for _ in range(2)]
    sampled = runner._roll_out(episodes, runner.sampling, seeded=True)[0]
    sampled = [
        replace(r, answer=r.golden_answers[0] if i == 0 else "nobody", stats={**r.stats, "searches": 1})
        for i, r in enumerate(sampled)
    ]
    counted = []
    for calls in (0, 1, 2):  # the runner's 1st, 2nd and 3rd samples
        runner._sample_calls = calls
        after = runner._guide_groups(episodes, list(sampled), None)
        metrics = {key: float(value) for key, value in runner.get_metrics().items() if key != "reward"}
        assert metrics["guided_groups"] == 1 and after[3] is not sampled[3]  # the unsolved group, always
        counted.append(metrics["counter_groups"])
        assert (after[1] is sampled[1]) == (calls < 2)
    assert counted == [0.0, 0.0, 1.0]
