"""The main job over several seeds: how often RL, not the warm start, teaches the second search.

Runs ``tuned_examples/tiny_cpu_grpo.py`` once per seed, one after another, with the same flags, and checks
each run against the main job's goal: after RL, held-out 2-hop EM at least 0.20 above the warm start's
with its paired 95% interval above 0, and 1-hop EM not lower beyond its interval (the paired 1-hop gain's
interval reaches 0). Writes, after every seed (an interrupted sweep keeps what it has):

- ``seeds.json``: per seed the EMs per stage, both paired gains with their intervals, searches per 2-hop
  episode per stage, the iteration RL kept, seconds, the verdict and why it failed; and the pass count with
  its 95% Wilson interval and the mean 2-hop gain with a bootstrap interval over seeds;
- ``seeds.md`` (the same as a table) and ``seeds.png`` (each seed's 2-hop gain with its interval).

Each seed's run lives in ``<out>/seed_<n>/`` (its log, summary, plot, predictions; the checkpoint is deleted
unless ``--keep-checkpoints``: about 1 GB a seed). A seed whose ``summary.json`` was written with the same
flags, under the same defaults of the main job, is read back, not run again, so the sweep resumes; other
flags, or a default changed since (``run.json`` keeps every setting the run had), run it again.

    python benchmarks/main_job_seeds.py --seeds 0-4 --out runs/main_job_seeds [-- MAIN-JOB FLAGS]

for example ``-- --rl-iterations 12 --rl-validate-at 4,8,12``. The last line printed is a JSON line with
the sweep's totals (``seeds``, ``passes``, ``pass_rate_interval``, ``mean_rl_gain_2hop``, ``failed_seeds``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks.results_file import write_results  # noqa: E402

MAIN_JOB = ROOT / "tuned_examples" / "tiny_cpu_grpo.py"
MIN_GAIN_2HOP = 0.20  # the goal: 2-hop EM at least 0.20 above the warm start's
STAGES = ("before", "after warm start", "after RL")


def parse_seeds(text: str) -> list[int]:
    """``"0,13-15"`` -> ``[0, 13, 14, 15]`` (order kept, duplicates dropped)."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            span = range(int(first), int(last or first) + 1)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--seeds: {part!r} is not a seed or a range a-b") from None
        if not span:
            raise argparse.ArgumentTypeError(f"--seeds: the range {part!r} is empty")
        seeds += [s for s in span if s not in seeds]
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds: no seed given")
    return seeds


def goal_verdict(summary: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether one run's ``summary.json`` meets the main job's goal, and the reasons it does not."""
    gain, (low, _) = summary["rl_gain_2hop"], summary["rl_gain_2hop_interval"]
    one_hop, (_, one_hop_high) = summary["rl_gain_1hop"], summary["rl_gain_1hop_interval"]
    reasons = []
    if gain < MIN_GAIN_2HOP - 1e-9:
        reasons.append(f"2-hop gain {gain:+.2f} is below {MIN_GAIN_2HOP:+.2f}")
    if low <= 0:
        reasons.append(f"2-hop gain's interval starts at {low:+.2f}, not above 0")
    if one_hop_high < 0:
        reasons.append(f"1-hop fell {one_hop:+.2f}, beyond its interval (upper end {one_hop_high:+.2f})")
    return not reasons, reasons


@functools.cache
def _main_job() -> Any:
    """``tuned_examples/tiny_cpu_grpo.py`` loaded by path, so that the sweep uses the job's own flags and
    defaults, never a copy of them."""
    spec = importlib.util.spec_from_file_location("tiny_cpu_grpo_of_the_sweep", MAIN_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # at its top only the standard library and the job's config
    return module


def run_record(seed: int, flags: list[str]) -> dict[str, Any]:
    """What a seed's run is reused by: the seed, the flags, and every setting they give under the main
    job's defaults of now (``settings``, as its parser reads them, before it resolves the machine's
    precision), so a run made before a default changed runs again. ``--out`` is left out: a sweep's
    directory may move. Flags the job refuses give no settings: their run fails and its log says why."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = _main_job().build_parser().parse_args(["--seed", str(seed), *flags])
    except SystemExit:
        return {"seed": seed, "flags": flags, "settings": None}
    settings = vars(parsed)
    settings.pop("out")
    return {"seed": seed, "flags": flags, "settings": json.loads(json.dumps(settings, default=str))}


