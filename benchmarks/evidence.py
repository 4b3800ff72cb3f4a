"""A controlled experiment on the main job: its RL against a placebo of itself and against no RL.

The rule, fixed before any run: world seeds 1000-1009 (worlds never used while developing the job), each
paired with seed 0; ``--pairs N`` takes the first N pairs (``--world-seeds`` / ``--seeds`` replace them for
checks). For each (world seed, seed) pair:

1. ``warm_start``: the main job with ``--rl-iterations 0``: SFT, plan calibration, the held-out
   evaluation and ``warm_start_model/``; its evaluation is the arm ``no_rl``;
2. ``recipe``: the main job's RL from that warm start (``--warm-start DIR``);
3. ``placebo``: the same with ``--placebo-rewards`` (each sample's rewards permuted among its episodes
   after teacher guidance; ``rllib_search/recipes/tiny_cpu/placebo.py``).

Each run is a subprocess of ``tuned_examples/tiny_cpu_grpo.py`` with its own ``--out`` under
``<out>/world_<w>_seed_<s>/<run>/`` (its log in ``job.log``; the RL checkpoint is deleted unless
``--keep-checkpoints``). A run whose ``summary.json`` exists is read back, not run again, so an interrupted
experiment resumes where it stopped; a pair whose three runs the results file already holds is kept from it
and not run again (its run directories may be gone), and ``--merge FILE ...`` keeps the finished pairs of
other results files the same way (pairs run on other machines). Every run records the commit and the
machine it ran on. After every run the results file (``benchmarks/results/evidence.json``) is written
again: ``runs`` (per arm and pair, every held-out answer and EM per hop count) and ``summary``
(``rllib_search/recipes/tiny_cpu/evidence.py``: EM per arm with two-level bootstrap intervals, the paired
gains recipe - placebo and recipe - no_rl, the pass rates of the main job's goal).

    python benchmarks/evidence.py                      # all 10 pairs, ~13 minutes a pair on 2 cores
    python benchmarks/evidence.py --pairs 2            # the first two pairs
    python benchmarks/evidence.py --world-seeds 1005-1009 --results b.json   # pairs split across machines,
    python benchmarks/evidence.py --merge b.json       # ... then merged into one results file
    python benchmarks/evidence.py --plan-only          # the results file from the runs done; the runs left
    python benchmarks/evidence.py --report             # docs/evidence.md and docs/evidence.png from the JSON
    python benchmarks/evidence.py --smoke --pairs 1 --out /tmp/evidence_smoke --results /tmp/evidence.json \\
        -- --model PATH                                # every stage at its smallest size [MAIN-JOB FLAGS]

Flags after ``--`` go to every run of the main job.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks.results_file import git_commit, write_results  # noqa: E402
from rllib_search.recipes.tiny_cpu import evidence  # noqa: E402

MAIN_JOB = ROOT / "tuned_examples" / "tiny_cpu_grpo.py"
WORLD_SEEDS = tuple(range(1000, 1010))
SEED = 0
RULE = "1000-1009, each paired with seed 0 (`--pairs N` takes the first N)"
RESULTS = ROOT / "benchmarks" / "results" / "evidence.json"
DOCS = ROOT / "docs"
RUNS = Path.home() / "rllib_search_runs" / "evidence"
#: The job's runs per pair, in order (the RL arms start from the warm start's model), and each one's arm.
RUN_ARMS = {"warm_start": "no_rl", "recipe": "recipe", "placebo": "placebo"}
#: What a run records of the machine (``llm.models.cpu_description``'s keys, from the job's summary.json).
MACHINE_KEYS = ("cpu", "cpu_family", "cpu_model", "cores", "torch_threads", "vector_unit", "native_bf16")


@dataclass(frozen=True)
class PlannedRun:
    """One subprocess of the main job: which run of which pair, where it writes, its flags, whether done."""

    name: str  # warm_start, recipe or placebo
    world_seed: int
    seed: int
    out: Path
    flags: tuple[str, ...]
    done: bool

    @property
    def arm(self) -> str:
        return RUN_ARMS[self.name]


def parse_numbers(text: str) -> list[int]:
    """``"1000-1002,7"`` -> ``[1000, 1001, 1002, 7]``."""
    numbers: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            numbers += list(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number or a range a-b") from None
    return numbers


def pairs_of(world_seeds: list[int], seeds: list[int], count: int | None) -> list[tuple[int, int]]:
    """The (world seed, seed) pairs: one seed goes with every world, otherwise the lists pair up in order;
    ``count`` (None: all) takes the first ones."""
    if len(seeds) == 1:
        seeds = seeds * len(world_seeds)
    if len(seeds) != len(world_seeds):
        raise ValueError(f"{len(world_seeds)} world seeds but {len(seeds)} seeds: give one seed, or one each")
    pairs = list(zip(world_seeds, seeds))
    return pairs if count is None else pairs[:count]


def pair_directory(runs: Path, world_seed: int, seed: int) -> Path:
    return runs / f"world_{world_seed}_seed_{seed}"


def plan(pairs: list[tuple[int, int]], runs: Path, job_flags: list[str]) -> list[PlannedRun]:
    """Every run of the experiment in the order it runs, each marked done when its summary.json exists."""
    planned = []
    for world_seed, seed in pairs:
        directory = pair_directory(runs, world_seed, seed)
        warm_model = directory / "warm_start" / "warm_start_model"
        own = {
            "warm_start": ("--rl-iterations", "0"),  # after the caller's flags: the warm start alone
            "recipe": ("--warm-start", str(warm_model)),
            "placebo": ("--warm-start", str(warm_model), "--placebo-rewards"),
        }
        for name in RUN_ARMS:
            out = directory / name
            flags = (
                "--world-seed",
                str(world_seed),
                "--seed",
                str(seed),
                "--out",
                str(out),
                *job_flags,
                *own[name],
            )
            planned.append(PlannedRun(name, world_seed, seed, out, flags, (out / "summary.json").exists()))
    return planned


def kept_pairs(files: list[Path]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The finished pairs (all three arms) of earlier results files, each run with the commit and the
    machine it ran on (an entry without its own takes its file's); a later file's pair replaces an
    earlier one's."""
    kept: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for path in files:
        if not path.exists():
            continue
        found = json.loads(path.read_text())
        by_pair: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for entry in found.get("runs") or []:
            stamped = {"commit": found.get("commit"), "machine": found.get("machine"), **entry}
            by_pair.setdefault(evidence.pair_of(entry), []).append(stamped)
        for pair, entries in by_pair.items():
            if {entry["arm"] for entry in entries} >= set(RUN_ARMS.values()):
                kept[pair] = entries
    return kept


