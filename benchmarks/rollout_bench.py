"""Rollout benchmark: the LLMEnvRunner's multi-turn rollout against the raw engine, side by side.

For each model (a tiny Llama and the bundled SmolLM2-135M-Instruct, each trained for a few steps to open
its answers with a search turn, so that every episode searches; ``--smollm2 DIR`` takes another SmolLM2,
such as the main job's warm start):

- rollout: ``LLMEnvRunner.sample()`` on the synthetic world with an in-process BM25 retriever (search_r1
  protocol, stop strings, up to 3 turns) and its default engine (``PrefixCachingHFEngine``): generated
  tokens / wall time of the whole sample (engine, env parsing, retrieval, observation tokenisation);
- same-engine raw (the headline, like for like): ``PrefixCachingHFEngine.generate``, the rollout's own
  engine, fresh, in ONE call for the same prompts, each row generating exactly the number of tokens its
  episode generated in total (no stop strings, EOS ignored). It prefills a prompt shared by G samples once,
  as the rollout does, so this ratio isolates what the turns cost: observations to prefill and attend to,
  a decode batch that drains at every turn's end, env and retrieval (below 1: the rollout does that
  call's work and more);
- raw: ``HFEngine.generate`` (transformers' ``generate``) in ONE call for the same prompts, each row
  generating exactly the number of tokens its episode generated in total (no stop strings, EOS ignored):
  generated tokens / wall time. Not like for like: ``HFEngine`` prefills a prompt shared by G samples G
  times and decodes finished rows on to the longest row's limit, which the rollout's engine does not;
- context-matched raw: the same, but each row starts from its episode's own tokens, cut so that its
  generated tokens attend to as many tokens on average as the episode's did. The rollout's tokens come after
  retrieved observations; for a model as small as the tiny one, attention over them is most of a step's
  cost, which the plain raw call does not pay.

Where the turns' cost goes: the rollout's wall time and the same-engine call's are each split into forward
passes that prefill (the prompt; in a rollout also each observation), forward passes that decode, the
engine's bookkeeping (caches, sampling, stop strings; ``PrefixCachingHFEngine.seconds``) and what happens
outside the engine (the env's parsing, retrieval, observation tokenisation). ``turn_cost_share_<part>`` is
the rollout's extra seconds in that part over the call's, as a share of the rollout's wall time. On
SmolLM2 the observations' prefill, work the one call never does, is the whole gap; on the tiny model it is
the largest part, beside attention over the longer contexts and the turns' bookkeeping.

Each figure is the median of alternating repeats, each on the next questions: 7 for the tiny model, whose
repeats take seconds and vary by 10% on a shared machine, 3 for SmolLM2 (3 and 2 with ``--quick``).
Episodes come in groups of ``--group-size`` samples a question (default 4, as GRPO; 1 as PPO: then no
prompt is shared, and the results go to ``rollout_g1.json``).
Also counted: tokens kept after a stop tag in any rollout segment (must be 0), and the mean context each
generated token attends to in each. Prints a final JSON line and writes ``benchmarks/results/rollout.json``
(``rollout_g<G>.json`` for another group size; ``--quick`` adds ``_quick`` to the name, never overwriting
the full run's file), with the commit and the machine (``benchmarks/results_file.py``); ``--quick`` runs
in under 3 minutes.

    OMP_NUM_THREADS=1 python benchmarks/rollout_bench.py [--quick] [--group-size G]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rllib_search import ENV_ID
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.env.protocols import get_protocol
from rllib_search.llm.engines import SamplingParams
from rllib_search.llm.engines.hf import HFEngine
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit
from rllib_search.serve.retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "smollm2-135m-instruct"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402

SEARCH_TURN = "<think> look </think>\n<search> lead singer </search> and then more words"


def searching_tiny_model(out: Path, questions: list[str]) -> Path:
    """A tiny Llama trained for a few steps to open answers with a search turn (so stop strings fire)."""
    base = build_tiny_causal_lm(out / "base", build_tiny_tokenizer(out / "tok"))
    return teach_to_emit(base, out / "trained", questions, SEARCH_TURN)


def searching_smollm2(out: Path, questions: list[str]) -> Path:
    """The bundled SmolLM2-135M-Instruct trained for a few steps to open its answers to the rollout's own
    prompts (Search-R1's instruction around each question) with a search turn: as instructed, it mostly
    answers at once, and a rollout without searches measures no turns."""
    instruction = get_protocol("search_r1").instruction
    prompts = [instruction.format(question=question) for question in questions]
    return teach_to_emit(SMOLLM2, out / "smollm2_searching", prompts, SEARCH_TURN, steps=24, lr=5e-5)


def tokens_after_stop(runner: LLMEnvRunner, rollouts) -> int:
    """Tokens kept after the token that completes a stop string, over every generated segment."""
    extra = 0
    for rollout in rollouts:
        for start, end in rollout.turn_spans:
            ids = rollout.token_ids[start:end].tolist()
            for cut in range(1, len(ids) + 1):
                if any(stop in runner.tokenizer.decode(ids[:cut]) for stop in runner.sampling.stop):
                    extra += len(ids) - cut
                    break
    return extra


def generated_positions(rollout) -> list[int]:
    """The positions of a rollout's generated tokens in its sequence: how many tokens each one attends to."""
    return [position for start, end in rollout.turn_spans for position in range(start, end)]


def mean(values) -> float:
    values = list(values)
    return sum(values) / max(1, len(values))


def raw_generate(engine: HFEngine, prefixes: list[list[int]], limits: list[int]):
    """ONE engine call, each row generating exactly its limit (EOS ignored); the segments and seconds."""
    params = SamplingParams(temperature=1.0, max_new_tokens=max(limits), seed=0, ignore_eos=True)
    started = time.perf_counter()
    segments = engine.generate(prefixes, params, limits)
    return segments, time.perf_counter() - started


def timed(engine: PrefixCachingHFEngine, work):
    """``work()``'s result and wall seconds, and where the engine spent its part of them: forward passes that
    prefill, forward passes that decode, the engine's bookkeeping (caches, sampling, stop strings), and
    what happened outside the engine (for a rollout: the env's parsing, retrieval, observations)."""
    before = dict(engine.seconds)
    started = time.perf_counter()
    result = work()
    wall = time.perf_counter() - started
    spent = {phase: engine.seconds[phase] - before[phase] for phase in before}
    parts = {
        "prefill": spent["prefill"],
        "decode": spent["decode"],
        "engine_bookkeeping": spent["call"] - spent["prefill"] - spent["decode"],
        "outside_engine": wall - spent["call"],
    }
    return result, wall, parts


def measure(
    model: str, world, prompts: int, group_size: int, turn_tokens: int, repeats: int
) -> dict[str, float]:
    """Median figures over ``repeats`` alternating rollout / raw measurements with one runner."""
    env_config = {
        "retriever": BM25Retriever(world.passages),
        "dataset": world.train,
        "protocol": "search_r1",
        "max_turns": 3,
        "max_total_tokens": 2048,
        "max_obs_tokens": 200,
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model})
        .rollouts(group_size=group_size, prompts_per_sample=prompts, max_turn_tokens=turn_tokens)
        .debugging(seed=0)
    )
    runner = LLMEnvRunner(config=config)
    runner.sample(num_prompts=1)  # warm-up
    engine = HFEngine(runner.module.model, runner.tokenizer)
    same_engine = PrefixCachingHFEngine(runner.module.model, runner.tokenizer)
    # Rollout and raw calls alternate, each repeat on the next questions; medians absorb a shared machine.
    runs = [measure_once(runner, engine, same_engine) for _ in range(repeats)]
    summary = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    summary["repeats"] = repeats
    summary["rollout_vs_raw_ratios"] = [run["rollout_vs_raw_tokens_per_s_ratio"] for run in runs]
    summary["tokens_generated_after_stop"] = sum(run["tokens_generated_after_stop"] for run in runs)
    return summary


