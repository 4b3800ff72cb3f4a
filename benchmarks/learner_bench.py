"""Learner benchmark: SearchLearner.update against a plain torch training loop, side by side.

Both train the same model from the same weights on the same padded batch of search-agent sequences
(prompt, generated turns, observation holes, right padding), in the same micro-batches:

- learner: ``SearchTorchLearner.update`` (GRPO loss, KL off so both do the same work; RLlib's update loop,
  batch preparation, metrics, the NaN guard, gradient clipping, AdamW);
- raw (masked): the decoder's hidden states -> the vocabulary projection of the loss-masked positions
  only (as the learner's module does) -> log_softmax -> gather -> masked clipped-surrogate loss ->
  backward -> clip -> AdamW step, written in a dozen lines;
- raw (full projection): the same with ``model(input_ids).logits`` over every position.

The headline, ``learner_vs_raw_tokens_per_s_ratio``, compares like with like: the learner against the
masked raw loop (the minimum over models). ``learner_vs_full_projection_raw_ratio`` (per model) is the
learner against the full-projection loop: it measures the masked projection as well as the learner's
overhead. The masked raw loop is also the oracle of ``tests/test_learner_oracle.py``: one learner update
gives its weights.

``learner_shared_prompts_vs_raw_ratio`` (per model) is not like for like, and says so: on a batch of GRPO
groups of 4 whose rows share their prompt (the first third), the learner reads each prompt once
(``shared_prompt.py``) where the plain loop reads it per row; it measures what sharing saves.

Trained tokens per second = generated (loss-masked) tokens / wall time of one update; runs alternate so all
see the same machine load. Also reported: the learner with the k3 KL to a frozen reference on (its extra
reference forward pass), and peak RSS. Prints a final JSON line and writes
``benchmarks/results/learner.json`` (``learner_quick.json`` with ``--quick``, which runs in under 3
minutes), with the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/learner_bench.py [--quick] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.learners.batching import bucket_order
from rllib_search.algos.learners.losses import clipped_policy_loss
from rllib_search.llm.models import load_causal_lm, load_tokenizer
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402


def search_batch(
    rows: int, length: int, vocab: int, seed: int = 0, group_size: int = 1
) -> dict[str, np.ndarray]:
    """Padded sequences shaped like search episodes: a prompt (the first third of ``length``; the same
    token ids for the ``group_size`` rows of a group, as a GRPO group's), then generated turns (mask 1)
    alternating with observations (mask 0), lengths varying between 60% and 100% of ``length``."""
    rng = np.random.default_rng(seed)
    prompt = length // 3
    ids = np.zeros((rows, length), dtype=np.int64)
    attention = np.zeros((rows, length), dtype=np.int64)
    loss_mask = np.zeros((rows, length), dtype=np.float32)
    for row in range(rows):
        n = int(rng.integers(int(0.6 * length), length + 1))
        ids[row, :n] = rng.integers(3, vocab, size=n)
        if row % group_size:
            ids[row, :prompt] = ids[row - row % group_size, :prompt]
        attention[row, :n] = 1
        position, generated = prompt, True
        while position < n:
            span = int(rng.integers(20, 60)) if generated else int(rng.integers(40, 120))
            loss_mask[row, position : position + span] = 1.0 if generated else 0.0
            position, generated = position + span, not generated
        loss_mask[row, n:] = 0.0
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask[:, 1:],
        "response_mask": (attention[:, 1:] * (np.arange(1, length)[None] >= prompt)).astype(np.float32),
        "old_logprobs": np.full((rows, length - 1), -2.0, dtype=np.float32) * loss_mask[:, 1:],
        "rewards": rng.random(rows).astype(np.float32),
        "episode_advantages": rng.standard_normal(rows).astype(np.float32),
        "prompt_lengths": np.full(rows, prompt, dtype=np.int64),
    }


def build_learner(model: str, micro: int, kl_coeff: float, lr: float = 1e-5, autocast: bool | None = None):
    config = (
        SearchGRPOConfig()
        .rl_module(model_config={"model": model})
        .training(lr=lr, kl_coeff=kl_coeff, micro_batch_size=micro, grad_clip=1.0, autocast=autocast)
    )
    vocab = len(load_tokenizer(model))
    space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (space, space)})


class RawLoop:
    """The plain torch loop: the same loss on the same micro-batches (the learner's bucketing by length),
    no RLlib, every row's whole sequence through the decoder (no shared prompts). ``masked``: only the
    loss-masked positions go through the vocabulary projection (as in the learner's module)."""

    def __init__(self, model: str, micro: int, masked: bool = True, lr: float = 1e-5) -> None:
        self.model, _ = load_causal_lm(model)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.micro = micro
        self.masked = masked

    def logprobs(self, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T-1) log-probs of the next tokens (0 off the mask when ``masked``)."""
        if not self.masked:
            logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        hidden = self.model.get_decoder()(
            input_ids=ids, attention_mask=attention, position_ids=positions
        ).last_hidden_state[:, :-1]
        where = mask.bool()
        logits = self.model.get_output_embeddings()(hidden[where]).float()
        picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)
        return torch.zeros(where.shape, dtype=torch.float32).index_put((where,), picked)

    def update(self, batch: dict[str, np.ndarray]) -> None:
        columns = {k: torch.as_tensor(v) for k, v in batch.items()}
        rows = columns["input_ids"].shape[0]
        order = torch.as_tensor(bucket_order(batch))  # the learner's micro-batches: rows by length
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, rows, self.micro):
            part = {k: v[order[start : start + self.micro]] for k, v in columns.items()}
            width = int(part["attention_mask"].sum(-1).max())
            ids, attention = part["input_ids"][:, :width], part["attention_mask"][:, :width]
            mask, old = part["loss_mask"][:, : width - 1], part["old_logprobs"][:, : width - 1]
            logprobs = self.logprobs(ids, attention, mask)
            advantages = part["episode_advantages"][:, None] * mask
            loss, _ = clipped_policy_loss(logprobs, old, advantages, mask)
            (loss * ids.shape[0] / rows).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench(model: str, rows: int, length: int, micro: int, repeats: int) -> dict[str, float]:
    learner = build_learner(model, micro, kl_coeff=0.0)
    with_kl = build_learner(model, micro, kl_coeff=0.001)
    raw = RawLoop(model, micro, masked=True)
    raw_full = RawLoop(model, micro, masked=False)
    vocab = int(learner.module[DEFAULT_MODULE_ID].unwrapped().model.config.vocab_size)
    batch = search_batch(rows, length, vocab)
    grouped = search_batch(rows, length, vocab, group_size=4)  # GRPO groups of 4 sharing their prompt
    tokens = float(batch["loss_mask"].sum())
    grouped_tokens = float(grouped["loss_mask"].sum())
    multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=rows)
    grouped_multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(grouped))}, env_steps=rows)
    steps = {
        "learner": lambda: learner.update(batch=multi),
        "raw": lambda: raw.update(batch),
        "raw_full": lambda: raw_full.update(batch),
        "learner_kl": lambda: with_kl.update(batch=multi),
        "learner_grouped": lambda: learner.update(batch=grouped_multi),
        "raw_grouped": lambda: raw.update(grouped),
    }
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up (allocator, first-call overheads)
        step()
    for repeat in range(repeats):
        for name, step in steps.items():
            runs[name].append(timed(step))
            print(f"  {model}: repeat {repeat + 1}/{repeats} {name:>10} {runs[name][-1]:.2f}s", flush=True)
    seconds = {name: median(values) for name, values in runs.items()}
    return {
        "rows": rows,
        "max_length": length,
        "trained_tokens": tokens,
        "learner_tokens_per_s": tokens / seconds["learner"],
        "raw_tokens_per_s": tokens / seconds["raw"],
        "raw_full_projection_tokens_per_s": tokens / seconds["raw_full"],
        "learner_with_kl_tokens_per_s": tokens / seconds["learner_kl"],
        "learner_vs_raw_tokens_per_s_ratio": seconds["raw"] / seconds["learner"],
        "learner_vs_full_projection_raw_ratio": seconds["raw_full"] / seconds["learner"],
        "grouped_trained_tokens": grouped_tokens,
        "learner_shared_prompts_tokens_per_s": grouped_tokens / seconds["learner_grouped"],
        "raw_on_grouped_batch_tokens_per_s": grouped_tokens / seconds["raw_grouped"],
        # not like for like: the learner reads each group's prompt once, the plain loop once per row
        "learner_shared_prompts_vs_raw_ratio": seconds["raw_grouped"] / seconds["learner_grouped"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (under 3 minutes)")
    parser.add_argument("--model", action="append", help="models to run (default: tiny and SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tiny_dir = tempfile.mkdtemp(prefix="learner_bench_")
    tiny = str(build_tiny_causal_lm(Path(tiny_dir) / "model", build_tiny_tokenizer(Path(tiny_dir) / "tok")))
    models = args.model or ["tiny", "smollm2-135m-instruct"]
    results: dict[str, dict[str, float]] = {}
    for name in models:
        path = tiny if name == "tiny" else name
        if args.quick:
            rows, length, micro, repeats = (16, 384, 4, 6) if name == "tiny" else (4, 256, 2, 2)
        else:
            rows, length, micro, repeats = (32, 512, 4, 8) if name == "tiny" else (8, 384, 4, 3)
        print(f"[learner_bench] {name}: {rows} sequences up to {length} tokens, micro-batches of {micro}")
        results[name] = bench(path, rows, length, micro, repeats)
    summary = {
        "benchmark": "learner",
        "quick": args.quick,
        "threads": args.threads,
        "models": results,
        "learner_vs_raw_tokens_per_s_ratio": min(
            r["learner_vs_raw_tokens_per_s_ratio"] for r in results.values()
        ),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    write_results("learner_quick" if args.quick else "learner", summary)  # quick never replaces full


if __name__ == "__main__":
    main()
