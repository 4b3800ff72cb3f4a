"""Exact-products benchmark: the rollout engine's decoding step with and without ``ExactProducts``.

``PrefixCachingHFEngine`` serves a forward pass's fp32 CPU matrix products of a few rows with the fastest
formulation checked bitwise equal to ``F.linear`` for their shape (``rllib_search/llm/engines/
exact_products.py``). This benchmark runs two engines over one model (the bundled SmolLM2 policy by
default), one with it and one without, on the same prompts (chat prompts of the embedded world's
questions), greedy, every row generating ``--tokens`` tokens (EOS ignored, so the batch keeps its rows),
alternating engine by engine within each repeat (the first repeat a warm-up, not counted), at each of
``--rows``. Per row count it reports the median seconds of a decoding step (one new token a row; prefill
passes are left out) for each engine, their ratio, whether both engines generated the same tokens and
log-probs, and which formulations served the products.

With ``--evaluation-model`` (a main job's warm start, e.g. ``runs/tiny_cpu_grpo/warm_start_model``: the
bundled base model never closes a turn) it also times the main job's greedy evaluation, multi-turn with
retrieval, on ``--evaluation-questions`` held-out questions per hop count in one batch (the EnvRunner of
``benchmarks/main_job_parts_bench.py``: the compact protocol, 3 turns, two passages, 48 tokens a turn),
with the runner's engine's ``ExactProducts`` off and on, alternating: seconds and whether the answers and
episodes' tokens are the same. Prints a final JSON line and writes ``benchmarks/results/
exact_products.json`` (``_quick`` with ``--quick``: 2 repeats, rows 8 and 32, 8 tokens, 10 questions), with
the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/exact_products_bench.py [--quick] [--rows 8,16,32,64,100] [--model NAME_OR_PATH]
        [--evaluation-model runs/tiny_cpu_grpo/warm_start_model] [--evaluation-questions 50]

(``--rows ""`` times the evaluation alone, written to ``exact_products_evaluation.json``.)
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world  # noqa: E402
from rllib_search.llm.engines import SamplingParams  # noqa: E402
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine  # noqa: E402
from rllib_search.llm.models import cpu_description, describe_cpu, load_causal_lm  # noqa: E402


class TimedEngine:
    """An engine whose forward passes are timed, decoding steps (one new token a row) apart."""

    def __init__(self, engine: PrefixCachingHFEngine) -> None:
        self.engine = engine
        self.decode_seconds: list[float] = []
        forward = engine._forward

        def timed_forward(input_ids, *args, **kwargs):
            started = time.perf_counter()
            logits = forward(input_ids, *args, **kwargs)
            if input_ids.shape[1] == 1:
                self.decode_seconds.append(time.perf_counter() - started)
            return logits

        engine._forward = timed_forward

    def generate(self, prefixes: list[list[int]], params: SamplingParams) -> list[tuple]:
        self.engine.reset_cache()
        return [(s.token_ids, s.logprobs) for s in self.engine.generate(prefixes, params)]


def prompts(tokenizer, count: int) -> list[list[int]]:
    """Chat prompts of the embedded world's test questions, 1- and 2-hop."""
    world = generate_world(SyntheticWorldConfig(seed=0))
    questions = [record.question for record in world.test][:count]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def measure(model, tokenizer, rows: int, tokens: int, repeats: int) -> dict:
    """Both engines at ``rows`` rows: median decoding-step seconds, ratio, same outputs, formulations."""
    engines = {
        "plain": TimedEngine(PrefixCachingHFEngine(model, tokenizer, exact_products=False)),
        "exact": TimedEngine(PrefixCachingHFEngine(model, tokenizer)),
    }
    batch = prompts(tokenizer, rows)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens, ignore_eos=True)
    outputs: dict[str, list] = {}
    for repeat in range(repeats):
        for name, engine in engines.items():
            if repeat == 1:
                engine.decode_seconds.clear()  # the first repeat was the warm-up
            outputs[name] = engine.generate(batch, params)
    plain = median(engines["plain"].decode_seconds)
    exact = median(engines["exact"].decode_seconds)
    products = engines["exact"].engine.products
    return {
        "rows": rows,
        "plain_step_ms": round(plain * 1e3, 1),
        "exact_step_ms": round(exact * 1e3, 1),
        "speedup": round(plain / exact, 3),
        "same_tokens_and_logprobs": outputs["plain"] == outputs["exact"],
        "formulations": dict(products.calls),
        "shape_keys": len(products.keys),
    }


