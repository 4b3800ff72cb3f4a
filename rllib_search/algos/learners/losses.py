"""The masked loss terms of PPO, GRPO, GSPO, Dr. GRPO, DAPO and REINFORCE++, and the LLDS regulariser that
any of them can add, as pure torch functions over (B, T) tensors.

``mask`` is 1 on tokens the policy generated and 0 on prompt, observation and padding tokens; it applies
to EVERY term (policy, KL, entropy, value) and to every ratio, length and normaliser, so retrieved text
never produces a gradient nor counts towards a length. Aggregation: ``"sequence"`` averages each sequence
over its generated tokens and then the sequences (Search-R1 eq. 1); ``"token"`` averages all generated
tokens of the batch alike (DAPO); ``"constant"`` sums each sequence's tokens, divides by one constant
(``normaliser``: the response budget) and averages the sequences (Dr. GRPO).
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["sequence", "token", "constant"]
AGGREGATIONS = ("sequence", "token", "constant")


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "sequence",
    normaliser: float | None = None,
) -> torch.Tensor:
    """Mean of ``values`` over masked entries, per ``aggregation`` (``"constant"`` divides each sequence's
    sum by ``normaliser``); 0 when nothing is masked."""
    mask = mask.to(values.dtype)
    if aggregation == "token":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "constant":
        if not normaliser or normaliser <= 0:
            raise ValueError(f"aggregation 'constant' needs a positive normaliser, got {normaliser!r}")
        per_sequence = (values * mask).sum(-1) / float(normaliser)
    else:
        per_sequence = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    has_tokens = (mask.sum(-1) > 0).to(values.dtype)
    return (per_sequence * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3", k3_clamp: float = 10.0
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probs.

    ``k1``: log p - log q (unbiased, high variance); ``k3``: exp(log q - log p) - (log q - log p) - 1
    (unbiased, always >= 0, low variance; GRPO's choice). k3 grows exponentially where the policy samples a
    token it finds far less likely than the reference does (a tail sample at temperature 1): one such token
    can dominate a batch's mean, so each token's k3 is clamped at ``k3_clamp`` (10, as verl does).
    """
    log_ratio = ref_logprobs - logprobs
    if kind == "k1":
        return -log_ratio
    if kind == "k3":
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, max=k3_clamp)
    raise ValueError(f"kind must be 'k1' or 'k3', got {kind!r}")


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    aggregation: Aggregation = "sequence",
    clip_high: float | None = None,
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate with per-token ratios, negated for minimisation, with its clip fraction and
    approximate KL. The ratio is clipped to [1 - ``clip``, 1 + ``clip_high``] (``clip_high`` None:
    ``clip``; DAPO's clip-higher sets it above ``clip``).

    Masked positions are filled before the exponent so that garbage there (padding log-probs) can never
    turn into inf or NaN and leak through ``0 * inf``.
    """
    clip_high = clip if clip_high is None else clip_high
    valid = mask.bool()
    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip_high) * advantages
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask, aggregation, normaliser)
    with torch.no_grad():
        stats = {
            # Where the clipped term is the one in effect (its gradient is zero there).
            "clip_fraction": masked_mean((clipped < unclipped).float(), mask, "token"),
            "approx_kl": masked_mean(0.5 * log_ratio**2, mask, "token"),
        }
    return loss, stats


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    aggregation: Aggregation = "sequence",
    normaliser: float | None = None,
) -> torch.Tensor:
    """PPO's clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- clip) - R)^2), masked."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    losses = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * masked_mean(losses, mask, aggregation, normaliser)


def sequence_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 3e-4,
    clip_high: float | None = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's clipped surrogate (Zheng et al., 2025, eq. 5-7): one importance ratio per sequence, the
    geometric mean of its generated tokens' ratios, s_i = exp(mean_t (log pi(y_t) - log pi_old(y_t))),
    clipped to [1 - ``clip``, 1 + ``clip_high``] (the paper's 3e-4 and 4e-4) and multiplied by the
    sequence's advantage (the mean of its tokens' advantages: GRPO's are equal along a sequence); negated
    and averaged over the sequences that generated tokens. Returns the loss, the share of sequences clipped
    and the approximate KL of the tokens."""
    clip_high = clip if clip_high is None else clip_high
    valid = mask.bool()
    weights = mask.to(logprobs.dtype)
    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    lengths = weights.sum(-1)
    has_tokens = (lengths > 0).to(logprobs.dtype)
    ratio = torch.exp((log_ratio * weights).sum(-1) / lengths.clamp(min=1.0))
    advantage = (torch.where(valid, advantages, torch.zeros_like(advantages)) * weights).sum(-1)
    advantage = advantage / lengths.clamp(min=1.0)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip_high) * advantage
    per_sequence = -torch.minimum(unclipped, clipped) * has_tokens
    loss = per_sequence.sum() / has_tokens.sum().clamp(min=1.0)
    with torch.no_grad():
        stats = {
            "clip_fraction": ((clipped < unclipped).to(logprobs.dtype) * has_tokens).sum()
            / has_tokens.sum().clamp(min=1.0),
            "approx_kl": masked_mean(0.5 * log_ratio**2, mask, "token"),
        }
    return loss, stats


def contiguous_actions(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1-based index of each maximal run of 1s in ``mask`` along its row, 0 off the mask: the
    actions of rows whose turns are separated by observations, where the batch carries no ``turn_index``."""
    on = mask.bool()
    before = torch.nn.functional.pad(on[:, :-1], (1, 0), value=False)
    starts = on & ~before
    return torch.cumsum(starts.long(), dim=-1) * on.long()


def llds_penalty(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    action_ids: torch.Tensor,
    aggregation: Aggregation = "sequence",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LLDS, the likelihood-preserving regulariser of Deng et al. (2025, "the Lazy Likelihood-Displacement"),
    not yet weighted by its coefficient.

    An action is the set of masked tokens of a row sharing one positive ``action_ids`` value (a model turn;
    one value per row gives the paper's response-level gate). An action is gated on when it is in the
    preserving set (the sum of its tokens' advantages is >= 0) and its log-likelihood fell since sampling
    (sum over its tokens of log pi_old - log pi > 0). Within gated actions, each token whose log-prob fell
    contributes log pi_old - log pi (> 0); every other token contributes 0. The per-token penalty is
    aggregated like the other terms (``aggregation`` over ``mask``), and its gradient raises the
    log-probs of exactly the tokens it penalises. Returns the penalty and ``llds_active_fraction`` (the
    share of masked tokens penalised) and ``llds_displaced_actions`` (the share of preserving-set actions
    whose likelihood fell).
    """
    in_action = mask.bool() & (action_ids > 0)
    ids = torch.where(in_action, action_ids.long(), torch.zeros_like(action_ids, dtype=torch.long))
    drop = torch.where(in_action, old_logprobs - logprobs, torch.zeros_like(logprobs))
    token_advantages = torch.where(in_action, advantages, torch.zeros_like(advantages))
    with torch.no_grad():
        slots = int(ids.max()) + 1 if ids.numel() else 1
        per_action = drop.new_zeros(ids.shape[0], slots)
        action_drop = per_action.scatter_add(1, ids, drop.detach())
        action_advantage = per_action.scatter_add(1, ids, token_advantages.to(drop.dtype))
        action_tokens = per_action.scatter_add(1, ids, in_action.to(drop.dtype))
        is_action = action_tokens > 0
        is_action[:, 0] = False  # slot 0 collects the tokens outside every action
        preserving = is_action & (action_advantage >= 0)
        displaced = preserving & (action_drop > 0)
        penalised = displaced.gather(1, ids) & in_action & (drop > 0)
    per_token = torch.where(penalised, drop, torch.zeros_like(drop))
    penalty = masked_mean(per_token, mask, aggregation, normaliser)
    with torch.no_grad():
        stats = {
            "llds_active_fraction": masked_mean(penalised.to(drop.dtype), mask, "token"),
            "llds_displaced_actions": displaced.sum().to(drop.dtype)
            / preserving.sum().clamp(min=1).to(drop.dtype),
        }
    return penalty, stats
