"""benchmarks/main_job_seeds.py's own parts: the seed list, the main job's goal as a verdict on a run's
summary, the pass rate's interval, when a seed's earlier run is reused, the report, and a seed whose main
job fails (recorded, the sweep goes on, exit 1, the totals as the last line). Its run of a real main job and
its resume are in test_tuned_examples.py (the main job's end-to-end test goes through it)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import main_job_seeds

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return main_job_seeds


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


def test_the_verdict_is_the_main_jobs_goal():
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
    command = [sys.executable, str(ROOT / "benchmarks" / "main_job_seeds.py")]
    command += ["--seeds", "4-5", "--out", str(tmp_path), "--", "--no-such-flag", "no-such-value"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    document = json.loads((tmp_path / "seeds.json").read_text())
    assert document["failed_seeds"] == [4, 5] and document["rows"] == [] and document["passes"] == 0
    assert "--no-such-flag" in (tmp_path / "seed_4" / "main_job.log").read_text()
    assert "the main job failed" in done.stdout and not (tmp_path / "seed_4" / "run.json").exists()
    last = json.loads(done.stdout.splitlines()[-1])
    assert {k: last.pop(k) is not None for k in ("commit", "machine")} == {"commit": True, "machine": True}
    assert last == {
        "seeds": [],
        "passes": 0,
        "pass_rate_interval": [0.0, 1.0],
        "mean_rl_gain_2hop": None,
        "failed_seeds": [4, 5],
    }
    refused = subprocess.run(
        [*command[:2], "--out", str(tmp_path), "--", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--seed is this sweep's to set" in refused.stderr


def test_a_seed_is_reused_only_under_the_same_flags_and_defaults(tmp_path):
    """A seed's earlier run is read back when it ran with the same flags under the main job's defaults of
    now; one recorded under another default (here the KL coefficient), with other flags, for another seed or
    by a sweep that kept only the flags runs again."""
    seeds = _script()
    flags = ["--rl-iterations", "6"]
    (tmp_path / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    record = seeds.run_record(3, flags)
    settings = record["settings"]
    default_kl = seeds._main_job().build_parser().get_default("kl_coeff")
    assert settings["seed"] == 3 and settings["rl_iterations"] == 6
    assert settings["kl_coeff"] == default_kl
    assert "out" not in settings and settings["bf16"] is None  # the machine's precision is chosen later
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert seeds.earlier_run(3, tmp_path, flags) == {"seconds": 1.0}
    assert seeds.earlier_run(4, tmp_path, flags) is None
    assert seeds.earlier_run(3, tmp_path, ["--rl-iterations", "8"]) is None
    other_default = {**record, "settings": {**settings, "kl_coeff": default_kl * 2}}
    (tmp_path / "run.json").write_text(json.dumps(other_default))
    assert seeds.earlier_run(3, tmp_path, flags) is None
    (tmp_path / "run.json").write_text(json.dumps({"seed": 3, "flags": flags}))
    assert seeds.earlier_run(3, tmp_path, flags) is None
    refused = seeds.run_record(3, ["--no-such-flag", "no-such-value"])
    assert refused == {"seed": 3, "flags": ["--no-such-flag", "no-such-value"], "settings": None}


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
    document = seeds.report([row], ["--rl-iterations", "12"], failed=[8])
    assert document["passes"] == 1 and document["failed_seeds"] == [8]
    assert document["mean_rl_gain_2hop"]["value"] == pytest.approx(0.30)
    table = seeds.markdown(document)
    assert "| 7 | 0.90 / 0.10 | 0.90 / 0.40 | +0.30 [+0.16, +0.44] |" in table
    assert "`--rl-iterations 12`" in table and "seeds [8]" in table
    assert "Written by `benchmarks/main_job_seeds.py`." in table and "schedules" not in document
    assert seeds.totals(document) == {
        "seeds": [7],
        "passes": 1,
        "pass_rate_interval": document["pass_rate_interval"],
        "mean_rl_gain_2hop": document["mean_rl_gain_2hop"],
        "failed_seeds": [8],
    }
    assert "Machines (the seconds depend on them): not recorded (seeds 7)." in table  # no machine recorded


def test_rows_record_the_machine_their_run_measured():
    """A run's summary names its CPU (the seconds depend on it); the report groups seeds by machine."""
    from rllib_search.llm.models import cpu_description, describe_cpu

    seeds = _script()
    here = cpu_description()
    assert here["cores"] >= 1 and here["torch_threads"] >= 1 and isinstance(here["native_bf16"], bool)
    assert here["vector_unit"] and here["cpu"]
    other = {**here, "cpu": "Another CPU", "vector_unit": "AVX512", "native_bf16": True}
    other |= {"cpu_family": 6, "cpu_model": 143}
    other |= {"matmul_gflops_start": 66.2, "matmul_gflops_end": 33.4}  # the product speed at start and end
    shared = {**other, "cpu_steal_share": 0.0041}  # the hypervisor's share of the run's CPU time
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