def measure_once(
    runner: LLMEnvRunner, engine: HFEngine, same_engine: PrefixCachingHFEngine
) -> dict[str, float]:
    """One rollout sample, then the raw, same-engine raw and context-matched raw calls for its episodes."""
    rollouts, rollout_s, rollout_parts = timed(runner.engine, runner.sample)
    rollout_tokens = sum(r.num_generated_tokens for r in rollouts)

    limits = [max(1, r.num_generated_tokens) for r in rollouts]
    prompts = [r.token_ids[: r.prompt_length].tolist() for r in rollouts]
    # The raw baseline: the same number of tokens from the prompts, in one call.
    segments, raw_s = raw_generate(engine, prompts, limits)
    raw_tokens = sum(len(s.token_ids) for s in segments)
    same_engine.reset_cache()
    (same, same_s), _, same_parts = timed(
        same_engine,
        lambda: raw_generate(same_engine, prompts, limits),
    )
    same_tokens = sum(len(s.token_ids) for s in same)
    # Context-matched: each row starts from its own episode's tokens, cut so that its generated tokens
    # attend to as many tokens on average as the episode's did (prefix + (count - 1) / 2 = that mean).
    starts = [
        max(1, round(mean(generated_positions(r)) - (limit - 1) / 2)) for r, limit in zip(rollouts, limits)
    ]
    matched, matched_s = raw_generate(
        engine, [r.token_ids[:p].tolist() for r, p in zip(rollouts, starts)], limits
    )
    matched_tokens = sum(len(s.token_ids) for s in matched)

    rollout_tps, raw_tps = rollout_tokens / rollout_s, raw_tokens / raw_s
    return {
        "episodes": len(rollouts),
        "rollout_generated_tokens": rollout_tokens,
        "rollout_seconds": rollout_s,
        "rollout_tokens_per_s": rollout_tps,
        "raw_generated_tokens": raw_tokens,
        "raw_seconds": raw_s,
        "raw_tokens_per_s": raw_tps,
        "rollout_vs_raw_tokens_per_s_ratio": rollout_tps / raw_tps,
        "same_engine_raw_tokens_per_s": same_tokens / same_s,
        "rollout_vs_same_engine_raw_tokens_per_s_ratio": rollout_tps / (same_tokens / same_s),
        # Seconds of each part in the rollout and in the same-engine call, and the rollout's extra seconds
        # per part as a share of its wall time: together they say what the turns cost.
        **{f"rollout_{part}_seconds": value for part, value in rollout_parts.items()},
        **{f"same_engine_raw_{part}_seconds": value for part, value in same_parts.items()},
        **{
            f"turn_cost_share_{part}": (rollout_parts[part] - same_parts[part]) / rollout_s
            for part in rollout_parts
        },
        "rollout_mean_context_tokens": mean(p for r in rollouts for p in generated_positions(r)),
        "raw_mean_context_tokens": mean(
            r.prompt_length + k for r, seg in zip(rollouts, segments) for k in range(len(seg.token_ids))
        ),
        "context_matched_raw_tokens_per_s": matched_tokens / matched_s,
        "context_matched_raw_mean_context_tokens": mean(
            p + k for p, seg in zip(starts, matched) for k in range(len(seg.token_ids))
        ),
        "rollout_vs_context_matched_raw_tokens_per_s_ratio": rollout_tps / (matched_tokens / matched_s),
        "turns_per_episode": sum(r.stats["turns"] for r in rollouts) / len(rollouts),
        "searches_per_episode": sum(r.stats["searches"] for r in rollouts) / len(rollouts),
        "tokens_generated_after_stop": tokens_after_stop(runner, rollouts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes (< 3 minutes)")
    parser.add_argument(
        "--group-size", type=int, default=4, help="samples a question (episodes stay the same)"
    )
    parser.add_argument(
        "--smollm2",
        help="a SmolLM2 that searches on Search-R1's prompt, e.g. the main job's warm_start_model/ (default: "
        "the bundled one taught a search turn in a few steps)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    world = generate_world(SyntheticWorldConfig(num_passages=500, num_train=64, num_test=8))
    results: dict[str, object] = {
        "headline": "rollout vs one call of its own engine (PrefixCachingHFEngine), generated tokens/s",
        "benchmark": "rollout",
        "quick": args.quick,
        "group_size": args.group_size,
        "torch_threads": torch.get_num_threads(),
    }
    results["smollm2_model"] = args.smollm2 or "bundled SmolLM2-135M-Instruct, taught a search turn"
    group = args.group_size
    with tempfile.TemporaryDirectory() as tmp:
        questions = [r.question for r in world.train[:8]]
        tiny = searching_tiny_model(Path(tmp), questions)
        smollm2 = args.smollm2 or str(searching_smollm2(Path(tmp), questions))
        runs = {
            "tiny": (str(tiny), (32 if args.quick else 64) // group, group, 40, 3 if args.quick else 7),
            "smollm2-135m-instruct": (
                smollm2,
                (8 if args.quick else 16) // group,
                group,
                24 if args.quick else 48,
                2 if args.quick else 3,
            ),
        }
        for name, (model, prompts, samples, turn_tokens, repeats) in runs.items():
            print(
                f"[bench] {name}: {prompts} prompts x {samples} samples, {turn_tokens} tokens a turn",
                flush=True,
            )
            results[name] = measure(model, world, prompts, samples, turn_tokens, repeats=repeats)
            print(f"[bench] {name}: {json.dumps(results[name])}", flush=True)
    models = [results[name] for name in ("tiny", "smollm2-135m-instruct")]
    results["headline_ratio"] = {
        name: results[name]["rollout_vs_same_engine_raw_tokens_per_s_ratio"]
        for name in ("tiny", "smollm2-135m-instruct")
    }
    for key in (
        "rollout_vs_raw_tokens_per_s_ratio",
        "rollout_vs_same_engine_raw_tokens_per_s_ratio",
        "rollout_vs_context_matched_raw_tokens_per_s_ratio",
    ):
        results[key] = min(m[key] for m in models)
    results["tokens_generated_after_stop"] = sum(m["tokens_generated_after_stop"] for m in models)
    out_name = ("rollout" if group == 4 else f"rollout_g{group}") + ("_quick" if args.quick else "")
    write_results(out_name, results)


if __name__ == "__main__":
    main()
