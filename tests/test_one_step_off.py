"""One-step-off sampling (``rollouts(one_step_off=True)``): a remote EnvRunner samples iteration k+1 while
the learner updates on iteration k; the batch's weights are never more than one version behind; the
settings it cannot help are refused; off, every batch is sampled by the learner's current weights."""

from __future__ import annotations

import pytest

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.algorithm import IN_FLIGHT
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import make_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("one_step_off_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def remote_config(model_dir: str, world, corpus: str, one_step_off: bool):
    config = make_config(SearchGRPOConfig, model_dir, world, corpus)
    return config.env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5).rollouts(
        one_step_off=one_step_off
    )


def runner_versions(algo) -> list[int]:
    return algo.env_runner_group.foreach_env_runner(
        lambda runner: runner.weights_version, local_env_runner=False
    )


@pytest.mark.parametrize("one_step_off", [False, True], ids=["lock-step", "one-step-off"])
def test_the_batch_is_at_most_one_weights_version_behind_the_learner(
    ray_cluster, model_dir, world, corpus, one_step_off
):
    algo = remote_config(model_dir, world, corpus, one_step_off).build_algo()
    try:
        lags, seq_nos = [], []
        for _ in range(4):
            result = algo.train()
            learner = result["learners"]
            lags.append(learner["batch_weights_lag"])
            seq_nos.append(learner["default_policy"]["weights_seq_no"])
            assert result["env_runners"]["num_episodes"] == 2 * 2  # 2 questions x 2 samples, every time
            # one-step-off: the next sample is already running while train() returns
            assert algo.env_runner_group.num_in_flight_async_reqs(IN_FLIGHT) == int(one_step_off)
        assert seq_nos == [1, 2, 3, 4]
        # lock-step: every batch sampled by the learner's weights; one-step-off: the first batch is sampled
        # before any update, then each batch by the weights one update behind the learner's.
        assert lags == ([0, 1, 1, 1] if one_step_off else [0, 0, 0, 0])
        # the runner gets the newest weights after the sample it was running (Ray runs its calls in order)
        assert runner_versions(algo) == [4]
    finally:
        algo.stop()


def test_settings_where_overlap_cannot_help_or_be_correct_are_refused(model_dir, world, corpus):
    local = make_config(SearchGRPOConfig, model_dir, world, corpus).rollouts(one_step_off=True)
    with pytest.raises(ValueError, match="needs remote EnvRunners"):
        local.validate()
    remote = remote_config(model_dir, world, corpus, one_step_off=True)
    with pytest.raises(ValueError, match="colocated"):
        remote.copy(copy_frozen=False).rollouts(colocate=True).validate()
    with pytest.raises(ValueError, match="old_logprobs='sampler'"):
        remote.copy(copy_frozen=False).training(old_logprobs="recompute").validate()
    remote.validate()
