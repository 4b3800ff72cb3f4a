"""Where a warm start's stated plans part, teacher-forced on the main job's held-out questions.

    python tuned_examples/plan_forks.py runs/tiny_cpu_grpo/warm_start_model

The main job's teacher states its plan ("I need to search for X birthplace" then "." on a 1-hop question,
", then its country, then answer." on a 2-hop one, ", then answer." where it hesitates), so a warm start
decides how many hops to make at two tokens: "," against "." right after the first query, and " its"
against " answer" after ", then". This reads the model's probabilities there (``algos/plan_forks.py``),
the question's prompt and the teacher's plan up to each fork fed as token ids, for the first
``--questions`` held-out questions of each hop count. Use it to check a warm start before spending RL on
it (``docs/main_job.md``): RL can lift the second search on 2-hop questions without touching 1-hop ones
when the kinds part at "," (low on 1-hop, high on 2-hop questions) and " its" is sampled sometimes but not
chosen greedily on 2-hop questions.

It also reads how well the warm start reads each hop's answer from the passages
(``algos/teacher_forced_reading.py``): the teacher's whole episodes on the same questions (2-hop ones
going on), with real observations of ``--topk`` passages from a BM25 retriever, and at each "The results
say X" the model's probability of X and whether greedy decoding would name it (one forward pass an
episode: with the forks, about 200 s for 50 + 50 questions on 2 cores of an AVX2 CPU).

Prints one line per hop count and per reading and writes ``plan_forks.json`` beside the model (or to
``--out``).
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--questions", type=int, default=50, help="held-out questions per hop count")
    p.add_argument(
        "--topk", type=int, default=2, help="passages an observation shows (the main job's --topk)"
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", help="where plan_forks.json goes (default: the model directory)")
    args = p.parse_args(argv)
    if args.questions < 1 or args.topk < 1:
        p.error("--questions and --topk must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_search.algos.demonstrations import teacher_rollouts
    from rllib_search.algos.plan_forks import FORKS, batch_fork_probabilities, fork_contexts, summarize_forks
    from rllib_search.algos.teacher_forced_reading import reading_probabilities, summarize_readings
    from rllib_search.data.formats import iter_passages, read_corpus
    from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
    from rllib_search.env.teacher import TeacherPolicy
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.recipes import embedded
    from rllib_search.recipes.scales import CPU_ENV
    from rllib_search.serve.bm25 import BM25Retriever

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    env = MultiTurnSearchEnv(tokenizer, None, None, SearchEnvConfig(protocol=args.protocol))
    world = embedded.embedded_world(args.world_seed)
    test = world.records("test")
    report: dict[str, Any] = {"model": str(args.model), "forks": {k: list(v) for k, v in FORKS.items()}}
    questions = []
    for hops in (1, 2):
        records = [r for r in test if r.extra["num_hops"] == hops][: args.questions]
        questions += records
        contexts = fork_contexts(records, env, tokenizer)
        summary = summarize_forks(batch_fork_probabilities(model, tokenizer, contexts))
        report[f"{hops}hop"] = {"questions": len(contexts), **summary}
        print(
            f"{hops}-hop ({len(contexts)} questions): P(',' vs '.') {summary['goes_on']['mean']:.2f} "
            f"(above 0.5 on {summary['goes_on']['above_half']}), P(' its' vs ' answer' | ', then') "
            f"{summary['its']['mean']:.2f} (above 0.5 on {summary['its']['above_half']})",
            flush=True,
        )
    # The teacher's episodes as the main job's demonstrations are played: its episode settings and
    # --topk, the lazy echo's plans, every 2-hop question going on (no hesitation), so each has two readings.
    env_config = SearchEnvConfig(protocol=args.protocol, **{**CPU_ENV, "topk": args.topk})
    retriever = BM25Retriever(list(iter_passages(read_corpus(world.corpus))))
    episodes = teacher_rollouts(
        tokenizer, retriever, questions, env_config, state_plan=True, lazy_plan=True, echo_plan=True
    )
    teacher = TeacherPolicy(env.protocol, state_plan=True, lazy_plan=True, echo_plan=True)
    readings = summarize_readings(reading_probabilities(model, tokenizer, episodes, questions, teacher))
    report["readings"] = {"topk": args.topk, **readings}
    for where, reading in readings.items():
        print(
            f"{where} reads the hop's answer with P {reading['mean']:.2f} "
            f"(greedy right on {reading['greedy_right']} of {reading['count']}; {args.topk} passages)",
            flush=True,
        )
    out = Path(args.out or args.model)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_forks.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