def collect(
    planned: list[PlannedRun], kept: dict[tuple[int, int], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The finished runs' entries: per arm and pair, every held-out answer and EM per hop count, the commit
    and the machine; a pair none of whose runs is on disk is taken from ``kept`` where it is there."""
    runs, commit = [], git_commit(ROOT)
    on_disk = {(run.world_seed, run.seed) for run in planned if (run.out / "summary.json").exists()}
    for run in planned:
        pair = (run.world_seed, run.seed)
        if pair not in on_disk:
            if run.name == "warm_start":  # once per pair
                runs += kept.get(pair, [])
            continue
        if not (run.out / "summary.json").exists():
            continue
        summary = json.loads((run.out / "summary.json").read_text())
        answers = evidence.read_answers(run.out / "predictions.jsonl", evidence.ARM_STAGE[run.arm])
        entry = evidence.run_entry(run.arm, run.world_seed, run.seed, answers)
        machine = {key: summary.get("machine", {}).get(key) for key in MACHINE_KEYS}
        entry.update(seconds=summary["seconds"], commit=commit, machine=machine)
        runs.append(entry)
    return runs


def document(
    planned: list[PlannedRun],
    pairs: list[tuple[int, int]],
    command: str,
    failed: list[dict[str, Any]],
    kept: dict[tuple[int, int], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The results document: the rule and plan, the runs, their summary and the runs that failed."""
    runs = collect(planned, kept)
    return {
        "benchmark": "evidence",
        "plan": {"rule": RULE, "pairs": [list(p) for p in pairs], "command": command},
        "summary": evidence.summarize(runs) if runs else None,
        "failed": failed,
        "runs": runs,
    }


def run_job(run: PlannedRun, keep_checkpoint: bool) -> tuple[int, float]:
    """One run of the main job, its output in ``job.log``; its exit status and seconds."""
    run.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(run.out / "job.log", "w") as log:
        status = subprocess.run(
            [sys.executable, str(MAIN_JOB), *run.flags], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    if not keep_checkpoint:
        shutil.rmtree(run.out / "checkpoint", ignore_errors=True)
    return status, time.perf_counter() - started


def run_experiment(args: argparse.Namespace, job_flags: list[str], command: str) -> Path:
    pairs = pairs_of(args.world_seeds, args.seeds, args.pairs)
    job_flags = ["--smoke", *job_flags] if args.smoke else job_flags
    planned = plan(pairs, Path(args.out).expanduser(), job_flags)
    results = Path(args.results)
    kept = kept_pairs([results, *map(Path, args.merge)])
    on_disk = {(run.world_seed, run.seed) for run in planned if run.done}
    todo = [
        run
        for run in planned
        if not run.done and ((run.world_seed, run.seed) not in kept or (run.world_seed, run.seed) in on_disk)
    ]
    kept_here = sorted(set(kept) & {(run.world_seed, run.seed) for run in planned} - on_disk)
    print(
        f"evidence: {len(pairs)} pairs, {len(planned)} runs, {len(planned) - len(todo)} done "
        f"({3 * len(kept_here)} of them kept from results files), under {args.out}"
    )
    failed: list[dict[str, Any]] = []
    broken_pairs: set[tuple[int, int]] = set()
    path = write_results(results.stem, document(planned, pairs, command, failed, kept), {}, results.parent)
    if args.plan_only:
        for run in todo:
            print(f"to run: world {run.world_seed} seed {run.seed} {run.name}")
        return path
    for index, run in enumerate(todo, 1):
        label = f"[{index}/{len(todo)}] world {run.world_seed} seed {run.seed} {run.name}"
        if (run.world_seed, run.seed) in broken_pairs:
            print(f"{label}: skipped (its warm start failed)", flush=True)
            continue
        print(f"{label}: running (log {run.out / 'job.log'})", flush=True)
        status, seconds = run_job(run, args.keep_checkpoints)
        if status != 0:
            print(f"{label}: failed with status {status} after {seconds:.0f} s; see its log", flush=True)
            failed.append({"run": run.name, "world_seed": run.world_seed, "seed": run.seed, "status": status})
            if run.name == "warm_start":
                broken_pairs.add((run.world_seed, run.seed))
            continue
        entry = evidence.run_entry(
            run.arm,
            run.world_seed,
            run.seed,
            evidence.read_answers(run.out / "predictions.jsonl", evidence.ARM_STAGE[run.arm]),
        )
        print(
            f"{label}: done in {seconds:.0f} s, {run.arm} EM 1-hop {entry['em']['1hop']:.3f} "
            f"2-hop {entry['em']['2hop']:.3f}",
            flush=True,
        )
        path = write_results(
            results.stem, document(planned, pairs, command, failed, kept), {}, results.parent
        )
    return path


def write_report(results: Path, docs: Path) -> tuple[Path, Path]:
    """docs/evidence.md and docs/evidence.png from the results document."""
    found = json.loads(results.read_text())
    if not found["summary"]:
        raise SystemExit(f"{results} holds no finished run yet")
    docs.mkdir(parents=True, exist_ok=True)
    report, figure = docs / "evidence.md", docs / "evidence.png"
    report.write_text(evidence.markdown(found, found["plan"]["command"]))
    evidence.plot(found["summary"], figure)
    return report, figure


#: Driver flags that do not change what runs (with how many values each takes; -1: one or more).
BOOKKEEPING_FLAGS = {"--merge": -1, "--plan-only": 0, "--out": 1, "--results": 1, "--keep-checkpoints": 0}


def reproducing(flags: list[str]) -> list[str]:
    """The driver's flags less those that only say where runs and results go (``--out``, ``--results``,
    ``--merge``, ...): the command that reproduces the runs."""
    kept, skipping = [], 0
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in BOOKKEEPING_FLAGS:
            skipping = 0 if "=" in flag else BOOKKEEPING_FLAGS[name]
        elif skipping and not (skipping < 0 and flag.startswith("--")):
            skipping -= 1 if skipping > 0 else 0
        else:
            skipping = 0
            kept.append(flag)
    return kept


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    job_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, help="the first N (world seed, seed) pairs (default: all)")
    parser.add_argument("--world-seeds", type=parse_numbers, default=list(WORLD_SEEDS), help="checks only")
    parser.add_argument(
        "--seeds", type=parse_numbers, default=[SEED], help="one for every world, or one each"
    )
    parser.add_argument("--out", default=str(RUNS), help="the runs directory (one directory per pair)")
    parser.add_argument("--results", default=str(RESULTS), help="the results JSON")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="FILE",
        help="other results files whose finished pairs are kept, not run again (pairs run elsewhere)",
    )
    parser.add_argument(
        "--plan-only",
        action="store_true",
        help="write the results file from the runs done (on disk or kept) and list the runs left; run none",
    )
    parser.add_argument("--smoke", action="store_true", help="pass the main job's --smoke to every run")
    parser.add_argument(
        "--keep-checkpoints", action="store_true", help="keep each RL run's checkpoint (~1 GB)"
    )
    parser.add_argument(
        "--report", action="store_true", help="write the report from the results JSON; run nothing"
    )
    parser.add_argument(
        "--docs", default=str(DOCS), help="where --report writes evidence.md and evidence.png"
    )
    args = parser.parse_args(ours)
    for flag in ("--seed", "--world-seed", "--out", "--warm-start", "--placebo-rewards"):
        if flag in job_flags:
            parser.error(f"{flag} is the experiment's to set, not a main-job flag after --")
    if args.report:
        for path in write_report(Path(args.results), Path(args.docs)):
            print(f"wrote {path}")
        return 0
    command = shlex.join(
        ["python", "benchmarks/evidence.py", *reproducing(ours), *(["--", *job_flags] if job_flags else [])]
    )
    run_experiment(args, job_flags, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
