"""R1-Searcher (Song et al., arXiv 2503.05592): two-stage outcome RL with REINFORCE++.

Section 3.3 of the paper: Qwen-2.5-7B-Base (or Llama-3.1-8B-Instruct), BGE-large-en-v1.5 over KILT's
2019 Wikipedia, at most 8 retrievals; 16 rollouts a question, 64 questions a rollout batch, train batch 256,
lr 2e-6, temperature 1, discount 1, KL 0 for the Qwen base model (1e-4 for Llama), DeepSpeed ZeRO-2 (here:
FSDP2-sharded learners, which shard the same state and the weights too), one epoch. Stage 1 rewards
retrieval (0.5 for searching at all) and format (0.5) on 350 medium questions, so it lasts 350 / 64 = 6
rollout batches; stage 2 rewards the answer's F1 with -2 for a broken format, on 8,142
medium and hard questions (section 2.2, Table 1). The schedule moves on after ``stage1_iterations`` or,
when ``stage1_threshold`` is given, as soon as the batch's mean retrieval reward reaches it.

The algorithm is REINFORCE++ as published (Hu, 2025, the paper's reference [20]; estimator
``reinforce_pp``): no critic and no group baseline, the outcome reward on the last generated token minus the
KL penalty per token, returns-to-go with discount 1, whitened over the batch's generated tokens.
"""

from __future__ import annotations

from typing import Any

from rllib_search.algos import SearchReinforcePPConfig
from rllib_search.env.search_env import ENV_ID
from rllib_search.recipes.scales import at_cpu_scale, at_paper_scale, check_scale, env_settings

PAPER_MODEL = "Qwen/Qwen2.5-7B"
PAPER_ENV = {
    "protocol": "r1_searcher",
    "max_turns": 9,  # at most 8 retrievals, then the answer
    "topk": 3,
    "max_obs_tokens": 500,
    "max_total_tokens": 8192,
}


def r1_searcher_reinforce_pp(
    *,
    dataset: Any,
    stage2_dataset: Any = None,
    retriever: Any = None,
    scale: str = "paper",
    model: str | None = None,
    stage1_iterations: int | None = None,
    stage1_threshold: float | None = None,
) -> SearchReinforcePPConfig:
    """R1-Searcher's two stages with REINFORCE++ (no baseline). ``dataset`` holds the stage-1 questions
    and ``stage2_dataset`` the stage-2 ones (default: the same questions throughout)."""
    scale = check_scale(scale)
    retriever = retriever or {"type": "serve"}
    settings = env_settings(scale, PAPER_ENV)
    default_iterations = 6 if scale == "paper" else 2
    stage1: dict[str, Any] = {"reward": "r1_searcher_stage1"}
    if stage1_threshold is not None:
        stage1.update(metric="env_runners/reward/retrieval", threshold=stage1_threshold)
    if stage1_iterations is not None or stage1_threshold is None:
        stage1["iterations"] = stage1_iterations or default_iterations
    stage2: dict[str, Any] = {"reward": "r1_searcher_stage2", "dataset": stage2_dataset}
    config = (
        SearchReinforcePPConfig()
        .environment(ENV_ID, env_config={"dataset": dataset, "retriever": retriever, **settings})
        .reward_schedule(stages=[stage1, stage2])
        .training(advantage_estimator="reinforce_pp")
    )
    if scale == "cpu":
        # R1-Searcher's tags are longer (<|begin_of_query|> ...): the teacher's turns take up to 66 tokens.
        return at_cpu_scale(
            config, model=model, group_size=4, rollouts={"max_turn_tokens": 80}, training={"kl_coeff": 0.0}
        )
    training = {
        "lr": 2e-6,
        "kl_coeff": 0.0,
        "gamma": 1.0,
        "minibatch_size": 256,
        "micro_batch_size": 2,
        "sharding": "fsdp2",
    }
    return at_paper_scale(
        config,
        model=model or PAPER_MODEL,
        group_size=16,
        prompts_per_iteration=64,
        max_turn_tokens=512,
        training=training,
    )
