"""The controlled experiment on the main job: its statistics, report and figure
(``benchmarks/evidence.py`` runs it).

For each (world seed, seed) pair the experiment trains one warm start and three arms from it: ``recipe``
(the main job's RL), ``placebo`` (the same RL with each sample's rewards permuted among its episodes,
``--placebo-rewards``) and ``no_rl`` (the warm start's own held-out evaluation). A run is one arm of one
pair: its held-out answers, each scored right or wrong by exact match.

- :func:`arm_em`: an arm's held-out EM on one hop count, with a two-level bootstrap interval: pairs
  resampled, then questions within each drawn pair;
- :func:`paired_gain`: the gain of one arm over another, per question paired by (world seed, seed,
  question uid), with the same two-level interval;
- :func:`pass_rate`: the share of pairs where an arm's 2-hop gain over ``no_rl`` meets the main job's goal
  (at least 0.20, its paired 95% interval above 0, computed as the job computes its own gain), with a
  Wilson interval;
- :func:`summarize` all of it; :func:`markdown` and :func:`plot` the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllib_search.algos.evaluation.scores import Estimate, nested_bootstrap
from rllib_search.algos.evaluation.scores import paired_gain as question_paired_gain
from rllib_search.env.rewards import exact_match

ARMS = ("recipe", "placebo", "no_rl")
HOPS = (1, 2)
MIN_GAIN_2HOP = 0.20  # the main job's goal: 2-hop EM at least 0.20 above the warm start's
#: The stage of each arm's predictions.jsonl whose answers the arm reports.
ARM_STAGE = {"recipe": "after RL", "placebo": "after RL", "no_rl": "after warm start"}


# --- runs ------------------------------------------------------------------------------------------------
def read_answers(predictions: Path, stage: str) -> list[dict[str, Any]]:
    """The held-out answers of ``stage`` in a main job's predictions.jsonl, each scored by exact match."""
    answers = []
    for line in Path(predictions).read_text().splitlines():
        row = json.loads(line)
        if row["stage"] == stage:
            correct = exact_match(row["answer"], row["golds"]) > 0
            answers.append(
                {key: row[key] for key in ("uid", "hops", "answer", "golds")} | {"correct": correct}
            )
    if not answers:
        raise ValueError(f"{predictions} has no answers of the stage {stage!r}")
    return answers


