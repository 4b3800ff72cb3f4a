"""Masked loss terms: observation tokens give exactly zero gradient, KL is 0 at initialisation, the clipped
surrogate matches a hand computation, and one step raises the log-prob of positively-advantaged tokens."""

from __future__ import annotations

import pytest
import torch

from rllib_search.algos.learners.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    kl_estimate,
    masked_mean,
)

MASK = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 0, 0]])


def test_masked_mean_aggregations():
    values = torch.tensor([[9.0, 1.0, 2.0, 9.0, 9.0, 3.0], [9.0, 9.0, 4.0, 6.0, 9.0, 9.0]])
    assert masked_mean(values, MASK, "sequence") == pytest.approx((2.0 + 5.0) / 2)  # Search-R1 eq. 1
    assert masked_mean(values, MASK, "token") == pytest.approx((1 + 2 + 3 + 4 + 6) / 5)
    assert masked_mean(values, torch.zeros_like(MASK)) == 0.0


def test_observation_tokens_get_exactly_zero_gradient():
    logprobs = torch.randn(2, 6, requires_grad=True)
    old = logprobs.detach() + 0.1 * torch.randn(2, 6)
    old[~MASK.bool()] = float("inf")  # garbage off the mask must not leak (0 * inf would be NaN)
    ref = torch.randn(2, 6)
    advantages = torch.randn(2, 6)
    loss, _ = clipped_policy_loss(logprobs, old, advantages, MASK)
    loss = loss + 0.001 * masked_mean(kl_estimate(logprobs, ref, "k3"), MASK)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(logprobs.grad[~MASK.bool()] == 0)
    assert torch.any(logprobs.grad[MASK.bool()] != 0)


def test_kl_is_zero_at_initialisation_and_k3_is_non_negative():
    logprobs = torch.randn(3, 5)
    for kind in ("k1", "k3"):
        assert torch.all(kl_estimate(logprobs, logprobs.clone(), kind) == 0)
    assert torch.all(kl_estimate(logprobs, torch.randn(3, 5), "k3") >= 0)


def test_clipped_surrogate_by_hand():
    mask = torch.tensor([[1, 1]])
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.8, 0.2]]))  # ratios 1.6 and 0.4
    advantages = torch.tensor([[1.0, 1.0]])
    loss, stats = clipped_policy_loss(new, old, advantages, mask, clip=0.2)
    # min(1.6, 1.2) * 1 = 1.2 ; min(0.4, 0.8) * 1 = 0.4 -> loss = -(1.2 + 0.4) / 2
    assert loss.item() == pytest.approx(-0.8)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


def test_one_update_raises_positively_advantaged_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 10, requires_grad=True)
    tokens = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 1]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])

    def token_logprobs():
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    before = token_logprobs().detach()
    loss, _ = clipped_policy_loss(token_logprobs(), before, advantages, mask)
    loss.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    after = token_logprobs().detach()
    assert torch.all((after - before)[advantages > 0] > 0)
    assert torch.all((after - before)[advantages < 0] < 0)


def test_clipped_value_loss_by_hand():
    mask = torch.tensor([[1, 1, 0]])
    values = torch.tensor([[1.0, 0.0, 5.0]])
    old_values = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    # token 0: max((1-1)^2, (0.2-1)^2) = 0.64 ; token 1: max(1, 1) = 1 ; token 2 masked
    assert clipped_value_loss(values, old_values, returns, mask).item() == pytest.approx(0.5 * (0.64 + 1) / 2)


def test_k3_is_clamped_per_token_so_one_tail_sample_cannot_dominate():
    logprobs = torch.tensor([[-20.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    k3 = kl_estimate(logprobs, ref, "k3")
    assert k3[0, 0] == 10.0 and k3[0, 1] == 0.0
    assert kl_estimate(logprobs, ref, "k1")[0, 0] == -19.0
