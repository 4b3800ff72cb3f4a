"""Main-job parts benchmark: two batching choices of the main job timed side by side, alternating.

1. Greedy evaluation in one batch: the main job's held-out evaluation (50 1-hop + 50 2-hop questions) and
   its validation reading (20 + 20) as one ``rollout_records`` call against one call per hop count, with
   the same runner, weights and questions (the synthetic world of seed 0, the compact protocol, 3 turns,
   top-2 passages of at most 100 tokens, 48 tokens a turn, an in-process BM25 retriever). Also checked:
   both give the same answers.
2. The GRPO learner's micro-batch: one ``update`` of a batch shaped like a main-job iteration (4 questions
   x 8 samples sharing each question's prompt of ``--prompt-tokens``, then a trained first turn of 15-35
   tokens; minibatch 16, KL 0.001) with micro-batches of 4 against 16 (the minibatch). Also checked: from the
   same weights one update of each gives the same weights to float tolerance.

Run it with a main job's warm start (``--model runs/tiny_cpu_grpo/warm_start_model``): the bundled base
model never closes a turn, so its episodes are not the main job's. Medians over ``--repeats`` alternating
repeats (the first of each a warm-up, not counted). Prints a final JSON line and writes
``benchmarks/results/main_job_parts.json`` (``_quick`` with ``--quick``: 2 repeats, 20 + 20 questions),
with the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/main_job_parts_bench.py --model runs/tiny_cpu_grpo/warm_start_model [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_search import ENV_ID
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.serve.retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.learner_bench import build_learner  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def evaluation_runner(model: str, engine_dtype: str | None = None) -> tuple[LLMEnvRunner, dict[int, list]]:
    """A local EnvRunner with the main job's env settings (the engine's weights in ``engine_dtype``), and the
    world's test questions by hop count."""
    world = generate_world(SyntheticWorldConfig(seed=0))
    env_config = {
        "retriever": BM25Retriever(world.passages),
        "dataset": world.train,
        "protocol": "search_r1_compact",
        "max_turns": 3,
        "topk": 2,
        "max_obs_tokens": 100,
        "max_total_tokens": 1024,
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model})
        .rollouts(max_turn_tokens=48, engine_dtype=engine_dtype)
        .debugging(seed=0)
    )
    by_hops = {h: [r for r in world.test if r.extra["num_hops"] == h] for h in (1, 2)}
    return LLMEnvRunner(config=config), by_hops


def bench_evaluation(runner: LLMEnvRunner, questions: dict[int, list], repeats: int) -> dict[str, float]:
    """Per hop count against one batch, alternating; ``questions`` hop count -> records."""

    def per_hop_count() -> list[str | None]:
        return [r.answer for group in questions.values() for r in runner.rollout_records(group)]

    def one_batch() -> list[str | None]:
        return [r.answer for r in runner.rollout_records([q for g in questions.values() for q in g])]

    runs: dict[str, list[float]] = {"per_hop_count": [], "one_batch": []}
    answers: dict[str, list] = {}
    for repeat in range(repeats + 1):
        for name, fn in (("per_hop_count", per_hop_count), ("one_batch", one_batch)):
            seconds, answers[name] = timed(fn)
            if repeat:  # the first round warms up the engine and its prefix cache
                runs[name].append(seconds)
            print(f"  evaluation {len(answers[name])} questions: {name:>13} {seconds:6.1f}s", flush=True)
    seconds = {name: median(values) for name, values in runs.items()}
    return {
        "questions_per_hop": len(next(iter(questions.values()))),
        "per_hop_count_s": seconds["per_hop_count"],
        "one_batch_s": seconds["one_batch"],
        "one_batch_vs_per_hop_count_speedup": seconds["per_hop_count"] / seconds["one_batch"],
        "same_answers": answers["per_hop_count"] == answers["one_batch"],
    }


