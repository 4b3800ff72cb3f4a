"""Reward schedules (R1-Searcher's two stages): when a stage ends, that a real run switches rewards at the
configured point, that a stage's own questions are drawn, and that the stage survives checkpoint/resume."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.algorithm import Algorithm

from rllib_search import ENV_ID
from rllib_search.algos import SearchReinforcePPConfig
from rllib_search.algos.rollouts.reward_schedule import RewardSchedule, RewardStage
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

STAGE1_COMPONENTS = {"retrieval", "format", "f1"}
STAGE2_COMPONENTS = {"f1", "format", "searched"}


def test_a_stage_ends_after_its_iterations():
    schedule = RewardSchedule(
        [{"reward": "r1_searcher_stage1", "iterations": 2}, {"reward": "r1_searcher_stage2"}]
    )
    assert [schedule.observe(lambda _: None) for _ in range(4)] == [False, True, False, False]
    assert schedule.index == 1 and schedule.stage.reward == "r1_searcher_stage2"


def test_a_stage_ends_when_its_metric_holds_for_patience_iterations():
    values = iter([0.2, 0.6, 0.3, 0.6, 0.7, 0.9])
    schedule = RewardSchedule(
        [
            RewardStage(
                "r1_searcher_stage1", metric="env_runners/reward/retrieval", threshold=0.5, patience=2
            ),
            RewardStage("r1_searcher_stage2"),
        ]
    )
    seen = []
    switched = [schedule.observe(lambda name: seen.append(name) or next(values)) for _ in range(5)]
    assert switched == [False, False, False, False, True]  # 0.6 then 0.3 breaks the streak; 0.6, 0.7 holds
    assert seen == ["env_runners/reward/retrieval"] * 5
    # A missing metric never counts as reached; iterations and metric together: whichever comes first.
    schedule = RewardSchedule(
        [
            RewardStage("search_r1", iterations=3, metric="m", threshold=1.0),
            RewardStage("r1_searcher_stage2"),
        ]
    )
    assert [schedule.observe(lambda _: None) for _ in range(3)] == [False, False, True]


def test_schedules_are_checked_and_their_state_round_trips():
    with pytest.raises(ValueError, match="unknown reward"):
        RewardStage("no_such_reward")
    with pytest.raises(ValueError, match="metric and threshold"):
        RewardStage("search_r1", metric="m")
    with pytest.raises(ValueError, match="needs iterations or metric"):
        RewardSchedule([{"reward": "r1_searcher_stage1"}, {"reward": "r1_searcher_stage2"}])
    schedule = RewardSchedule([{"reward": "search_r1", "iterations": 1}, {"reward": "r_search"}])
    schedule.observe(lambda _: None)
    other = RewardSchedule([{"reward": "search_r1", "iterations": 1}, {"reward": "r_search"}])
    other.set_state(schedule.get_state())
    assert other.index == 1 and other.get_state() == schedule.get_state()
    with pytest.raises(ValueError, match="schedule has 1"):
        RewardSchedule([{"reward": "search_r1"}]).set_state(
            {"index": 1, "iterations_in_stage": 0, "streak": 0}
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("schedule_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def two_stage_config(model_dir, world, corpus, stage2_dataset=None):
    env_config = {
        "retriever": {"type": "bm25", "corpus": corpus},
        "dataset": world.train[:10],
        "protocol": "r1_searcher",
        "max_turns": 2,
        "max_total_tokens": 700,
        "max_obs_tokens": 60,
    }
    return (
        SearchReinforcePPConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model_dir})
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=8)
        .training(lr=1e-3, micro_batch_size=2)
        .reward_schedule(
            stages=[
                {"reward": "r1_searcher_stage1", "iterations": 2},
                {"reward": "r1_searcher_stage2", "dataset": stage2_dataset},
            ]
        )
        .debugging(seed=4)
    )


@pytest.mark.slow
def test_the_run_switches_rewards_at_the_configured_point_and_resumes_in_its_stage(
    ray_cluster, model_dir, world, corpus, tmp_path
):
    stage2_questions = world.test[:3]
    algo = two_stage_config(model_dir, world, corpus, stage2_dataset=stage2_questions).build_algo()
    try:
        stages, components = [], []
        for _ in range(2):
            runners = algo.train()["env_runners"]
            stages.append(runners["reward_stage"])
            components.append(set(runners["reward"]))
        assert stages == [0, 0] and all(c == STAGE1_COMPONENTS for c in components)
        assert algo.reward_schedule.index == 1  # decided at the end of iteration 2
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
        runners = algo.train()["env_runners"]
        assert runners["reward_stage"] == 1 and set(runners["reward"]) == STAGE2_COMPONENTS
        # Stage 2 draws its own questions.
        drawn = {r.uid for r in algo.env_runner.sample(num_prompts=3)}
        assert drawn <= {r.uid for r in stage2_questions}
    finally:
        algo.stop()

    resumed = Algorithm.from_checkpoint(checkpoint)
    try:
        assert resumed.reward_schedule.get_state() == {"index": 1, "iterations_in_stage": 0, "streak": 0}
        runners = resumed.train()["env_runners"]
        assert runners["reward_stage"] == 1 and set(runners["reward"]) == STAGE2_COMPONENTS
        drawn = {r.uid for r in resumed.env_runner.sample(num_prompts=3)}
        assert drawn <= {r.uid for r in stage2_questions}
    finally:
        resumed.stop()
