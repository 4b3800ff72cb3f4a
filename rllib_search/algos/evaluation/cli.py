"""``rllib-search eval``: evaluate a checkpoint, a Hugging Face directory or a hub model on a QA set.

    rllib-search eval --checkpoint runs/x/checkpoint --data test.parquet --index idx/ --out runs/eval_x
    rllib-search eval --model PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo --engine vllm \\
        --data search_r1_test.parquet --retriever-url http://127.0.0.1:8000/retrieve --out runs/eval
    rllib-search eval            # the embedded default: the main job's checkpoint on the synthetic test set

Greedy rollouts through the training engine (``--engine vllm`` on GPU), a progress bar, then a markdown
table of EM / F1 / cover-EM per source with 95% bootstrap intervals, their average over sources and the
pooled mean (and per hop count when the questions carry ``num_hops``), printed and written under ``--out``
as ``eval.md``, ``eval.json`` and ``predictions.jsonl`` (see ``algos/evaluation/evaluate.py``).

Settings: a checkpoint's own protocol and budgets are the defaults for it; otherwise Search-R1's
evaluation settings; each flag overrides. Ray is needed only for ``--retriever-app`` (a Serve app in a
running cluster, joined with ``--address`` or found on this machine; a Ray this command starts gets no
resource settings).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rllib_search.algos.evaluation.evaluate import EvalSettings

#: The main job's (``tuned_examples/tiny_cpu_grpo.py``) outputs and world, the embedded default.
MAIN_JOB_CHECKPOINT = Path("runs/tiny_cpu_grpo/checkpoint")
MAIN_JOB_WORLD_SEED = 0


def add_eval_command(sub: Any) -> None:
    """Register ``eval`` on the ``rllib-search`` subparsers."""
    p = sub.add_parser(
        "eval",
        help="evaluate a checkpoint or model on a QA set (EM / F1 / cover-EM per source)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("policy (default: the main job's checkpoint, runs/tiny_cpu_grpo/checkpoint)")
    what.add_argument("--checkpoint", help="an RLlib checkpoint directory (algo.save_to_path)")
    what.add_argument(
        "--model",
        help="a bundled alias, hub name or Hugging Face directory; with --checkpoint: its base model",
    )
    data = p.add_argument_group("data (default: the main job's synthetic test set)")
    data.add_argument("--data", nargs="+", help="Search-R1 test parquet(s) or FlashRAG jsonl file(s)")
    data.add_argument(
        "--limit-per-source", type=int, help="a seeded sample of at most N questions per source"
    )
    data.add_argument(
        "--prompt",
        choices=("auto", "data", "protocol"),
        default="auto",
        help="prompt with the Search-R1 parquet's own template (data), the protocol's (protocol), or the "
        "data's when every row has one (auto)",
    )
    data.add_argument(
        "--group-by",
        nargs="+",
        help="fields to report besides data_source (default: num_hops when every question has it)",
    )
    retrieval = p.add_argument_group("retriever (one; default with the synthetic test set: its BM25 index)")
    retrieval.add_argument("--retriever-url", help="a Search-R1-style /retrieve endpoint")
    retrieval.add_argument("--retriever-app", help="a Ray Serve retriever app in a running cluster")
    retrieval.add_argument("--address", help="the Ray cluster of --retriever-app (default: the running one)")
    retrieval.add_argument("--index", help="an index directory built by `rllib-search index build`")
    retrieval.add_argument("--corpus", help="a corpus jsonl/parquet searched with in-process BM25")
    episode = p.add_argument_group(
        "episodes (default: the checkpoint's, else Search-R1's: topk 3, 500 tokens a turn and an "
        "observation, max_turns 5 = Search-R1's 4 search rounds + the answer turn)"
    )
    episode.add_argument(
        "--protocol", help="search_r1 | search_r1_compact | r1_searcher | r_search | a registered one"
    )
    episode.add_argument("--max-turns", type=int, help="model turns (Search-R1's max_turns + 1)")
    episode.add_argument("--topk", type=int, help="passages per search")
    episode.add_argument("--max-turn-tokens", type=int, help="new tokens per turn")
    episode.add_argument("--max-obs-tokens", type=int, help="tokens per observation")
    episode.add_argument("--max-total-tokens", type=int, help="tokens per episode, prompt included")
    run = p.add_argument_group("run")
    run.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="hf (CPU/GPU) or vllm (GPU)")
    run.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine keyword (JSON value), e.g. gpu_memory_utilization=0.8",
    )
    run.add_argument("--batch-size", type=int, help="questions per engine batch (default: hf 32, vllm 256)")
    run.add_argument("--seed", type=int, default=0, help="question sampling and bootstrap seed")
    run.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    run.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--out", default="runs/eval", help="where eval.md, eval.json, predictions.jsonl go")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rllib_search.algos.evaluation.evaluate import (
        data_prompt_template,
        evaluate,
        limit_per_source,
        load_policy,
        read_eval_records,
        write_result,
    )

    checkpoint = args.checkpoint
    if checkpoint is None and args.model is None:
        checkpoint = MAIN_JOB_CHECKPOINT
        if not checkpoint.exists():
            raise SystemExit(
                f"rllib-search eval: no checkpoint at {checkpoint}: run the main job first "
                "(bash scripts/run.sh), or pass --checkpoint DIR or --model NAME"
            )
    policy = load_policy(model=args.model, checkpoint=checkpoint)
    data_paths, retriever_spec = _data_and_retriever(args)
    all_records = read_eval_records(data_paths)
    template = None
    if args.prompt != "protocol":
        template = data_prompt_template(data_paths, all_records)
        if template is None and args.prompt == "data":
            raise SystemExit(
                "rllib-search eval: --prompt data, but the data holds no Search-R1 prompt template"
            )
    records = limit_per_source(all_records, args.limit_per_source, seed=args.seed)
    settings = _settings(args, policy.trained_settings)
    if args.retriever_app:
        _connect_ray(args.address)
    print(
        f"[eval] {policy.name}: {len(records)} questions of {len(all_records)} "
        f"({len({r.data_source for r in records})} sources), retriever {retriever_spec}, "
        f"protocol {settings.protocol}, engine {settings.engine}, batch {settings.batch_size}",
        flush=True,
    )
    result = evaluate(
        policy,
        records,
        retriever_spec,
        settings,
        prompt_template=template,
        group_by=args.group_by,
        resamples=args.resamples,
        confidence=args.confidence,
        progress=not args.no_progress,
        info={"data": [str(p) for p in data_paths], "retriever": retriever_spec},
    )
    paths = write_result(result, args.out)
    print(result.markdown())
    print(f"[eval] wrote {paths['markdown']}, {paths['json']} and {paths['predictions']}", flush=True)
    return 0


def _data_and_retriever(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The QA files and the retriever spec (``serve.client.build_retriever``); without ``--data``, the
    main job's synthetic world and its BM25 index (both written on first use, as the main job does)."""
    given = {
        "url": args.retriever_url,
        "serve": args.retriever_app,
        "index": args.index,
        "bm25": args.corpus,
    }
    chosen = {kind: value for kind, value in given.items() if value}
    if len(chosen) > 1:
        raise SystemExit("rllib-search eval: give one of --retriever-url, --retriever-app, --index, --corpus")
    if args.data:
        if not chosen:
            raise SystemExit(
                "rllib-search eval: --data needs a retriever (--retriever-url, --index, --corpus, ...)"
            )
        return list(args.data), _retriever_spec(*next(iter(chosen.items())))
    from rllib_search.data.synthetic import SyntheticWorldConfig, ensure_world
    from rllib_search.llm.models import cache_dir
    from rllib_search.serve.retrieval.build import ensure_index

    world_dir = cache_dir() / "worlds" / f"demo_seed{MAIN_JOB_WORLD_SEED}"
    paths = ensure_world(world_dir, SyntheticWorldConfig(seed=MAIN_JOB_WORLD_SEED))
    if chosen:
        return [str(paths["test_parquet"])], _retriever_spec(*next(iter(chosen.items())))
    index_dir = ensure_index(paths["corpus_parquet"], world_dir / "bm25_index", kind="bm25", progress=False)
    return [str(paths["test_parquet"])], {"type": "index", "dir": str(index_dir)}


