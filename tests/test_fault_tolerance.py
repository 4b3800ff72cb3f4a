"""Faults in real training runs (local Ray, tiny models, real Serve): two remote EnvRunners (disjoint
shards, weight versions, aggregated metrics, every runner's data position through a checkpoint and resume)
and one of them killed mid-sample; a retriever replica killed mid-rollout; a NaN loss skipped mid-run.
The driver killed with SIGKILL and resumed is in ``test_learner.py`` (the resume test) and, through the
recipe jobs, in ``test_durable_runs.py``."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchGRPOConfig
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit
from tests.helpers import KillsItsRunnerOnce, make_config, policy_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def searching_model(tmp_path_factory, world) -> str:
    """A tiny policy taught to open its answers with a search, so that rollouts call the retriever."""
    root = tmp_path_factory.mktemp("faults_model")
    model = build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok"))
    questions = [record.question for record in world.train[:6]]
    return str(teach_to_emit(model, root / "searching", questions, "<search> capital city </search>"))


def remote_config(model: str, world, corpus: str, trigger: Path):
    config = make_config(SearchGRPOConfig, model, world, corpus).rollouts(max_turn_tokens=24)
    config.env_config["retriever"] = KillsItsRunnerOnce(corpus, str(trigger))
    return config.env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)


def on_runners(algo, fn) -> dict[int, object]:
    """``fn(runner)`` on every remote EnvRunner, by worker index."""
    pairs = algo.env_runner_group.foreach_env_runner(
        lambda runner: (runner.worker_index, fn(runner)), local_env_runner=False
    )
    return dict(pairs)


def module_weights(runner) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in runner.module.model.state_dict().items()}


def data_positions(algo) -> dict[int, dict]:
    return on_runners(algo, lambda runner: runner.get_state()["data_position"])


@pytest.mark.timing
def test_two_remote_runners_shard_sync_aggregate_resume_and_survive_a_kill(
    ray_cluster, searching_model, world, corpus, tmp_path
):
    from ray.rllib.algorithms.algorithm import Algorithm

    trigger = tmp_path / "kill-a-runner"
    algo = remote_config(searching_model, world, corpus, trigger).build_algo()
    shards = on_runners(algo, lambda runner: [record.uid for record in runner.records])
    assert sorted(shards) == [1, 2]
    assert not set(shards[1]) & set(shards[2])
    assert sorted(shards[1] + shards[2]) == sorted(record.uid for record in world.train)

    first = algo.train()
    runners = first["env_runners"]
    assert runners["num_episodes"] == 2 * 2 * 2  # two runners x 2 questions x 2 samples, summed
    assert runners["num_env_steps_sampled_lifetime"] == runners["num_env_steps_sampled"] > 0
    assert runners["searches_per_episode"] > 0 and runners["retriever_errors"] == 0
    assert runners["runner_sample_retries"] == 0 and runners["runner_samples_missing"] == 0
    assert on_runners(algo, lambda runner: runner.weights_version) == {1: 1, 2: 1}
    learner = {f"model.{k}": v.numpy() for k, v in policy_weights(algo).items()}
    for weights in on_runners(algo, module_weights).values():  # the trained weights reached both runners
        assert all(np.array_equal(weights[k], learner[f"model.{k}"]) for k in weights)

    checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
    saved_positions = data_positions(algo)
    second = algo.train()
    assert on_runners(algo, lambda runner: runner.weights_version) == {1: 2, 2: 2}
    expected_weights, expected_positions = policy_weights(algo), data_positions(algo)
    algo.stop()

    resumed = Algorithm.from_checkpoint(checkpoint)
    try:
        assert resumed.iteration == 1
        assert data_positions(resumed) == saved_positions  # every runner's own position, not the local one's
        assert on_runners(resumed, lambda runner: runner.weights_version) == {1: 1, 2: 1}

        trigger.touch()  # the next search of either runner kills it mid-sample
        result = resumed.train()
        assert Path(f"{trigger}.fired").exists(), "no runner searched: nothing was killed"
        assert result["fault_tolerance"]["num_remote_worker_restarts"] >= 1
        assert result["fault_tolerance"]["num_healthy_workers"] == 2
        runners = result["env_runners"]
        assert runners["runner_sample_retries"] == 1 and runners["runner_samples_missing"] == 0
        # The dead runner's questions were drawn again from where it stood, once: the same episodes as the
        # uninterrupted run (none twice, none lost), hence the same update and the same data positions.
        assert runners["num_episodes"] == second["env_runners"]["num_episodes"] == 8
        assert data_positions(resumed) == expected_positions
        got = policy_weights(resumed)
        for name in expected_weights:
            torch.testing.assert_close(got[name], expected_weights[name], atol=1e-6, rtol=1e-5)
        assert on_runners(resumed, lambda runner: runner.weights_version) == {1: 2, 2: 2}
    finally:
        resumed.stop()


@pytest.mark.timing
def test_retriever_replicas_killed_mid_rollout_lose_no_episode(service, searching_model, world, corpus):
    from ray import serve

    from rllib_search.serve.retrieval.deployment import APP_NAME
    from tests.helpers import KillsReplicasOnce, retriever_replicas

    config = make_config(SearchGRPOConfig, searching_model, world, corpus).rollouts(max_turn_tokens=24)
    spec = {"type": "serve", "timeout_s": 20, "max_retries": 10, "backoff_s": 0.25}
    config.env_config["retriever"] = KillsReplicasOnce(spec)
    algo = config.build_algo()
    try:
        results = [algo.train()["env_runners"] for _ in range(2)]
        killed = algo.env_runner.retriever.killed
    finally:
        algo.stop()
    assert len(killed) == 2  # both replicas died during the first iteration's first search
    for runners in results:
        assert runners["num_episodes"] == 4 and runners["searches_per_episode"] > 0
        assert runners["retriever_errors"] == 0  # every query answered: no episode saw a failed search
    # Whether a query saw the dead replicas (our client retries it: ``retriever_retries``) or Serve's router
    # held it until the new replicas came up is a race: the count is reported, its value not asserted.
    assert all(runners["retriever_retries"] >= 0 for runners in results)
    # Serve replaced them (and the session's service is whole again for the tests after this one).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = serve.status().applications[APP_NAME].deployments
        replicas = retriever_replicas()
        if all(d.status == "HEALTHY" for d in status.values()) and len(replicas) == 2:
            break
        time.sleep(1)
    assert len(replicas) == 2 and not set(replicas) & set(killed)


def test_a_nan_loss_mid_run_is_skipped_reported_and_training_goes_on(
    ray_cluster, searching_model, world, corpus, monkeypatch
):
    """A reward that turns NaN for one episode of the second iteration (a broken reward server, say)
    makes that iteration's loss NaN: the learner's guard skips the update and counts it; the next
    iteration trains as usual."""
    from rllib_search.env import rewards

    scored = []

    def nan_once(response, golds, config):
        scored.append(1)
        breakdown = rewards.search_r1_reward(response, golds, config)
        return rewards.RewardBreakdown(float("nan"), breakdown.components) if len(scored) == 5 else breakdown

    monkeypatch.setitem(rewards.REWARDS, "nan_once", (nan_once, rewards.SearchR1RewardConfig))
    config = make_config(SearchGRPOConfig, searching_model, world, corpus).rollouts(max_turn_tokens=24)
    config.env_config["reward"] = "nan_once"  # the local EnvRunner scores in this process
    algo = config.build_algo()
    try:
        learners, steps, weights = [], [], [policy_weights(algo)]
        for _ in range(3):
            learners.append(algo.train()["learners"]["default_policy"])
            steps.append(algo.learner_group._learner.optimizer_steps)
            weights.append(policy_weights(algo))
    finally:
        algo.stop()
    assert len(scored) == 12  # three iterations of 4 episodes; the 5th (iteration 2) scored NaN
    assert [row["skipped_updates"] for row in learners] == [0, 1, 0]
    assert steps == [1, 1, 2]
    unchanged = [all(torch.equal(a[k], b[k]) for k in a) for a, b in itertools.pairwise(weights)]
    assert unchanged == [False, True, False]  # trained, skipped, trained
    assert all(np.isfinite(row["policy_loss"]) for row in (learners[0], learners[2]))


def test_the_recipe_job_resumes_from_its_newest_checkpoint(
    ray_cluster, searching_model, world, corpus, tmp_path
):
    """The tuned examples' job runner: ``--checkpoint-every 1 --keep-last 2``, then ``--resume`` to a later
    iteration count continues from the newest checkpoint (here the final one, at the same iteration as the
    newest periodic one) with the rows written before it, a torn last row dropped."""
    from rllib_search.data.formats import write_qa_jsonl
    from rllib_search.recipes.jobs import RecipeJob, job_arguments

    questions = tmp_path / "questions.jsonl"
    write_qa_jsonl(world.train, questions)
    common = ["--out", str(tmp_path / "out"), "--data", str(questions), "--seed", "11"]
    common += ["--checkpoint-every", "1", "--keep-last", "2"]
    parser = job_arguments("a tiny GRPO run", iterations=2)
    with RecipeJob("tiny", parser.parse_args(common)) as job:
        first = job.train(make_config(SearchGRPOConfig, searching_model, world, corpus))
    history = tmp_path / "out" / "history.jsonl"
    history.write_text(history.read_text() + '{"iteration": 3, "rew')  # a line that a kill cut short
    with RecipeJob("tiny", parser.parse_args([*common, "--resume", "--iterations", "3"])) as job:
        resumed = job.train(make_config(SearchGRPOConfig, searching_model, world, corpus))
    assert [row["iteration"] for row in first["iterations"]] == [1, 2]
    assert json.dumps(resumed["iterations"][:2]) == json.dumps(first["iterations"])  # NaN rows too
    assert [row["iteration"] for row in resumed["iterations"]] == [1, 2, 3]
    checkpoints = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint_000002", "checkpoint_000003"]
    assert Path(resumed["checkpoint"], "learner_group").is_dir()

    # A checkpoint damaged after it was written (a truncated state file) is refused by name on resume.
    from rllib_search.algos.checkpoints.check import CheckpointError

    newest = tmp_path / "out" / "checkpoint"  # iteration 3, as checkpoint_000003: the final one is taken
    state = next(newest.glob("algorithm_state.*"))
    state.write_bytes(state.read_bytes()[:10])
    resume = parser.parse_args([*common, "--resume", "--iterations", "4"])
    with pytest.raises(CheckpointError, match=state.name), RecipeJob("tiny", resume) as job:
        job.train(make_config(SearchGRPOConfig, searching_model, world, corpus))


def test_the_latest_checkpoint_is_never_a_half_written_one(tmp_path):
    from rllib_search.algos.checkpoints.periodic import checkpoints, latest_checkpoint

    assert latest_checkpoint(tmp_path / "none") is None
    for name in ("checkpoint_000010", "checkpoint_000002", ".tmp-checkpoint_000011-42", "checkpoint_x"):
        (tmp_path / name).mkdir()
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint_000002", "checkpoint_000010"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint_000010"