def run_entry(arm: str, world_seed: int, seed: int, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One run as the experiment records it: the arm, the pair, its answers and EM per hop count."""
    em = {}
    for hops in sorted({a["hops"] for a in answers}):
        right = [a["correct"] for a in answers if a["hops"] == hops]
        em[f"{hops}hop"] = sum(right) / len(right)
    return {"arm": arm, "world_seed": world_seed, "seed": seed, "em": em, "answers": answers}


def pair_of(run: dict[str, Any]) -> tuple[int, int]:
    return run["world_seed"], run["seed"]


def correct_by_uid(run: dict[str, Any], hops: int) -> dict[str, float]:
    return {a["uid"]: float(a["correct"]) for a in run["answers"] if a["hops"] == hops}


def runs_of(runs: Sequence[dict[str, Any]], arm: str) -> dict[tuple[int, int], dict[str, Any]]:
    return {pair_of(run): run for run in runs if run["arm"] == arm}


# --- statistics ------------------------------------------------------------------------------------------
def arm_em(runs: Sequence[dict[str, Any]], arm: str, hops: int, **bootstrap: Any) -> Estimate:
    """``arm``'s held-out EM on ``hops``-hop questions over its pairs (:func:`nested_bootstrap`)."""
    chosen = runs_of(runs, arm)
    values = [list(correct_by_uid(chosen[pair], hops).values()) for pair in sorted(chosen)]
    return nested_bootstrap(values, **bootstrap)


def paired_differences(
    runs: Sequence[dict[str, Any]], arm: str, baseline: str, hops: int
) -> dict[tuple[int, int], list[float]]:
    """Per pair that both arms ran, ``arm``'s minus ``baseline``'s correctness per question, paired by
    question uid, in uid order (questions only one of them answered are left out)."""
    a, b = runs_of(runs, arm), runs_of(runs, baseline)
    differences = {}
    for pair in sorted(set(a) & set(b)):
        right_a, right_b = correct_by_uid(a[pair], hops), correct_by_uid(b[pair], hops)
        shared = sorted(uid for uid in right_a if uid in right_b)
        if shared:
            differences[pair] = [right_a[uid] - right_b[uid] for uid in shared]
    return differences


def paired_gain(
    runs: Sequence[dict[str, Any]], arm: str, baseline: str, hops: int, **bootstrap: Any
) -> Estimate:
    """The gain in held-out EM of ``arm`` over ``baseline`` on ``hops``-hop questions, paired by (world
    seed, seed, question), with the two-level interval of :func:`nested_bootstrap`."""
    differences = paired_differences(runs, arm, baseline, hops)
    if not differences:
        raise ValueError(f"no pair has both {arm!r} and {baseline!r}")
    return nested_bootstrap(list(differences.values()), **bootstrap)


def job_gain(run: dict[str, Any], baseline: dict[str, Any], hops: int, seed: int = 0) -> Estimate:
    """``run``'s gain over ``baseline`` on one pair's ``hops``-hop questions as the main job computes its own
    RL gain (``algos.evaluation.scores.paired_gain``: questions resampled, 1000 times)."""
    before = {a["uid"]: a for a in baseline["answers"] if a["hops"] == hops}
    after = [a for a in run["answers"] if a["hops"] == hops and a["uid"] in before]
    scores = question_paired_gain(
        [before[a["uid"]]["answer"] for a in after],
        [a["answer"] for a in after],
        [a["golds"] for a in after],
        metrics=("em",),
        seed=seed,
    )
    return scores.groups["all"]["em"]


def wilson_interval(passes: int, count: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a pass rate."""
    if count == 0:
        return 0.0, 1.0
    rate = passes / count
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_rate(runs: Sequence[dict[str, Any]], arm: str, baseline: str = "no_rl") -> dict[str, Any]:
    """The pairs where ``arm``'s 2-hop gain over ``baseline`` meets the main job's goal (at least
    ``MIN_GAIN_2HOP``, its paired interval above 0), their share and its Wilson interval."""
    a, b = runs_of(runs, arm), runs_of(runs, baseline)
    per_pair = []
    for world_seed, seed in sorted(set(a) & set(b)):
        gain = job_gain(a[world_seed, seed], b[world_seed, seed], 2, seed=seed)
        passed = gain.value >= MIN_GAIN_2HOP and gain.low > 0
        per_pair.append(
            {"world_seed": world_seed, "seed": seed, "gain_2hop": gain.to_dict(), "passed": passed}
        )
    passes = sum(p["passed"] for p in per_pair)
    share = passes / len(per_pair) if per_pair else None
    return {
        "passes": passes,
        "pairs": len(per_pair),
        "rate": share,
        "interval": wilson_interval(passes, len(per_pair)),
        "per_pair": per_pair,
    }


def summarize(runs: Sequence[dict[str, Any]], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per arm EM per hop count; the gains recipe - placebo and recipe - no_rl (and placebo - no_rl) per
    hop count; the pass rates of the RL arms. Arms or comparisons without runs are left out."""
    bootstrap = {"resamples": resamples, "seed": seed}
    present = [arm for arm in ARMS if any(run["arm"] == arm for run in runs)]
    em = {arm: {f"{h}hop": arm_em(runs, arm, h, **bootstrap).to_dict() for h in HOPS} for arm in present}
    gains = {}
    for arm, baseline in (("recipe", "placebo"), ("recipe", "no_rl"), ("placebo", "no_rl")):
        if paired_differences(runs, arm, baseline, 2):
            gains[f"{arm}-{baseline}"] = {
                f"{h}hop": paired_gain(runs, arm, baseline, h, **bootstrap).to_dict() for h in HOPS
            }
    rates = {
        arm: pass_rate(runs, arm) for arm in ("recipe", "placebo") if arm in present and "no_rl" in present
    }
    pairs = sorted({pair_of(run) for run in runs})
    return {
        "pairs": [list(p) for p in pairs],
        "em": em,
        "gains": gains,
        "pass_rates": rates,
        "resamples": resamples,
    }


# --- report -----------------------------------------------------------------------------------------------
def interval(estimate: dict[str, float]) -> str:
    return f"{estimate['value']:+.3f} [{estimate['low']:+.3f}, {estimate['high']:+.3f}]"


def em_cell(estimate: dict[str, float]) -> str:
    return f"{estimate['value']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def placebo_verdict(summary: dict[str, Any]) -> str:
    """Whether the placebo matches the recipe, in plain words, from the paired 2-hop gain recipe - placebo."""
    gain = summary["gains"].get("recipe-placebo", {}).get("2hop")
    if gain is None:
        return "The placebo arm has not run on any pair yet: no comparison."
    if gain["low"] > 0:
        return (
            f"The recipe beats the placebo on 2-hop questions: paired gain {interval(gain)}, its 95% "
            "interval above 0. What RL teaches depends on which episodes its rewards credit."
        )
    if gain["high"] < 0:
        return (
            f"The placebo beats the recipe on 2-hop questions: paired gain {interval(gain)}, its 95% "
            "interval below 0."
        )
    return (
        f"The placebo matches the recipe within the interval on 2-hop questions: paired gain "
        f"{interval(gain)}, its 95% interval contains 0. These runs do not show that the rewards, "
        "rather than the pipeline around them, teach the second search."
    )


def one_hop_verdict(summary: dict[str, Any]) -> str:
    """What the recipe's RL does to 1-hop questions, from the paired 1-hop gain recipe - no_rl."""
    gain = summary["gains"].get("recipe-no_rl", {}).get("1hop")
    if gain is None:
        return ""
    if gain["high"] < 0:
        return (
            f"On 1-hop questions the recipe loses EM against its warm start: paired gain {interval(gain)}, "
            "its 95% interval below 0."
        )
    if gain["low"] > 0:
        return f"On 1-hop questions the recipe gains too: paired gain {interval(gain)}, its interval above 0."
    return (
        f"On 1-hop questions the recipe keeps its warm start's EM: paired gain {interval(gain)}, its 95% "
        "interval contains 0."
    )


def markdown(document: dict[str, Any], command: str) -> str:
    """The experiment's report (docs/evidence.md) from its results document."""
    summary, plan = document["summary"], document["plan"]
    lines = [
        "# Evidence: the main job's RL against a placebo and no RL",
        "",
        "Generated by `benchmarks/evidence.py --report` from `benchmarks/results/evidence.json`; the runs "
        f"ran the code of commit {', '.join(commits_of(document))}"
        + (
            " (-dirty: the checkout also held files not committed)."
            if any(commit.endswith("-dirty") for commit in commits_of(document))
            else "."
        ),
        "",
        "## The rule",
        "",
        f"World seeds {plan['rule']}, fixed before any run; none of these worlds was used while developing "
        "the job. Each (world seed, seed) pair gets one warm start (SFT and plan calibration, the job with "
        "`--rl-iterations 0`) and three arms from that same warm start:",
        "",
        "- **recipe**: the main job's RL as it is (`--warm-start DIR`);",
        "- **placebo**: the same RL, with each sample's rewards permuted among its episodes after teacher "
        "guidance (`--warm-start DIR --placebo-rewards`); validation, the WiSE-FT check and evaluation "
        "unchanged;",
        "- **no_rl**: no RL, the warm start's held-out evaluation.",
        "",
        f"Pairs run: {len(summary['pairs'])} of {len(plan['pairs'])} "
        f"({', '.join(f'world {w} seed {s}' for w, s in summary['pairs'])}).",
        "",
        "## Held-out EM",
        "",
        "Greedy exact match on the held-out questions of each world (the main job's, 50 per hop count by "
        "default); 95% intervals resample pairs, then questions within them; gains pair the arms by (world "
        "seed, seed, question).",
        "",
        "| arm | EM 1-hop | EM 2-hop |",
        "|---|---|---|",
    ]
    for arm, em in summary["em"].items():
        lines.append(f"| {arm} | {em_cell(em['1hop'])} | {em_cell(em['2hop'])} |")
    lines += ["", "| paired gain | 1-hop | 2-hop |", "|---|---|---|"]
    for name, gain in summary["gains"].items():
        lines.append(f"| {name.replace('-', ' − ')} | {interval(gain['1hop'])} | {interval(gain['2hop'])} |")
    if summary["pass_rates"]:
        lines += [
            "",
            f"Pairs meeting the main job's goal (2-hop gain over no_rl at least {MIN_GAIN_2HOP:.2f}, its "
            "paired 95% interval above 0, as the job computes its own gain):",
            "",
        ]
        for arm, rate in summary["pass_rates"].items():
            low, high = rate["interval"]
            lines.append(
                f"- {arm}: {rate['passes']} of {rate['pairs']} (95% Wilson interval {low:.2f}-{high:.2f})"
            )
    lines += ["", *pair_table(document.get("runs") or [], document.get("machine"))]
    lines += [
        "",
        "## Verdict",
        "",
        placebo_verdict(summary),
        "",
        one_hop_verdict(summary),
        "",
        "![EM per arm and paired gains](evidence.png)",
        "",
        "## Reproduce",
        "",
        "```bash",
        command,
        "python benchmarks/evidence.py --report",
        "```",
        "",
    ]
    return "\n".join(lines)


def commits_of(document: dict[str, Any]) -> list[str]:
    """The commits the document's runs ran (the file's own for runs that record none)."""
    found = {run.get("commit") or document.get("commit") for run in document.get("runs") or []}
    return sorted(str(commit) for commit in found if commit) or [str(document.get("commit") or "unknown")]


def pair_table(runs: list[dict[str, Any]], machine: dict[str, Any] | None) -> list[str]:
    """Each pair's held-out EM per arm (1-hop / 2-hop), minutes per run and the machine its runs ran on
    (``machine``, the results file's, for runs that record none)."""
    by_pair: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_pair.setdefault((int(run["world_seed"]), int(run["seed"])), {})[run["arm"]] = run
    machines = sorted({describe_machine(run.get("machine") or machine) for run in runs} - {""})
    lines = [
        "## Per pair",
        "",
        "EM 1-hop / 2-hop of each arm, and each run's wall-clock minutes (the no_rl arm's are the warm "
        "start's; on a shared machine they count whatever else ran beside them).",
        "",
        "| world seed | seed | " + " | ".join(ARMS) + " | minutes (" + ", ".join(ARMS) + ") | machine |",
        "|---|---|" + "---|" * (len(ARMS) + 2),
    ]
    for (world, seed), arms in sorted(by_pair.items()):
        cells = [
            f"{arms[arm]['em']['1hop']:.2f} / {arms[arm]['em']['2hop']:.2f}" if arm in arms else "not run"
            for arm in ARMS
        ]
        minutes = [
            f"{arms[arm]['seconds'] / 60:.1f}" if arms.get(arm, {}).get("seconds") else "-" for arm in ARMS
        ]
        ran_on = sorted({describe_machine(run.get("machine") or machine) for run in arms.values()} - {""})
        label = ", ".join(chr(ord("A") + machines.index(m)) for m in ran_on) or "-"
        lines.append(f"| {world} | {seed} | " + " | ".join(cells) + f" | {', '.join(minutes)} | {label} |")
    if machines:
        lines += ["", "Machines:", ""]
        lines += [f"- {chr(ord('A') + index)}: {m}" for index, m in enumerate(machines)]
    return lines


def describe_machine(machine: dict[str, Any] | None) -> str:
    """A run's machine in words (empty when unknown)."""
    if not machine:
        return ""
    bf16 = "native bf16" if machine.get("native_bf16") else "no native bf16"
    return (
        f"{machine.get('cpu', 'CPU')} (family {machine.get('cpu_family')} model {machine.get('cpu_model')}), "
        f"{machine.get('cores')} cores, {machine.get('vector_unit')}, {bf16}"
    )


def _hop_bars(ax: Any, names: list[str], estimates: dict[str, Any]) -> None:
    """Bars of each name's 1-hop and 2-hop estimate side by side, with their intervals."""
    for offset, hops in ((-0.2, "1hop"), (0.2, "2hop")):
        rows = [estimates[name][hops] for name in names]
        values = [e["value"] for e in rows]
        errors = [[v - e["low"] for v, e in zip(values, rows)], [e["high"] - v for v, e in zip(values, rows)]]
        ax.bar([i + offset for i in range(len(names))], values, width=0.4, yerr=errors, capsize=3, label=hops)


def plot(summary: dict[str, Any], path: Path) -> None:
    """EM per arm and hop count with intervals beside the paired gains with theirs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    arms = list(summary["em"])
    _hop_bars(left, arms, summary["em"])
    left.set_xticks(range(len(arms)), arms)
    left.set_ylim(0, 1)
    left.set_title("held-out EM (95% interval)")
    left.legend()
    names = list(summary["gains"])
    _hop_bars(right, names, summary["gains"])
    right.axhline(0, color="black", linewidth=0.8)
    right.set_xticks(range(len(names)), [n.replace("-", " − ") for n in names])
    right.set_title("paired EM gain (95% interval)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
