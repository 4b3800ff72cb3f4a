"""The policy-loss variants (``training(policy_loss=...)``) against hand-written references on a small batch:
GSPO's sequence ratios, Dr. GRPO's constant normaliser, DAPO's clip-higher, token-level loss and overlong
penalty; retrieved tokens stay out of every ratio, length and normaliser; and one learner update with each."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.config import POLICY_LOSSES
from rllib_search.algos.learners.advantages import overlong_penalty
from rllib_search.algos.learners.batching import micro_batch_weights
from rllib_search.algos.learners.losses import clipped_policy_loss, masked_mean, sequence_policy_loss

# Three sequences of 6 positions: generated tokens (1), a retrieved passage in the middle of the first (0),
# and a third that generated nothing.
MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ],
    dtype=torch.float32,
)
ADVANTAGES = torch.tensor([0.8, -0.5, 1.0]).unsqueeze(-1).expand(3, 6).contiguous()


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 6, generator=generator) * 2
    new = (old + torch.randn(3, 6, generator=generator) * 0.3).requires_grad_(True)
    return new, old


def rows(mask: torch.Tensor) -> list[list[int]]:
    return [[t for t in range(mask.shape[1]) if mask[b, t] > 0] for b in range(mask.shape[0])]


def reference_gspo(new, old, advantages, mask, low, high):
    """GSPO eq. 5-7 written out sequence by sequence."""
    terms = []
    for b, tokens in enumerate(rows(mask)):
        if not tokens:
            continue
        ratio = torch.exp(sum(new[b, t] - old[b, t] for t in tokens) / len(tokens))
        advantage = advantages[b, tokens[0]]
        terms.append(-torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - low, 1 + high) * advantage))
    return sum(terms) / len(terms)


def reference_token_surrogate(new, old, advantages, mask, low, high, aggregation, normaliser=None):
    """The per-token clipped surrogate, aggregated over sequences, tokens or one constant, by loops."""
    per_token = {}
    for b, tokens in enumerate(rows(mask)):
        for t in tokens:
            ratio = torch.exp(new[b, t] - old[b, t])
            a = advantages[b, t]
            per_token[b, t] = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
    sequences = [tokens for tokens in rows(mask) if tokens]
    if aggregation == "token":
        return sum(per_token.values()) / len(per_token)
    sums = [sum(per_token[b, t] for t in tokens) for b, tokens in enumerate(rows(mask)) if tokens]
    if aggregation == "constant":
        return sum(s / normaliser for s in sums) / len(sequences)
    return sum(s / len(tokens) for s, tokens in zip(sums, sequences)) / len(sequences)


def grad_of(loss: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, new)
    return grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_matches_its_sequence_by_sequence_reference_in_value_and_gradient(seed):
    new, old = batch(seed)
    for low, high in ((3e-4, 4e-4), (0.05, 0.1)):
        loss, stats = sequence_policy_loss(new, old, ADVANTAGES, MASK, low, high)
        reference = reference_gspo(new, old, ADVANTAGES, MASK, low, high)
        assert loss.item() == pytest.approx(reference.item(), rel=1e-6, abs=1e-7)
        assert torch.allclose(grad_of(loss, new), grad_of(reference, new), atol=1e-6)
        assert 0.0 <= stats["clip_fraction"].item() <= 1.0


def test_gspo_clips_whole_sequences():
    """A sequence whose mean log-ratio is beyond the clip range trains no token; one inside trains all."""
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.5, 0.5], [1e-5, -1e-5, 0.0]], requires_grad=True)
    mask, advantages = torch.ones(2, 3), torch.ones(2, 3)
    loss, stats = sequence_policy_loss(new, old, advantages, mask, 3e-4, 4e-4)
    grad = grad_of(loss, new)
    assert torch.all(grad[0] == 0) and torch.all(grad[1] != 0)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
def test_the_token_surrogate_matches_its_reference_with_clip_higher(aggregation):
    new, old = batch(3)
    normaliser = 10.0 if aggregation == "constant" else None
    loss, _ = clipped_policy_loss(new, old, ADVANTAGES, MASK, 0.2, aggregation, 0.28, normaliser)
    reference = reference_token_surrogate(new, old, ADVANTAGES, MASK, 0.2, 0.28, aggregation, normaliser)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert torch.allclose(grad_of(loss, new), grad_of(reference, new), atol=1e-6)


def test_clip_higher_lets_a_positive_token_rise_further_than_it_may_fall():
    """DAPO's asymmetric range: a ratio of 1.25 still trains under clip_high 0.28, not under 0.2."""
    old = torch.zeros(1, 1)
    new = torch.tensor([[math.log(1.25)]], requires_grad=True)
    mask, advantages = torch.ones(1, 1), torch.ones(1, 1)
    symmetric, _ = clipped_policy_loss(new, old, advantages, mask, 0.2, "token")
    higher, _ = clipped_policy_loss(new, old, advantages, mask, 0.2, "token", clip_high=0.28)
    assert grad_of(symmetric, new).item() == 0.0 and grad_of(higher, new).item() != 0.0


@pytest.mark.parametrize("variant", ["gspo", "token", "sequence", "constant"])
def test_retrieved_tokens_change_no_ratio_length_or_normaliser(variant):
    """Whatever sits at the retrieved positions (log-probs, advantages), the loss and its gradient are the
    same: retrieved tokens enter no ratio, no length and no normaliser."""
    new, old = batch(4)
    garbage_new = new.detach().clone()
    garbage_old = old.clone()
    retrieved = MASK == 0
    garbage_new[retrieved] = -50.0
    garbage_old[retrieved] = 30.0
    garbage_new.requires_grad_(True)

    def loss_of(n, o):
        if variant == "gspo":
            return sequence_policy_loss(n, o, ADVANTAGES, MASK, 0.1, 0.2)[0]
        return clipped_policy_loss(n, o, ADVANTAGES, MASK, 0.2, variant, 0.28, 7.0)[0]

    clean, dirty = loss_of(new, old), loss_of(garbage_new, garbage_old)
    assert clean.item() == pytest.approx(dirty.item(), rel=1e-6)
    assert torch.allclose(grad_of(clean, new)[~retrieved], grad_of(dirty, garbage_new)[~retrieved])
    assert torch.all(grad_of(loss_of(garbage_new, garbage_old), garbage_new)[retrieved] == 0)


