"""bf16 on the CPU benchmark: the main job's two hot loops in fp32 and in bf16, side by side, alternating.

1. Greedy evaluation: the main job's held-out evaluation (50 1-hop + 50 2-hop questions, one batch) by an
   EnvRunner whose engine holds fp32 weights against one holding bf16 weights
   (``rollouts(engine_dtype="bfloat16")``), the same checkpoint, questions and env settings as
   ``main_job_parts_bench.py``. Also reported: how many answers agree (bf16 rounding moves a few greedy
   choices) and each one's EM.
2. The GRPO learner's update: one ``update`` of a batch shaped like a main-job iteration in fp32 against
   under bf16 autocast over the fp32 master weights (``training(autocast=True)``, what ``--bf16`` sets).
3. ``--parts int8_evaluation`` (not run by default): the same evaluation with the fp32 engine against one
   whose linear layers are PyTorch's dynamic int8 ones (``torch.ao.quantization.quantize_dynamic``, fbgemm),
   the lead for CPUs without bf16 units. It is why the engine has no int8 option: it is only a little
   faster and changes most greedy answers (this part reports both).

Worth it only on a CPU with bf16 matrix units (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``, printed
in the result): without them PyTorch emulates bf16 and it runs slower. Medians over ``--repeats``
alternating repeats (the first of each a warm-up, not counted). Run it with a main job's warm start (the base
model never closes a turn). Prints a final JSON line and writes ``benchmarks/results/bf16_cpu.json``
(``_quick`` with ``--quick``: 2 repeats, 20 + 20 questions; ``--questions``, ``--repeats`` and ``--parts``
for a slow machine), with the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/bf16_cpu_bench.py --model runs/tiny_cpu_grpo/warm_start_model [--quick]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median

import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.learner_bench import build_learner  # noqa: E402
from benchmarks.main_job_parts_bench import evaluation_runner, grpo_batch, timed  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.env.rewards import exact_match  # noqa: E402

DTYPES = ("float32", "bfloat16")


def cpu_bf16_flags() -> list[str]:
    """The CPU's bf16 instruction sets, as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return []
    return sorted(flag for flag in flags.split() if "bf16" in flag)


def alternate_evaluations(
    evaluations: dict[str, Callable[[], list]], questions: list, repeats: int
) -> dict[str, object]:
    """Time each of two evaluations of ``questions`` (``float32`` and one candidate, each returning its
    rollout records), alternating; medians after a warm-up round; answers compared and scored."""
    (candidate,) = [name for name in evaluations if name != "float32"]
    runs: dict[str, list[float]] = {name: [] for name in evaluations}
    answers: dict[str, list] = {}
    for repeat in range(repeats + 1):
        for name, evaluate in evaluations.items():
            seconds, records = timed(evaluate)
            answers[name] = [r.answer for r in records]
            if repeat:  # the first round warms up the engine and its prefix cache
                runs[name].append(seconds)
            print(f"  evaluation {len(questions)} questions, {name:>8}: {seconds:6.1f}s", flush=True)
    seconds = {name: median(values) for name, values in runs.items()}
    gold = [q.golden_answers for q in questions]
    return {
        "float32_s": seconds["float32"],
        f"{candidate}_s": seconds[candidate],
        f"{candidate}_vs_float32_speedup": seconds["float32"] / seconds[candidate],
        "same_answers": sum(a == b for a, b in zip(answers["float32"], answers[candidate])),
        "questions": len(questions),
        "em": {
            name: sum(exact_match(a, g) for a, g in zip(answers[name], gold)) / len(questions)
            for name in evaluations
        },
    }


def bench_evaluation(model: str, questions_per_hop: int, repeats: int) -> dict[str, object]:
    """fp32 against bf16 engine weights on the same questions, alternating."""
    runners, questions = {}, []
    for dtype in DTYPES:
        runners[dtype], by_hops = evaluation_runner(model, engine_dtype=dtype)
        questions = [q for h in (1, 2) for q in by_hops[h][:questions_per_hop]]
    evaluations = {
        dtype: (lambda runner=runner: runner.rollout_records(questions)) for dtype, runner in runners.items()
    }
    return {"questions_per_hop": questions_per_hop, **alternate_evaluations(evaluations, questions, repeats)}


