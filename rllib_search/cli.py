"""``rllib-search`` (also ``python -m rllib_search``): the command line.

- ``rllib-search train RECIPE [flags]``: train a recipe as a job (``--list``: the recipes; ``RECIPE
  --help``: its flags; ``--smoke``: the embedded default at its smallest size). The papers' recipes and the
  λ sweep run through ``recipes/train_cli.py``, the CPU main job through ``recipes/tiny_cpu/cli.py``.
- ``rllib-search plan RECIPE [--gpus N --gpu-memory-gib M]``: a recipe's GPUs and per-GPU memory at paper
  scale beside its services (``algos/plan``); exits 1 when it does not fit.
- ``rllib-search world --out DIR``: write the synthetic multi-hop world (corpus + train/test files).
- ``rllib-search rollout``: scripted policies (and a zero-shot LLM policy) through MultiTurnSearchEnv on
  the synthetic world with a BM25 retriever, for each protocol; prints a table and writes
  ``summary.json``, ``rewards.png`` and example responses under ``--out``.
- ``rllib-search index build ...`` / ``index info DIR``: build or describe a retrieval index.
- ``rllib-search serve retriever --index DIR``: the retrieval service on Ray Serve.
- ``rllib-search serve judge [--model gemma3-270m]``: the evidence judge (OpenAI-compatible) on Ray Serve.
- ``rllib-search eval [--checkpoint DIR | --model NAME] --data FILE ...``: greedy evaluation, EM / F1 /
  cover-EM per source with bootstrap intervals (default: the main job's checkpoint on the synthetic test set).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rllib_search.llm.models import cache_dir


def _world_config(args: argparse.Namespace):
    from rllib_search.data.synthetic import SyntheticWorldConfig

    return SyntheticWorldConfig(seed=args.seed, num_train=args.train, num_test=args.test)


def cmd_world(args: argparse.Namespace) -> int:
    from rllib_search.data.synthetic import ensure_world

    paths = ensure_world(Path(args.out), _world_config(args))
    for name, path in paths.items():
        print(f"{name:16s} {path}")
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from rllib_search.algos.rollouts.scripted import run_scripted_rollouts
    from rllib_search.data.formats import iter_passages, read_corpus, read_qa_file
    from rllib_search.data.synthetic import ensure_world
    from rllib_search.env.search_env import SearchEnvConfig
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.serve.retrieval.bm25 import BM25Retriever

    world_dir = Path(args.world) if args.world else cache_dir() / "worlds" / f"seed{args.seed}"
    print(f"[rollout] synthetic world in {world_dir}")
    paths = ensure_world(world_dir, _world_config(args))
    records = read_qa_file(paths["test_parquet"])
    passages = list(iter_passages(read_corpus(paths["corpus_parquet"])))
    print(f"[rollout] {len(passages)} passages, {len(records)} test questions; BM25 index")
    retriever = BM25Retriever(passages)
    print(f"[rollout] tokenizer {args.tokenizer}")
    tokenizer = load_tokenizer(args.tokenizer)

    summaries, examples = [], {}
    for protocol in args.protocols:
        reward_config = {}
        if protocol == "search_r1":
            reward_config = {"lambda_format": args.lambda_format, "lambda_retrieval": args.lambda_retrieval}
        env_config = SearchEnvConfig(
            protocol=protocol, max_turns=args.max_turns, topk=args.topk, reward_config=reward_config
        )
        for policy in args.policies:
            shown: list[str] = []
            summary = run_scripted_rollouts(
                tokenizer,
                retriever,
                records,
                env_config,
                policy,
                args.episodes,
                seed=args.seed,
                examples=shown,
            )
            summaries.append(summary)
            examples[f"{protocol}/{policy}"] = shown
            print(_format_row(summary))

    llm_summary = None
    if args.llm_prompts > 0:
        llm_summary, text = _llm_rollout(args, retriever, records)
        examples[f"search_r1/llm:{args.llm_model}"] = [text]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [s.row() for s in summaries] + ([llm_summary] if llm_summary else [])
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    with (out / "examples.txt").open("w") as handle:
        for key, texts in examples.items():
            for text in texts:
                handle.write(f"===== {key} =====\n{text}\n\n")
    _plot(summaries, out / "rewards.png")
    print(f"[rollout] wrote {out / 'summary.json'}, {out / 'rewards.png'} and {out / 'examples.txt'}")
    return 0


def _llm_rollout(args: argparse.Namespace, retriever, records) -> tuple[dict, str]:
    """The same env and retriever driven by a real policy: LLMEnvRunner with the model ``--llm-model``
    (zero-shot: the bundled SmolLM2 does not follow a search protocol before training)."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from rllib_search import ENV_ID
    from rllib_search.algos.config import SearchConfig
    from rllib_search.algos.rollouts.env_runner import LLMEnvRunner

    env_config = {
        "retriever": retriever,
        "dataset": records,
        "protocol": "search_r1",
        "max_turns": args.max_turns,
        "topk": args.topk,
        "max_total_tokens": 2048,
        "max_obs_tokens": 300,
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": args.llm_model})
        .rollouts(
            group_size=2,
            prompts_per_sample=args.llm_prompts,
            max_turn_tokens=args.llm_turn_tokens,
            temperature=1.0,
        )
        .debugging(seed=args.seed)
    )
    print(f"[rollout] LLM rollout: {args.llm_model}, {args.llm_prompts} prompts x 2 samples (LLMEnvRunner)")
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    metrics = MetricsLogger.peek_results(runner.get_metrics())
    summary = {
        "protocol": "search_r1",
        "policy": f"llm:{args.llm_model}",
        "episodes": len(rollouts),
        "reward": metrics["episode_return_mean"],
        "searches": metrics["searches_per_episode"],
        "valid_action_rate": metrics["valid_action_rate"],
        "answer_rate": metrics["answer_rate"],
        "generated_tokens": metrics["generated_tokens_per_episode"],
        "generation_tokens_per_s": metrics["generation_tokens_per_s"],
    }
    print(
        "[rollout] "
        + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())
    )
    return summary, runner.tokenizer.decode(rollouts[0].token_ids[rollouts[0].prompt_length :])


