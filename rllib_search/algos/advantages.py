"""Advantage estimators as pure numpy functions over padded (batch, time) arrays with a loss mask.

The mask is 1 on tokens the policy generated and 0 on prompt, observation and padding tokens. Every
estimator here looks at generated tokens only: observation tokens carry no reward, no value and no
advantage, and whitening statistics are taken over generated tokens alone.

- :func:`grpo_advantages`: (r - group mean) / (group std + eps), one value per episode, over whole groups
  (compute it before episodes are sharded across learners, which would split groups).
- :func:`gae`: generalised advantage estimation over the generated tokens of each sequence, skipping the
  observation tokens between turns (Search-R1's PPO: gamma = lambda = 1).
- :func:`reinforce_pp_advantages`: REINFORCE++ with a group baseline (R1-Searcher): the outcome reward
  minus its group mean, plus per-token rewards such as a KL penalty, summed into returns-to-go with
  discount gamma (1 by default), then whitened over the batch's generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def group_statistics(rewards: np.ndarray, group_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: the mean and the (unbiased, N-1) standard deviation of its group's rewards.

    A group of one gets mean 0 and std 1 (as verl, which Search-R1 runs on, does), so its advantage is its
    reward: there is nothing to compare it with.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    means, stds = np.zeros_like(rewards), np.ones_like(rewards)
    members: dict[str, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    for indices in members.values():
        if len(indices) > 1:
            values = rewards[indices]
            means[indices] = values.mean()
            stds[indices] = values.std(ddof=1)
    return means, stds


def grpo_advantages(
    rewards: Sequence[float], group_ids: Sequence[str], eps: float = 1e-6, scale_by_std: bool = True
) -> np.ndarray:
    """GRPO's outcome advantage per episode: (r - mean_g) / (std_g + eps), or r - mean_g when
    ``scale_by_std`` is False (Dr. GRPO's variant)."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards for {len(group_ids)} group ids")
    rewards = np.asarray(rewards, dtype=np.float64)
    means, stds = group_statistics(rewards, group_ids)
    centred = rewards - means
    return centred / (stds + eps) if scale_by_std else centred


def masked_whiten(values: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(values - mean) / std over the masked entries; unmasked entries become 0."""
    mask = np.asarray(mask, dtype=bool)
    selected = values[mask]
    if selected.size == 0:
        return np.zeros_like(values, dtype=np.float64)
    whitened = (values - selected.mean()) / (selected.std() + eps)
    return np.where(mask, whitened, 0.0)


def gae(
    token_rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float = 1.0, lam: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (both (B, T), 0 off the mask) by GAE over each row's generated tokens.

    The generated tokens of a row, in order, form the decision sequence: the value after the last one is
    0 (the episode ended), and tokens in between that the env inserted are skipped, neither bootstrapped
    from nor rewarded. With gamma = lambda = 1 the advantage is the sum of the remaining token rewards
    minus the value.
    """
    token_rewards = np.asarray(token_rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    mask = np.asarray(mask, dtype=bool)
    advantages = np.zeros_like(token_rewards)
    for row in range(token_rewards.shape[0]):
        positions = np.flatnonzero(mask[row])
        running, next_value = 0.0, 0.0
        for position in positions[::-1]:
            delta = token_rewards[row, position] + gamma * next_value - values[row, position]
            running = delta + gamma * lam * running
            advantages[row, position] = running
            next_value = values[row, position]
    returns = np.where(mask, advantages + values, 0.0)
    return advantages, returns


def returns_to_go(token_rewards: np.ndarray, mask: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """(B, T) discounted sums of the remaining rewards over each row's generated tokens (0 elsewhere);
    tokens the env inserted are skipped, as in :func:`gae`."""
    mask = np.asarray(mask, dtype=bool)
    rewards = np.where(mask, np.asarray(token_rewards, dtype=np.float64), 0.0)
    returns = np.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        running = 0.0
        for position in np.flatnonzero(mask[row])[::-1]:
            running = rewards[row, position] + gamma * running
            returns[row, position] = running
    return returns


def place_on_last_token(per_episode: Sequence[float], mask: np.ndarray) -> np.ndarray:
    """(B, T) zeros with each episode's value on its last generated token (outcome rewards)."""
    mask = np.asarray(mask, dtype=bool)
    placed = np.zeros(mask.shape, dtype=np.float64)
    for row, value in enumerate(per_episode):
        positions = np.flatnonzero(mask[row])
        if positions.size:
            placed[row, positions[-1]] = value
    return placed


def reinforce_pp_advantages(
    outcome_rewards: Sequence[float],
    group_ids: Sequence[str],
    token_rewards: np.ndarray,
    mask: np.ndarray,
    gamma: float = 1.0,
) -> np.ndarray:
    """REINFORCE++ with a group baseline (R1-Searcher): each episode's outcome reward minus its group's
    mean is placed on its last generated token, ``token_rewards`` (e.g. -beta * KL per token) are added,
    returns-to-go are summed over generated tokens with ``gamma``, and the result is whitened over the
    batch's generated tokens."""
    outcome = np.asarray(outcome_rewards, dtype=np.float64)
    baseline, _ = group_statistics(outcome, group_ids)
    rewards = np.asarray(token_rewards, dtype=np.float64) + place_on_last_token(outcome - baseline, mask)
    return masked_whiten(returns_to_go(rewards, mask, gamma), mask)
