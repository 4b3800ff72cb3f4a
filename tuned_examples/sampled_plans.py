"""What a warm start's sampled plans go on to do, as the main job's GRPO samples them.

    python tuned_examples/sampled_plans.py runs/tiny_cpu_grpo/warm_start_model

Rolls out each question ``--samples`` times the way the main job's GRPO does: the first turn (the plan
and the first query) sampled at ``--temperature``, the later turns greedy, the main job's episode settings
and a BM25 retriever over the embedded world's passages (in process: no Ray). By default the questions are
the main job's fork-reading ones (the last 30 training questions of each hop count: never demonstrated,
never in RL), or the held-out ones with ``--split test``. Prints, per hop count, the funnel of
``algos/sampled_plans.py`` (what the plans say, which episodes searched twice, which were right, how many
questions have partly right samples: the GRPO groups with an advantage; how often a hop's query asked in
the teacher's words is read right) and writes ``sampled_plans.json`` (and ``sampled_episodes.jsonl``, each
episode's turns and observations as text) beside the model or to ``--out``. 30 + 30 questions x 4
samples: about 2 minutes on 2 cores of an AVX-512 CPU, 5 on an AVX2 one.

Use it beside ``tuned_examples/plan_forks.py`` (the forks teacher-forced) to see where a warm start loses
its 2-hop episodes before spending RL on it (``docs/main_job.md``, stops 46 and 55).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a Hugging Face model directory (the main job's warm_start_model)")
    p.add_argument("--protocol", default="search_r1_compact", help="the protocol the model was trained on")
    p.add_argument("--world-seed", type=int, default=0)
    p.add_argument(
        "--split",
        choices=("fork", "test"),
        default="fork",
        help="fork: the main job's fork-reading training questions; test: the held-out questions",
    )
    p.add_argument("--questions", type=int, default=30, help="questions per hop count")
    p.add_argument("--samples", type=int, default=4, help="episodes per question (a GRPO group)")
    p.add_argument("--temperature", type=float, default=1.0, help="the first turn's sampling temperature")
    p.add_argument("--max-turn-tokens", type=int, default=64, help="the main job's default")
    p.add_argument(
        "--topk", type=int, default=2, help="passages an observation shows (the main job's --topk)"
    )
    p.add_argument("--seed", type=int, default=0, help="the sampling seed")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", help="where the results go (default: the model directory)")
    args = p.parse_args(argv)
    if args.questions < 1 or args.samples < 1 or args.topk < 1:
        p.error("--questions, --samples and --topk must be at least 1")
    return args


def questions_of(args: argparse.Namespace) -> list[Any]:
    """The questions to sample, 1-hop then 2-hop (``--split``)."""
    from rllib_search.recipes import embedded

    world = embedded.embedded_world(args.world_seed)
    split = "train" if args.split == "fork" else "test"
    chosen = []
    for hops in (1, 2):
        records = world.records(split, hops=hops)
        chosen += records[-30:][: args.questions] if args.split == "fork" else records[: args.questions]
    return chosen


def sample(args: argparse.Namespace, records: list[Any]) -> list[Any]:
    """``--samples`` episodes of each record: the first turn sampled, the later turns greedy."""
    from rllib_search.algos.config import SearchConfig
    from rllib_search.algos.env_runner import LLMEnvRunner
    from rllib_search.data.formats import iter_passages, read_corpus
    from rllib_search.env.search_env import ENV_ID
    from rllib_search.recipes import embedded
    from rllib_search.recipes.scales import CPU_ENV
    from rllib_search.serve.bm25 import BM25Retriever

    corpus = embedded.embedded_world(args.world_seed).corpus
    env_config = {
        "retriever": BM25Retriever(list(iter_passages(read_corpus(corpus)))),
        "dataset": records,
        "protocol": args.protocol,
        **CPU_ENV,  # the main job's episodes: 3 turns and its token budgets
        "topk": args.topk,
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": str(args.model)})
        .rollouts(
            group_size=args.samples,
            prompts_per_sample=len(records),
            temperature=args.temperature,
            execution_temperature=0.0,
            max_turn_tokens=args.max_turn_tokens,
        )
        .training(trained_turns=1)  # the turns after the first run at the execution temperature
        .debugging(seed=args.seed)
    )
    # One draw of every question: the runner's sampler walks a seeded shuffle of the dataset.
    return LLMEnvRunner(config=config).sample(num_prompts=len(records))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from rllib_search.algos.sampled_plans import describe_funnel, sampled_funnel
    from rllib_search.env.protocols import get_protocol
    from rllib_search.env.teacher import hops_of
    from rllib_search.llm.models import load_tokenizer

    torch.set_num_threads(args.threads)
    records = questions_of(args)
    rollouts = sample(args, records)
    tokenizer = load_tokenizer(args.model)
    hops_by_uid = {record.uid: int(record.extra["num_hops"]) for record in records}
    chains_by_uid = {record.uid: hops_of(record) for record in records}
    funnel = sampled_funnel(rollouts, tokenizer, hops_by_uid, chains_by_uid, get_protocol(args.protocol))
    for hops in sorted(funnel):
        print(describe_funnel(hops, funnel[hops]), flush=True)
    out = Path(args.out or args.model)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "threads")}
    report = {"settings": settings, "funnel": {str(h): row for h, row in sorted(funnel.items())}}
    (out / "sampled_plans.json").write_text(json.dumps(report, indent=2))
    with open(out / "sampled_episodes.jsonl", "w") as f:
        for rollout in rollouts:
            spans = rollout.turn_spans
            turns = [tokenizer.decode(rollout.token_ids[s:e].tolist()) for s, e in spans]
            # What the env appended after each turn but the last (the retrieved passages), for reading.
            observations = [
                tokenizer.decode(rollout.token_ids[end:start].tolist())
                for (_, end), (start, _) in itertools.pairwise(spans)
            ]
            row = {"uid": rollout.uid, "hops": hops_by_uid[rollout.uid], "turns": turns}
            row["observations"] = observations
            row |= {"answer": rollout.answer, "golds": rollout.golden_answers}
            row["searches"] = rollout.stats["searches"]
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
