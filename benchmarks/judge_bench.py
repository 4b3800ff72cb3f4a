"""Evidence judge benchmark: how well the judge answers from evidence, and how fast it does over Ray Serve.

R-Search's evidence reward is the F1 between the judge's answer, from the policy's evidence alone, and the
gold answers: the reward is only as good as the judge. Questions come from the synthetic world (seed 0;
those for which both evidences below exist), each asked three ways (``env/judge.py``'s ``judge_accuracy``):

- ``gold``: the passages that answer each hop (the best BM25 hit for the hop's query that states its
  answer), what a perfect policy would quote;
- ``none``: empty evidence (a judge that guesses scores here);
- ``misleading``: the same, but the last hop's passage replaced by a twin entity's passage stating the same
  relation with another answer ("Velmora Dynamics" for "Velmora Systems").

A good judge scores high F1 on gold evidence and low on misleading evidence. Judge variants (the prompt
R-Search's Table 5 template alone, 2 or 4 worked examples before it, or the bare template with
``extract_short_answer`` on its answers) are compared on a development split of the questions; the one
with the largest F1(gold) - F1(misleading) there (the first listed on a tie) is then measured, beside the
bare template, on held-out questions never used for that choice. Its final JSON line carries the held-out
``judge_f1_on_gold_evidence`` and ``judge_f1_on_misleading_evidence``.

Throughput, measured side by side in one run, alternating (R-Search's Table 5 prompts over BM25's top
passage for each hop):

- ``one by one``: R-Search's own pattern, one request per evidence, each sent after the previous answer;
- ``batched``: what a training run sends, ``--clients`` concurrent EnvRunners each posting its sample's
  ``--sample-size`` evidences in ONE request; Serve's ``@serve.batch`` merges requests that arrive
  while a batch runs; once with the bare template and once with the chosen variant's prompt.

Figures: answered evidences per second, batched over one by one, and the chosen prompt's batched rate over
the bare template's (medians of the repeats); the p99 latency of a sample's call; whether both modes give
the same answers.

The judge is by default the bundled Gemma-3-270M (greedy, at most 32 tokens, cut at the first newline)
deployed here on 127.0.0.1. ``--engine vllm --model meta-llama/Llama-3.2-3B-Instruct --num-gpus 1
--api chat --temperature 0.1`` deploys R-Search's judge on a GPU instead; ``--judge-url`` measures an
OpenAI-compatible server already running (vLLM's, Ray Serve LLM's, ours; with ``--model`` its served name).

Prints a final JSON line and writes ``benchmarks/results/judge.json`` and ``judge.png`` (``judge_quick.*``
with ``--quick``; ``--dtype bfloat16`` adds ``_bfloat16``; another model adds its name), with the commit and
the machine (``benchmarks/results_file.py``).

    python benchmarks/judge_bench.py            # full run (5 minutes on 2 cores)
    python benchmarks/judge_bench.py --quick    # the same steps on fewer questions and evidences
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.env.judge import (  # noqa: E402
    ExtractingJudge,
    JudgeCase,
    JudgePrompt,
    judge_accuracy,
)

CPU_JUDGE = "gemma3-270m"
WORLD_SEED = 0


@dataclass(frozen=True)
class Variant:
    """A way to ask the judge: the prompt before R-Search's template, and whether answers are shortened."""

    name: str
    examples: int = 0
    extract: bool = False

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "examples": self.examples, "extract_short_answer": self.extract}


VARIANTS = (
    Variant("zero-shot"),
    Variant("2 examples", examples=2),
    Variant("4 examples", examples=4),
    Variant("zero-shot + extraction", extract=True),
)


# --- questions and evidence ------------------------------------------------------------------------
def _world(num_test: int):
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.serve.retrieval.bm25 import BM25Retriever

    world = generate_world(
        SyntheticWorldConfig(seed=WORLD_SEED, num_passages=2000, num_train=0, num_test=num_test)
    )
    return world, BM25Retriever(world.passages)


def _name_words(title: str, fixed: set[str]) -> set[str]:
    """The invented words of an entity's name (not "The", "University", "Records"...)."""
    return set(title.split()) - fixed - {"The"}


