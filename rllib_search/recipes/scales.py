"""What the two recipe scales share: the CPU path's model and budgets, and the GPU path's cluster layout."""

from __future__ import annotations

from typing import Any, Literal

Scale = Literal["paper", "cpu"]

CPU_POLICY = "smollm2-135m-instruct"
CPU_JUDGE = "gemma3-270m"
# The bundled Gemma-3-270M is a base model: given R-Search's template alone it answers in sentences, so its
# prompts carry this many worked examples before the verbatim template (the variant
# benchmarks/judge_bench.py chooses on its development questions; it reports the accuracy on held-out ones).
CPU_JUDGE_EXAMPLES = 4

# Budgets for two CPU cores: short turns and contexts, few questions an iteration (the main job's).
CPU_ENV = {"max_turns": 3, "topk": 2, "max_obs_tokens": 100, "max_total_tokens": 1024}
# A turn's budget must hold the teacher's longest turn in the recipe's protocol, or the sampler cuts the
# warm-started policy's turns mid-tag and the env reads invalid actions. On the embedded world (1-2 hop
# questions, SmolLM2's tokens) Search-R1's protocol writes turns of up to 54 tokens; R1-Searcher and R-Search
# set their own (r1_searcher.py, r_search.py). A turn that closes costs the same under a larger budget.
CPU_ROLLOUTS = {"prompts_per_sample": 2, "max_turn_tokens": 64, "engine": "hf"}
CPU_TRAINING = {"lr": 3e-5, "micro_batch_size": 4, "minibatch_size": 8}

# The papers' nodes: 8 GPUs. Four GPUs each hold a colocated pair, a learner and a vLLM EnvRunner on one
# GPU at half a GPU each (the engine sleeps while the learner trains, the learner's state waits in CPU memory
# while the engine samples); the other four hold the services (tuned_examples/serve_gpu.yaml: at most two
# retriever and two judge replicas). `rllib-search plan RECIPE` prints the plan.
PAPER_LEARNERS = 4
PAPER_ENV_RUNNERS = 4
PAPER_GPU_SHARE = 0.5  # of a colocated pair's GPU, for each of its learner and EnvRunner
PAPER_SHARDING = "fsdp2"  # weights, gradients, optimizer state and reference sharded over the learners


def check_scale(scale: str) -> Scale:
    if scale not in ("paper", "cpu"):
        raise ValueError(f"scale must be 'paper' or 'cpu', got {scale!r}")
    return scale  # type: ignore[return-value]


def env_settings(scale: Scale, paper: dict[str, Any]) -> dict[str, Any]:
    """The paper's env budgets, or the CPU budgets over them."""
    return dict(paper) if scale == "paper" else {**paper, **CPU_ENV}


def at_cpu_scale(
    config: Any,
    *,
    model: str | None,
    group_size: int,
    model_config: dict[str, Any] | None = None,
    rollouts: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> Any:
    """``config`` on the embedded default: the bundled policy (or ``model``), HF rollouts, local learner."""
    return (
        config.rl_module(model_config={"model": model or CPU_POLICY, **(model_config or {})})
        .rollouts(group_size=group_size, **{**CPU_ROLLOUTS, **(rollouts or {})})
        .training(**{**CPU_TRAINING, **(training or {})})
    )


def at_paper_scale(
    config: Any,
    *,
    model: str,
    group_size: int,
    prompts_per_iteration: int,
    max_turn_tokens: int,
    training: dict[str, Any],
    model_config: dict[str, Any] | None = None,
) -> Any:
    """``config`` on one 8-GPU node: the paper's model with activation checkpointing, vLLM rollouts at
    temperature 1 spread over the EnvRunners, each EnvRunner colocated with a learner on one GPU, the
    learners sharded with FSDP2 (weights, gradients, optimizer state and reference: a 7B learner then fits
    beside its sleeping engine)."""
    return (
        config.rl_module(
            model_config={"model": model, "gradient_checkpointing": True, **(model_config or {})}
        )
        .rollouts(
            group_size=group_size,
            prompts_per_sample=prompts_per_iteration // PAPER_ENV_RUNNERS,
            engine="vllm",
            temperature=1.0,
            max_turn_tokens=max_turn_tokens,
            colocate=True,
        )
        .training(**{"sharding": PAPER_SHARDING, **training})
        .learners(num_learners=PAPER_LEARNERS, num_gpus_per_learner=PAPER_GPU_SHARE)
        .env_runners(num_env_runners=PAPER_ENV_RUNNERS, num_gpus_per_env_runner=PAPER_GPU_SHARE)
    )