def bench_int8_evaluation(model: str, questions_per_hop: int, repeats: int) -> dict[str, object]:
    """fp32 against dynamic-int8 linear layers in the engine, on the same questions, alternating. One
    runner; the int8 engine is a second prefix-caching engine over a quantized copy of its model."""
    import copy

    from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine

    runner, by_hops = evaluation_runner(model)
    questions = [q for h in (1, 2) for q in by_hops[h][:questions_per_hop]]
    quantized = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(runner.module.model), {torch.nn.Linear}, dtype=torch.qint8
    )
    engines = {"float32": runner.engine, "int8": PrefixCachingHFEngine(quantized, runner.tokenizer)}

    def with_engine(engine: object) -> list:
        runner.engine = engine
        return runner.rollout_records(questions)

    evaluations = {name: (lambda engine=engine: with_engine(engine)) for name, engine in engines.items()}
    return {"questions_per_hop": questions_per_hop, **alternate_evaluations(evaluations, questions, repeats)}


def bench_learner(model: str, prompt_tokens: int, repeats: int) -> dict[str, float]:
    """One GRPO update in fp32 against under bf16 autocast, the same batch, alternating."""
    learners = {
        dtype: build_learner(model, 16, kl_coeff=0.001, lr=5e-6, autocast=dtype == "bfloat16")
        for dtype in DTYPES
    }
    vocab = int(learners["float32"].module[DEFAULT_MODULE_ID].unwrapped().model.config.vocab_size)
    batch = grpo_batch(vocab, prompt_tokens)
    multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=32)
    runs: dict[str, list[float]] = {dtype: [] for dtype in DTYPES}
    for repeat in range(repeats + 1):
        for dtype, learner in learners.items():
            seconds, _ = timed(
                lambda learner=learner: learner.update(
                    batch=multi, num_epochs=1, minibatch_size=16, shuffle_batch_per_epoch=False
                )
            )
            if repeat:
                runs[dtype].append(seconds)
            print(f"  GRPO update, {dtype:>8}: {seconds:6.2f}s", flush=True)
    seconds = {dtype: median(values) for dtype, values in runs.items()}
    return {
        "rows": 32,
        "prompt_tokens": prompt_tokens,
        "float32_s": seconds["float32"],
        "bfloat16_autocast_s": seconds["bfloat16"],
        "bfloat16_vs_float32_speedup": seconds["float32"] / seconds["bfloat16"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a main job's warm_start_model")
    parser.add_argument("--quick", action="store_true", help="2 repeats, 20 + 20 evaluation questions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--questions", type=int, help="held-out questions a hop count (50; quick: 20)")
    parser.add_argument("--prompt-tokens", type=int, default=110, help="the compact prompt and a question")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--parts",
        default="evaluation,grpo_update",
        help="comma-separated: evaluation, grpo_update (on a CPU without bf16 units one emulated bf16 "
        "update takes over 10x fp32's), int8_evaluation",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts or not parts <= {"evaluation", "grpo_update", "int8_evaluation"}:
        parser.error(f"--parts takes evaluation, grpo_update and int8_evaluation, got {args.parts!r}")
    torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    result: dict[str, object] = {
        "benchmark": "bf16_cpu",
        "quick": args.quick,
        "model": args.model,
        "torch_threads": args.threads,
        "cpu_bf16_flags": cpu_bf16_flags(),
        "repeats": repeats,
    }
    size = args.questions or (20 if args.quick else 50)  # held-out questions a hop count
    if "evaluation" in parts:
        print(f"held-out evaluation: {size} + {size} questions", flush=True)
        result["evaluation"] = bench_evaluation(args.model, size, repeats)
    if "int8_evaluation" in parts:
        print(
            f"held-out evaluation, fp32 against dynamic int8 linears: {size} + {size} questions", flush=True
        )
        result["int8_evaluation"] = bench_int8_evaluation(args.model, size, repeats)
    if "grpo_update" in parts:
        print("GRPO learner update", flush=True)
        result["grpo_update"] = bench_learner(args.model, args.prompt_tokens, repeats)
    write_results("bf16_cpu_quick" if args.quick else "bf16_cpu", result)


if __name__ == "__main__":
    sys.exit(main())
