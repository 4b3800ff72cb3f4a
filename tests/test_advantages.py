"""Advantage estimators on hand-computed cases; observation tokens never get advantage."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search.algos.learners.advantages import (
    gae,
    grpo_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline,
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


def test_reinforce_pp_group_baseline_and_token_rewards():
    mask = np.array([[1, 1, 0, 1], [1, 1, 1, 0]])
    penalty = np.array([[0.1, 0.0, -5.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # e.g. kl_coeff * KL
    signal = reinforce_pp_baseline([1.0, 0.0], ["g", "g"])
    np.testing.assert_allclose(signal, [0.5, -0.5])
    advantages = reinforce_pp_advantages(signal, mask, penalty)
    # Baseline 0.5: row 0 gets +0.5 on its last generated token, row 1 gets -0.5; returns-to-go:
    raw = np.array([[0.4, 0.5, 0.0, 0.5], [-0.5, -0.5, -0.5, 0.0]])
    np.testing.assert_allclose(advantages, masked_whiten(raw, mask))
    assert advantages[0, 2] == 0.0 and advantages[1, 3] == 0.0
