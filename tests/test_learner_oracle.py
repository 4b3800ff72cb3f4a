"""One SearchTorchLearner update against independent oracles: the plain torch loop of
``benchmarks/learner_bench.py`` (weights after one update), and hand-written GRPO, GAE and REINFORCE++
token advantages of the batch the learner prepares (training's own path through ``advantages.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from benchmarks.learner_bench import RawLoop, build_learner, search_batch
from rllib_search.algos import SearchGRPOConfig, SearchPPOConfig, SearchReinforcePPConfig
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("oracle_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def vocab_of(model_dir: str) -> int:
    from rllib_search.llm.models import load_tokenizer

    return len(load_tokenizer(model_dir))


def as_multi(batch: dict[str, np.ndarray]) -> MultiAgentBatch:
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["rewards"]))


@pytest.mark.parametrize("group_size", [1, 3], ids=["own-prompts", "shared-prompts"])
def test_one_learner_update_equals_the_plain_torch_loop(model_dir, group_size):
    """The plain loop runs every row's whole sequence in the given order; the learner buckets rows by
    length and, where rows share a prompt, reads it once (``shared_prompt.py``): the update is the same."""
    torch.manual_seed(0)
    batch = search_batch(rows=6, length=160, vocab=vocab_of(model_dir), seed=1, group_size=group_size)
    learner = build_learner(model_dir, micro=4, kl_coeff=0.0, lr=1e-3)
    raw = RawLoop(model_dir, micro=4, masked=True, lr=1e-3)
    before = {k: v.detach().clone() for k, v in raw.model.state_dict().items()}
    results = learner.update(batch=as_multi(batch))
    raw.update(batch)
    savings = results[DEFAULT_MODULE_ID]["shared_prompt_savings"]
    assert (savings > 0.1) if group_size > 1 else (savings == 0)
    assert 0 <= results[DEFAULT_MODULE_ID]["padding_fraction"] < 0.5
    trained = learner.module[DEFAULT_MODULE_ID].unwrapped().model.state_dict()
    changed = 0
    for name, expected in raw.model.state_dict().items():
        torch.testing.assert_close(trained[name], expected, atol=2e-6, rtol=1e-4)
        changed += int(not torch.equal(expected, before[name]))
    assert changed > 0


def build(config_cls, model_dir: str, **training):
    model_config = {"model": model_dir}
    if config_cls is SearchPPOConfig:
        model_config["value_head"] = True
    config = config_cls().rl_module(model_config=model_config).training(micro_batch_size=2, **training)
    space = spaces.Sequence(spaces.Discrete(vocab_of(model_dir)), stack=True)
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (space, space)})


def prepared(learner, batch) -> dict[str, np.ndarray]:
    columns = learner.prepare_batch(as_multi(batch)).policy_batches[DEFAULT_MODULE_ID]
    return {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}


def token_kl_k1(columns) -> np.ndarray:
    return columns["old_logprobs"] - columns["ref_logprobs"]


def returns_by_loop(rewards: np.ndarray, mask: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Sum of the remaining rewards over generated tokens (gamma = 1), minus the value when given."""
    out = np.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        positions = [t for t in range(rewards.shape[1]) if mask[row, t]]
        for i, t in enumerate(positions):
            out[row, t] = sum(rewards[row, u] for u in positions[i:])
            if values is not None:
                out[row, t] -= values[row, t]
    return out


def whiten_by_hand(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    picked = values[mask > 0]
    return np.where(mask > 0, (values - picked.mean()) / (picked.std() + 1e-8), 0.0)


def outcome_rewards(columns, mask, kl_coeff) -> np.ndarray:
    rewards = -kl_coeff * token_kl_k1(columns) * mask
    for row in range(mask.shape[0]):
        last = np.flatnonzero(mask[row])[-1]
        rewards[row, last] += columns["episode_advantages"][row]
    return rewards


def test_grpo_token_advantages_are_the_episode_advantage_on_generated_tokens(model_dir):
    batch = search_batch(rows=4, length=96, vocab=vocab_of(model_dir), seed=2)
    columns = prepared(build(SearchGRPOConfig, model_dir), batch)
    mask = columns["loss_mask"]
    expected = columns["episode_advantages"][:, None] * mask
    np.testing.assert_allclose(columns["advantages"], expected, rtol=1e-6, atol=1e-7)
    assert "returns" not in columns and "ref_logprobs" in columns


def test_reinforce_pp_token_advantages_as_trained(model_dir):
    batch = search_batch(rows=4, length=96, vocab=vocab_of(model_dir), seed=3)
    learner = build(SearchReinforcePPConfig, model_dir, kl_coeff=0.05, kl_estimator="k1", kl_in_reward=True)
    columns = prepared(learner, batch)
    mask = columns["loss_mask"]
    assert np.abs(token_kl_k1(columns) * mask).sum() > 0  # the sampler's log-probs differ from the reference
    expected = whiten_by_hand(returns_by_loop(outcome_rewards(columns, mask, 0.05), mask), mask)
    np.testing.assert_allclose(columns["advantages"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("whiten", [False, True], ids=["raw", "whitened"])
def test_gae_token_advantages_as_trained(model_dir, whiten):
    batch = search_batch(rows=4, length=96, vocab=vocab_of(model_dir), seed=4)
    learner = build(SearchPPOConfig, model_dir, kl_coeff=0.05, kl_estimator="k1", whiten_advantages=whiten)
    with torch.no_grad():  # a critic that is not zero, so that values enter the advantages
        learner.policy().value_head.bias.fill_(0.3)
    columns = prepared(learner, batch)
    mask = columns["loss_mask"]
    values = columns["old_values"]
    assert np.allclose(values[mask > 0], 0.3, atol=1e-5)
    rewards = outcome_rewards(columns, mask, 0.05)
    advantages = returns_by_loop(rewards, mask, values)
    np.testing.assert_allclose(columns["returns"], (advantages + values) * mask, rtol=1e-4, atol=1e-5)
    expected = whiten_by_hand(advantages, mask) if whiten else advantages
    np.testing.assert_allclose(columns["advantages"], expected, rtol=1e-4, atol=1e-5)
