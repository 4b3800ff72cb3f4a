"""GRPO step benchmark: our SearchGRPO iteration against TRL's GRPOTrainer step on the same work.

The same work, in one process, alternating (TRL's step k, then ours, then TRL's step k+1, ...):

- the bundled SmolLM2-135M-Instruct from the same fp32 weights on both sides;
- the same prompts token for token: Search-R1's instruction over questions of the embedded world, as a chat
  (TRL applies the chat template itself; the benchmark checks its ids equal our env's prompt ids);
- 4 prompts x 4 generations per step, at most 64 new tokens, temperature 1, one turn (TRL has no search
  loop), the same 4 questions every step;
- lr 1e-6, KL coefficient 0.001 (a frozen reference's forward on both sides), one optimizer step per step,
  fp32 without gradient checkpointing on both sides (TRL's defaults are bf16 and checkpointing),
  the whole batch in one forward and backward (``micro_batch_size`` 16 ours, ``per_device_train_batch_size``
  16 theirs), the sampler's log-probs as the old ones (no recompute on either side), 2 torch threads.

Both stop a generation at EOS; ours also stops at the protocol's tags (``</search>``, ``</answer>``), so
the tokens each side generated are reported with the times (``*_completion_tokens``), and the headline
``grpo_step_vs_trl_ratio`` (our median step / TRL's, lower is better) comes with the same ratio per generated
token. Medians are over the steps after the first (warm-up) one; the first steps are reported apart, with
their parts. Ours is split into sampling, learner update and weight sync (timed around the Algorithm's own
calls), plus the learner's padding fraction and what the shared prompt saved; TRL's into generation with
scoring (``sample``, around its ``_generate_and_score_completions``) and the rest.

``--multi-turn`` also times our step on Search-R1's 3-turn protocol with BM25 search (no TRL equivalent).
Prints a final JSON line and writes ``benchmarks/results/grpo_step.json`` (``grpo_step_quick.json`` with
``--quick``: 2 steps a side and 32 new tokens, the same on both sides, under 4 minutes), with the commit
and the machine (``benchmarks/results_file.py``). TRL is a benchmark extra: ``pip install -e .[bench]``.

    python benchmarks/grpo_step_bench.py [--quick] [--steps 6] [--new-tokens 64] [--multi-turn]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPTS, GROUP, LR, KL, TEMPERATURE = 4, 4, 1e-6, 0.001, 1.0


class PartTimer:
    """Wall time of named calls of one step, by wrapping the callables that make the step."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - started

        return timed

    def take(self) -> dict[str, float]:
        parts, self.parts = self.parts, {}
        return parts


class OurStep:
    """One ``SearchGRPO`` iteration (local EnvRunner and learner, in this process), timed by part."""

    def __init__(
        self, questions: list[Any], index_dir: Path, max_turns: int, new_tokens: int, seed: int
    ) -> None:
        from rllib_search import ENV_ID
        from rllib_search.algos import SearchGRPOConfig

        env_config = {
            "retriever": {"type": "index", "dir": str(index_dir)},
            "dataset": questions,
            "protocol": "search_r1",
            "max_turns": max_turns,
            "topk": 2,
            "max_obs_tokens": 100,
            "max_total_tokens": 2048,
        }
        config = (
            SearchGRPOConfig()
            .environment(ENV_ID, env_config=env_config)
            .rl_module(model_config={"model": MODEL})
            .rollouts(
                group_size=GROUP,
                prompts_per_sample=PROMPTS,
                max_turn_tokens=new_tokens,
                temperature=TEMPERATURE,
            )
            .training(
                lr=LR,
                kl_coeff=KL,
                micro_batch_size=PROMPTS * GROUP,
                minibatch_size=PROMPTS * GROUP,
                num_epochs=1,
                grad_clip=1.0,
            )
            .debugging(seed=seed)
            .dashboard_metrics(enabled=False)
        )
        self.algo = config.build_algo()
        self.timer = PartTimer()
        algo = self.algo
        algo.sample_rollouts = self.timer.wrap("sample", algo.sample_rollouts)
        algo.learner_group.update = self.timer.wrap("learner_update", algo.learner_group.update)
        algo.env_runner_group.sync_weights = self.timer.wrap(
            "weight_sync", algo.env_runner_group.sync_weights
        )

    def prompt_ids(self, question: str) -> list[int]:
        """Our env's prompt token ids for ``question``."""
        return self.algo.env_runner.new_env().render_prompt(question)[1]

    def __call__(self) -> dict[str, float]:
        started = time.perf_counter()
        result = self.algo.train()
        seconds = time.perf_counter() - started
        runners, learner = result["env_runners"], result["learners"]["default_policy"]
        return {
            "seconds": seconds,
            **self.timer.take(),
            "completion_tokens": float(runners["generated_tokens_per_episode"]) * PROMPTS * GROUP,
            "padding_fraction": float(learner["padding_fraction"]),
            "shared_prompt_savings": float(learner["shared_prompt_savings"]),
        }


