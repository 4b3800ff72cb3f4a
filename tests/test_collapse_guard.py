"""Collapse monitors and their guard: the monitors in every result, bands and patience, and a run driven to
collapse by a learning rate far too high (entropy falls from ~6.1 to ~2.8 in four iterations) that the guard
stops, or rolls back to the last checkpoint saved before the breach."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.collapse import MONITORS, CollapseGuard, monitor_values
from rllib_search.algos.rollouts.record import Rollout, correct_logprob_mean
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import make_config, policy_weights


def result_with(entropy: float, valid: float = 1.0) -> dict:
    return {
        "learners": {"default_policy": {"entropy": entropy, "kl": 0.01}},
        "env_runners": {"valid_action_rate": valid, "episode_return_mean": 0.3, "searches_per_episode": 1.0},
    }


def test_monitor_values_reads_every_monitor_the_result_holds():
    values = monitor_values(result_with(2.5))
    assert values == {"entropy": 2.5, "kl": 0.01, "valid_actions": 1.0, "reward": 0.3, "searches": 1.0}
    assert monitor_values({"learners": {"default_policy": {"entropy": float("nan")}}}) == {}
    assert set(MONITORS) >= {"entropy", "response_tokens", "correct_likelihood", "format_valid", "kl"}


def test_a_breach_needs_patience_iterations_in_a_row_and_is_recorded():
    guard = CollapseGuard(bands={"entropy": (1.0, None), "valid_actions": (0.5, 1.0)}, patience=2)
    results = [result_with(2.0), result_with(0.5), result_with(2.0), result_with(0.5), result_with(0.4)]
    actions = []
    for iteration, result in enumerate(results, start=1):
        actions.append(guard.check(result, iteration))
    assert actions == [None, None, None, None, "warn"]
    assert results[-1]["collapse"]["breaches"] == 1 and results[-1]["collapse"]["breached"] == "entropy"
    assert results[0]["collapse"]["entropy"] == 2.0 and results[0]["collapse"]["breaches"] == 0
    assert guard.first_bad_iteration == 4


def test_rollbacks_turn_into_a_stop_after_max_rollbacks():
    guard = CollapseGuard(bands={"entropy": (1.0, None)}, on_breach="rollback", max_rollbacks=1)
    assert guard.check(result_with(0.5), 3) == "rollback"
    guard.rolled_back()
    assert guard.first_bad_iteration is None
    assert guard.check(result_with(0.5), 3) == "stop"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"bands": {"entropyy": (0.1, None)}}, "unknown monitors"),
        ({"on_breach": "panic"}, "on_breach"),
        ({"bands": {"kl": (1.0, 0.5)}}, "empty"),
        ({"patience": 0}, "patience"),
    ],
)
def test_bad_guard_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        CollapseGuard(**settings)


def test_rollback_needs_periodic_checkpoints():
    config = SearchGRPOConfig().collapse_guard(bands={"entropy": (0.1, None)}, on_breach="rollback")
    with pytest.raises(ValueError, match="needs periodic checkpoints"):
        config.validate_collapse_guard()


def test_correct_likelihood_is_the_mean_logprob_of_correct_episodes_only():
    def episode(answer: str, logprobs: list[float]) -> Rollout:
        n = len(logprobs)
        return Rollout(
            token_ids=np.arange(n + 2),
            loss_mask=np.array([0, 0] + [1] * n),
            logprobs=np.array([np.nan, np.nan, *logprobs]),
            prompt_length=2,
            turn_spans=[(2, n + 2)],
            reward=0.0,
            reward_components={},
            group_id="g",
            uid="u",
            data_source="test",
            weights_version=0,
            terminated=True,
            truncated=False,
            answer=answer,
            golden_answers=["Paris"],
        )

    rollouts = [episode("Paris", [-1.0, -3.0]), episode("paris", [-0.5]), episode("Rome", [-9.0])]
    assert correct_logprob_mean(rollouts) == pytest.approx((-2.0 + -0.5) / 2)
    assert correct_logprob_mean(rollouts[2:]) is None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("collapse_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def collapsing_config(tiny_model, world, corpus):
    """lr 0.5: the tiny policy's entropy falls below 5 on the third iteration (seeded)."""
    return make_config(SearchGRPOConfig, tiny_model, world, corpus, lr=0.5)


@pytest.mark.slow
def test_a_run_driven_to_collapse_is_stopped(ray_cluster, tiny_model, world, corpus):
    config = collapsing_config(tiny_model, world, corpus).collapse_guard(
        bands={"entropy": (5.0, None)}, on_breach="stop"
    )
    algo = config.build_algo()
    entropies, displaced, done = [], [], False
    try:
        while not done and len(entropies) < 6:
            result = algo.train()
            entropies.append(result["collapse"]["entropy"])
            displaced.append(result["collapse"]["displaced_actions"])  # measured without LLDS's penalty
            done = bool(result.get("done"))
    finally:
        algo.stop()
    assert done and entropies[-1] < 5.0 and all(e >= 5.0 for e in entropies[:-1]), entropies
    assert result["collapse"]["breached"] == "entropy"
    assert all(0.0 <= share <= 1.0 for share in displaced), displaced


@pytest.mark.slow
def test_a_run_driven_to_collapse_rolls_back_to_the_last_good_checkpoint(
    ray_cluster, tiny_model, world, corpus, tmp_path
):
    config = (
        collapsing_config(tiny_model, world, corpus)
        .checkpointing(directory=str(tmp_path / "ckpt"), every_n_iterations=1, keep_last=0)
        .collapse_guard(bands={"entropy": (5.0, None)}, on_breach="rollback", max_rollbacks=1)
    )
    algo = config.build_algo()
    good: dict[int, dict] = {}
    results = []
    try:
        for _ in range(6):
            result = algo.train()
            results.append(result)
            if result["collapse"]["breaches"] == 0:
                good[algo.iteration] = policy_weights(algo)
            else:
                break
        rolled = results[-1]["collapse"]["rolled_back_to"]
        assert rolled.endswith(f"checkpoint_{algo.iteration:06d}") and algo.iteration in good
        # The weights are the last good iteration's again, and no checkpoint of the collapsed one was kept.
        restored = policy_weights(algo)
        assert all(restored[k].equal(good[algo.iteration][k]) for k in restored)
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("checkpoint_")) == [
            f"checkpoint_{i:06d}" for i in sorted(good)
        ]
        # It collapses again the same way; with its one rollback spent, the guard stops the run.
        while not results[-1].get("done") and len(results) < 10:
            results.append(algo.train())
    finally:
        algo.stop()
    assert results[-1].get("done") and results[-1]["collapse"]["breaches"] == 1
