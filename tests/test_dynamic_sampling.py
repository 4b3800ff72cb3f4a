"""Dynamic sampling (DAPO): groups of equal rewards are dropped, the runners sample again up to the
configured rounds, and the update trains the informative groups alone, each episode once an epoch."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search.algos import SearchGRPOConfig, SearchPPOConfig
from rllib_search.algos.rollouts.dynamic_sampling import informative_groups, split_groups
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import make_config, policy_weights


def episode(group: str, reward: float) -> Rollout:
    return Rollout(
        np.array([5, 6, 7]), np.array([0, 0, 1], dtype=np.int8), np.zeros(3, dtype=np.float32), 2, [],
        reward, {}, group, group.split("@")[0], "d", 0, True, False, None, [],
    )  # fmt: skip


def test_informative_groups_are_those_whose_rewards_differ_in_first_seen_order():
    rollouts = [
        episode("b@1", 1.0), episode("a@1", 0.0), episode("b@1", 1.0), episode("a@1", 1.0),
        episode("c@1", 0.0), episode("c@1", 0.5), episode("d@1", 1.0),
    ]  # fmt: skip
    assert [g[0].group_id for g in split_groups(rollouts)] == ["b@1", "a@1", "c@1", "d@1"]
    kept = informative_groups(rollouts)
    assert [g[0].group_id for g in kept] == ["a@1", "c@1"]  # b: all 1; d: a group of one
    assert [r.reward for r in kept[0]] == [0.0, 1.0] and [r.reward for r in kept[1]] == [0.0, 0.5]
    assert informative_groups([episode("e@1", 0.0), episode("e@1", 0.0)]) == []


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamic_sampling_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def test_dynamic_sampling_config_is_checked(model_dir, world, corpus):
    with pytest.raises(ValueError, match="dynamic_sampling_rounds must be"):
        make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(
            dynamic_sampling_rounds=-1
        ).validate()
    with pytest.raises(ValueError, match="group_size >= 2"):
        config = make_config(SearchPPOConfig, model_dir, world, corpus).rollouts(group_size=1)
        config.rollouts(dynamic_sampling_rounds=2).validate()
    with pytest.raises(ValueError, match="use one or the other"):
        config = make_config(SearchGRPOConfig, model_dir, world, corpus).env_runners(num_env_runners=1)
        config.rollouts(one_step_off=True, dynamic_sampling_rounds=2).validate()


@pytest.mark.slow
def test_rounds_until_informative_groups_then_the_last_round_when_none(ray_cluster, model_dir, world, corpus):
    """A tiny random model never answers right: every group's rewards are equal, so each iteration takes
    every allowed round, keeps no group and trains the last round as sampled (the weights still move)."""
    plain = make_config(SearchGRPOConfig, model_dir, world, corpus).build_algo()
    one_round = plain.train()["env_runners"]["num_env_steps_sampled_lifetime"]
    plain.stop()
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(dynamic_sampling_rounds=3)
    algo = algo.build_algo()
    before = policy_weights(algo)
    result = algo.train()
    runners = result["env_runners"]
    assert runners["sample_rounds"] == 3 and runners["informative_groups"] == 0
    assert runners["num_env_steps_sampled_lifetime"] > one_round  # three rounds sampled, one trained
    after = policy_weights(algo)
    assert any(not np.array_equal(before[k].numpy(), after[k].numpy()) for k in before)
    algo.stop()


@pytest.mark.parametrize(("rows", "size", "expected"), [(32, 16, 16), (24, 16, 12), (8, 16, 8), (40, 16, 14)])
def test_minibatches_split_a_dynamic_batch_evenly(model_dir, world, corpus, rows, size, expected):
    from rllib_search.algos.algorithm import SearchAlgorithm

    config = make_config(SearchGRPOConfig, model_dir, world, corpus, minibatch_size=size)
    holder = type("Holder", (), {"config": config.rollouts(dynamic_sampling_rounds=2)})()
    assert SearchAlgorithm._minibatch_size(holder, rows) == expected
    holder.config = make_config(SearchGRPOConfig, model_dir, world, corpus, minibatch_size=size)
    assert SearchAlgorithm._minibatch_size(holder, rows) == size  # off: RLlib's iterator as configured
