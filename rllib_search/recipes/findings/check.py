"""Checking committed findings by training some of their arms again (``tuned_examples/findings.py --check``).

A re-run arm is set beside the arm ``docs/findings/findings.json`` holds, seed by seed: the held-out
EM of each seed trained again next to the committed one, and over the seeds re-run the difference of the
two pooled EMs with a 95% interval. The committed file keeps each seed's EM, not its answers, so the
interval treats the two runs as independent samples of ``questions`` answers a seed (a normal
approximation of two proportions): wider than a paired one, which suits a check.

Greedy held-out answers after seeded training are the same run after run on one machine, and MKL's fp32
products give the same bits on AVX2 CPUs of different generations (AMD's Zen 2 and Zen 3 agree); a CPU
whose kernels sum in another order (AVX-512, AMX) trains other weights from the same seed, and at this
scale a seed's outcome is then a draw of its own, so "within the interval" is what carries across CPUs and
"the same EM at every seed" is what carries on one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rllib_search.recipes.findings.study import (
    FINDINGS,
    RUN_SETTINGS,
    Finding,
    machine_line,
    measured_turn_budget,
)

Z95 = 1.959964
#: The run settings a re-run must share with the committed one for its arms to be the same experiment
#: (any of the committed seeds may be re-run).
COMPARED_SETTINGS = tuple(key for key in RUN_SETTINGS if key != "seeds")


def compare_arm(committed: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """One re-run arm (an :func:`~rllib_search.recipes.findings.study.analyse` arm entry) against the
    committed one: per seed both EMs; over the re-run seeds the committed and re-run pooled EM, their
    difference (re-run minus committed) with a 95% interval, and a verdict: ``the same EM at every
    seed``, ``within the interval`` (the difference's interval covers 0) or ``differs``."""
    if committed.get("status") != "run":
        return {"status": "nothing committed", "verdict": "nothing to compare with"}
    committed_seeds = committed.get("per_seed_em", {})
    seeds = [str(s) for s in rerun["seeds"] if str(s) in committed_seeds]
    if not seeds:
        return {
            "status": "no common seed",
            "verdict": "nothing to compare with",
            "committed_seeds": sorted(committed_seeds, key=int),
        }
    questions = int(rerun["questions_per_seed"])
    rows = [
        {"seed": int(s), "committed_em": committed_seeds[s], "rerun_em": rerun["per_seed_em"][s]}
        for s in seeds
    ]
    before = sum(r["committed_em"] for r in rows) / len(rows)
    after = sum(r["rerun_em"] for r in rows) / len(rows)
    answers = questions * len(rows)  # on each side
    spread = Z95 * math.sqrt((before * (1 - before) + after * (1 - after)) / answers)
    difference = {"value": after - before, "low": after - before - spread, "high": after - before + spread}
    if all(math.isclose(r["committed_em"], r["rerun_em"], abs_tol=1e-9) for r in rows):
        verdict = "the same EM at every seed"
    elif difference["low"] <= 0 <= difference["high"]:
        verdict = "within the interval"
    else:
        verdict = "differs"
    return {
        "status": "compared",
        "seeds": [r["seed"] for r in rows],
        "questions_per_seed": questions,
        "per_seed": rows,
        "committed_em": before,
        "rerun_em": after,
        "difference": difference,
        "verdict": verdict,
    }


def mismatched_settings(committed_run: dict[str, Any], rerun_run: dict[str, Any]) -> list[str]:
    """The settings in which the re-run differs from the committed run (then its arms are not the same
    experiment and no comparison is made)."""
    return [key for key in COMPARED_SETTINGS if committed_run.get(key) != rerun_run.get(key)]


def check(
    committed: dict[str, Any],
    rerun_run: dict[str, Any],
    reruns: dict[str, dict[str, Any]],
    arms: dict[str, list[str]],
) -> dict[str, Any]:
    """The check document: for each finding key in ``arms`` and each of its re-run arm names, the
    comparison with ``committed`` (a findings.json document); ``reruns`` maps a finding key to the
    :func:`~rllib_search.recipes.findings.study.analyse` output of its re-run arms."""
    committed_run = committed.get("run", {})
    mismatch = mismatched_settings(committed_run, rerun_run)
    entries = []
    for finding in FINDINGS:
        analysis = committed.get("findings", {}).get(finding.key, {})
        budget = _budget(finding, analysis)
        for name in arms.get(finding.key, []):
            entry: dict[str, Any] = {
                "finding": finding.key,
                "title": finding.title,
                "arm": name,
                "committed_machine": analysis.get("machine"),  # None in older files: "not recorded"
            }
            rerun = reruns.get(finding.key, {}).get("arms", {}).get(name, {"status": "not yet run"})
            if rerun.get("status") != "run":
                entry.update(status="not run", verdict="the re-run has no results")
            elif mismatch:
                entry.update(status="other settings", verdict=f"not comparable: other {', '.join(mismatch)}")
            elif budget is not None and budget != rerun_run.get("max_turn_tokens", {}).get(finding.base):
                entry.update(status="other settings", verdict=f"not comparable: committed at {budget} tokens")
            else:
                entry.update(compare_arm(analysis.get("arms", {}).get(name, {}), rerun))
            entries.append(entry)
    return {
        "committed": {"generated": committed.get("generated"), "run": committed_run},
        "rerun": rerun_run,
        "arms": entries,
    }


def _budget(finding: Finding, analysis: dict[str, Any]) -> int | None:
    if analysis.get("status") not in ("run", "partly run"):
        return None
    return measured_turn_budget(finding, analysis)


def write_check(document: dict[str, Any], markdown: Path, json_path: Path) -> str:
    """Write the check as JSON and as a markdown table; returns the table."""
    rerun, entries = document["rerun"], document["arms"]
    machine = rerun.get("machine", {})
    committed_on = sorted(
        {machine_line(e["committed_machine"]) if e["committed_machine"] else "not recorded" for e in entries}
    )
    lines = [
        "# Findings checked by training arms again",
        "",
        f"- committed results: generated {document['committed'].get('generated', '—')}; measured on: "
        f"{'; '.join(committed_on) or '—'}",
        f"- re-run here: {machine_line(machine) if machine else '—'}; seeds {rerun.get('seeds')}, "
        f"{rerun.get('iterations')} iterations, {rerun.get('held_out_per_hop')} held-out questions per hop",
        "- difference: re-run minus committed pooled EM over the re-run seeds, 95% interval of two "
        "independent proportions (findings.json keeps each seed's EM, not its answers)",
        "",
        "| Finding | Arm | Seed: committed EM -> re-run EM | Pooled committed -> re-run | "
        "Difference [95% CI] | Verdict |",
        "|---|---|---|---|---|---|",
    ]
    for entry in entries:
        if entry.get("status") == "compared":
            seeds = "; ".join(
                f"{r['seed']}: {r['committed_em']:.3f} -> {r['rerun_em']:.3f}" for r in entry["per_seed"]
            )
            pooled = f"{entry['committed_em']:.3f} -> {entry['rerun_em']:.3f}"
            d = entry["difference"]
            difference = f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
        else:
            seeds = pooled = difference = "—"
        lines.append(
            f"| {entry['title']} | {entry['arm']} | {seeds} | {pooled} | {difference} | {entry['verdict']} |"
        )
    table = "\n".join(lines) + "\n"
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(table)
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    return table
