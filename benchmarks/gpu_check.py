"""The GPU check: one colocated GRPO iteration of the Search-R1 recipe at small scale on one GPU.

Run it on any machine with one CUDA GPU and this package installed with Ray (and vLLM for the default
engine). It builds ``search_r1_grpo(scale="paper")`` with a small model (default: the bundled SmolLM2),
one learner and one EnvRunner sharing the GPU (``rollouts(colocate=True)``, half a GPU each, one
placement-group bundle), BM25 over a synthetic world in-process, and trains one iteration. It checks:

- fp32 master weights: every trainable parameter of the learner's policy is float32;
- the weight sync: the engine's log-probs of a fixed greedy continuation agree with the learner's (within
  ``--logprob-tolerance``; the engine computes in bf16) before the update, and after the update and sync
  they have moved and agree again;
- sleep frees memory: the GPU memory free in the EnvRunner's process before and after the engine sleeps
  (vLLM; the HF engine has nothing to free and reports 0);
- the order of the colocated iteration (sample, sleep, sync, wake) as the EnvRunner recorded it;
- peak memory against the plan (``algos/plan``): the learner's and the EnvRunner's
  ``torch.cuda.max_memory_allocated`` beside the plan's per-GPU peak for the same config.

Prints a line per check and a final JSON line; writes ``benchmarks/results/gpu_check.json`` (the device
named in ``machine``'s ``gpu``). Exits non-zero when a check fails.

    python benchmarks/gpu_check.py                 # vLLM EnvRunner (needs vllm)
    python benchmarks/gpu_check.py --engine hf     # the learner-only path: HF engine on CUDA, no vLLM
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks.results_file import write_results  # noqa: E402

GIB = 1024**3
PROMPT = "Question: who founded the company that made the first search engine?\nAnswer:"


def build_config(args: argparse.Namespace, corpus: str, questions: list[Any]) -> Any:
    """Search-R1's GRPO at paper scale, cut to one colocated pair and a handful of short episodes."""
    from rllib_search.recipes import search_r1_grpo

    config = search_r1_grpo(
        dataset=questions, retriever={"type": "bm25", "corpus": corpus}, scale="paper", model=args.model
    )
    engine_options = {"gpu_memory_utilization": args.gpu_memory_utilization} if args.engine == "vllm" else {}
    return (
        config.rollouts(
            engine=args.engine,
            engine_options=engine_options,
            group_size=4,
            prompts_per_sample=2,
            max_turn_tokens=64,
            colocate=True,
        )
        .learners(num_learners=1, num_gpus_per_learner=0.5)
        .env_runners(num_env_runners=1, num_gpus_per_env_runner=0.5)
        .training(minibatch_size=8, micro_batch_size=2, sharding=None, warmup_ratio=0.0, lr=args.lr)
        .debugging(seed=0)
    )


def learner_logprobs(algo: Any, prefix: list[int], tokens: list[int]) -> list[float]:
    """The learner policy's log-probabilities of ``tokens`` after ``prefix`` (fp32 masters, no autocast)."""
    import torch

    def score(module: Any) -> list[float]:
        model = module.model
        device = next(model.parameters()).device
        ids = torch.tensor([prefix + tokens], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prefix) - 1 : -1].float()
        picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prefix) :, None])[:, 0]
        return picked.cpu().tolist()

    return algo.on_policy_module(score)


def on_runner(algo: Any, fn: Any) -> Any:
    """``fn(runner)`` on the (one) remote EnvRunner."""
    return algo.env_runner_group.foreach_env_runner(fn, local_env_runner=False)[0]


def engine_continuation(algo: Any, prefix: list[int]) -> tuple[list[int], list[float]]:
    """The engine's greedy continuation of ``prefix`` (16 tokens) and its log-probabilities."""

    def generate(runner: Any) -> tuple[list[int], list[float]]:
        from rllib_search.llm.engines.base import SamplingParams

        segment = runner.engine.generate([prefix], SamplingParams(temperature=0.0, max_new_tokens=16))[0]
        return list(segment.token_ids), [float(x) for x in segment.logprobs]

    return on_runner(algo, generate)


def sleep_frees(algo: Any) -> dict[str, float]:
    """GPU memory free in the EnvRunner's process before and after its engine sleeps, then awake again."""

    def measure(runner: Any) -> dict[str, float]:
        import torch

        before = torch.cuda.mem_get_info()[0]
        runner.engine.sleep(level=1)  # keeps the weights on the host: the engine wakes up as it was
        asleep = torch.cuda.mem_get_info()[0]
        runner.engine.wake_up()
        return {"free_awake_gib": before / GIB, "free_asleep_gib": asleep / GIB}

    return on_runner(algo, measure)