def earlier_run(seed: int, directory: Path, flags: list[str]) -> dict[str, Any] | None:
    """The summary of the run in ``directory`` when it ran ``seed`` as :func:`run_record` would now
    (the same flags and defaults), else None."""
    summary_path, run_path = directory / "summary.json", directory / "run.json"
    if not (summary_path.exists() and run_path.exists()):
        return None
    if json.loads(run_path.read_text()) != run_record(seed, flags):
        return None
    return json.loads(summary_path.read_text())


def seed_row(seed: int, summary: dict[str, Any]) -> dict[str, Any]:
    """One seed's line of the report, read from its run's ``summary.json``."""
    meets, reasons = goal_verdict(summary)
    return {
        "seed": seed,
        # Every stage the run evaluated (one started from --warm-start has no "before").
        "em": {stage: summary["em"][stage] for stage in STAGES if stage in summary["em"]},
        "searches_2hop": {
            stage: summary["searches_per_episode"][stage]["2hop"]
            for stage in STAGES
            if stage in summary["searches_per_episode"]
        },
        "rl_gain_2hop": summary["rl_gain_2hop"],
        "rl_gain_2hop_interval": summary["rl_gain_2hop_interval"],
        "rl_gain_1hop": summary["rl_gain_1hop"],
        "rl_gain_1hop_interval": summary["rl_gain_1hop_interval"],
        "kept_iteration": (summary.get("rl_validation") or {}).get("kept_iteration"),
        "kept_alpha": (summary.get("rl_validation") or {}).get("kept_alpha", 1.0),  # the WiSE-FT mix
        "seconds": summary["seconds"],
        "machine": summary.get("machine"),  # None where the run did not record it
        "meets_goal": meets,
        "why_not": reasons,
    }


def kept_weights(row: dict[str, Any]) -> str:
    """The report's "kept" cell: the iteration RL kept, and the WiSE-FT mix where one was kept
    (``6 (0.25 x RL)``: a quarter of the way from the warm start to iteration 6's weights)."""
    alpha = row.get("kept_alpha", 1.0)
    return f"{row['kept_iteration']}" + ("" if alpha in (None, 1.0) else f" ({alpha:g} x RL)")