def measure_evaluation(model: str, questions_per_hop: int, repeats: int) -> dict:
    """The main job's greedy evaluation with the engine's ExactProducts off and on: seconds, same output."""
    from benchmarks.main_job_parts_bench import evaluation_runner

    runner, by_hops = evaluation_runner(model)
    engine = runner.engine
    products = {"plain": None, "exact": engine.products}
    records = [record for hops in (1, 2) for record in by_hops[hops][:questions_per_hop]]
    seconds: dict[str, list[float]] = {name: [] for name in products}
    outputs: dict[str, list] = {}
    for repeat in range(repeats):
        for name, served_by in products.items():
            engine.products = served_by
            started = time.perf_counter()
            rollouts = runner.rollout_records(records)
            took = time.perf_counter() - started
            outputs[name] = [(r.answer, r.token_ids.tolist()) for r in rollouts]
            if repeat:  # the first repeat warms up (and checks the shape keys)
                seconds[name].append(took)
            print(f"  evaluation of {len(records)} questions, {name}: {took:.1f} s", flush=True)
    plain, exact = median(seconds["plain"]), median(seconds["exact"])
    return {
        "model": model,
        "questions": len(records),
        "plain_s": round(plain, 3),
        "exact_s": round(exact, 3),
        "speedup": round(plain / exact, 3),
        "same_answers_and_tokens": outputs["plain"] == outputs["exact"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", default="8,16,32,64,100", help="decoding batch sizes, comma-separated")
    parser.add_argument("--tokens", type=int, default=24, help="tokens each row generates")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (the first a warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--evaluation-model", default=None, help="a main job's warm start (see above)")
    parser.add_argument("--evaluation-questions", type=int, default=50, help="questions per hop count")
    parser.add_argument("--quick", action="store_true", help="2 repeats, rows 8, 32, 8 tokens, 10 questions")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rows, args.tokens, args.evaluation_questions = 2, "8,32", 8, 10
    torch.set_num_threads(args.threads)
    print(f"machine: {describe_cpu(cpu_description())}", flush=True)
    model, tokenizer = load_causal_lm(args.model)
    by_rows = []
    for rows in [int(r) for r in args.rows.split(",") if r.strip()]:
        result = measure(model, tokenizer, rows, args.tokens, max(2, args.repeats))
        by_rows.append(result)
        print(
            f"{rows:4d} rows: a decoding step {result['plain_step_ms']} ms -> {result['exact_step_ms']} ms "
            f"({result['speedup']:.2f}x), same tokens and log-probs: {result['same_tokens_and_logprobs']}",
            flush=True,
        )
    evaluation = None
    if args.evaluation_model:
        repeats = max(2, args.repeats)
        evaluation = measure_evaluation(args.evaluation_model, args.evaluation_questions, repeats)
        print(
            f"main job's evaluation, {evaluation['questions']} questions: {evaluation['plain_s']} s -> "
            f"{evaluation['exact_s']} s ({evaluation['speedup']:.2f}x), "
            f"same answers and tokens: {evaluation['same_answers_and_tokens']}",
            flush=True,
        )
    summary = {
        "benchmark": "exact_products",
        "model": args.model,
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "by_rows": by_rows,
        "evaluation": evaluation,
        "all_same": all(r["same_tokens_and_logprobs"] for r in by_rows)
        and (evaluation is None or evaluation["same_answers_and_tokens"]),
    }
    # The evaluation alone (``--rows ""``) does not replace the decoding steps' figures.
    name = "exact_products" + ("" if by_rows else "_evaluation") + ("_quick" if args.quick else "")
    write_results(name, summary)


if __name__ == "__main__":
    main()
