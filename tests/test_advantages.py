"""Advantage estimators on hand-computed cases; observation tokens never get advantage."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search.algos.learners.advantages import (
    episode_signals,
    gae,
    grpo_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline,
    returns_to_go,
)


def test_grpo_on_a_hand_computed_group():
    # Group "a": rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) = 0.57735.
    rewards = [1.0, 0.0, 0.0, 1.0, 0.3]
    groups = ["a", "a", "a", "a", "b"]
    advantages = grpo_advantages(rewards, groups, eps=0.0)
    std = np.sqrt(((0.5**2) * 4) / 3)
    np.testing.assert_allclose(advantages[:4], [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std])
    assert advantages[4] == pytest.approx(0.3)  # a group of one keeps its reward (mean 0, std 1)
    np.testing.assert_allclose(
        grpo_advantages(rewards, groups, scale_by_std=False)[:4], [0.5, -0.5, -0.5, 0.5]
    )


def test_grpo_groups_are_by_id_not_position_and_equal_rewards_give_zero():
    advantages = grpo_advantages([1.0, 5.0, 1.0, 5.0], ["x", "y", "x", "y"])
    np.testing.assert_allclose(advantages, [0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        grpo_advantages([1.0], ["x", "y"])


# prompt(2) generated(3) observation(2) generated(2) padding(1)
MASK = np.array([[0, 0, 1, 1, 1, 0, 0, 1, 1, 0]])


def test_gae_with_gamma_lambda_one_is_return_minus_value_and_skips_observations():
    rewards = np.zeros((1, 10))
    rewards[0, 8] = 1.0  # outcome on the last generated token
    rewards[0, 3] = -0.1  # a per-token penalty
    rewards[0, 5] = 100.0  # on an observation token: must be ignored
    values = np.arange(10, dtype=float)[None] / 10
    advantages, returns = gae(rewards, values, MASK)
    generated = np.flatnonzero(MASK[0])
    to_go = {2: 0.9, 3: 0.9, 4: 1.0, 7: 1.0, 8: 1.0}  # sum of remaining generated-token rewards
    for position in generated:
        assert advantages[0, position] == pytest.approx(to_go[position] - values[0, position])
        assert returns[0, position] == pytest.approx(to_go[position])
    assert np.all(advantages[0, MASK[0] == 0] == 0) and np.all(returns[0, MASK[0] == 0] == 0)


def test_gae_with_discount_bootstraps_across_the_observation_gap():
    rewards = np.zeros((1, 10))
    rewards[0, 8] = 1.0
    values = np.full((1, 10), 0.5)
    advantages, _ = gae(rewards, values, MASK, gamma=0.9, lam=0.0)
    # lambda = 0: one-step TD. Token 4's next decision is token 7 (the observation is skipped).
    assert advantages[0, 4] == pytest.approx(0.9 * 0.5 - 0.5)
    assert advantages[0, 8] == pytest.approx(1.0 - 0.5)


def test_masked_whiten_uses_only_masked_entries():
    values = np.array([[1.0, 2.0, 3.0, 1000.0]])
    mask = np.array([[1, 1, 1, 0]])
    whitened = masked_whiten(values, mask)
    np.testing.assert_allclose(whitened[0, :3], (np.array([1, 2, 3]) - 2) / np.std([1, 2, 3]), rtol=1e-6)
    assert whitened[0, 3] == 0.0


def test_reinforce_pp_has_no_baseline_equal_rewards_vanish_only_by_whitening():
    mask = np.array([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1]])
    signal = episode_signals("reinforce_pp", [1.0, 1.0, 1.0], ["g", "g", "h"])
    np.testing.assert_array_equal(signal, [1.0, 1.0, 1.0])  # no baseline: the rewards themselves
    returns = returns_to_go(_last_token(signal, mask), mask)
    np.testing.assert_array_equal(returns, mask * 1.0)  # every generated token's return is 1, not 0
    np.testing.assert_allclose(reinforce_pp_advantages(signal, mask), 0.0, atol=1e-6)  # whitening's doing
    # A KL penalty makes the returns differ, and whitening keeps what differs.
    penalty = np.array([[0.1, 0.0, 9.0, 0.0], [0.0, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.3]])
    advantages = reinforce_pp_advantages(signal, mask, penalty)
    by_hand = np.array([[0.9, 1.0, 0.0, 1.0], [0.8, 0.8, 1.0, 0.0], [0.0, 0.7, 0.7, 0.7]])
    np.testing.assert_allclose(advantages, masked_whiten(by_hand, mask))
    assert np.all(advantages[mask == 0] == 0.0)


def test_reinforce_pp_advantages_do_not_depend_on_group_membership():
    mask = np.array([[1, 1, 0, 1], [1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1]])
    rewards = [1.0, 0.0, 0.5, 1.0]
    groupings = (["a", "a", "b", "b"], ["a", "b", "c", "d"], ["a", "a", "a", "a"], ["x", "y", "x", "y"])
    published = [
        reinforce_pp_advantages(episode_signals("reinforce_pp", rewards, g), mask) for g in groupings
    ]
    for advantages in published[1:]:
        np.testing.assert_array_equal(advantages, published[0])
    # The baseline variant does depend on them: its signal is the reward minus the group's mean.
    baselined = [
        reinforce_pp_advantages(episode_signals("reinforce_pp_baseline", rewards, g), mask) for g in groupings
    ]
    assert not np.allclose(baselined[0], baselined[2])
    assert not np.allclose(baselined[0], published[0])


def test_reinforce_pp_baseline_subtracts_the_group_mean_before_the_same_returns_and_whitening():
    mask = np.array([[1, 1, 0, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    penalty = np.array([[0.1, 0.0, -5.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # kl_coeff * KL
    signal = episode_signals("reinforce_pp_baseline", [1.0, 0.0, 0.7], ["g", "g", "lone"])
    np.testing.assert_allclose(signal, [0.5, -0.5, 0.7])  # group g's mean 0.5; a group of one keeps its own
    np.testing.assert_allclose(signal, reinforce_pp_baseline([1.0, 0.0, 0.7], ["g", "g", "lone"]))
    # Not divided by the group's std, as GRPO is.
    assert not np.allclose(signal[:2], grpo_advantages([1.0, 0.0], ["g", "g"]))
    advantages = reinforce_pp_advantages(signal, mask, penalty)
    # Row 0 gets +0.5 on its last generated token, row 1 -0.5, row 2 +0.7; returns-to-go:
    raw = np.array([[0.4, 0.5, 0.0, 0.5], [-0.5, -0.5, -0.5, 0.0], [0.7, 0.7, 0.7, 0.7]])
    np.testing.assert_allclose(advantages, masked_whiten(raw, mask))
    assert advantages[0, 2] == 0.0 and advantages[1, 3] == 0.0


@pytest.mark.parametrize("estimator", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_whitens_over_the_global_batch_across_learner_shards(estimator):
    rng = np.random.default_rng(0)
    mask = (rng.random((6, 8)) < 0.7).astype(np.int64)
    mask[:, 0] = 1
    penalty = rng.normal(0.0, 0.05, size=mask.shape)
    signal = episode_signals(estimator, [1.0, 0.0, 0.0, 1.0, 1.0, 0.3], ["a", "a", "b", "b", "c", "c"])
    whole = reinforce_pp_advantages(signal, mask, penalty)
    shards = (slice(0, 2), slice(2, 6))  # unequal shards: moments are summed, not averaged

    def moments(rows: slice) -> np.ndarray:
        returns = returns_to_go(
            _last_token(signal[rows], mask[rows]) - mask[rows] * penalty[rows], mask[rows]
        )
        selected = returns[mask[rows] == 1]
        return np.array([selected.sum(), (selected**2).sum(), float(selected.size)])

    for rows in shards:
        others = sum(moments(other) for other in shards if other != rows)
        shard = reinforce_pp_advantages(
            signal[rows], mask[rows], penalty[rows], reduce_sums=lambda sums, others=others: sums + others
        )
        np.testing.assert_allclose(shard, whole[rows], atol=1e-12)
    # Each shard whitened alone would differ: the statistics are the whole batch's.
    alone = reinforce_pp_advantages(signal[shards[0]], mask[shards[0]], penalty[shards[0]])
    assert not np.allclose(alone, whole[shards[0]])


def test_episode_signals_name_every_estimator():
    rewards, groups = [1.0, 0.0], ["g", "g"]
    np.testing.assert_allclose(episode_signals("grpo", rewards, groups), grpo_advantages(rewards, groups))
    for estimator in ("reinforce_pp", "gae", "sft"):
        np.testing.assert_array_equal(episode_signals(estimator, rewards, groups), rewards)
    with pytest.raises(ValueError, match="reinforce"):
        episode_signals("reinforce", rewards, groups)


def test_the_reinforce_pp_config_takes_either_estimator_and_no_other():
    from rllib_search.algos import SearchReinforcePPConfig
    from rllib_search.algos.config import ADVANTAGE_ESTIMATORS

    assert {"reinforce_pp", "reinforce_pp_baseline"} <= set(ADVANTAGE_ESTIMATORS)
    assert SearchReinforcePPConfig().advantage_estimator == "reinforce_pp"
    SearchReinforcePPConfig().training(advantage_estimator="reinforce_pp_baseline").validate()
    with pytest.raises(ValueError, match="reinforce_pp_baseline"):
        SearchReinforcePPConfig().training(advantage_estimator="grpo").validate()
    with pytest.raises(ValueError, match="reinforce_pp_baseline"):
        SearchReinforcePPConfig().training(advantage_estimator="reinforce_baseline").validate()


def _last_token(per_episode: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T) zeros with each row's value on its last generated token, written out by hand."""
    placed = np.zeros(mask.shape)
    for row, value in enumerate(per_episode):
        placed[row, np.flatnonzero(mask[row])[-1]] = value
    return placed
