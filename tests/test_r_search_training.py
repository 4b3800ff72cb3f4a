"""R-Search with the served evidence judge: one judge call per EnvRunner sample, judge failures counted
without losing an episode (a killed replica, an unreachable server), and a short GRPO run end to end."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_search import ENV_ID
from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.env.protocols import R_SEARCH
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.family import SameFamilyJudgeError
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit
from rllib_search.serve.http.ports import free_port
from rllib_search.serve.judge.client import JudgeClient
from rllib_search.serve.judge.deployment import build_judge_app
from tests.helpers import RECORDS

pytestmark = pytest.mark.slow

ENV = {"protocol": "r_search", "max_turns": 2, "max_total_tokens": 900, "max_obs_tokens": 80, "topk": 2}


@pytest.fixture(scope="module")
def evidence_policy_dir(tmp_path_factory, world):
    """A tiny Llama taught to answer R-Search prompts at once with an evidence box and an answer."""
    root = tmp_path_factory.mktemp("evidence_policy")
    base = build_tiny_causal_lm(root / "base", build_tiny_tokenizer(root / "tok"))
    text = "<original_evidence> Velmora is a city. </original_evidence>\n<answer> Velmora </answer>"
    questions = [record.question for record in world.train[:6]]
    return teach_to_emit(base, root / "policy", questions, text, system=R_SEARCH.instruction)


@pytest.fixture(scope="module")
def two_answer_policy_dir(tmp_path_factory):
    """A tiny Llama that answers R-Search prompts with evidence and either of two answers, about equally
    often: the samples of a group then earn different rewards (GRPO has something to learn)."""
    root = tmp_path_factory.mktemp("two_answer_policy")
    base = build_tiny_causal_lm(root / "base", build_tiny_tokenizer(root / "tok"))
    texts = [
        f"<original_evidence> Tarquin Oskaley was born in {city}. </original_evidence>\n"
        f"<answer> {city} </answer>"
        for city in ("Velmora", "Carvossa")
    ]
    questions = [record.question for record in RECORDS]
    return teach_to_emit(base, root / "policy", questions, texts, steps=240, system=R_SEARCH.instruction)


def runner_config(policy_dir, world, judge, **rollouts) -> SearchConfig:
    env_config = {
        "retriever": {"type": "serve", "timeout_s": 60},
        "dataset": world.train,
        "judge": judge,
        **ENV,
    }
    settings = {
        "group_size": 2,
        "prompts_per_sample": 3,
        "max_turn_tokens": 48,
        "temperature": 0.5,
        **rollouts,
    }
    return (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": str(policy_dir)})
        .rollouts(**settings)
        .debugging(seed=5)
    )


def two_answer_grpo_config(policy_dir, judge, judge_retries: int = 2) -> SearchGRPOConfig:
    """GRPO of the two-answer policy on one question (gold: Velmora) with the given judge spec."""
    retriever = {"type": "serve", "timeout_s": 60}
    env_config = {"retriever": retriever, "dataset": RECORDS[:1], "judge": judge, **ENV}
    return (
        SearchGRPOConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": str(policy_dir)})
        .rollouts(
            group_size=4,
            prompts_per_sample=2,
            max_turn_tokens=48,
            temperature=1.0,
            judge_retries=judge_retries,
        )
        .training(lr=1e-3, micro_batch_size=4, minibatch_size=8)
        .debugging(seed=3)
    )


def with_evidence(rollouts):
    return [r for r in rollouts if r.reward_components["judge_error"] or r.evidence_answer is not None]


def test_one_sample_makes_one_judge_call_for_all_its_evidences(judge_url, evidence_policy_dir, world):
    runner = LLMEnvRunner(
        config=runner_config(evidence_policy_dir, world, {"type": "serve", "app": "judge", "max_tokens": 8})
    )
    judge = JudgeClient.from_app("judge")
    before = judge.describe()
    rollouts = runner.sample()
    after = judge.describe()
    metrics = runner.get_metrics()
    judged = with_evidence(rollouts)
    assert len(rollouts) == 6 and len(judged) >= 3  # the policy writes evidence in (nearly) every episode
    assert after["requests"] - before["requests"] == 1  # ONE call for the whole sample
    assert (metrics["judge_calls"], metrics["judge_prompts"], metrics["judge_errors"]) == (1, len(judged), 0)
    for rollout in judged:
        assert isinstance(rollout.evidence_answer, str)
        assert "evidence_f1" in rollout.reward_components and rollout.reward_components["judge_error"] == 0.0
    # This policy writes evidence in (nearly) every episode, so an evidence-less episode (its note says why
    # its term is 0) is checked where one is certain: test_search_env's one-judge-call test.


def test_an_unreachable_judge_is_counted_and_loses_no_episode(service, evidence_policy_dir, world):
    """Without retries a judge failure is counted at once: the evidence term is 0, never scored right."""
    spec = {"type": "url", "url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 1, "backoff_s": 0.01}
    runner = LLMEnvRunner(config=runner_config(evidence_policy_dir, world, spec, judge_retries=0))
    rollouts = runner.sample()
    judged = with_evidence(rollouts)
    assert len(rollouts) == 6 and judged
    assert all(r.reward_components["judge_error"] == 1.0 for r in judged)
    assert all(r.reward_components["evidence_f1"] == 0.0 for r in judged)
    assert all("judge failed: JudgeUnavailable" in r.reward_notes["evidence"] for r in judged)
    metrics = runner.get_metrics()
    assert (metrics["judge_calls"], metrics["judge_errors"]) == (1, len(judged))


def test_a_judge_replica_killed_mid_rollout_loses_no_episode(
    service, judge_model_dir, evidence_policy_dir, world
):
    import ray
    from ray import serve

    serve.run(
        build_judge_app(
            {"model": str(judge_model_dir), "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.5}}
        ),
        name="judge_kill",
        route_prefix="/judge_kill",
    )

    def kill_the_replica() -> None:
        replicas = [
            actor
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == "serve"
            and "judge_kill" in actor["name"]
            and "REPLICA" in actor["name"].upper()
        ]
        assert replicas, "no judge replica found"
        ray.kill(ray.get_actor(replicas[0]["name"], namespace="serve"), no_restart=True)

    class KillingEngine(PrefixCachingHFEngine):
        """The runner's own engine, which kills the judge's replica during the first turn of a sample."""

        killed = False

        def generate(self, prefixes, params, max_new_tokens=None):
            if not KillingEngine.killed:
                KillingEngine.killed = True
                kill_the_replica()
            return super().generate(prefixes, params, max_new_tokens)

    spec = {"type": "serve", "app": "judge_kill", "timeout_s": 20, "max_retries": 3, "backoff_s": 1.0}
    runner = LLMEnvRunner(config=runner_config(evidence_policy_dir, world, spec, judge_retries=0))
    runner.engine = KillingEngine(runner.module.model, runner.tokenizer)
    try:
        rollouts = runner.sample()
        assert KillingEngine.killed and len(rollouts) == 6  # every episode came back
        judged = with_evidence(rollouts)
        errors = sum(int(r.reward_components["judge_error"]) for r in judged)
        assert runner.get_metrics()["judge_errors"] == errors
        for (
            rollout
        ) in judged:  # either answered by the restarted replica, or counted: never scored as correct
            if rollout.reward_components["judge_error"]:
                assert rollout.reward_components["evidence_f1"] == 0.0 and rollout.evidence_answer is None
            else:
                assert isinstance(rollout.evidence_answer, str)
        # Serve brings the replica back; the next sample is judged again.
        assert len(runner.sample()) == 6
        assert runner.get_metrics()["judge_errors"] == 0
    finally:
        serve.delete("judge_kill")


def test_a_judge_of_the_policys_family_is_refused(judge_url, judge_model_dir, world):
    policy = judge_model_dir  # a Gemma policy with the Gemma judge
    with pytest.raises(SameFamilyJudgeError, match="allow_same_family"):
        LLMEnvRunner(config=runner_config(policy, world, {"type": "serve", "app": "judge", "max_tokens": 8}))
    allowed = {"type": "serve", "app": "judge", "max_tokens": 8, "allow_same_family": True}
    assert LLMEnvRunner(config=runner_config(policy, world, allowed)).judge is not None


def test_r_search_grpo_trains_end_to_end_with_the_served_judge(judge_url, two_answer_policy_dir):
    judge = {"type": "serve", "app": "judge", "max_tokens": 8}
    algo = two_answer_grpo_config(two_answer_policy_dir, judge).build_algo()
    try:
        judge = JudgeClient.from_app("judge")
        requests_before = judge.describe()["requests"]
        results = [algo.train() for _ in range(3)]
        assert judge.describe()["requests"] - requests_before == 3  # one judge call per iteration
        for result in results:
            runners = result["env_runners"]
            assert runners["judge_calls"] == 1 and runners["judge_errors"] == 0
            assert {"answer_f1", "evidence_f1", "format", "judge_error"} <= set(runners["reward"])
        # Groups held both answers (answer F1 strictly between 0 and 1), so every update had a gradient
        # (a policy with one answer gives zero advantages: gradient norm ~1e-7) and the policy moved away
        # from the reference (KL > 0 after the first update).
        learner = [result["learners"]["default_policy"] for result in results]
        assert all(0 < result["env_runners"]["reward"]["answer_f1"] < 1 for result in results)
        assert all(stats["gradients_policy_global_norm"] > 1e-3 for stats in learner)
        assert learner[0]["kl"] == pytest.approx(0.0, abs=1e-6) and learner[-1]["kl"] > 1e-4
        assert all(np.isfinite(stats["policy_loss"]) for stats in learner)
    finally:
        algo.stop()


def test_a_training_run_goes_on_when_its_judge_is_down(service, two_answer_policy_dir):
    """A judge that never answers (nothing listens on its port) during a GRPO run without retries: each
    iteration counts the failure for every judged episode, scores their evidence 0, and still trains on the
    answers."""
    down = {"type": "url", "url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 1, "backoff_s": 0.01}
    algo = two_answer_grpo_config(two_answer_policy_dir, down, judge_retries=0).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for result in results:
        runners, learner = result["env_runners"], result["learners"]["default_policy"]
        assert runners["num_episodes"] == 8  # no episode lost
        assert runners["judge_calls"] == 1 and runners["judge_errors"] > 0
        assert runners["reward"]["judge_error"] > 0 and runners["reward"]["evidence_f1"] == 0.0
        assert np.isfinite(learner["policy_loss"]) and learner["gradients_policy_global_norm"] > 1e-3


class FlakyJudge:
    """A reader that fails on the calls numbered in ``failing`` (1-based) and answers "Velmora" otherwise:
    an evidence judge that is down for a while."""

    def __init__(self, failing: set[int] | None = None) -> None:
        self.failing = failing if failing is not None else {1}
        self.calls = 0

    def answer_evidence(self, questions, evidences):
        self.calls += 1
        if self.failing == "all" or self.calls in self.failing:
            raise ConnectionError(f"judge call {self.calls} failed")
        return ["Velmora"] * len(questions)


def test_a_group_whose_judge_failed_waits_and_is_judged_at_the_next_sample(
    service, evidence_policy_dir, world
):
    """``judge_retries``: the groups of a sample whose judge call failed are held back, judged again with
    the next sample's call, and come back with it, scored as if the judge had answered at once."""
    judge = FlakyJudge({1})  # the runner may hold a copy: its own counts are read below
    runner = LLMEnvRunner(config=runner_config(evidence_policy_dir, world, judge, judge_retries=2))
    first = runner.sample()
    metrics = runner.get_metrics()
    held = int(metrics["judge_held_groups"])
    assert held >= 1 and len(first) == 6 - 2 * held  # groups that needed no judge go on
    assert all(r.reward_components.get("judge_error", 0.0) == 0.0 for r in first)
    second = runner.sample()
    metrics = runner.get_metrics()
    assert len(second) == 6 + 2 * held and int(metrics["judge_recovered_groups"]) == held
    assert int(metrics["judge_unjudged_groups"]) == 0 and runner.judge.calls == 3  # the sample, the retry
    judged = with_evidence(second)
    assert judged and all(r.reward_components["judge_error"] == 0.0 for r in judged)
    assert all(r.evidence_answer == "Velmora" and "evidence" not in r.reward_notes for r in judged)
    assert len({r.group_id for r in second}) == 3 + held  # whole groups


