"""LLDS, the likelihood-preserving regulariser (``losses.llds_penalty``): its gates, its gradient, its
actions as the learner builds them from a batch's ``turn_index``, and the loss with it switched off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.config import POLICY_LOSSES
from rllib_search.algos.learners.batching import broadcast_to_tokens, pad_rollouts
from rllib_search.algos.learners.losses import contiguous_actions, llds_penalty
from rllib_search.algos.learners.torch_learner import SearchTorchLearner
from rllib_search.algos.rollouts.record import Rollout

# Two rows of (B, T-1) positions: a generated turn, an observation token, a second generated turn.
MASK = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 1, 1, 0, 1, 1]], dtype=torch.float32)
TURNS = torch.tensor([[0, 1, 1, 0, 2, 2], [0, 1, 1, 0, 2, 2]])


def penalty_of(drops, row_advantages, action_ids=TURNS, aggregation="token"):
    """LLDS on log-probs that fell by ``drops`` (log pi_old - log pi) since sampling, with the rows'
    advantages on their masked tokens; returns the penalty, its stats and the log-probs (a leaf)."""
    old = torch.zeros(MASK.shape)
    logprobs = (old - torch.tensor(drops)).requires_grad_(True)
    advantages = torch.tensor(row_advantages, dtype=torch.float32)[:, None] * MASK
    penalty, stats = llds_penalty(logprobs, old, advantages, MASK, action_ids, aggregation)
    return penalty, stats, logprobs


def test_no_action_whose_likelihood_fell_means_no_penalty_and_no_gradient():
    drops = [[0.0, -0.1, 0.0, 0.0, -0.3, 0.0], [0.0, 0.0, -0.2, 0.0, 0.0, -0.5]]
    penalty, stats, logprobs = penalty_of(drops, [1.0, 0.0])
    penalty.backward()
    assert float(penalty) == 0.0
    assert float(stats["llds_active_fraction"]) == 0.0 and float(stats["llds_displaced_actions"]) == 0.0
    assert torch.count_nonzero(logprobs.grad) == 0


def test_only_the_falling_tokens_of_a_displaced_preserving_turn_are_penalised():
    drops = [
        # turn 1 fell in sum (0.5 - 0.2): its falling token is penalised, its rising one is not;
        # turn 2 rose in sum (0.1 - 0.6): its falling token is left alone.
        [0.0, 0.5, -0.2, 0.0, 0.1, -0.6],
        # every token fell, but the episode has a negative advantage: outside the preserving set.
        [0.0, 0.3, 0.3, 0.0, 0.3, 0.3],
    ]
    penalty, stats, logprobs = penalty_of(drops, [1.0, -1.0])
    penalty.backward()
    assert float(penalty) == pytest.approx(0.5 / 8)  # token mean over the 8 masked tokens
    assert float(stats["llds_active_fraction"]) == pytest.approx(1 / 8)
    assert float(stats["llds_displaced_actions"]) == pytest.approx(1 / 2)  # row 0's two turns
    expected = torch.zeros(MASK.shape)
    expected[0, 1] = -1 / 8
    assert torch.allclose(logprobs.grad, expected)


def test_a_zero_advantage_turn_is_preserved():
    drops = [[0.0] * 6, [0.0, 0.4, 0.0, 0.0, 0.0, 0.0]]
    penalty, _, _ = penalty_of(drops, [1.0, 0.0])
    assert float(penalty) == pytest.approx(0.4 / 8)


def test_a_step_on_the_penalty_raises_exactly_the_penalised_tokens():
    drops = [[0.0, 0.5, -0.2, 0.0, 0.1, -0.6], [0.0, 0.3, 0.3, 0.0, 0.3, 0.3]]
    penalty, _, logprobs = penalty_of(drops, [1.0, -1.0])
    penalty.backward()
    with torch.no_grad():
        stepped = logprobs - 1.0 * logprobs.grad
    moved = (stepped - logprobs).detach()
    assert moved[0, 1] > 0
    moved[0, 1] = 0.0
    assert torch.count_nonzero(moved) == 0


def test_the_response_gate_sums_the_whole_response():
    # Turn 2's sum is exactly 0 (no fall): the action gate leaves it, the response gate (0.5 - 0.2 + 0.1 -
    # 0.1 = 0.3 > 0) takes both falling tokens of the response.
    drops = [[0.0, 0.5, -0.2, 0.0, 0.1, -0.1], [0.0] * 6]
    by_turn, _, _ = penalty_of(drops, [1.0, 1.0])
    by_response, _, _ = penalty_of(drops, [1.0, 1.0], action_ids=MASK.long())
    assert float(by_turn) == pytest.approx(0.5 / 8)
    assert float(by_response) == pytest.approx(0.6 / 8)
    # A response that rose in sum is not gated even where one turn fell.
    drops = [[0.0, 0.5, -0.2, 0.0, 0.1, -0.6], [0.0] * 6]
    assert float(penalty_of(drops, [1.0, 1.0], action_ids=MASK.long())[0]) == 0.0


def test_sequence_aggregation_and_garbage_off_the_mask():
    drops = [[float("nan"), 0.5, -0.2, float("inf"), 0.1, -0.6], [0.0, 0.3, 0.3, 0.0, 0.3, 0.3]]
    penalty, _, logprobs = penalty_of(drops, [1.0, -1.0], aggregation="sequence")
    penalty.backward()
    assert float(penalty) == pytest.approx((0.5 / 4) / 2)  # row 0's mean, averaged over the 2 rows
    assert torch.isfinite(logprobs.grad).all()


def test_contiguous_actions_number_the_runs_of_a_row():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 1], [1, 1, 0, 0, 0, 0, 0]])
    assert contiguous_actions(mask).tolist() == [[0, 1, 1, 0, 2, 0, 3], [1, 1, 0, 0, 0, 0, 0]]


def rollout(token_ids, loss_mask, turn_spans) -> Rollout:
    return Rollout(
        token_ids=np.array(token_ids),
        loss_mask=np.array(loss_mask, dtype=np.int8),
        logprobs=np.where(np.array(loss_mask) > 0, -1.0, np.nan).astype(np.float32),
        prompt_length=2,
        turn_spans=turn_spans,
        reward=1.0,
        reward_components={},
        group_id="g",
        uid="u",
        data_source="d",
        weights_version=0,
        terminated=True,
        truncated=False,
        answer=None,
        golden_answers=[],
    )


def test_the_learner_adds_llds_to_the_loss_only_when_switched_on():
    """The learner's loss on a padded batch: the turns come from ``turn_index`` (two turns with no
    observation between them stay two actions); with ``llds_coeff`` 0 the loss is the surrogate alone."""
    rollouts = [
        rollout([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 1, 1], [(2, 4), (4, 6)]),
        rollout([5, 6, 7, 8, 9, 3], [0, 0, 1, 1, 0, 1], [(2, 4), (5, 6)]),
    ]
    batch = pad_rollouts(rollouts)
    assert batch["turn_index"].tolist() == [[0, 1, 1, 2, 2], [0, 1, 1, 0, 2]]
    batch["advantages"] = torch.as_tensor(broadcast_to_tokens([1.0, -1.0], batch["loss_mask"].numpy()))
    batch["advantages"] = batch["advantages"].float()
    # Row 0: turn 1 fell (0.4 - 0.1), turn 2 rose (0.2 - 0.3); contiguous runs would merge them (sum 0.2).
    logprobs = batch["old_logprobs"] - torch.tensor([[0, 0.4, -0.1, 0.2, -0.3], [0, 0.5, 0.5, 0, 0.5]])
    fwd_out = {"logprobs": logprobs, "entropy": torch.zeros_like(logprobs)}

    def loss_with(**training):
        config = SearchGRPOConfig().training(kl_coeff=0.0, loss_aggregation="token", **training)
        return SearchTorchLearner(config=config).masked_loss(batch, fwd_out)

    off, off_stats = loss_with()
    surrogate, _ = SearchTorchLearner(
        config=SearchGRPOConfig().training(loss_aggregation="token")
    ).policy_loss(logprobs, batch, batch["loss_mask"])
    assert torch.equal(off, surrogate)
    assert "llds_penalty" not in off_stats and "llds_active_fraction" not in off_stats
    # Without the penalty the displaced share is still measured (a collapse monitor): row 0's turn 1 of 2.
    assert float(off_stats["llds_displaced_actions"]) == pytest.approx(1 / 2)
    on, on_stats = loss_with(llds_coeff=0.2)
    assert float(on_stats["llds_penalty"]) == pytest.approx(0.4 / 7)
    assert float(on - off) == pytest.approx(0.2 * 0.4 / 7)
    _, response_stats = loss_with(llds_coeff=0.2, llds_gate="response")
    assert float(response_stats["llds_penalty"]) == pytest.approx((0.4 + 0.2) / 7)


@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
def test_llds_adds_to_each_policy_loss_under_its_aggregation(policy_loss):
    rollouts = [
        rollout([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1], [(2, 4), (5, 6)]),
        rollout([5, 6, 7, 8, 9, 3], [0, 0, 1, 1, 0, 1], [(2, 4), (5, 6)]),
    ]
    batch = pad_rollouts(rollouts)
    batch["advantages"] = torch.as_tensor(broadcast_to_tokens([1.0, 0.5], batch["loss_mask"].numpy())).float()
    logprobs = batch["old_logprobs"] - torch.tensor([[0, 0.4, -0.1, 0, 0.2], [0, 0.1, 0.1, 0, -0.3]])
    fwd_out = {"logprobs": logprobs, "entropy": torch.zeros_like(logprobs)}
    settings = {"policy_loss": policy_loss, "kl_coeff": 0.0}
    off_learner = SearchTorchLearner(config=SearchGRPOConfig().training(**settings))
    on_learner = SearchTorchLearner(config=SearchGRPOConfig().training(llds_coeff=0.5, **settings))
    off, _ = off_learner.masked_loss(batch, fwd_out)
    on, stats = on_learner.masked_loss(batch, fwd_out)
    assert torch.equal(off, off_learner.policy_loss(logprobs, batch, batch["loss_mask"])[0])
    assert float(stats["llds_penalty"]) > 0
    assert float(on - off) == pytest.approx(0.5 * float(stats["llds_penalty"]))
    # Row 0's turn 1 and its turn 2, row 1's turn 1: three of the four preserving turns fell.
    assert float(stats["llds_displaced_actions"]) == pytest.approx(3 / 4)


def test_bad_llds_settings_are_refused():
    from rllib_search.env.search_env import ENV_ID

    def validated(**training):
        config = SearchGRPOConfig().environment(ENV_ID, env_config={"dataset": []}).training(**training)
        config.validate_training()

    validated(llds_coeff=0.2, llds_gate="response")
    with pytest.raises(ValueError, match="llds_coeff"):
        validated(llds_coeff=-0.1)
    with pytest.raises(ValueError, match="llds_gate"):
        validated(llds_gate="turn")
    with pytest.raises(ValueError, match="llds_coeff"):
        validated(llds_coeff=0.2, advantage_estimator="sft")


@pytest.mark.slow
def test_a_real_update_penalises_the_displaced_turns_of_the_advantaged_episode(
    ray_cluster, tmp_path_factory, world, corpus
):
    """One learner update (the tiny model, teacher episodes with retrieved passages between turns) whose
    old log-probs lie 1 above the policy's on every generated token: each turn of the positive-advantage
    episode is displaced, none of the negative one's is penalised; the turns reach the loss through the
    batch's ``turn_index``, and the metrics come back with the update's results."""
    from rllib_search.algos.algorithm import train_batch
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
    from rllib_search.env.search_env import SearchEnvConfig
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
    from rllib_search.serve.retrieval.bm25 import BM25Retriever
    from tests.helpers import ENV_SETTINGS, make_config

    root = tmp_path_factory.mktemp("llds")
    model_dir = str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))
    env = SearchEnvConfig.from_dict(ENV_SETTINGS)
    rollouts = teacher_rollouts(
        load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:2], env
    )
    assert all(len(r.turn_spans) > 1 for r in rollouts)
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, llds_coeff=0.2, num_epochs=1)
    algo = config.build_algo()
    learner = algo.learner_group._learner
    batch = train_batch(rollouts, algo.config, 0)
    columns = batch.policy_batches["default_policy"]
    columns["episode_advantages"] = np.asarray([1.0, -1.0], dtype=np.float32)
    module = learner.module["default_policy"].unwrapped()
    with torch.no_grad():
        now = module.forward_train({k: torch.as_tensor(v) for k, v in columns.items()})["logprobs"].numpy()
    columns["old_logprobs"] = ((now + 1.0) * columns["loss_mask"]).astype(np.float32)
    results = learner.update(batch=batch)["default_policy"]
    algo.stop()
    penalty = float(np.asarray(results["llds_penalty"].peek()))
    active = float(np.asarray(results["llds_active_fraction"].peek()))
    tokens = columns["loss_mask"].sum(-1)
    # Sequence aggregation: episode 0's mean fall (1) and episode 1's 0, averaged.
    assert penalty == pytest.approx(0.5, abs=1e-3)
    assert active == pytest.approx(tokens[0] / tokens.sum(), abs=1e-6)
    assert float(np.asarray(results["llds_displaced_actions"].peek())) == pytest.approx(1.0)
