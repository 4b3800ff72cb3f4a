"""The CPU main job: teach SmolLM2-135M-Instruct to chain searches with GRPO, on 2 CPU cores.

    rllib-search train tiny_cpu            # the whole job (about 8 minutes with AVX512-BF16)
    rllib-search train tiny_cpu --smoke    # every stage at the smallest size (minutes)
    rllib-search train tiny_cpu --warm-start runs/tiny_cpu_grpo/warm_start_model  # GRPO only
    RAY_AUTH_MODE=token ray job submit -- python -m rllib_search train tiny_cpu

Local Ray (or the cluster it was submitted to), the bundled SmolLM2, the synthetic multi-hop world and a
BM25 retriever served by Ray Serve. The stages (rllib_search/recipes/tiny_cpu/job.py):

1. world and retriever: the synthetic world's questions and a BM25 index of its passages on Serve;
2. evaluation before training on 50 held-out 1-hop and 50 2-hop questions, greedy;
3. warm start: masked SFT on 60 + 60 teacher trajectories whose first thought states the plan ("I need
   to search for X birthplace, then its country, then answer."); the teacher answers a quarter of the
   2-hop questions after one hop, so the warm start can chain searches but rarely does;
4. plan calibration: a few steps on the teacher's first turns with P(" its") as a soft target, until
   the plan's branch probabilities leave RL a second search to lift;
5. GRPO on never-demonstrated questions, crediting each episode's first turn (the plan and the first
   query) while the later turns run greedily; groups with no right answer get one episode guided by the
   teacher's first turn; validations keep the best weights, then a WiSE-FT mix if it reads better;
6. evaluation and report: EM per hop count with 95% bootstrap intervals after each stage, RL's paired
   gain over the warm start, summary.json, predictions.jsonl, training.png, the warm-started model and
   the RL checkpoint (Algorithm.from_checkpoint resumes it) under --out.

bf16 where the CPU has bf16 units that pay (AVX512-BF16 or AMX, bf16 products at least 0.75x fp32's,
measured at the start), fp32 elsewhere; --bf16 / --no-bf16 choose.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace

from rllib_search.recipes.tiny_cpu.config import TinyCPUConfig

DEFAULTS = TinyCPUConfig()

#: The job's environment where the shell sets none: the bundled models read offline, and every Ray
#: worker's log lines shown (not deduplicated).
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}


def numbers(kind: type) -> Callable[[str], tuple]:
    """A comma-separated list of ``kind`` ("4,6" -> (4, 6); "" -> ())."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None

    return parse


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The job's flags; ``prog`` is the command its help and errors name (default: the script's name)."""
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=DEFAULTS.model, help="the policy: an alias, hub name or local path")
    p.add_argument(
        "--out",
        default=DEFAULTS.out,
        help="output directory (default: runs/tiny_cpu_grpo; in a submitted Ray job, whose working directory "
        "Ray deletes, ~/rllib_search_runs/tiny_cpu_grpo; $RLLIB_SEARCH_RUNS replaces the runs directory)",
    )
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--world-seed", type=int, default=DEFAULTS.world_seed, help="the synthetic world's seed")
    p.add_argument("--demonstrations", type=int, default=DEFAULTS.demonstrations, help="1-hop demonstrations")
    p.add_argument("--two-hop-demonstrations", type=int, default=DEFAULTS.two_hop_demonstrations)
    p.add_argument("--sft-steps", type=int, default=DEFAULTS.sft_steps)
    p.add_argument("--calibration-steps", type=int, default=DEFAULTS.calibration_steps, help="at most")
    p.add_argument(
        "--warm-start",
        help="a Hugging Face model directory to start GRPO from (a run's warm_start_model): no SFT, no "
        "evaluation before training",
    )
    p.add_argument(
        "--rl-iterations",
        type=int,
        default=DEFAULTS.rl_iterations,
        help="GRPO iterations; 0: the warm start alone (SFT, calibration, evaluation, warm_start_model)",
    )
    p.add_argument("--group-size", type=int, default=DEFAULTS.group_size)
    p.add_argument("--rl-lr", type=float, default=DEFAULTS.rl_lr)
    p.add_argument("--kl-coeff", type=float, default=DEFAULTS.kl_coeff)
    p.add_argument(
        "--rl-guidance",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.rl_guidance,
        help="in each GRPO group with no right answer, re-run its last episode with the teacher's first turn",
    )
    p.add_argument(
        "--placebo-rewards",
        action="store_true",
        help="a control, not a recipe: after guidance, each sample's rewards are permuted among its "
        "episodes (seeded), so GRPO learns from rewards unrelated to the answers",
    )
    p.add_argument(
        "--rl-validate-at",
        type=numbers(int),
        default=DEFAULTS.rl_validate_at,
        help="GRPO iterations after which the policy answers the validation questions; the last is always "
        "read and RL keeps the weights with the most right answers (the latest on a tie); '': none",
    )
    p.add_argument(
        "--validation-questions",
        type=int,
        default=DEFAULTS.validation_questions,
        help=f"validation questions per hop count (at most {DEFAULTS.fork_questions})",
    )
    p.add_argument(
        "--rl-interpolate",
        type=numbers(float),
        default=DEFAULTS.rl_interpolate,
        help="after RL keeps the best validation, check (1 - a) x warm start + a x kept weights for each a "
        "and keep the one with the most right answers (WiSE-FT); '': none",
    )
    p.add_argument(
        "--eval-questions", type=int, default=DEFAULTS.eval_questions, help="held out, per hop count"
    )
    p.add_argument(
        "--eval-cache",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.eval_cache,
        help="read the base model's evaluation from an earlier run with the same weights and settings",
    )
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="generate with bf16 weights and train under bf16 autocast over fp32 master weights (default: "
        "where the CPU has AVX512-BF16 or AMX and its bf16 products run at least 0.75x fp32's)",
    )
    p.add_argument("--threads", type=int, default=DEFAULTS.threads, help="torch intra-op threads")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="every stage at its smallest size (a few minutes); flags still set theirs",
    )
    p.add_argument("--metrics-port", type=int, help="Prometheus port of the local Ray (default: random)")
    return p


def parse_config(argv: list[str] | None = None, *, prog: str | None = None) -> tuple[TinyCPUConfig, bool]:
    """The job's config from the command line, and whether its precision was measured (not chosen)."""
    p = build_parser(prog)
    args = p.parse_args(argv)
    measured = args.bf16 is None
    if measured:
        from rllib_search.llm.models import cpu_precision

        args.bf16 = cpu_precision().bf16
    flags = {k: v for k, v in vars(args).items() if k != "smoke"}
    if args.smoke:  # the smallest sizes, where no flag sets another
        flags = {k: v for k, v in flags.items() if k == "bf16" or v != p.get_default(k)}
    try:
        return replace(TinyCPUConfig().smoke(), **flags) if args.smoke else TinyCPUConfig(**flags), measured
    except ValueError as error:
        p.error(str(error))


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """Run the job with the command-line flags ``argv`` (None: the process's own)."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    config, measured = parse_config(argv, prog=prog)
    from rllib_search.recipes.tiny_cpu.job import JobError, run

    try:
        run(config, precision_measured=measured)
    except JobError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
