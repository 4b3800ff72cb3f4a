"""tuned_examples/main_job_seeds.py's own parts: the seed list, issue 13's verdict on a run's summary, the
pass rate's interval, when a seed's earlier run is reused, and a seed whose main job fails (recorded, the
sweep goes on, exit 1). Its run of a real main job and its resume are in test_tuned_examples.py (the main
job's end-to-end test goes through it)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import tuned_example

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return tuned_example("main_job_seeds")


def _summary(gain_2hop, interval_2hop, gain_1hop, interval_1hop):
    return {
        "rl_gain_2hop": gain_2hop,
        "rl_gain_2hop_interval": interval_2hop,
        "rl_gain_1hop": gain_1hop,
        "rl_gain_1hop_interval": interval_1hop,
    }


def test_seeds_parse_as_lists_and_ranges():
    seeds = _script()
    assert seeds.parse_seeds("0,13-15") == [0, 13, 14, 15]
    assert seeds.parse_seeds("3, 1-3") == [3, 1, 2]
    for bad in ("", "a", "5-3", "1-x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seeds.parse_seeds(bad)


def test_the_verdict_is_issue_13s_goal():
    verdict = _script().goal_verdict
    assert verdict(_summary(0.28, [0.16, 0.42], 0.0, [0.0, 0.0])) == (True, [])
    assert verdict(_summary(0.20, [0.06, 0.34], -0.04, [-0.12, 0.04])) == (True, [])  # 1-hop within
    meets, why = verdict(_summary(0.18, [0.06, 0.30], 0.0, [0.0, 0.0]))
    assert not meets and why == ["2-hop gain +0.18 is below +0.20"]
    meets, why = verdict(_summary(0.22, [0.0, 0.44], 0.0, [0.0, 0.0]))
    assert not meets and why == ["2-hop gain's interval starts at +0.00, not above 0"]
    meets, why = verdict(_summary(0.26, [0.12, 0.38], -0.26, [-0.38, -0.14]))
    assert not meets and why == ["1-hop fell -0.26, beyond its interval (upper end -0.14)"]


def test_the_pass_rate_interval_is_wilsons():
    wilson = _script().wilson_interval
    low, high = wilson(7, 12)
    assert low == pytest.approx(0.3195, abs=1e-3) and high == pytest.approx(0.8067, abs=1e-3)
    assert wilson(0, 12)[0] == 0.0 and wilson(12, 12)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def test_a_seed_whose_main_job_fails_is_recorded_and_the_sweep_exits_1(tmp_path):
    command = [sys.executable, str(ROOT / "tuned_examples" / "main_job_seeds.py")]
    command += ["--seeds", "4-5", "--out", str(tmp_path), "--", "--rl-recipe", "no-such-recipe"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    document = json.loads((tmp_path / "seeds.json").read_text())
    assert document["failed_seeds"] == [4, 5] and document["rows"] == [] and document["passes"] == 0
    assert "no-such-recipe" in (tmp_path / "seed_4" / "main_job.log").read_text()
    assert "the main job failed" in done.stdout and not (tmp_path / "seed_4" / "run.json").exists()
    refused = subprocess.run(
        [*command[:2], "--out", str(tmp_path), "--", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--seed is this sweep's to set" in refused.stderr


def test_a_seed_is_reused_only_under_the_same_flags_and_defaults(tmp_path):
    """A seed's earlier run is read back when it ran with the same flags under the main job's defaults of
    now; one recorded under another default (the search cost was 0.1 in stops 85-87), with other flags, for
    another seed or by a sweep that kept only the flags runs again."""
    seeds = _script()
    flags = ["--rl-iterations", "6"]
    (tmp_path / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    record = seeds.run_record(3, flags)
    settings = record["settings"]
    default_cost = seeds._main_job().build_parser().get_default("search_cost")
    assert settings["seed"] == 3 and settings["rl_iterations"] == 6
    assert settings["search_cost"] == default_cost
    assert "out" not in settings and settings["bf16"] is None  # the machine's precision is chosen later
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert seeds.earlier_run(3, tmp_path, flags) == {"seconds": 1.0}
    assert seeds.earlier_run(4, tmp_path, flags) is None
    assert seeds.earlier_run(3, tmp_path, ["--rl-iterations", "8"]) is None
    other_default = {**record, "settings": {**settings, "search_cost": default_cost + 0.1}}
    (tmp_path / "run.json").write_text(json.dumps(other_default))
    assert seeds.earlier_run(3, tmp_path, flags) is None
    (tmp_path / "run.json").write_text(json.dumps({"seed": 3, "flags": flags}))
    assert seeds.earlier_run(3, tmp_path, flags) is None
    refused = seeds.run_record(3, ["--rl-recipe", "no-such-recipe"])
    assert refused == {"seed": 3, "flags": ["--rl-recipe", "no-such-recipe"], "settings": None}


def test_a_row_keeps_the_stages_its_run_evaluated():
    """A run started from --warm-start evaluates no base model: its row has the two stages it has."""
    seeds = _script()
    stages = {"after warm start": {"1hop": 0.9, "2hop": 0.1}, "after RL": {"1hop": 0.9, "2hop": 0.4}}
    summary = {
        **_summary(0.30, [0.16, 0.44], 0.0, [-0.04, 0.04]),
        "em": stages,
        "searches_per_episode": {
            "after warm start": {"1hop": 1.0, "2hop": 1.2},
            "after RL": {"1hop": 1.0, "2hop": 1.7},
        },
        "rl_validation": {"kept_iteration": 6},
        "seconds": 812.5,
    }
    row = seeds.seed_row(7, summary)
    assert row["em"] == stages and row["searches_2hop"] == {"after warm start": 1.2, "after RL": 1.7}
    assert row["meets_goal"] and row["kept_iteration"] == 6 and row["kept_alpha"] == 1.0
    mixed = seeds.seed_row(9, {**summary, "rl_validation": {"kept_iteration": 6, "kept_alpha": 0.25}})
    assert seeds.kept_weights(row) == "6" and seeds.kept_weights(mixed) == "6 (0.25 x RL)"
    document = seeds.report([row], ["--calibration-turns", "2"], failed=[8])
    assert document["passes"] == 1 and document["failed_seeds"] == [8]
    assert document["mean_rl_gain_2hop"]["value"] == pytest.approx(0.30)
    table = seeds.markdown(document)
    assert "| 7 | 0.90 / 0.10 | 0.90 / 0.40 | +0.30 [+0.16, +0.44] |" in table
    assert "`--calibration-turns 2`" in table and "seeds [8]" in table
    assert "Machines (the seconds depend on them): not recorded (seeds 7)." in table  # an older summary


def test_rows_record_the_machine_their_run_measured():
    """A run's summary names its CPU (the seconds depend on it); the report groups seeds by machine."""
    from rllib_search.llm.models import cpu_description, describe_cpu

    seeds = _script()
    here = cpu_description()
    assert here["cores"] >= 1 and here["torch_threads"] >= 1 and isinstance(here["native_bf16"], bool)
    assert here["vector_unit"] and here["cpu"]
    other = {**here, "cpu": "Another CPU", "vector_unit": "AVX512", "native_bf16": True}
    other |= {"cpu_family": 6, "cpu_model": 143}  # recorded since stop 75
    other |= {"matmul_gflops_start": 66.2, "matmul_gflops_end": 33.4}  # measured since stop 71
    shared = {**other, "cpu_steal_share": 0.0041}  # since stop 75: the hypervisor's share of the run
    base = {
        **_summary(0.30, [0.16, 0.44], 0.0, [-0.04, 0.04]),
        "em": {"after warm start": {"1hop": 0.9, "2hop": 0.1}, "after RL": {"1hop": 0.9, "2hop": 0.4}},
        "searches_per_episode": {"after warm start": {"2hop": 1.2}, "after RL": {"2hop": 1.7}},
        "seconds": 812.5,
    }
    rows = [
        seeds.seed_row(seed, {**base, "machine": machine})
        for seed, machine in ((0, here), (1, other), (2, here), (3, shared))
    ]
    assert rows[1]["machine"] == other
    table = seeds.markdown(seeds.report(rows, []))
    assert f"{describe_cpu(here)} (seeds 0, 2); Another CPU (family 6 model 143), " in table
    assert "AVX512, bf16 native (seeds 1, 3)." in table
    # The seconds beside the machine's product speed at the run's start and end, where it was measured,
    # and the share of the run's CPU time the hypervisor took, where that was.
    assert "| 812 (66 -> 33 GFLOP/s) | meets |" in table and table.count("| 812 | meets |") == 2
    assert "| 812 (66 -> 33 GFLOP/s, 0.4% stolen) | meets |" in table