def evidence_cases(records: list, retriever: Any, hits_per_hop: int = 20) -> list[list[JudgeCase]]:
    """For each record with a gold passage for every hop and a twin's passage for its last hop: its
    ``gold``, ``none`` and ``misleading`` :class:`JudgeCase`; records lacking either are left out.

    A hop's gold passage is the best of its query's ``hits_per_hop`` BM25 hits titled with the hop's subject
    (the query is ``"<subject> <relation word>"``) and stating its answer. The twin's passage is the best
    hit for the last hop's query titled with another entity sharing an invented name word with the
    subject, stating the same relation word and no gold answer.
    """
    from rllib_search.data.synthetic_vocabulary import KINDS

    fixed = {w for kind in KINDS for f in kind.formats + kind.twin_formats for w in f.split() if "{" not in w}
    cases = []
    for record in records:
        hops = record.extra["hops"]
        hits = retriever.search([hop["query"] for hop in hops], hits_per_hop)
        gold_passages = []
        for hop, found in zip(hops, hits):
            passage = next(
                (p for p in found if hop["query"].startswith(p.title + " ") and hop["answer"] in p.text), None
            )
            if passage is None:
                break
            gold_passages.append(passage)
        if len(gold_passages) < len(hops):
            continue
        subject = gold_passages[-1].title
        relation = hops[-1]["query"][len(subject) :].strip().lower()
        twin = next(
            (
                p
                for p in hits[-1]
                if p.title != subject
                and _name_words(p.title, fixed) & _name_words(subject, fixed)
                and relation in p.text.lower()
                and not any(gold in p.text for gold in record.golden_answers)
            ),
            None,
        )
        if twin is None:
            continue
        golds = tuple(record.golden_answers)
        cases.append(
            [
                JudgeCase(record.question, _evidence(gold_passages), golds, "gold"),
                JudgeCase(record.question, "", golds, "none"),
                JudgeCase(record.question, _evidence([*gold_passages[:-1], twin]), golds, "misleading"),
            ]
        )
    return cases


def _evidence(passages: list) -> str:
    return " ".join(f"{p.title}: {p.text}" for p in passages)


def throughput_evidence(records: list, retriever: Any, count: int) -> list[tuple[str, str]]:
    """(question, evidence) pairs: BM25's top passage for each hop's query, as a perfect policy quotes."""
    pairs = []
    for record in records[:count]:
        queries = [hop["query"] for hop in record.extra["hops"]]
        pairs.append((record.question, _evidence([hits[0] for hits in retriever.search(queries, 1)])))
    return pairs


# --- the judge over HTTP ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    """Where the judge answers and how to ask it (``JudgeClient`` options)."""

    url: str
    api: str
    model: str | None
    temperature: float

    def client(self, examples: int = 0):
        from rllib_search.serve.judge.client import JudgeClient

        return JudgeClient(
            url=self.url,
            api=self.api,
            model=self.model,
            temperature=self.temperature,
            max_tokens=32,
            stop=("\n",),
            examples=examples,
            max_retries=0,
            timeout_s=600.0,
        )

    def judge(self, variant: Variant) -> Any:
        client = self.client(variant.examples)
        return ExtractingJudge(client) if variant.extract else client


def measure_accuracy(endpoint: Endpoint, variant: Variant, cases: list[list[JudgeCase]]) -> dict[str, Any]:
    flat = [case for group in cases for case in group]
    started = time.perf_counter()
    figures, answers = judge_accuracy(endpoint.judge(variant), flat)
    seconds = time.perf_counter() - started
    examples = [
        {"kind": case.kind, "golds": list(case.golds), "answer": answer}
        for case, answer in zip(flat[:6], answers[:6])
    ]
    return {**variant.describe(), "by_evidence": figures, "seconds": seconds, "example_answers": examples}