def wilson_interval(passes: int, runs: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a pass rate (sound at a dozen runs, unlike the normal one).
    Three lines by hand: scipy's ``binomtest(...).proportion_ci("wilson")`` gives the same figures but is no
    dependency of ours (only of sentence-transformers here)."""
    if runs == 0:
        return 0.0, 1.0
    rate = passes / runs
    centre = (rate + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(rate * (1 - rate) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)


def report(
    rows: list[dict[str, Any]], main_job_flags: list[str], failed: list[int] | None = None
) -> dict[str, Any]:
    """The sweep's document: the rows, the pass count and the mean 2-hop gain over seeds (``failed``:
    seeds whose run did not finish, counted nowhere else)."""
    from rllib_search.algos.evaluation.scores import aggregate

    passes = sum(row["meets_goal"] for row in rows)
    low, high = wilson_interval(passes, len(rows))
    document: dict[str, Any] = {
        "main_job_flags": main_job_flags,
        "goal": f"2-hop gain >= {MIN_GAIN_2HOP:.2f} with its 95% interval above 0; 1-hop not lower beyond "
        "its interval",
        "seeds": [row["seed"] for row in rows],
        "passes": passes,
        "pass_rate": passes / len(rows) if rows else None,
        "pass_rate_interval": [low, high],
        "rows": rows,
        "failed_seeds": list(failed or []),
    }
    if rows:
        gains = aggregate({"rl_gain_2hop": [row["rl_gain_2hop"] for row in rows]}).pooled["rl_gain_2hop"]
        document["mean_rl_gain_2hop"] = gains.to_dict()  # bootstrap over seeds
    return document


def totals(document: dict[str, Any]) -> dict[str, Any]:
    """The sweep's totals, the final JSON line: the seeds that finished, how many meet the goal with the
    pass rate's 95% Wilson interval, the mean 2-hop gain over seeds (None without a finished seed) and the
    seeds whose run failed."""
    return {
        "seeds": document["seeds"],
        "passes": document["passes"],
        "pass_rate_interval": document["pass_rate_interval"],
        "mean_rl_gain_2hop": document.get("mean_rl_gain_2hop"),
        "failed_seeds": document["failed_seeds"],
    }


def machine_speed(machine: dict[str, Any] | None) -> str:
    """`` (66 -> 64 GFLOP/s, 0.4% stolen)``: the machine's product speed at a run's start and end and the
    share of its CPU time the hypervisor took, where the run measured them, since a shared machine's speed
    varies by 2x between days."""
    if not machine or "matmul_gflops_start" not in machine:
        return ""
    steal = machine.get("cpu_steal_share")
    stolen = f", {steal:.1%} stolen" if steal is not None else ""
    return f" ({machine['matmul_gflops_start']:.0f} -> {machine['matmul_gflops_end']:.0f} GFLOP/s{stolen})"


def markdown(document: dict[str, Any]) -> str:
    """``seeds.md``: one row per seed and the pass count."""
    from rllib_search.llm.models import describe_cpu

    flags = " ".join(document["main_job_flags"]) or "(the default)"
    lines = [
        f"# The main job over seeds: `{flags}`",
        "",
        f"Goal: {document['goal']}. Written by `benchmarks/main_job_seeds.py`.",
        "",
        "| seed | warm 1-hop / 2-hop | RL 1-hop / 2-hop | 2-hop gain [95%] | 1-hop gain [95%] "
        "| 2-hop searches warm -> RL | kept | seconds (machine speed) | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        warm, rl = row["em"]["after warm start"], row["em"]["after RL"]
        g2, g1 = row["rl_gain_2hop_interval"], row["rl_gain_1hop_interval"]
        verdict = "meets" if row["meets_goal"] else "fails: " + "; ".join(row["why_not"])
        searches = row["searches_2hop"]
        lines.append(
            f"| {row['seed']} | {warm['1hop']:.2f} / {warm['2hop']:.2f} "
            f"| {rl['1hop']:.2f} / {rl['2hop']:.2f} "
            f"| {row['rl_gain_2hop']:+.2f} [{g2[0]:+.2f}, {g2[1]:+.2f}] "
            f"| {row['rl_gain_1hop']:+.2f} [{g1[0]:+.2f}, {g1[1]:+.2f}] "
            f"| {searches['after warm start']:.2f} -> {searches['after RL']:.2f} | {kept_weights(row)} "
            f"| {row['seconds']:.0f}{machine_speed(row.get('machine'))} | {verdict} |"
        )
    machines: dict[str, list[int]] = {}
    for row in document["rows"]:
        name = describe_cpu(row["machine"]) if row.get("machine") else "not recorded"
        machines.setdefault(name, []).append(row["seed"])
    if machines:
        lines += [
            "",
            "Machines (the seconds depend on them): "
            + "; ".join(f"{name} (seeds {', '.join(map(str, seeds))})" for name, seeds in machines.items())
            + ".",
        ]
    if document["failed_seeds"]:
        lines += ["", f"Runs that failed (see their main_job.log): seeds {document['failed_seeds']}."]
    if document["rows"]:
        low, high = document["pass_rate_interval"]
        mean = document["mean_rl_gain_2hop"]
        lines += [
            "",
            f"Meets the goal: {document['passes']} of {len(document['rows'])} seeds (pass rate 95% Wilson "
            f"interval [{low:.2f}, {high:.2f}]); mean 2-hop gain {mean['value']:+.3f} "
            f"[{mean['low']:+.3f}, {mean['high']:+.3f}] (bootstrap over seeds).",
        ]
    return "\n".join(lines) + "\n"


def plot(document: dict[str, Any], path: Path) -> None:
    """Each seed's paired 2-hop gain with its 95% interval; the goal's 0.20 as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = document["rows"]
    fig, axis = plt.subplots(figsize=(max(5.0, 0.6 * len(rows) + 2), 3.5))
    for i, row in enumerate(rows):
        low, high = row["rl_gain_2hop_interval"]
        value = row["rl_gain_2hop"]
        colour = "tab:green" if row["meets_goal"] else "tab:red"
        axis.errorbar(i, value, yerr=[[value - low], [high - value]], fmt="o", color=colour, capsize=3)
    axis.axhline(MIN_GAIN_2HOP, color="grey", linestyle="--", label=f"goal {MIN_GAIN_2HOP:+.2f}")
    axis.axhline(0, color="black", linewidth=0.5)
    axis.set_xticks(range(len(rows)), [str(row["seed"]) for row in rows])
    axis.set_xlabel("seed")
    axis.set_ylabel("2-hop EM gain, RL over warm start")
    axis.set_title(f"meets the goal: {document['passes']} of {len(rows)} (green)")
    axis.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_seed(seed: int, directory: Path, flags: list[str], keep_checkpoint: bool) -> dict[str, Any] | None:
    """The main job for ``seed`` in ``directory`` (its output echoed and logged): its summary, its earlier
    summary when that run had the same flags and defaults, or None when it failed (said, with its log). A
    subprocess, not a Ray Tune trial: each run starts and stops its own Ray and uses both cores, so runs go
    one at a time, and a crash stays one seed's."""
    summary_path, run_path = directory / "summary.json", directory / "run.json"
    earlier = earlier_run(seed, directory, flags)
    if earlier is not None:
        print(f"[seed {seed}] reusing {summary_path}", flush=True)
        return earlier
    wanted = run_record(seed, flags)
    directory.mkdir(parents=True, exist_ok=True)
    run_path.unlink(missing_ok=True)
    summary_path.unlink(missing_ok=True)
    command = [sys.executable, str(MAIN_JOB), "--seed", str(seed), "--out", str(directory), *flags]
    print(f"[seed {seed}] {' '.join(command)}", flush=True)
    with open(directory / "main_job.log", "w", buffering=1) as log:  # line by line: it can be followed
        child = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert child.stdout is not None
        for line in child.stdout:
            log.write(line)
            print(f"[seed {seed}] {line}", end="", flush=True)
        status = child.wait()
    if status != 0 or not summary_path.exists():
        print(f"[seed {seed}] the main job failed ({status}): see {directory / 'main_job.log'}", flush=True)
        return None
    if not keep_checkpoint:
        shutil.rmtree(directory / "checkpoint", ignore_errors=True)
    run_path.write_text(json.dumps(wanted) + "\n")
    return json.loads(summary_path.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-4"))
    parser.add_argument("--out", default="runs/main_job_seeds", help="one directory per seed, and the report")
    parser.add_argument("--keep-checkpoints", action="store_true")
    args = parser.parse_args(ours)
    for flag in ("--seed", "--out"):
        if flag in flags:
            parser.error(f"{flag} is this sweep's to set, not a main-job flag")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, rows, failed = time.perf_counter(), [], []
    for done, seed in enumerate(args.seeds):
        summary = run_seed(seed, out / f"seed_{seed}", flags, args.keep_checkpoints)
        if summary is None:
            failed.append(seed)
        else:
            rows.append(seed_row(seed, summary))
        document = report(rows, flags, failed)
        write_results("seeds", document, headline=totals(document), directory=out)  # after every seed
        (out / "seeds.md").write_text(markdown(document))
        plot(document, out / "seeds.png")
        if summary is not None:
            row = rows[-1]
            verdict = "meets the goal" if row["meets_goal"] else "fails: " + "; ".join(row["why_not"])
            low, high = row["rl_gain_2hop_interval"]
            print(
                f"[{done + 1}/{len(args.seeds)} seeds, {time.perf_counter() - started:.0f}s] seed {seed}: "
                f"2-hop {row['rl_gain_2hop']:+.2f} [{low:+.2f}, {high:+.2f}], {verdict}; "
                f"{document['passes']} of {len(rows)} so far",
                flush=True,
            )
    print(markdown(document))
    print(f"report: {out / 'seeds.md'}, {out / 'seeds.json'}, {out / 'seeds.png'}")
    write_results("seeds", document, headline=totals(document), directory=out)  # the final JSON line
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
