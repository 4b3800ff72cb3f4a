"""Off-policy guidance as a group hook (``rollouts(group_hook=TeacherGuidance(...))``,
``recipes/tiny_cpu/guidance.py``): in each group with no right answer the last episode is re-run with the
teacher's first turns, scored with the runner's weights, and trained."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.env.protocols import get_protocol
from rllib_search.env.teacher import TeacherPolicy, hops_of
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.recipes.tiny_cpu.guidance import TeacherGuidance, answered_right, unsolved_groups
from tests.helpers import make_config, policy_weights

# The teacher writes every turn (search, search, answer): in the env's three turns and 700 tokens its
# guided episodes of 1- and 2-hop questions answer right.
WHOLE_EPISODE = TeacherGuidance(turns=3, teacher={"state_plan": True})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("guidance_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def test_guidance_is_checked_with_the_config(model_dir, world, corpus):
    config = make_config(SearchGRPOConfig, model_dir, world, corpus)
    for bad, message in [
        (TeacherGuidance(turns=0), "at least 1"),
        (TeacherGuidance(teacher={"plan": True}), "unexpected keyword argument 'plan'"),
        (TeacherGuidance(teacher={"lazy_plan": True}), "needs state_plan=True"),
    ]:
        with pytest.raises(ValueError, match=message):
            config.copy(copy_frozen=False).rollouts(group_hook=bad).validate()
    with pytest.raises(ValueError, match="group_size >= 2"):
        config.copy(copy_frozen=False).rollouts(group_hook=TeacherGuidance(), group_size=1).validate()
    with pytest.raises(ValueError, match="old_logprobs='recompute'"):
        config.copy(copy_frozen=False).rollouts(
            group_hook=TeacherGuidance(), engine="vllm"
        ).validate_group_hook()
    with pytest.raises(ValueError, match="group_hook must be None or a callable"):
        config.copy(copy_frozen=False).rollouts(group_hook={"turns": 1}).validate()
    config.copy(copy_frozen=False).rollouts(
        group_hook=TeacherGuidance()
    ).validate()  # one turn, plain teacher


def test_a_group_hook_sees_every_sample_and_its_result_is_what_the_runner_returns(model_dir, world, corpus):
    """The core's hook contract: called once per sample with the (record, group id) pairs in the order of
    the rollouts; what it returns is the sample."""
    calls = []

    def keep_first_of_each_group(runner, episodes, rollouts):
        calls.append([(record.uid, group_id) for record, group_id in episodes])
        assert [r.group_id for r in rollouts] == [group_id for _, group_id in episodes]
        return rollouts[:: runner.config.group_size]

    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=2, prompts_per_sample=3, group_hook=keep_first_of_each_group
    )
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    assert len(calls) == 1 and len(calls[0]) == 6 and len(rollouts) == 3
    assert [r.group_id for r in rollouts] == [group_id for _, group_id in calls[0][::2]]


@pytest.mark.slow
def test_each_unsolved_group_ends_with_a_guided_episode_scored_by_the_runner(model_dir, world, corpus):
    """A tiny random model never answers right, so every group is guided: its last episode's first turn is
    the teacher's, its answer right (within the env's budgets), every generated token's log-prob the
    runner's own (temperature 1)."""
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
        group_size=3, prompts_per_sample=4, group_hook=WHOLE_EPISODE
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
    advantage: the weights barely move); guided, the solved groups have one."""
    moved = {}
    for name, hook in (("plain", None), ("guided", WHOLE_EPISODE)):
        algo = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(group_hook=hook).build_algo()
        before = policy_weights(algo)
        result = algo.train()
        after = policy_weights(algo)
        algo.stop()
        moved[name] = sum(float((after[k] - before[k]).abs().sum()) for k in before)
        if hook:
            assert result["env_runners"]["guided_groups"] == 2 and result["env_runners"]["guided_solved"] >= 1
    assert moved["guided"] > 100 * moved["plain"]
