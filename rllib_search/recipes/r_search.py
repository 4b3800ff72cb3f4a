"""R-Search (Zhao et al., 2025): GRPO with answer, evidence and format rewards; evidence judged by a model
of another family.

Section 4 and Appendix A.3 of the paper: Qwen-2.5-7B-Instruct (and 3B), E5 over Wikipedia, trained on
2WikiMultiHopQA only, 195 steps of batch 256, lr 1e-6 with warmup over 95% of the steps (following
Search-R1), 5 responses a prompt, KL 0.001, top-3 passages, γ_e = γ_a = 0.2. The evidence reward is the F1
of Llama-3.2-3B-Instruct's answer from the evidence alone (Table 5 template, temperature 0.1); retrieved
tokens are masked, the model's own evidence tokens are trained (section 3.2.3: they are generated tokens,
so the loss mask keeps them).

The judge is a service: ``rllib-search serve judge`` (our deployment, HF on CPU or ``--engine vllm``), or
Ray Serve LLM (``tuned_examples/serve_gpu_llm.yaml``) reached through ``{"type": "url", "api": "chat"}``.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos import SearchGRPOConfig
from rllib_search.env.search_env import ENV_ID
from rllib_search.recipes.scales import (
    CPU_JUDGE_EXAMPLES,
    at_cpu_scale,
    at_paper_scale,
    check_scale,
    env_settings,
)

PAPER_MODEL = "Qwen/Qwen2.5-7B-Instruct"
PAPER_ENV = {
    "protocol": "r_search",
    "max_turns": 4,
    "topk": 3,
    "max_obs_tokens": 500,
    "max_total_tokens": 4096,
}
# The paper's judge through our deployment in-cluster (``serve judge --engine vllm --model
# meta-llama/Llama-3.2-3B-Instruct``): chat API, temperature 0.1 as R-Search.
PAPER_JUDGE = {"type": "serve", "app": "judge", "api": "chat", "temperature": 0.1, "max_tokens": 32}
# The bundled Gemma-3-270M, greedy, worked examples before R-Search's template (scales.CPU_JUDGE_EXAMPLES).
CPU_JUDGE_SPEC = {
    "type": "serve",
    "app": "judge",
    "api": "completions",
    "temperature": 0.0,
    "max_tokens": 32,
    "examples": CPU_JUDGE_EXAMPLES,
}


def r_search_grpo(
    *,
    dataset: Any,
    retriever: Any = None,
    judge: Any = None,
    scale: str = "paper",
    model: str | None = None,
    gamma_evidence: float = 0.2,
    gamma_answer: float = 0.2,
    total_iterations: int = 195,
) -> SearchGRPOConfig:
    """R-Search's GRPO with the evidence reward; ``judge`` defaults to the in-cluster Serve judge app."""
    scale = check_scale(scale)
    retriever = retriever or {"type": "serve"}
    judge = judge or (PAPER_JUDGE if scale == "paper" else CPU_JUDGE_SPEC)
    settings = env_settings(scale, PAPER_ENV)
    env_config = {
        "dataset": dataset,
        "retriever": retriever,
        "judge": judge,
        **settings,
        "reward": "r_search",
        "reward_config": {"gamma_evidence": gamma_evidence, "gamma_answer": gamma_answer},
    }
    config = (
        SearchGRPOConfig().environment(ENV_ID, env_config=env_config).training(mask_retrieved_tokens=True)
    )
    if scale == "cpu":
        # The answer turn quotes its evidence (a passage a hop): up to 123 tokens on a 2-hop question.
        return at_cpu_scale(
            config, model=model, group_size=4, rollouts={"max_turn_tokens": 128}, training={"kl_coeff": 0.001}
        )
    training = {
        "lr": 1e-6,
        "kl_coeff": 0.001,
        "kl_estimator": "k3",
        "minibatch_size": 256 * 5 // 2,
        "micro_batch_size": 4,
        "warmup_ratio": 0.95,
        "total_training_steps": total_iterations * 2,
    }
    return at_paper_scale(
        config,
        model=model or PAPER_MODEL,
        group_size=5,
        prompts_per_iteration=256,
        max_turn_tokens=500,
        training=training,
    )
