"""Advantage estimators as pure numpy functions over padded (batch, time) arrays with a loss mask.

The mask is 1 on tokens the policy generated and 0 on prompt, observation and padding tokens. Every
estimator here looks at generated tokens only: observation tokens carry no reward, no value and no
advantage, and whitening statistics are taken over generated tokens alone.

- :func:`grpo_advantages`: (r - group mean) / (group std + eps), one value per episode, over whole groups
  (compute it before episodes are sharded across learners, which would split groups).
- :func:`gae`: generalised advantage estimation over the generated tokens of each sequence, skipping the
  observation tokens between turns (Search-R1's PPO: gamma = lambda = 1).
- :func:`reinforce_pp_advantages`: REINFORCE++ (Hu, 2025; estimator ``reinforce_pp``, R1-Searcher's
  algorithm, OpenRLHF's ``reinforce``): no critic and no baseline. The outcome reward sits on the last
  generated token, a per-token penalty such as ``kl_coeff * KL`` is subtracted on every generated token,
  the token rewards are summed into returns-to-go with discount gamma (1 by default), and the returns are
  whitened (mean and std) over the generated tokens of the whole batch, across learners.
- :func:`reinforce_pp_baseline`: REINFORCE++-baseline (estimator ``reinforce_pp_baseline``, OpenRLHF's
  ``reinforce_baseline``): the same, from the outcome reward minus its group's mean (over whole groups,
  before sharding), with no division by the group's std.

:func:`episode_signals` is the per-episode value each estimator starts from, computed over whole groups
before episodes are sharded across learners.

Whitening takes a ``reduce_sums`` function: the learner passes one that sums the moments over every
learner's shard, so 2 learners whiten like 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# Sums (sum, sum of squares, count) of a learner's shard over all learners; identity for one learner.
ReduceSums = Callable[[np.ndarray], np.ndarray]


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


def masked_whiten(
    values: np.ndarray, mask: np.ndarray, eps: float = 1e-8, reduce_sums: ReduceSums | None = None
) -> np.ndarray:
    """(values - mean) / std over the masked entries; unmasked entries become 0. ``reduce_sums`` turns
    this shard's (sum, sum of squares, count) into those of all shards."""
    values = np.asarray(values, dtype=np.float64)
    mask = np.asarray(mask, dtype=bool)
    selected = values[mask]
    sums = np.array([selected.sum(), (selected**2).sum(), float(selected.size)])
    if reduce_sums is not None:
        sums = np.asarray(reduce_sums(sums), dtype=np.float64)
    total, total_sq, count = sums.tolist()
    if count == 0:
        return np.zeros_like(values)
    mean = total / count
    std = float(np.sqrt(max(total_sq / count - mean**2, 0.0)))
    return np.where(mask, (values - mean) / (std + eps), 0.0)


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


def outcome_token_rewards(
    per_episode: Sequence[float], mask: np.ndarray, token_penalty: np.ndarray | None = None
) -> np.ndarray:
    """(B, T) token rewards: each episode's outcome on its last generated token, minus ``token_penalty``
    (e.g. ``kl_coeff * KL``) on every generated token."""
    rewards = place_on_last_token(per_episode, mask)
    if token_penalty is not None:
        rewards = rewards - np.where(np.asarray(mask, dtype=bool), token_penalty, 0.0)
    return rewards


def reinforce_pp_baseline(rewards: Sequence[float], group_ids: Sequence[str]) -> np.ndarray:
    """REINFORCE++-baseline's episode signal: the outcome reward minus its group's mean (a group of one
    keeps its reward); unlike GRPO, not divided by the group's std. Computed over whole groups, before
    episodes are sharded across learners."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return rewards - group_statistics(rewards, group_ids)[0]


def reinforce_pp_advantages(
    episode_signal: Sequence[float],
    mask: np.ndarray,
    token_penalty: np.ndarray | None = None,
    gamma: float = 1.0,
    reduce_sums: ReduceSums | None = None,
) -> np.ndarray:
    """REINFORCE++'s token advantages: ``episode_signal`` (the outcome reward for ``reinforce_pp``,
    :func:`reinforce_pp_baseline`'s centred reward for ``reinforce_pp_baseline``) on each episode's last
    generated token, minus ``token_penalty`` on every generated token, summed into returns-to-go with
    ``gamma``, then whitened over the generated tokens of every learner's shard (``reduce_sums``)."""
    rewards = outcome_token_rewards(episode_signal, mask, token_penalty)
    return masked_whiten(returns_to_go(rewards, mask, gamma), mask, reduce_sums=reduce_sums)


def episode_signals(
    estimator: str, rewards: Sequence[float], group_ids: Sequence[str], scale_by_std: bool = True
) -> np.ndarray:
    """The per-episode value ``estimator`` turns into token advantages, over whole groups: GRPO's advantage
    (``grpo``), the reward minus its group's mean (``reinforce_pp_baseline``), or the reward itself
    (``reinforce_pp``, ``gae``, ``sft``: group membership plays no part)."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards for {len(group_ids)} group ids")
    if estimator == "grpo":
        return grpo_advantages(rewards, group_ids, scale_by_std=scale_by_std)
    if estimator == "reinforce_pp_baseline":
        return reinforce_pp_baseline(rewards, group_ids)
    if estimator in ("reinforce_pp", "gae", "sft"):
        return np.asarray(rewards, dtype=np.float64)
    raise ValueError(f"unknown advantage_estimator {estimator!r}")


def overlong_penalty(generated_tokens: Sequence[int], max_tokens: int, buffer_tokens: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), one value per episode from the tokens the
    policy generated (retrieved tokens do not count): 0 up to ``max_tokens - buffer_tokens``, then falling
    linearly to -1 at ``max_tokens``, and -1 beyond."""
    if buffer_tokens <= 0 or buffer_tokens > max_tokens:
        raise ValueError(f"buffer_tokens must be in (0, max_tokens={max_tokens}], got {buffer_tokens}")
    lengths = np.asarray(generated_tokens, dtype=np.float64)
    start = max_tokens - buffer_tokens
    return np.where(lengths > max_tokens, -1.0, np.minimum(0.0, (start - lengths) / buffer_tokens))