def grpo_batch(vocab: int, prompt_tokens: int, seed: int = 0) -> dict[str, np.ndarray]:
    """4 questions x 8 samples: each question's prompt shared by its 8 rows, then a trained first turn."""
    rng = np.random.default_rng(seed)
    rows, group = 32, 8
    turns = rng.integers(15, 36, size=rows)
    length = prompt_tokens + int(turns.max())
    ids = np.zeros((rows, length), dtype=np.int64)
    attention = np.zeros((rows, length), dtype=np.int64)
    loss_mask = np.zeros((rows, length), dtype=np.float32)
    for row in range(rows):
        if row % group == 0:
            prompt = rng.integers(3, vocab, size=prompt_tokens)
        end = prompt_tokens + int(turns[row])
        ids[row, :prompt_tokens] = prompt
        ids[row, prompt_tokens:end] = rng.integers(3, vocab, size=int(turns[row]))
        attention[row, :end] = 1
        loss_mask[row, prompt_tokens:end] = 1.0
    advantages = rng.standard_normal(rows).astype(np.float32)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask[:, 1:],
        "response_mask": loss_mask[:, 1:].copy(),
        "old_logprobs": np.full((rows, length - 1), -2.0, dtype=np.float32) * loss_mask[:, 1:],
        "rewards": (advantages > 0).astype(np.float32),
        "episode_advantages": advantages,
        "prompt_lengths": np.full(rows, prompt_tokens, dtype=np.int64),
    }


def weights(learner) -> dict[str, torch.Tensor]:
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def bench_learner(model: str, prompt_tokens: int, repeats: int) -> dict[str, float]:
    """Micro-batches of 4 against 16 on the same GRPO batch, alternating; then one update of each from
    the same weights, compared."""
    # The main job's GRPO learner settings (grad clip 1.0 is the config's default there too).
    learners = {micro: build_learner(model, micro, kl_coeff=0.001, lr=5e-6) for micro in (4, 16)}
    vocab = int(learners[4].module[DEFAULT_MODULE_ID].unwrapped().model.config.vocab_size)
    batch = grpo_batch(vocab, prompt_tokens)
    multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=32)

    def update(learner) -> None:  # as SearchAlgorithm.training_step calls it: 2 mini-batches, in order
        learner.update(batch=multi, num_epochs=1, minibatch_size=16, shuffle_batch_per_epoch=False)

    start = weights(learners[4])
    after = {}
    runs: dict[int, list[float]] = {4: [], 16: []}
    for repeat in range(repeats + 1):
        for micro, learner in learners.items():
            seconds, _ = timed(lambda learner=learner: update(learner))
            if repeat:
                runs[micro].append(seconds)
            else:  # the first update of each starts from the same weights
                after[micro] = weights(learner)
            print(f"  GRPO update, micro-batch {micro:2d}: {seconds:6.2f}s", flush=True)
    moved = max(float((after[4][k] - start[k]).abs().max()) for k in start)
    differs = max(float((after[4][k] - after[16][k]).abs().max()) for k in start)
    seconds = {micro: median(values) for micro, values in runs.items()}
    return {
        "rows": 32,
        "prompt_tokens": prompt_tokens,
        "trained_tokens": float(batch["loss_mask"].sum()),
        "micro_4_s": seconds[4],
        "micro_16_s": seconds[16],
        "micro_16_vs_4_speedup": seconds[4] / seconds[16],
        "first_update_max_weight_change": moved,
        "first_update_max_difference_4_vs_16": differs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a main job's warm_start_model")
    parser.add_argument("--quick", action="store_true", help="2 repeats, 20 + 20 evaluation questions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=110, help="the compact prompt and a question")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats

    runner, by_hops = evaluation_runner(args.model)
    sizes = {"validation_reading": 20} if args.quick else {"held_out": 50, "validation_reading": 20}
    result: dict[str, object] = {
        "benchmark": "main_job_parts",
        "quick": args.quick,
        "model": args.model,
        "torch_threads": args.threads,
        "repeats": repeats,
    }
    for name, size in sizes.items():
        print(f"{name}: {size} + {size} questions", flush=True)
        result[name] = bench_evaluation(runner, {h: by_hops[h][:size] for h in (1, 2)}, repeats)
    del runner
    print("GRPO learner update", flush=True)
    result["grpo_update"] = bench_learner(args.model, args.prompt_tokens, repeats)
    write_results("main_job_parts_quick" if args.quick else "main_job_parts", result)


if __name__ == "__main__":
    sys.exit(main())