def test_a_group_whose_judge_stays_down_is_trained_unjudged_after_its_retries(
    service, evidence_policy_dir, world
):
    judge = FlakyJudge("all")
    runner = LLMEnvRunner(config=runner_config(evidence_policy_dir, world, judge, judge_retries=1))
    assert runner.sample() == []  # every group waits for the judge
    assert int(runner.get_metrics()["judge_held_groups"]) == 3
    released = runner.sample()  # the first sample's groups, after their one retry; the second's wait
    metrics = runner.get_metrics()
    assert len(released) == 6 and int(metrics["judge_unjudged_groups"]) == 3
    judged = with_evidence(released)
    assert judged and all(r.reward_components["judge_error"] == 1.0 for r in judged)
    assert all(r.reward_components["evidence_f1"] == 0.0 for r in judged)  # never scored as right


def test_an_iteration_whose_groups_all_wait_samples_again(service, two_answer_policy_dir):
    """A GRPO iteration whose first sample was held back whole samples again, and trains on both samples'
    groups once the judge answers."""
    algo = two_answer_grpo_config(two_answer_policy_dir, FlakyJudge({1})).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners, learner = result["env_runners"], result["learners"]["default_policy"]
    assert runners["judge_held_groups"] == 2 and runners["judge_recovered_groups"] == 2
    assert runners["num_episodes"] == 16  # two samples of 8 episodes, all trained
    assert np.isfinite(learner["policy_loss"])