_COLUMNS = ("reward", "exact_match", "f1", "searches", "invalid_actions", "format_valid", "retrieval_hit")


def _format_row(summary) -> str:
    values = "  ".join(f"{name}={getattr(summary, name):.3f}" for name in _COLUMNS)
    head = f"{summary.protocol:12s} {summary.policy:14s} n={summary.episodes:<4d}"
    return f"{head} {values}  ({summary.seconds:.1f}s)"


def _plot(summaries, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = sorted({s.protocol for s in summaries})
    policies = list(dict.fromkeys(s.policy for s in summaries))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(policies))
    for ax, metric in zip(axes, ("reward", "exact_match")):
        for j, policy in enumerate(policies):
            values = [
                next((getattr(s, metric) for s in summaries if s.protocol == p and s.policy == policy), 0.0)
                for p in protocols
            ]
            ax.bar([i + j * width for i in range(len(protocols))], values, width, label=policy)
        ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(protocols))], protocols)
        ax.set_title(f"mean {metric} per episode")
        ax.axhline(0, color="black", linewidth=0.5)
    axes[0].legend()
    fig.suptitle("Scripted policies through MultiTurnSearchEnv (synthetic world, BM25)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MAIN_EPILOG = """\
examples:
  rllib-search train --list                          # the recipes, one line each
  rllib-search train search_r1_grpo --smoke          # a recipe on the embedded default, minutes on CPU
  rllib-search train tiny_cpu                        # the CPU main job (train RECIPE --help: its flags)
  rllib-search plan search_r1_grpo --gpus 8 --gpu-memory-gib 80   # GPUs and memory of a paper run
  rllib-search world --out worlds/seed0              # the synthetic world's corpus and questions
  rllib-search rollout --episodes 16                 # scripted policies through the env, per protocol
  rllib-search index build --corpus corpus.jsonl --kind bm25 --out idx/
  rllib-search index info idx/
  rllib-search serve retriever --index idx/          # POST 127.0.0.1:8000/retrieve
  rllib-search serve judge                           # the bundled Gemma-3-270M judge at /judge/v1
  rllib-search eval                                  # the main job's checkpoint on the synthetic test set
  rllib-search eval --checkpoint runs/search_r1_grpo/checkpoint --data test.parquet --index idx/

`rllib-search COMMAND --help` shows a command's flags.
"""

#: ``rllib-search train``'s recipes and their one-line descriptions, in the order ``--list`` shows them.
#: Kept here rather than beside the recipes so that listing them imports no model code.
TRAIN_RECIPES = {
    "search_r1_grpo": "Search-R1 GRPO (arXiv 2503.09516): EM reward, retrieved tokens masked",
    "search_r1_ppo": "Search-R1 PPO (arXiv 2503.09516): a value head and GAE, KL in the reward",
    "r1_searcher": "R1-Searcher (arXiv 2503.05592): REINFORCE++, retrieval + format reward, then F1",
    "r_search_grpo": "R-Search GRPO: answer, evidence and format rewards, evidence judged by a served model",
    "tiny_cpu": "the CPU main job: SmolLM2-135M learns to chain searches (SFT, calibration, GRPO), 2 cores",
    "lambda_sweep": "Ray Tune sweep of Search-R1 GRPO's format (λ_f) and retrieval (λ_r) rewards and seeds",
}

TRAIN_EPILOG = """\
Each recipe runs at one of three sizes: the paper's (the default: --data and the served retriever or
--retriever-url, on a GPU cluster), --embedded (the bundled SmolLM2, the synthetic world and a BM25
retriever on CPU, with a warm start) or --smoke (the same code path at its smallest size, minutes); the
CPU main job has its own sizes (--smoke too). A run writes its summary (summary.json; the sweep's
results.md), plots and checkpoints under --out. `rllib-search train RECIPE --help` shows a recipe's flags.

  rllib-search train --list
  rllib-search train search_r1_grpo --smoke
  rllib-search train r1_searcher --embedded --out runs/r1_searcher_cpu
  rllib-search train tiny_cpu
  RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train r_search_grpo --data /data/train.parquet
