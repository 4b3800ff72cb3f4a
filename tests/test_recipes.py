"""The papers' recipes: the paper-scale presets carry the papers' hyperparameters, and every recipe trains
an iteration at CPU scale (a tiny policy standing in for SmolLM2) with the served retriever and judge."""

from __future__ import annotations

import pytest

from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.recipes import (
    RECIPES,
    r1_searcher_reinforce_pp,
    r_search_grpo,
    search_r1_grpo,
    search_r1_ppo,
)
from rllib_search.recipes.scales import CPU_POLICY


def test_paper_scale_presets_carry_the_papers_hyperparameters():
    grpo = search_r1_grpo(dataset="train.parquet", lambda_format=0.2, lambda_retrieval=0.1)
    assert (grpo.lr, grpo.group_size, grpo.kl_coeff, grpo.kl_estimator) == (1e-6, 5, 0.001, "k3")
    assert (grpo.warmup_ratio, grpo.total_training_steps) == (0.285, 2010)  # 1005 steps x 2 mini-batches
    assert grpo.engine == "vllm" and grpo.prompts_per_sample * grpo.num_env_runners == 512
    assert grpo.minibatch_size == 256 * 5 and grpo.model_config["model"] == "Qwen/Qwen2.5-3B"
    assert grpo.env_config["reward_config"] == {"lambda_format": 0.2, "lambda_retrieval": 0.1}
    assert (grpo.env_config["max_turns"], grpo.env_config["topk"], grpo.max_turn_tokens) == (4, 3, 500)

    ppo = search_r1_ppo(dataset="train.parquet")
    assert (ppo.lr, ppo.critic_lr, ppo.group_size, ppo.warmup_ratio) == (1e-6, 1e-5, 1, 0.95)
    assert ppo.kl_in_reward and ppo.model_config["value_head"] and (ppo.gamma, ppo.lambda_) == (1.0, 1.0)

    r1 = r1_searcher_reinforce_pp(dataset="stage1.parquet", stage2_dataset="stage2.parquet")
    assert (r1.lr, r1.group_size, r1.kl_coeff, r1.advantage_estimator) == (2e-6, 16, 0.0, "reinforce_pp")
    assert r1.sharding == "fsdp2" and r1.env_config["max_turns"] == 9
    assert r1.reward_stages == [
        {"reward": "r1_searcher_stage1", "iterations": 6},
        {"reward": "r1_searcher_stage2", "dataset": "stage2.parquet"},
    ]
    by_metric = r1_searcher_reinforce_pp(dataset="d", stage1_threshold=0.45)
    assert by_metric.reward_stages[0] == {
        "reward": "r1_searcher_stage1",
        "metric": "env_runners/reward/retrieval",
        "threshold": 0.45,
    }

    rs = r_search_grpo(dataset="2wiki.parquet")
    assert (rs.lr, rs.group_size, rs.kl_coeff, rs.warmup_ratio) == (1e-6, 5, 0.001, 0.95)
    assert rs.env_config["reward"] == "r_search" and rs.mask_retrieved_tokens
    assert rs.env_config["reward_config"] == {"gamma_evidence": 0.2, "gamma_answer": 0.2}
    assert rs.env_config["judge"]["api"] == "chat" and rs.env_config["judge"]["temperature"] == 0.1
    assert rs.model_config["model"] == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(ValueError, match="scale"):
        search_r1_grpo(dataset="d", scale="huge")


def test_paper_scale_gives_every_vllm_env_runner_a_gpu():
    for name, recipe in RECIPES.items():
        config = recipe(dataset="d")
        assert config.engine == "vllm" and config.num_env_runners > 0, name
        # Colocated: each learner and its EnvRunner share one GPU, half each.
        assert config.colocate and config.num_gpus_per_env_runner == config.num_gpus_per_learner == 0.5, name
        config.validate_rollouts()
    gpuless = search_r1_grpo(dataset="d").env_runners(num_gpus_per_env_runner=0)
    with pytest.raises(ValueError, match="vLLM EnvRunners need a GPU each"):
        gpuless.validate_rollouts()


def test_cpu_scale_uses_the_bundled_models():
    for name, recipe in RECIPES.items():
        config = recipe(dataset="d", scale="cpu")
        assert config.model_config["model"] == CPU_POLICY, name
        assert (
            config.engine == "hf"
            and config.num_learners == 0
            and config.env_config["max_total_tokens"] == 1024
        )


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe_policy")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_trains_at_cpu_scale(name, service, judge_url, policy_dir, world):
    inputs = {"dataset": world.train, "retriever": {"type": "serve", "timeout_s": 60}}
    if name == "r_search":
        inputs["judge"] = {"type": "serve", "app": "judge", "max_tokens": 8}
    config = (
        RECIPES[name](scale="cpu", model=policy_dir, **inputs).rollouts(max_turn_tokens=12).debugging(seed=1)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_episodes"] > 0
        assert "policy_loss" in result["learners"]["default_policy"]
        if name == "r_search":
            assert result["env_runners"]["judge_errors"] == 0
        if name == "r1_searcher":
            assert (
                result["env_runners"]["reward_stage"] == 0 and "retrieval" in result["env_runners"]["reward"]
            )
    finally:
        algo.stop()


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_cpu_turn_budget_holds_every_turn_the_teacher_writes(name, smollm2_tokenizer, embedded_world_data):
    """At CPU scale a recipe's policy is warm-started on the teacher's trajectories in the recipe's protocol;
    a turn budget below the teacher's longest turn makes RL's sampler cut what the warm start taught (48
    tokens cut R1-Searcher's query turns and R-Search's answer turns, which quote their evidence)."""
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts, turns_over_budget
    from rllib_search.env.search_env import SearchEnvConfig

    config = RECIPES[name](dataset=None, scale="cpu")
    settings = {k: v for k, v in config.env_config.items() if k not in ("dataset", "retriever", "judge")}
    retriever, records = embedded_world_data
    demos = teacher_rollouts(smollm2_tokenizer, retriever, records, SearchEnvConfig.from_dict(settings))
    assert len(demos) == len(records)
    assert turns_over_budget(demos, config.max_turn_tokens) == [], name


@pytest.fixture(scope="module")
def embedded_world_data():
    """The embedded default's world (seed 0): an in-process BM25 over its passages, and the questions the
    recipes' warm start demonstrates (120 1-hop and 40 2-hop training ones) with 50 + 50 held-out ones."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.serve.retrieval.bm25 import BM25Retriever

    world = generate_world(SyntheticWorldConfig(seed=0))

    def hops(records, n):
        return [r for r in records if r.extra["num_hops"] == n]

    records = hops(world.train, 1)[:120] + hops(world.train, 2)[:40] + hops(world.test, 1)[:50]
    return BM25Retriever(world.passages), records + hops(world.test, 2)[:50]
