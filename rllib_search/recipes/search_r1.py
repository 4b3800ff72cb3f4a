"""Search-R1 (Jin et al., arXiv 2503.09516): GRPO and PPO with retrieved-token masking and an EM reward.

Paper section 4.3 and the authors' ``train_grpo.sh`` / ``train_ppo.sh``: Qwen2.5-3B (Base or Instruct),
E5 over the 2018 Wikipedia dump, top-3 passages, NQ + HotpotQA training sets; 512 prompts a step,
mini-batches of 256 prompts, temperature 1; policy lr 1e-6 (warmup over 28.5% of the steps for GRPO, 95%
for PPO), critic lr 1e-5; KL 0.001 (GRPO: low-variance k3 in the loss; PPO: in the reward); GAE
gamma = lambda = 1; GRPO samples 5 responses a prompt; 500 new tokens a turn, 500-token observations,
4096 tokens in all. The empirical study (arXiv 2505.15117, Appendix G) used the GRPO lr 5e-7 and adds
the format (λ_f) and retrieval (λ_r) reward terms: ``lambda_format=0.2``, ``lambda_retrieval=0.1``.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos import SearchGRPOConfig, SearchPPOConfig
from rllib_search.env.search_env import ENV_ID
from rllib_search.recipes.scales import at_cpu_scale, at_paper_scale, check_scale, env_settings

PAPER_MODEL = "Qwen/Qwen2.5-3B"
PAPER_ENV = {
    "protocol": "search_r1",
    "max_turns": 4,
    "topk": 3,
    "max_obs_tokens": 500,
    "max_total_tokens": 4096,
}
PROMPTS_PER_STEP = 512
MINIBATCH_PROMPTS = 256
STEPS_PER_ITERATION = PROMPTS_PER_STEP // MINIBATCH_PROMPTS  # optimizer steps of one iteration


def _with_env(config: Any, scale: str, dataset: Any, retriever: Any, lambdas: tuple[float, float]) -> Any:
    reward = {"lambda_format": lambdas[0], "lambda_retrieval": lambdas[1]}
    env_config = {
        "dataset": dataset,
        "retriever": retriever or {"type": "serve"},
        **env_settings(scale, PAPER_ENV),
    }
    return config.environment(ENV_ID, env_config={**env_config, "reward_config": reward})


def search_r1_grpo(
    *,
    dataset: Any,
    retriever: Any = None,
    scale: str = "paper",
    model: str | None = None,
    lambda_format: float = 0.0,
    lambda_retrieval: float = 0.0,
    total_iterations: int = 1005,
) -> SearchGRPOConfig:
    """Search-R1's GRPO (``train_grpo.sh``: 1005 steps). ``retriever`` defaults to the in-cluster Serve
    retriever; λ_f / λ_r are the empirical study's reward terms (0: Search-R1's plain EM)."""
    scale = check_scale(scale)
    config = _with_env(SearchGRPOConfig(), scale, dataset, retriever, (lambda_format, lambda_retrieval))
    if scale == "cpu":
        return at_cpu_scale(config, model=model, group_size=4, training={"kl_coeff": 0.001})
    training = {
        "lr": 1e-6,
        "kl_coeff": 0.001,
        "kl_estimator": "k3",
        "clip_param": 0.2,
        "minibatch_size": MINIBATCH_PROMPTS * 5,
        "micro_batch_size": 4,
        "warmup_ratio": 0.285,
        "total_training_steps": total_iterations * STEPS_PER_ITERATION,
    }
    return at_paper_scale(
        config,
        model=model or PAPER_MODEL,
        group_size=5,
        prompts_per_iteration=PROMPTS_PER_STEP,
        max_turn_tokens=500,
        training=training,
    )


def search_r1_ppo(
    *,
    dataset: Any,
    retriever: Any = None,
    scale: str = "paper",
    model: str | None = None,
    lambda_format: float = 0.0,
    lambda_retrieval: float = 0.0,
    total_iterations: int = 305,
) -> SearchPPOConfig:
    """Search-R1's PPO (``train_ppo.sh``: 305 steps, one response a prompt, a critic at lr 1e-5)."""
    scale = check_scale(scale)
    config = _with_env(SearchPPOConfig(), scale, dataset, retriever, (lambda_format, lambda_retrieval))
    if scale == "cpu":
        return at_cpu_scale(
            config,
            model=model,
            group_size=1,
            model_config={"value_head": True},
            rollouts={"prompts_per_sample": 4},
            training={"kl_coeff": 0.001, "critic_lr": 1e-4, "minibatch_size": 4},
        )
    training = {
        "lr": 1e-6,
        "critic_lr": 1e-5,
        "kl_coeff": 0.001,
        "kl_estimator": "k1",
        "kl_in_reward": True,
        "gamma": 1.0,
        "lambda_": 1.0,
        "clip_param": 0.2,
        "minibatch_size": MINIBATCH_PROMPTS,
        "micro_batch_size": 4,
        "warmup_ratio": 0.95,
        "total_training_steps": total_iterations * STEPS_PER_ITERATION,
    }
    return at_paper_scale(
        config,
        model=model or PAPER_MODEL,
        group_size=1,
        prompts_per_iteration=PROMPTS_PER_STEP,
        max_turn_tokens=500,
        training=training,
        model_config={"value_head": True},
    )