class TRLSteps:
    """TRL's GRPOTrainer on the same work; each step's time from its own step callbacks."""

    def __init__(
        self,
        prompts: list[list[dict[str, str]]],
        answers: list[str],
        steps: int,
        new_tokens: int,
        seed: int,
    ) -> None:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from rllib_search.llm.models import resolve_model_path

        def exact_match(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [float(a.lower() in t.lower()) for t, a in zip(texts, answer, strict=True)]

        self.records: list[dict[str, float]] = []
        self.between: Callable[[], None] = lambda: None
        outer = self

        class StepTimes(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                self.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                record = {"seconds": time.perf_counter() - self.started}
                if outer.part_timer is not None:
                    record.update(outer.part_timer.take())
                outer.records.append(record)
                outer.between()  # our step runs here, outside TRL's timed span

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "completions/mean_length" in logs and outer.records:
                    outer.records[-1]["completion_tokens"] = logs["completions/mean_length"] * PROMPTS * GROUP

        args = GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="grpo_step_bench_trl_"),
            per_device_train_batch_size=PROMPTS * GROUP,
            gradient_accumulation_steps=1,
            num_generations=GROUP,
            max_completion_length=new_tokens,
            temperature=TEMPERATURE,
            learning_rate=LR,
            beta=KL,
            max_grad_norm=1.0,
            gradient_checkpointing=False,  # TRL's default is True; ours recomputes nothing either
            bf16=False,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        dataset = Dataset.from_dict({"prompt": prompts, "answer": answers})
        self.trainer = GRPOTrainer(
            model=resolve_model_path(MODEL),
            reward_funcs=exact_match,
            args=args,
            train_dataset=dataset,
            callbacks=[StepTimes()],
        )
        # TRL's step split as ours is: generation and scoring, then the rest (reference, loss, update).
        generate = getattr(self.trainer, "_generate_and_score_completions", None)
        if generate is not None:
            timer = PartTimer()
            self.trainer._generate_and_score_completions = timer.wrap("sample", generate)
            self.part_timer = timer
        else:
            self.part_timer = None

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The ids TRL generates from: its processing class's chat template, as ``_tokenize_prompts``."""
        tokenizer = self.trainer.processing_class
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )

    def run(self, between: Callable[[], None]) -> None:
        self.between = between
        self.trainer.train()


def summarize(records: list[dict[str, float]]) -> dict[str, Any]:
    """Medians after the first (warm-up) step, and the first step apart."""
    rest = records[1:] or records
    keys = sorted({k for r in rest for k in r})
    return {
        "steps": len(records),
        "first_step": records[0],
        **{f"median_{k}": median(r[k] for r in rest if k in r) for k in keys},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 steps a side, 32 new tokens (under 4 minutes)"
    )
    parser.add_argument("--new-tokens", type=int, default=64, help="most new tokens per sample")
    parser.add_argument("--steps", type=int, default=6, help="steps a side, the first a warm-up")
    parser.add_argument("--multi-turn", action="store_true", help="also our 3-turn search step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import ray
    import torch

    from rllib_search.env.protocols import get_protocol
    from rllib_search.recipes import embedded

    steps, new_tokens = (2, 32) if args.quick else (args.steps, args.new_tokens)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    world = embedded.embedded_world(0)
    questions = [r for r in world.records("train") if r.extra["num_hops"] == 1][:PROMPTS]
    protocol = get_protocol("search_r1")
    messages = [protocol.prompt_messages(r.question) for r in questions]

    print(
        f"[grpo_step_bench] {MODEL}: {PROMPTS} prompts x {GROUP} samples, {new_tokens} new tokens, "
        f"{steps} steps a side",
        flush=True,
    )
    ours = OurStep(questions, world.index, max_turns=1, new_tokens=new_tokens, seed=args.seed)
    answers = [r.golden_answers[0] for r in questions]
    theirs = TRLSteps(messages, answers, steps, new_tokens, args.seed)
    for record, chat in zip(questions, messages, strict=True):
        if ours.prompt_ids(record.question) != theirs.prompt_ids(chat):
            raise SystemExit("TRL's prompt ids differ from our env's: not the same work")
    prompt_tokens = sum(len(ours.prompt_ids(r.question)) for r in questions) / PROMPTS

    our_records: list[dict[str, float]] = []

    def our_step() -> None:
        our_records.append(ours())
        trl = theirs.records[-1]["seconds"]
        print(
            f"  step {len(our_records)}/{steps}: TRL {trl:.1f}s  ours {our_records[-1]['seconds']:.1f}s",
            flush=True,
        )

    theirs.run(between=our_step)
    ours.algo.stop()
    trl, our = summarize(theirs.records), summarize(our_records)
    summary: dict[str, Any] = {
        "benchmark": "grpo_step",
        "quick": args.quick,
        "model": MODEL,
        "threads": args.threads,
        "prompts": PROMPTS,
        "group_size": GROUP,
        "max_new_tokens": new_tokens,
        "mean_prompt_tokens": prompt_tokens,
        "trl_version": __import__("trl").__version__,
        "trl": trl,
        "ours": our,
        "grpo_step_vs_trl_ratio": our["median_seconds"] / trl["median_seconds"],
        "grpo_step_vs_trl_ratio_per_completion_token": (
            (our["median_seconds"] / our["median_completion_tokens"])
            / (trl["median_seconds"] / trl["median_completion_tokens"])
        ),
    }
    if args.multi_turn:
        multi = OurStep(questions, world.index, max_turns=3, new_tokens=new_tokens, seed=args.seed)
        records = []
        for step in range(steps):
            records.append(multi())
            print(f"  multi-turn step {step + 1}/{steps}: {records[-1]['seconds']:.1f}s", flush=True)
        multi.algo.stop()
        summary["ours_multi_turn"] = summarize(records)
    ray.shutdown()
    write_results("grpo_step_quick" if args.quick else "grpo_step", summary)  # quick never replaces full


if __name__ == "__main__":
    main()
