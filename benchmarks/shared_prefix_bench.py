"""Shared-prefix benchmark: the main job's SFT and fork-calibration steps with and without sharing.

The main job's warm start trains on rows of distinct questions: an SFT step on 8 teacher trajectories and a
fork-calibration step on 18 first turns (6 questions: a 1-hop turn, and a 2-hop question's pair of turns
that part at the fork). No two SFT rows share a prompt, but every row starts with the protocol's
instruction (52 tokens of the compact protocol's 67-70), and a calibration pair shares its prompt and plan
up to the fork. ``shared_prompt.plan_sharing`` reads such a prefix once per micro-batch; this times one
learner update of each batch with ``share_prompts`` on and off, alternating in one process, the main job's
settings (micro-batches of 4, bf16 autocast where the CPU has bf16 units, the compact protocol, the
teacher's main-job trajectories over the synthetic world of seed 0, an in-process BM25 retriever). Also
reported, counted rather than timed: the decoder positions each plan computes, with stop 64's rule (groups
by whole prompt only) beside them, and the largest difference of the two updates' weights.

    python benchmarks/shared_prefix_bench.py [--quick] [--model smollm2-135m-instruct] [--protocol search_r1]

Medians over ``--repeats`` alternating repeats (a warm-up first, not counted). Prints a final JSON line and
writes ``benchmarks/results/shared_prefix.json`` (``shared_prefix_search_r1.json`` with ``--protocol
search_r1``; ``_quick`` with ``--quick``: 2 repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_search.algos.algorithm import train_batch
from rllib_search.algos.batching import micro_batches
from rllib_search.algos.configs import SearchSFTConfig
from rllib_search.algos.demonstrations import teacher_rollouts
from rllib_search.algos.fork_calibration import ForkCalibration, calibration_demonstrations
from rllib_search.algos.plan_forks import fork_contexts
from rllib_search.algos.shared_prompt import computed_positions, group_prompts, plan_sharing
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.llm.models import cpu_has_native_bf16, load_tokenizer
from rllib_search.serve.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for tuned_examples

from tuned_examples.tiny_cpu_grpo import parse_args as main_job_args  # noqa: E402
from tuned_examples.tiny_cpu_grpo import teacher_options  # noqa: E402


def main_job_batches(model: str, protocol: str) -> tuple[Any, dict[str, list]]:
    """The tokenizer and the rows of one SFT step (4 1-hop + 4 2-hop teacher trajectories with the main
    job's teacher settings) and of one calibration step (6 questions, the main job's default turns)."""
    job = main_job_args(["--protocol", protocol])
    world = generate_world(SyntheticWorldConfig(seed=0))
    retriever = BM25Retriever(world.passages)
    tokenizer = load_tokenizer(model)
    env_config = SearchEnvConfig(
        protocol=job.protocol, max_turns=3, topk=job.topk, max_obs_tokens=100, max_total_tokens=1024
    )
    by_hops = {h: [r for r in world.train if r.extra["num_hops"] == h] for h in (1, 2)}
    demos = teacher_rollouts(
        tokenizer, retriever, by_hops[1][:4] + by_hops[2][:4], env_config, **teacher_options(job)
    )
    settings = ForkCalibration(its_target=job.calibration_its, turns=job.calibration_turns)
    questions = {h: by_hops[h][: job.calibration_questions] for h in (1, 2)}
    fork_env = MultiTurnSearchEnv(tokenizer, None, None, SearchEnvConfig(protocol=job.protocol))
    contexts = {h: fork_contexts(questions[h], fork_env, tokenizer) for h in (1, 2)}
    calibration = calibration_demonstrations(tokenizer, retriever, questions, contexts, env_config, settings)
    return tokenizer, {"sft": demos, "calibration": calibration}


def build_learner(model: str, share: bool, micro: int, autocast: bool | None, vocab: int) -> Any:
    config = (
        SearchSFTConfig()
        .rl_module(model_config={"model": model, "share_prompts": share})
        .training(lr=4e-5, micro_batch_size=micro, autocast=autocast)
    )
    space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (space, space)})


def positions(columns: dict[str, np.ndarray], micro: int) -> dict[str, int]:
    """Decoder positions computed by the plain forward, stop 64's prompt groups, and ``plan_sharing``."""
    counts = {"plain": 0, "prompt_groups": 0, "plan": 0}
    for _, part in micro_batches(columns, micro):
        lengths = part["attention_mask"].sum(-1)
        groups = group_prompts(part["input_ids"], part["prompt_lengths"])
        counts["plain"] += computed_positions(lengths, None)[0]
        counts["prompt_groups"] += computed_positions(lengths, groups if groups.shares else None)[0]
        plan = plan_sharing(part["input_ids"], lengths, part["prompt_lengths"])
        counts["plan"] += computed_positions(lengths, plan)[0]
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument(
        "--protocol",
        default="search_r1_compact",
        help="the main job's (default) or search_r1, the paper's instruction (prompts of 164 tokens)",
    )
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 repeats")
    args = p.parse_args()
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    autocast = True if cpu_has_native_bf16() else None
    tokenizer, rows = main_job_batches(args.model, args.protocol)
    vocab = len(tokenizer)
    pad = tokenizer.pad_token_id or 0
    config = SearchSFTConfig().training(micro_batch_size=args.micro_batch)
    results: dict[str, Any] = {}
    for name, demos in rows.items():
        batch = train_batch(demos, config, pad)
        columns = {k: np.asarray(v) for k, v in batch.policy_batches[DEFAULT_MODULE_ID].items()}
        learners = {
            share: build_learner(args.model, share, args.micro_batch, autocast, vocab)
            for share in (False, True)
        }
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(repeats + 1):
            for share, learner in learners.items():
                started = time.perf_counter()
                learner.update(batch=batch, num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False)
                if repeat:  # the first update of each is a warm-up
                    seconds[share].append(time.perf_counter() - started)
            done = {("shared" if share else "plain"): round(s[-1], 2) for share, s in seconds.items() if s}
            print(f"{name}: repeat {repeat}/{repeats} {done or '(warm-up)'}", flush=True)
        weights = [
            dict(learners[share].module[DEFAULT_MODULE_ID].named_parameters()) for share in (False, True)
        ]
        drift = max(float((weights[0][n] - weights[1][n]).abs().max()) for n in weights[0])
        plain, shared = median(seconds[False]), median(seconds[True])
        results[name] = {
            "rows": len(demos),
            "tokens": int(columns["attention_mask"].sum()),
            "plain_s": plain,
            "shared_s": shared,
            "speedup": plain / shared,
            "decoder_positions": positions(columns, args.micro_batch),
            "max_weight_difference_after_updates": drift,
        }
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    out = {
        "benchmark": "shared_prefix",
        "model": args.model,
        "protocol": args.protocol,
        "autocast_bf16": bool(autocast),
        "threads": args.threads,
        "repeats": repeats,
        "sft_step_speedup": results["sft"]["speedup"],
        "calibration_step_speedup": results["calibration"]["speedup"],
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.protocol == "search_r1_compact" else f"_{args.protocol}") + (
        "_quick" if args.quick else ""
    )
    path = RESULTS / f"shared_prefix{suffix}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
