"""Rollouts to learner tensors: the shift by one is right, and the module's log-probs of the sampled tokens
equal the sampler's own (temperature 1): the learner sees exactly what the sampler produced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_search import ENV_ID
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.learners.batching import broadcast_to_tokens, pad_rollouts
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.llm.tiny import build_tiny_causal_lm


def rollout(ids, mask, logprobs, reward=1.0) -> Rollout:
    return Rollout(
        np.array(ids),
        np.array(mask, dtype=np.int8),
        np.array(logprobs, dtype=np.float32),
        2,
        [],
        reward,
        {},
        "g",
        "u",
        "d",
        0,
        True,
        False,
        None,
        [],
    )


def test_shift_by_one_and_padding():
    nan = float("nan")
    batch = pad_rollouts(
        [
            rollout([5, 6, 7, 8], [0, 0, 1, 1], [nan, nan, -0.5, -0.25]),
            rollout([5, 6, 9], [0, 0, 1], [nan, nan, -1.0], reward=0.0),
        ],
        pad_token_id=3,
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [5, 6, 9, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    # position t scores token t+1
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    assert batch["old_logprobs"].tolist() == [[0.0, -0.5, -0.25], [0.0, -1.0, 0.0]]
    assert batch["rewards"].tolist() == [1.0, 0.0]
    assert broadcast_to_tokens([2.0, -1.0], batch["loss_mask"]).tolist() == [[0, 2, 2], [0, -1, 0]]
    with pytest.raises(ValueError):
        pad_rollouts([])


@pytest.mark.slow
def test_module_logprobs_of_sampled_tokens_equal_the_samplers(tmp_path, world, retriever):
    model_dir = build_tiny_causal_lm(tmp_path / "model")
    config = (
        SearchConfig()
        .environment(
            ENV_ID,
            env_config={
                "retriever": retriever,
                "dataset": world.train,
                "max_turns": 3,
                "max_total_tokens": 900,
                "max_obs_tokens": 100,
            },
        )
        .rl_module(model_config={"model": str(model_dir)})
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=20, temperature=1.0, top_p=1.0)
        .debugging(seed=0)
    )
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    batch = pad_rollouts(rollouts, pad_token_id=runner.tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = runner.module.forward_train(batch)["logprobs"]
    mask = batch["loss_mask"].bool()
    assert mask.sum() == sum(r.num_generated_tokens for r in rollouts)
    torch.testing.assert_close(logprobs[mask], batch["old_logprobs"][mask], atol=1e-4, rtol=1e-4)