def _retriever_spec(kind: str, value: str) -> dict[str, Any]:
    if kind == "url":
        return {"type": "url", "url": value}
    if kind == "serve":
        return {"type": "serve", "app": value}
    if kind == "index":
        return {"type": "index", "dir": value}
    return {"type": "bm25", "corpus": value}


def _settings(args: argparse.Namespace, trained: dict[str, Any]) -> EvalSettings:
    """Defaults (Search-R1's) < the checkpoint's settings < flags."""
    values: dict[str, Any] = dict(trained)
    for name in ("protocol", "max_turns", "topk", "max_turn_tokens", "max_obs_tokens", "max_total_tokens"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    options = {}
    for item in args.engine_option:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"rllib-search eval: --engine-option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    batch = args.batch_size or (256 if args.engine == "vllm" else 32)
    return EvalSettings(
        **values, engine=args.engine, engine_options=options, batch_size=batch, seed=args.seed
    )


def _connect_ray(address: str | None) -> None:
    """Join the Ray cluster that serves ``--retriever-app`` (never resized: no resource arguments)."""
    import ray

    from rllib_search.serve.cluster import cluster_address

    if ray.is_initialized():
        return
    address = address or cluster_address()
    if address is None:
        raise SystemExit(
            "--retriever-app needs the Ray cluster that runs it: `ray start` (and `serve deploy`) "
            "or set RAY_ADDRESS / --address"
        )
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