def peaks(algo: Any) -> dict[str, float]:
    """``torch.cuda.max_memory_allocated`` of the learner and the EnvRunner processes (GiB)."""

    def peak(_: Any = None) -> float:
        import torch

        return torch.cuda.max_memory_allocated() / GIB

    learner_peak = next(iter(algo.learner_group.foreach_learner(lambda learner: peak()))).get()
    return {"learner_gib": float(learner_peak), "env_runner_gib": float(on_runner(algo, peak))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the policy (default: bundled)")
    parser.add_argument("--lr", type=float, default=1e-5, help="the update's learning rate")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the GPU")
    parser.add_argument("--logprob-tolerance", type=float, default=0.1, help="engine vs learner, per token")
    args = parser.parse_args(argv)

    import ray
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    from rllib_search.algos.plan import make_plan
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world

    started = time.monotonic()
    device = torch.cuda.get_device_name(0)
    total_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    world = generate_world(SyntheticWorldConfig(seed=0, num_passages=300, num_train=16, num_test=8))
    corpus = Path(tempfile.mkdtemp(prefix="gpu_check")) / "corpus.jsonl"
    write_corpus_jsonl(world.passages, corpus)
    config = build_config(args, str(corpus), world.train)
    plan = make_plan(config, gpus=1, gpu_memory_gib=total_gib, name="gpu_check")
    print(plan)
    checks: dict[str, bool] = {}
    figures: dict[str, Any] = {"device": device, "gpu_memory_gib": round(total_gib, 2), "engine": args.engine}

    ray.init(num_gpus=1)
    algo = config.build_algo()
    try:
        dtypes = algo.on_policy_module(
            lambda module: sorted({str(p.dtype) for p in module.model.parameters() if p.requires_grad})
        )
        checks["fp32_masters"] = dtypes == ["torch.float32"]
        print(f"trainable parameter dtypes: {dtypes}")

        prefix = on_runner(algo, lambda runner: list(runner.tokenizer.encode(PROMPT)))
        tokens, engine_before = engine_continuation(algo, prefix)
        learner_before = learner_logprobs(algo, prefix, tokens)
        gap_before = max(abs(a - b) for a, b in zip(engine_before, learner_before))
        checks["logprobs_match_before"] = gap_before <= args.logprob_tolerance
        print(f"engine vs learner log-probs before the update: max gap {gap_before:.4f}")

        result = algo.train()
        events = [name for name, _ in on_runner(algo, lambda runner: list(runner.events))]
        order = [e for e in events if e in ("sample", "sleep", "sync", "wake")]
        checks["colocated_order"] = order[-4:] == ["sample", "sleep", "sync", "wake"]
        print(f"EnvRunner events: {order}")

        engine_after = engine_continuation_scored(algo, prefix, tokens)
        learner_after = learner_logprobs(algo, prefix, tokens)[: len(engine_after)]
        moved = max((abs(a - b) for a, b in zip(engine_after, engine_before)), default=0.0)
        gap_after = max((abs(a - b) for a, b in zip(engine_after, learner_after)), default=float("inf"))
        checks["engine_logprobs_moved"] = moved > 0.0
        checks["logprobs_match_after"] = gap_after <= args.logprob_tolerance
        print(f"after the sync: engine moved by up to {moved:.5f}, engine vs learner gap {gap_after:.4f}")

        memory = sleep_frees(algo)
        freed = memory["free_asleep_gib"] - memory["free_awake_gib"]
        checks["sleep_frees_memory"] = freed > 0.0 if args.engine == "vllm" else True
        print(f"engine sleep freed {freed:.2f} GiB in the EnvRunner's process")

        peak = peaks(algo)
        predicted = {kind.name: kind.peak / GIB for kind in plan.gpu_kinds}
        print(
            f"peak allocated: learner {peak['learner_gib']:.2f}, EnvRunner {peak['env_runner_gib']:.2f} GiB"
        )
        print(f"plan's per-GPU peak: {predicted}")
        figures.update(
            {
                "trainable_dtypes": dtypes,
                "logprob_gap_before": gap_before,
                "logprob_gap_after": gap_after,
                "engine_logprob_moved": moved,
                "sleep_freed_gib": freed,
                "peak_allocated_gib": peak,
                "plan_peak_gib": predicted,
                "plan_fits": plan.fits,
                "iteration_reward": result.get("env_runners", {}).get("episode_return_mean"),
                "events": order,
            }
        )
    finally:
        algo.stop()
        ray.shutdown()
    figures["seconds"] = round(time.monotonic() - started, 1)
    passed = all(checks.values())
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    name = "gpu_check" if args.engine == "vllm" else "gpu_check_hf"
    write_results(name, {"benchmark": "gpu_check", "checks": checks, "passed": passed, **figures})
    return 0 if passed else 1


def engine_continuation_scored(algo: Any, prefix: list[int], tokens: list[int]) -> list[float]:
    """The engine's log-probabilities of ``tokens`` after ``prefix`` now: its greedy continuation again
    (the update at a small learning rate keeps the greedy tokens); a changed continuation is scored on its
    common prefix with ``tokens``."""
    again, logprobs = engine_continuation(algo, prefix)
    common = next((i for i, (a, b) in enumerate(zip(again, tokens)) if a != b), min(len(again), len(tokens)))
    if common < len(tokens):
        print(f"note: the greedy continuation changed after token {common}; comparing the first {common}")
    return logprobs[:common]


if __name__ == "__main__":
    sys.exit(main())