def _reading_row(iteration, correct, gain_2hop, gain_1hop, held_out=True):
    """One GRPO iteration's row as the main job writes it with --rl-validate-at and
    --rl-validation-held-out (gains as value, low, high)."""
    row = {"iteration": iteration, "validation": {"iteration": iteration, "correct": correct}}
    if held_out:
        gain = {
            "2hop": dict(zip(("value", "low", "high"), gain_2hop)),
            "1hop": dict(zip(("value", "low", "high"), gain_1hop)),
        }
        row["held_out"] = {"em_1hop": 0.9, "em_2hop": 0.4, "gain": gain}
    return row


def test_reading_schedules_are_scored_by_the_jobs_rule_on_the_runs_held_out_readings():
    """--score-readings: each schedule keeps what the job's rule (most right, latest on a tie) keeps among
    its readings, and is judged on that iteration's held-out gains; a run without a reading's held-out
    evaluation cannot tell."""
    seeds = _script()
    assert seeds.reading_schedule("8, 4,6") == (4, 6, 8)
    for bad in ("", "0,4", "4,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seeds.reading_schedule(bad)
    grpo = [
        {"iteration": 1},  # not read
        _reading_row(2, 25, (0.16, 0.04, 0.30), (0.0, 0.0, 0.0)),
        _reading_row(3, 27, (0.30, 0.16, 0.44), (-0.10, -0.20, -0.02)),
        _reading_row(4, 27, (0.36, 0.22, 0.50), (0.0, -0.04, 0.04)),
        _reading_row(5, 30, (0.50, 0.36, 0.64), (0.0, 0.0, 0.0), held_out=False),
    ]
    summary = {
        **_summary(0.36, [0.22, 0.50], 0.0, [-0.04, 0.04]),
        "em": {"after warm start": {"1hop": 0.9, "2hop": 0.1}, "after RL": {"1hop": 0.9, "2hop": 0.46}},
        "searches_per_episode": {"after warm start": {"2hop": 1.0}, "after RL": {"2hop": 1.8}},
        "rl_validation": {"kept_iteration": 4},
        "seconds": 600.0,
        "grpo": grpo,
    }
    outcome = seeds.scheduled_outcome
    assert outcome(summary, (2,))["kept_iteration"] == 2
    fails = outcome(summary, (2,))
    assert not fails["meets_goal"] and fails["why_not"] == ["2-hop gain +0.16 is below +0.20"]
    one_hop_loss = outcome(summary, (2, 3))  # 3 has more right answers: kept, and its 1-hop fell
    assert one_hop_loss["kept_iteration"] == 3 and not one_hop_loss["meets_goal"]
    assert one_hop_loss["rl_gain_1hop_interval"] == [-0.20, -0.02]
    tied = outcome(summary, (2, 3, 4))  # 3 and 4 tie: the latest
    assert tied["kept_iteration"] == 4 and tied["meets_goal"] and tied["rl_gain_2hop"] == 0.36
    assert outcome(summary, (1, 2)) is None and outcome(summary, (4, 5)) is None  # 1 unread; 5 no held-out
    assert outcome(summary, (6,)) is None  # the run stopped before
    # A run that read WiSE-FT mixes read them only at the iteration it kept: no other schedule is known.
    mixes = [{"alpha": 1.0, "correct": 27}, {"alpha": 0.25, "correct": 25}]
    read_mixes = {**summary, "rl_validation": {"kept_iteration": 4, "interpolations": mixes}}
    assert outcome(read_mixes, (2, 3, 4)) is None
    schedules = ((2,), (2, 3, 4), (4, 5))
    rows = [seeds.seed_row(seed, summary, schedules) for seed in (0, 1)]
    assert rows[0]["schedules"]["2,3,4"] == tied and rows[0]["schedules"]["4,5"] is None
    document = seeds.report(rows, ["--rl-validation-held-out"])
    totals = document["schedules"]
    assert totals["2"]["passes"] == 0
    assert totals["2,3,4"]["passes"] == 2 and totals["2,3,4"]["seeds"] == [0, 1]
    assert totals["4,5"] == {"seeds": [], "passes": 0, "pass_rate_interval": [0.0, 1.0]}
    assert totals["2,3,4"]["mean_rl_gain_2hop"]["value"] == pytest.approx(0.36)
    table = seeds.markdown(document)
    assert "| seed | `2` | `2,3,4` | `4,5` |" in table
    assert "| 0 | 2: +0.16 [+0.04, +0.30]; +0.00 [+0.00, +0.00] fails | 4: +0.36 [+0.22, +0.50]; " in table
    assert "+0.00 [-0.04, +0.04] **meets** | not read |" in table
    assert "- `2,3,4`: meets the goal on 2 of 2 seeds (pass rate 95% Wilson interval [0.34, 1.00]" in table
    assert "- `4,5`: meets the goal on 0 of 0 seeds." in table
    assert "Reading schedules" not in seeds.markdown(seeds.report([seeds.seed_row(0, summary)], []))