"""


def recipe_lines() -> list[str]:
    """One line per recipe: its name and what it trains."""
    width = max(map(len, TRAIN_RECIPES))
    return [f"{name:{width}s}  {summary}" for name, summary in TRAIN_RECIPES.items()]


def cmd_train(args: argparse.Namespace) -> int:
    if args.list or args.recipe is None:
        print("\n".join(recipe_lines()))
        if not args.list:
            print("\nrllib-search train RECIPE --help: a recipe's flags; --smoke: its smallest run")
        return 0
    if args.recipe not in TRAIN_RECIPES:
        args.parser.error(f"unknown recipe {args.recipe!r}; one of: {', '.join(TRAIN_RECIPES)}")
    prog = f"rllib-search train {args.recipe}"
    if args.recipe == "tiny_cpu":
        from rllib_search.recipes.tiny_cpu.cli import main as tiny_cpu_main

        return tiny_cpu_main(args.recipe_args, prog=prog)
    from rllib_search.recipes.train_cli import train

    return train(args.recipe, args.recipe_args, prog=prog)


def add_train_command(sub) -> None:
    train = sub.add_parser(
        "train",
        help="train a recipe: the papers', the CPU main job, the λ sweep",
        description="Train a recipe as a job: on the running Ray cluster when there is one (`ray job\n"
        "submit` sets RAY_ADDRESS), else on a local Ray.\n\nrecipes:\n"
        + "\n".join(f"  {line}" for line in recipe_lines()),
        epilog=TRAIN_EPILOG,
        usage="rllib-search train [-h] [--list] [RECIPE [recipe flags ...]]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--list", action="store_true", help="list the recipes, one line each")
    train.add_argument("recipe", nargs="?", metavar="RECIPE", help="the recipe to train (see above)")
    train.add_argument(
        "recipe_args", nargs=argparse.REMAINDER, metavar="...", help="the recipe's flags (RECIPE --help)"
    )
    train.set_defaults(func=cmd_train, parser=train)


def cmd_plan(args: argparse.Namespace) -> int:
    from rllib_search.recipes.train_cli import plan

    return plan(args)


def add_plan_command(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="a recipe's GPUs and per-GPU memory at paper scale: does it fit the cluster?",
        description="The resource and memory plan of a recipe at paper scale: the GPUs its learners, vLLM\n"
        "EnvRunners and Serve replicas ask against the cluster's, and each GPU's memory term by term\n"
        "(learner state, activations, logits, vLLM's budget and KV cache) against one GPU's. Exits 0 when\n"
        "it fits, 1 when it does not (the reasons name the numbers). `train` checks the same plan against\n"
        "the running cluster before any actor starts.",
        epilog="  rllib-search plan search_r1_grpo\n"
        "  rllib-search plan r_search_grpo --gpus 1 --gpu-memory-gib 24\n"
        "  rllib-search plan search_r1_grpo --model Qwen/Qwen2.5-7B \\\n"
        "      --services tuned_examples/serve_gpu_llm.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("recipe", choices=PLAN_RECIPES, metavar="RECIPE", help=", ".join(PLAN_RECIPES))
    plan.add_argument("--gpus", type=float, default=8, help="GPUs of the cluster (default 8)")
    plan.add_argument(
        "--gpu-memory-gib", type=float, default=80, help="memory of one GPU in GiB (default 80)"
    )
    plan.add_argument(
        "--host-memory-gib",
        type=float,
        help="host memory of the cluster in GiB, all nodes (default: unchecked)",
    )
    plan.add_argument(
        "--model", help="policy: hub name, local directory or bundled alias (default: the paper's)"
    )
    plan.add_argument(
        "--services",
        help="the Serve config deployed beside the run, its replicas' GPUs counted at max_replicas (default: "
        "tuned_examples/serve_gpu.yaml; none: no services)",
    )
    plan.set_defaults(func=cmd_plan)


#: The recipes ``rllib-search plan`` knows (the CPU main job asks no GPU).
PLAN_RECIPES = tuple(name for name in TRAIN_RECIPES if name != "tiny_cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rllib-search",
        description="Train LLM search agents (Search-R1, R1-Searcher, R-Search) with reinforcement learning\n"
        "on Ray RLlib, and serve their retriever and evidence judge on Ray Serve.\n"
        "`python -m rllib_search` is the same command.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    add_train_command(sub)
    add_plan_command(sub)

    def world_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--seed", type=int, default=0, help="synthetic world seed")
        p.add_argument("--train", type=int, default=1000, help="train questions")
        p.add_argument("--test", type=int, default=200, help="test questions")

    world = sub.add_parser("world", help="write the synthetic multi-hop world (corpus and questions)")
    world.add_argument("--out", required=True, help="output directory")
    world_options(world)
    world.set_defaults(func=cmd_world)

    rollout = sub.add_parser(
        "rollout", help="scripted and LLM policies through the env on the synthetic world"
    )
    world_options(rollout)
    rollout.add_argument("--world", help="world directory (default: generated under the cache)")
    rollout.add_argument(
        "--tokenizer", default="smollm2-135m-instruct", help="hub name, path or bundled alias"
    )
    rollout.add_argument("--protocols", nargs="+", default=["search_r1", "r1_searcher", "r_search"])
    rollout.add_argument("--policies", nargs="+", default=["teacher", "noisy_teacher", "no_search"])
    rollout.add_argument("--episodes", type=int, default=64, help="episodes per protocol and policy")
    rollout.add_argument("--max-turns", type=int, default=4)
    rollout.add_argument("--topk", type=int, default=3)
    rollout.add_argument("--lambda-format", type=float, default=0.0, help="search_r1 reward's λ_f")
    rollout.add_argument("--lambda-retrieval", type=float, default=0.0, help="search_r1 reward's λ_r")
    rollout.add_argument("--out", default="runs/rollout", help="where summary.json and rewards.png go")
    rollout.add_argument("--llm-model", default="smollm2-135m-instruct", help="policy of the LLM rollout")
    rollout.add_argument("--llm-prompts", type=int, default=4, help="prompts of the LLM rollout (0: skip it)")
    rollout.add_argument("--llm-turn-tokens", type=int, default=64, help="tokens per turn in the LLM rollout")
    rollout.set_defaults(func=cmd_rollout)

    from rllib_search.algos.evaluation.cli import add_eval_command
    from rllib_search.serve.cli import add_serve_commands
    from rllib_search.serve.retrieval.cli import add_index_commands

    add_index_commands(sub)
    add_serve_commands(sub)
    add_eval_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; a malformed input file (data, index, checkpoint) ends it with its message and
    exit status 1 instead of a traceback."""
    from rllib_search.algos.checkpoints.check import CheckpointError
    from rllib_search.data.errors import DataFormatError
    from rllib_search.serve.retrieval.manifest import IndexFileError, IndexMismatchError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (DataFormatError, IndexFileError, IndexMismatchError, CheckpointError, FileNotFoundError) as err:
        print(f"rllib-search: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