def margin(row: dict[str, Any]) -> float:
    """F1 on gold evidence minus F1 on misleading evidence: what a judge variant is chosen by."""
    return row["by_evidence"]["gold"]["f1"] - row["by_evidence"]["misleading"]["f1"]


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row with the largest :func:`margin`; the first listed on a tie."""
    return max(rows, key=lambda row: (round(margin(row), 9), -rows.index(row)))


def one_by_one(endpoint: Endpoint, examples: int, pairs: list[tuple[str, str]]) -> dict:
    client = endpoint.client(examples)
    started = time.perf_counter()
    answers, latencies = [], []
    for question, evidence in pairs:
        began = time.perf_counter()
        answers += client.answer_evidence([question], [evidence])
        latencies.append(time.perf_counter() - began)
    wall = time.perf_counter() - started
    return {"evidences_per_s": len(pairs) / wall, "latencies": latencies, "answers": answers}


def batched(
    endpoint: Endpoint, examples: int, pairs: list[tuple[str, str]], clients: int, sample_size: int
) -> dict:
    """``clients`` threads, each sending its samples (``sample_size`` evidences a call) one after another."""
    samples = [pairs[i : i + sample_size] for i in range(0, len(pairs), sample_size)]
    per_client = [samples[c::clients] for c in range(clients)]

    def run_client(own: list[list[tuple[str, str]]]) -> list[tuple[list[str], float]]:
        client = endpoint.client(examples)
        outcomes = []
        for sample in own:
            began = time.perf_counter()
            answers = client.answer_evidence([q for q, _ in sample], [e for _, e in sample])
            outcomes.append((answers, time.perf_counter() - began))
        return outcomes

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(run_client, per_client))
    wall = time.perf_counter() - started
    answers: dict[tuple[str, str], str] = {}
    latencies = []
    for own, outcomes in zip(per_client, results):
        for sample, (texts, seconds) in zip(own, outcomes):
            answers.update(zip(sample, texts))
            latencies.append(seconds)
    return {
        "evidences_per_s": len(pairs) / wall,
        "latencies": latencies,
        "answers": [answers[p] for p in pairs],
    }


# --- the run -------------------------------------------------------------------------------------------
def deploy(args: argparse.Namespace) -> str:
    """Start Ray and Serve on 127.0.0.1 with the judge deployment; its OpenAI base URL."""
    import ray
    from ray import serve

    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.judge.deployment import build_judge_app

    num_gpus = args.num_gpus if args.engine == "vllm" else 0
    ray.init(
        address="local",
        num_cpus=args.threads,
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    actor: dict[str, Any] = {"num_cpus": args.threads}
    if num_gpus:
        actor["num_gpus"] = num_gpus
    app = build_judge_app(
        {
            "model": args.model,
            "engine": args.engine,
            "num_replicas": 1,
            "ray_actor_options": actor,
            "batch_wait_timeout_s": 0.01,
            "dtype": args.dtype,
        }
    )
    serve.run(app, name="judge", route_prefix="/judge")
    return f"http://127.0.0.1:{port}/judge/v1"


def plot(accuracy: list[dict], rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = ("gold", "none", "misleading")
    width = 0.8 / max(len(accuracy), 1)
    for i, row in enumerate(accuracy):
        positions = np.arange(len(kinds)) + i * width
        left.bar(positions, [row["by_evidence"][k]["f1"] for k in kinds], width, label=row["name"])
    left.set_xticks(np.arange(len(kinds)) + width * (len(accuracy) - 1) / 2, [f"{k} evidence" for k in kinds])
    left.set_ylabel("judge F1 vs gold answers (held out)")
    left.set_ylim(0, 1)
    left.legend()
    modes = ["one by one", "batched, bare template", "batched, chosen prompt"]
    for repeat, row in enumerate(rows):
        values = [row["one_by_one_qps"], row["batched_bare_qps"], row["batched_qps"]]
        right.scatter(modes, values, label=f"repeat {repeat + 1}")
    right.set_ylabel("evidences judged per second")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer questions and evidences, one repeat")
    parser.add_argument("--model", default=CPU_JUDGE, help="the judge model (or --judge-url's name)")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="the deployment's engine")
    parser.add_argument("--num-gpus", type=float, default=1.0, help="GPUs of the judge replica (vllm)")
    parser.add_argument("--judge-url", help="an OpenAI-compatible base URL to measure instead of deploying")
    parser.add_argument(
        "--api", default="completions", choices=["completions", "chat"], help="chat for instruct models"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="R-Search's judge used 0.1")
    parser.add_argument("--clients", type=int, default=4, help="concurrent EnvRunners in batched mode")
    parser.add_argument("--sample-size", type=int, default=16, help="evidences in one sample's judge call")
    parser.add_argument("--threads", type=int, default=2, help="CPUs (torch threads) of the judge replica")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="the judge's weights"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    dev_count, held_out_count = (6, 12) if args.quick else (12, 40)
    repeats = 1
    serial_count = 8 if args.quick else 16
    batched_count = (1 if args.quick else 2) * args.clients * args.sample_size
    world, retriever = _world(num_test=max(240, batched_count))
    cases = evidence_cases(world.test, retriever)
    if len(cases) < dev_count + held_out_count:
        raise RuntimeError(f"only {len(cases)} questions have both evidences")
    dev, held_out = cases[:dev_count], cases[dev_count : dev_count + held_out_count]
    pairs = throughput_evidence(world.test, retriever, max(serial_count, batched_count))

    url = args.judge_url.rstrip("/") if args.judge_url else None
    if url is None:
        print(f"[bench] loading {args.model} on Ray Serve ({args.engine})", flush=True)
        url = deploy(args)
    endpoint = Endpoint(url, args.api, None if args.judge_url is None else args.model, args.temperature)
    endpoint.client().answer_evidence([pairs[0][0]], [pairs[0][1]])  # warm-up

    development = []
    for variant in VARIANTS:
        development.append(measure_accuracy(endpoint, variant, dev))
        gold, misleading = (development[-1]["by_evidence"][k]["f1"] for k in ("gold", "misleading"))
        print(f"[bench] dev, {variant.name}: F1 gold {gold:.2f}, misleading {misleading:.2f}", flush=True)
    chosen_row = choose(development)
    chosen = next(v for v in VARIANTS if v.name == chosen_row["name"])
    print(f"[bench] chosen on {len(dev)} dev questions: {chosen.name}", flush=True)
    held = [measure_accuracy(endpoint, variant, held_out) for variant in dict.fromkeys((VARIANTS[0], chosen))]
    final = held[-1]["by_evidence"]

    rows = []
    for repeat in range(repeats):
        serial = one_by_one(endpoint, chosen.examples, pairs[:serial_count])
        bare = batched(endpoint, 0, pairs[:batched_count], args.clients, args.sample_size)
        batch = batched(endpoint, chosen.examples, pairs[:batched_count], args.clients, args.sample_size)
        print(
            f"[bench] repeat {repeat + 1}: one by one {serial['evidences_per_s']:.2f}, batched "
            f"{batch['evidences_per_s']:.2f} ({bare['evidences_per_s']:.2f} bare template) evidences/s",
            flush=True,
        )
        agree = np.mean([a == b for a, b in zip(serial["answers"], batch["answers"][:serial_count])])
        rows.append(
            {
                "one_by_one_qps": serial["evidences_per_s"],
                "batched_qps": batch["evidences_per_s"],
                "batched_bare_qps": bare["evidences_per_s"],
                "ratio": batch["evidences_per_s"] / serial["evidences_per_s"],
                "chosen_vs_bare_ratio": batch["evidences_per_s"] / bare["evidences_per_s"],
                "one_by_one_p50_ms": 1000 * statistics.median(serial["latencies"]),
                "batched_call_p50_ms": 1000 * statistics.median(batch["latencies"]),
                "batched_call_p99_ms": 1000 * float(np.percentile(batch["latencies"], 99)),
                "answers_agree": float(agree),
            }
        )
    if args.judge_url is None:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()

    results = {
        "benchmark": "judge",
        "quick": args.quick,
        "judge_model": args.model,
        "judge_engine": "url" if args.judge_url else args.engine,
        "judge_api": args.api,
        "judge_temperature": args.temperature,
        "judge_dtype": args.dtype,
        "judge_threads": args.threads,
        "world_seed": WORLD_SEED,
        "dev_questions": len(dev),
        "held_out_questions": len(held_out),
        "development": development,
        "held_out": held,
        "chosen_prompt": chosen.describe(),
        "clients": args.clients,
        "sample_size": args.sample_size,
        "evidences_one_by_one": serial_count,
        "evidences_batched": batched_count,
        "repeats": rows,
        "example_prompt": JudgePrompt(examples=chosen.examples).fill(*pairs[0]),
        "example_answer": serial["answers"][0],
        "judge_f1_on_gold_evidence": final["gold"]["f1"],
        "judge_em_on_gold_evidence": final["gold"]["em"],
        "judge_gold_contained_on_gold_evidence": final["gold"]["gold_contained"],
        "judge_f1_on_no_evidence": final["none"]["f1"],
        "judge_f1_on_misleading_evidence": final["misleading"]["f1"],
        "bare_template_f1_on_gold_evidence": held[0]["by_evidence"]["gold"]["f1"],
        "bare_template_f1_on_misleading_evidence": held[0]["by_evidence"]["misleading"]["f1"],
        "judge_batched_vs_one_by_one_ratio": statistics.median(r["ratio"] for r in rows),
        "chosen_vs_bare_template_throughput_ratio": statistics.median(
            r["chosen_vs_bare_ratio"] for r in rows
        ),
        "judge_p99_ms": statistics.median(r["batched_call_p99_ms"] for r in rows),
        "one_by_one_evidences_per_s": statistics.median(r["one_by_one_qps"] for r in rows),
        "batched_evidences_per_s": statistics.median(r["batched_qps"] for r in rows),
        "batched_bare_template_evidences_per_s": statistics.median(r["batched_bare_qps"] for r in rows),
        "answers_agree": min(r["answers_agree"] for r in rows),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "judge"
    if args.model != CPU_JUDGE or args.judge_url:
        name += "_" + re.sub(r"[^a-z0-9.]+", "-", args.model.split("/")[-1].lower())
    name += ("_quick" if args.quick else "") + ("" if args.dtype == "auto" else f"_{args.dtype}")
    title = f"{args.model} judge ({'given URL' if args.judge_url else args.engine}), chosen: {chosen.name}"
    plot(held, rows, title, RESULTS / f"{name}.png")
    skip = ("repeats", "example_prompt", "development", "held_out")
    write_results(name, results, headline={k: v for k, v in results.items() if k not in skip})


if __name__ == "__main__":
    main()