def test_constant_aggregation_accumulates_over_micro_batches_like_the_whole_batch():
    """Micro-batches weighted by their sequences give the whole mini-batch's Dr. GRPO loss."""
    values = torch.randn(3, 6, generator=torch.Generator().manual_seed(5))
    whole = masked_mean(values, MASK, "constant", 8.0)
    parts = [(values[:2], MASK[:2]), (values[2:], MASK[2:])]
    weights = micro_batch_weights([m for _, m in parts], "constant")
    accumulated = sum(w * masked_mean(v, m, "constant", 8.0) for w, (v, m) in zip(weights, parts))
    assert accumulated.item() == pytest.approx(whole.item(), rel=1e-6)
    assert whole.item() == pytest.approx(float((values * MASK).sum() / 8.0 / 2), rel=1e-6)


def test_dapo_overlong_penalty_follows_eq_13():
    """0 up to L_max - L_cache, linear down to -1 at L_max, -1 beyond (generated tokens only)."""
    lengths = [0, 80, 81, 90, 100, 101, 500]
    penalty = overlong_penalty(lengths, max_tokens=100, buffer_tokens=20)
    expected = [0.0, 0.0, -1 / 20, -10 / 20, -1.0, -1.0, -1.0]
    np.testing.assert_allclose(penalty, expected)
    with pytest.raises(ValueError, match="buffer_tokens"):
        overlong_penalty(lengths, max_tokens=100, buffer_tokens=0)


def test_each_policy_loss_brings_its_settings_unless_the_call_sets_them():
    gspo = SearchGRPOConfig().training(policy_loss="gspo")
    assert (gspo.clip_param, gspo.clip_param_high, gspo.loss_aggregation) == (3e-4, 4e-4, "sequence")
    dr = SearchGRPOConfig().training(policy_loss="dr_grpo")
    assert dr.scale_by_std is False and dr.loss_aggregation == "constant"
    dapo = SearchGRPOConfig().training(policy_loss="dapo", clip_param_high=0.3)
    assert (dapo.clip_param, dapo.clip_param_high, dapo.loss_aggregation) == (0.2, 0.3, "token")
    assert dapo.overlong_buffer_fraction == 0.2
    plain = SearchGRPOConfig()
    assert (
        plain.policy_loss == "grpo"
        and plain.clip_param_high is None
        and set(POLICY_LOSSES)
        == {
            "grpo",
            "gspo",
            "dr_grpo",
            "dapo",
        }
    )
    # The response budget the constant normaliser and the overlong penalty use: every turn at its budget.
    env = {"max_turns": 3}
    budget = (
        SearchGRPOConfig().environment(env_config=env).rollouts(max_turn_tokens=64).response_token_budget()
    )
    assert budget == 3 * 64
    assert SearchGRPOConfig().training(max_response_tokens=100).response_token_budget() == 100


def test_unknown_policy_loss_and_bad_settings_are_refused():
    from rllib_search.env.search_env import ENV_ID

    def validated(**training):
        config = SearchGRPOConfig().environment(ENV_ID, env_config={"dataset": []}).training(**training)
        config.validate_training()

    with pytest.raises(ValueError, match="policy_loss"):
        validated(policy_loss="ppo2")
    with pytest.raises(ValueError, match="clip_param_high"):
        validated(clip_param_high=-0.1)
    with pytest.raises(ValueError, match="overlong_buffer_fraction"):
        validated(overlong_buffer_fraction=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
def test_one_update_with_each_policy_loss_raises_the_advantaged_episode(
    policy_loss, ray_cluster, tmp_path_factory, world, corpus
):
    """A real learner update (the tiny model, teacher episodes with retrieved passages between turns):
    under every variant the episode with the positive advantage becomes likelier, and more so than the
    one with the negative advantage; the loss is finite."""
    from rllib_search.algos.algorithm import train_batch
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
    from rllib_search.env.search_env import SearchEnvConfig
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
    from rllib_search.serve.retrieval.bm25 import BM25Retriever
    from tests.helpers import ENV_SETTINGS, generated_logprobs, make_config

    root = tmp_path_factory.mktemp(f"policy_loss_{policy_loss}")
    model_dir = str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))
    env = SearchEnvConfig.from_dict(ENV_SETTINGS)
    rollouts = teacher_rollouts(
        load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:2], env
    )
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, old_logprobs="recompute")
    algo = config.training(policy_loss=policy_loss).build_algo()
    learner = algo.learner_group._learner
    batch = train_batch(rollouts, algo.config, 0)
    batch.policy_batches["default_policy"]["episode_advantages"] = np.asarray([1.0, -1.0], dtype=np.float32)
    before = generated_logprobs(learner, batch)
    results = learner.update(batch=batch)
    after = generated_logprobs(learner, batch)
    algo.stop()
    # Teacher episodes share most of their tokens (tags, the protocol's words): with a token-level loss the
    # positive episode's gain lifts those in the negative one too, so the check is on the difference.
    gains = [a - b for a, b in zip(after, before)]
    assert gains[0] > 0 and gains[0] > gains[1], (policy_loss, before, after)
    assert np.isfinite(float(np.asarray(results["default_policy"]["policy_loss"].peek())))
