"""tuned_examples/findings.py end to end (--smoke, a tiny policy): one finding's two arms with two seeds each
as Tune experiments, findings.json with intervals from the trials' per-question answers, the markdown table
with "not yet run" rows, the learning-curve PNG, finished trials without their checkpoints, and a second run
that resumes instead of retraining; plus the study's pure parts (verdicts, the algorithm arms' budget)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.recipes import search_r1_grpo
from rllib_search.recipes.findings import study
from rllib_search.recipes.tiny_cpu.answer_cache import weights_digest
from tests.helpers import tuned_example

ROOT = Path(__file__).resolve().parents[1]


def test_the_verdict_follows_the_interval_and_the_papers_sign():
    assert study.reproduced(1, 0.01, 0.2) == "yes"
    assert study.reproduced(1, -0.2, -0.01) == "no"
    assert study.reproduced(1, -0.1, 0.1).startswith("inconclusive")
    assert study.reproduced(0, -0.1, 0.1) == "yes" and study.reproduced(0, 0.05, 0.1) == "no"
    assert study.reproduced(None, 0.1, 0.2) == "no claim"
    assert study.select(["evidence", "masking"]) == [study.BY_KEY["masking"], study.BY_KEY["evidence"]]
    with pytest.raises(ValueError):
        study.select(["nope"])


def test_the_algorithm_arms_get_the_same_budget():
    from rllib_search.recipes import search_r1_grpo

    base = search_r1_grpo(dataset=None, scale="cpu")
    context: dict = {}
    configs = {arm.name: study.arm_config(base, arm, context) for arm in study.BY_KEY["algorithms"].arms}
    episodes = {name: c.group_size * c.prompts_per_sample for name, c in configs.items()}
    assert len(set(episodes.values())) == 1, episodes
    estimators = {name: c.advantage_estimator for name, c in configs.items()}
    assert estimators == {
        "GRPO": "grpo",
        "PPO": "gae",
        "REINFORCE++ (no baseline)": "reinforce_pp",
        "REINFORCE++-baseline": "reinforce_pp_baseline",
    }
    assert len({(c.lr, c.minibatch_size, c.kl_coeff) for c in configs.values()}) == 1
    assert configs["PPO"].model_config["value_head"] and configs["PPO"].group_size == 1
    masking = {arm.name: study.arm_config(base, arm, context) for arm in study.BY_KEY["masking"].arms}
    assert masking["masking on"].mask_retrieved_tokens and not masking["masking off"].mask_retrieved_tokens
    assert base.mask_retrieved_tokens  # the base is untouched


@pytest.mark.slow
def test_the_findings_smoke_run_reports_intervals_and_resumes(tmp_path, capsys, monkeypatch):
    from rllib_search.algos.evaluation.scores import score_predictions

    model = str(build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok")))
    out = tmp_path / "findings"
    argv = [sys.executable, str(ROOT / "tuned_examples" / "findings.py")]
    argv += ["--smoke", "--findings", "masking", "--seeds", "0,1", "--model", model, "--out", str(out)]
    argv += ["--num-cpus", "2"]
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    def run(*extra: str) -> str:
        command = [*argv, *extra]
        done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    runner = _findings_script()

    def in_process(*arguments: str) -> str:
        capsys.readouterr()
        assert runner.main(list(arguments)) == 0
        return capsys.readouterr().out

    run()
    # Finished trials keep their results, not their checkpoints (the study's disk is its trials in flight).
    assert list((out / "tune").glob("*/*/result.json")) and not list((out / "tune").glob("*/*/checkpoint_*"))
    # Each arm's experiment is named with the turn budget it trained at (the smoke's 32 tokens).
    assert sorted(p.name for p in (out / "tune").iterdir()) == [
        "masking__masking_off__32_tokens",
        "masking__masking_on__32_tokens",
    ]
    document = json.loads((out / "findings.json").read_text())
    assert document["run"]["scale"] == "smoke" and document["run"]["seeds"] == [0, 1]
    masking = document["findings"]["masking"]
    assert masking["status"] == "run"
    assert all(f["status"] == "not yet run" for k, f in document["findings"].items() if k != "masking")
    per_hop = document["run"]["held_out_per_hop"]
    for name in ("masking on", "masking off"):
        arm = masking["arms"][name]
        assert arm["seeds"] == [0, 1] and arm["iterations"] == 1
        assert arm["scores"]["groups"].keys() == {"1", "2"}
        assert all(group["n"] == 2 * per_hop for group in arm["scores"]["groups"].values())
        em = arm["em"]
        assert em["low"] <= em["value"] <= em["high"]
        # The arm's EM and interval are those of its trials' per-question answers, pooled over seeds.
        rows = []
        for result_file in sorted(
            (
                out
                / "tune"
                / study.experiment_name(study.BY_KEY["masking"], study.BY_KEY["masking"].arm(name), 32)
            ).glob("*/result.json")
        ):
            last = json.loads(result_file.read_text().strip().splitlines()[-1])
            rows += json.loads(last["evaluation_answers"])
        assert len(rows) == 2 * 2 * per_hop
        scores = score_predictions(
            [r["answer"] for r in rows], [r["golden_answers"] for r in rows], [r["hops"] for r in rows]
        )
        # Each seed answers the same questions, so the mean of seed EMs is the pooled EM; its interval
        # resamples seeds, then questions.
        assert em["value"] == pytest.approx(scores.pooled["em"].value)
        assert arm["em_by_hop"].keys() == {"1", "2"} and "gain_over_warm_start" in arm
    assert masking["intervals"] == study.SEED_AWARE
    warm = masking["warm_start_eval"]
    assert (
        len(warm["answers"]) == 2 * per_hop and warm["em"]["low"] <= warm["em"]["value"] <= warm["em"]["high"]
    )
    (comparison,) = masking["comparisons"]
    assert comparison["arm"] == "masking on" and comparison["versus"] == "masking off"
    assert comparison["pairs"] == 2 * 2 * per_hop and comparison["expected"] == 1
    gain = comparison["em_gain"]
    assert gain["low"] <= gain["value"] <= gain["high"]
    assert comparison["power"]["seeds"] == 2 and comparison["power"]["effect"] == pytest.approx(0.158)
    assert comparison["power"]["detectable"] >= 0
    assert comparison["reproduced"] in ("yes", "no", "inconclusive (interval covers 0)")
    if comparison["reproduced"] != "yes":
        assert comparison["reason"]

    table = (out / "findings.md").read_text()
    assert "| Retrieved-token masking | masking on |" in table and "| masking off |" in table
    assert "| Retrieved-token masking | warm start (no RL) |" in table and "## Power" in table
    assert "2 seeds detect a difference of" in table and "the paper reports +0.158" in table
    assert "| Retriever quality | BM25 | not yet run |" in table and "seeds [0, 1]" in table
    assert "![Retrieved-token masking](findings/masking.png)" in table
    assert table.count("1-hop ") >= 2 and table.count("2-hop ") >= 2  # each arm's EM per hop count
    assert (out / "findings" / "masking.png").stat().st_size > 0
    # Search-R1's format check per iteration: a share of the iteration's episodes, plotted beside the EM.
    for figures_of_arm in masking["arms"].values():
        for seed_curve in figures_of_arm["format_curves"].values():
            assert len(seed_curve) == figures_of_arm["iterations"]
            assert all(0.0 <= share <= 1.0 for share in seed_curve)
    assert "![Retrieved-token masking: well-formed](findings/masking_format.png)" in table
    assert (out / "findings" / "masking_format.png").stat().st_size > 0
    # The collapse monitors per iteration, from each trial's results, plotted arm beside arm.
    for figures_of_arm in masking["arms"].values():
        assert figures_of_arm["monitor_curves"].keys() == {"0", "1"}
        for per_monitor in figures_of_arm["monitor_curves"].values():
            assert {"entropy", "response_tokens", "searches", "valid_actions", "reward"} <= per_monitor.keys()
            assert all(len(curve) == figures_of_arm["iterations"] for curve in per_monitor.values())
    assert "![Retrieved-token masking: collapse monitors](findings/masking_monitors.png)" in table
    assert (out / "findings" / "masking_monitors.png").stat().st_size > 0

    # Run again (reporting elsewhere, so the first report carries nothing over): the warm start and both
    # arms' Tune experiments are restored, not retrained.
    stdout = run("--json", str(tmp_path / "again.json"), "--markdown", str(tmp_path / "again.md"))
    assert "warm start: reusing" in stdout and stdout.count("resuming the arm") == 2
    assert "evaluating its warm start" not in stdout  # its answers are kept under --out
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["findings"]["masking"]["arms"] == masking["arms"]

    # And again with the first report: the finding it holds with the same settings is kept, not restored.
    stdout = run()
    assert "every arm's results are in" in stdout and "resuming the arm" not in stdout

    # The findings record where they ran: the CPU, its threads, fp32 and torch.
    assert masking["machine"]["precision"] == "fp32" and masking["machine"]["cores"] >= 1
    assert "torch" in masking["machine"] and document["run"]["machine"] == masking["machine"]
    assert f"fp32, torch {masking['machine']['torch']} (Retrieved-token masking)" in table

    # --check trains one arm again, seed 0 only, elsewhere, and sets it beside the committed results seed by
    # seed, leaving the committed report as it was: on one machine seeded training gives the same answers.
    committed = (out / "findings.json").read_text()
    check = tmp_path / "check"
    # The warm start is the first run's, copied (making it again is the first run's test): the arm is trained.
    for warm in ("warm_start_search_r1_1_steps", "warm_start_eval"):
        shutil.copytree(out / warm, check / warm)
    stdout = run(
        "--check",
        "--arms",
        "Masking On",
        "--seeds",
        "0",
        "--out",
        str(check),
        "--json",
        str(out / "findings.json"),
    )
    assert (out / "findings.json").read_text() == committed
    checked = json.loads((check / "check.json").read_text())
    (entry,) = checked["arms"]
    assert entry["finding"] == "masking" and entry["arm"] == "masking on" and entry["status"] == "compared"
    (row,) = entry["per_seed"]
    assert row["seed"] == 0 and row["committed_em"] == masking["arms"]["masking on"]["per_seed_em"]["0"]
    assert entry["verdict"] == "the same EM at every seed" and row["rerun_em"] == row["committed_em"]
    assert sorted(p.name for p in (check / "tune").iterdir()) == ["masking__masking_on__32_tokens"]
    assert "| Retrieved-token masking | masking on | 0: " in stdout and (check / "check.md").exists()

    # Another machine (the study spans sessions; Tune results do not travel): with nothing under a fresh
    # --out, the report is rewritten from the committed findings.json, its finished findings kept. The
    # report-only runs start no Ray and train nothing, so they run in this process (a start-up each less).
    elsewhere = tmp_path / "elsewhere"
    in_process("--smoke", "--report-only", "--out", str(elsewhere), "--json", str(out / "findings.json"))
    moved = json.loads((out / "findings.json").read_text())
    assert moved["run"] == again["run"] and moved["findings"]["masking"] == again["findings"]["masking"]
    table = (elsewhere / "findings.md").read_text()
    assert "| masking on |" in table and "| masking on | not yet run |" not in table
    # --report-only with a relative --out reads the Tune results back (they need an absolute path).
    with monkeypatch.context() as inside:
        inside.chdir(out.parent)
        in_process("--smoke", "--report-only", "--out", out.name, "--json", str(tmp_path / "relative.json"))
    relative = json.loads((tmp_path / "relative.json").read_text())
    assert relative["findings"]["masking"]["arms"] == masking["arms"]
    # The same experiments under another budget's names (an earlier recipe's runs left in --out) are not
    # this run's arms: the report leaves the finding not yet run rather than stamp them with this budget.
    other = tmp_path / "other"
    (other / "tune").mkdir(parents=True)
    (other / "run.json").write_text((out / "run.json").read_text())
    for experiment in (out / "tune").iterdir():
        shutil.copytree(experiment, other / "tune" / experiment.name.replace("__32_tokens", "__48_tokens"))
    in_process("--smoke", "--report-only", "--out", str(other), "--json", str(tmp_path / "other.json"))
    assert json.loads((tmp_path / "other.json").read_text())["findings"]["masking"]["status"] == "not yet run"
    # Arm by arm across sessions: another --out holds only the "masking on" experiment (and the same warm
    # start); the results file holds "masking off"'s trials. The report analyses them together.
    partial = tmp_path / "partial"
    (partial / "tune").mkdir(parents=True)
    (partial / "run.json").write_text((out / "run.json").read_text())
    shutil.copytree(out / "warm_start_eval", partial / "warm_start_eval")
    on_name = study.experiment_name(study.BY_KEY["masking"], study.BY_KEY["masking"].arm("masking on"), 32)
    shutil.copytree(out / "tune" / on_name, partial / "tune" / on_name)
    half = json.loads((out / "findings.json").read_text())
    half["findings"]["masking"]["arms"]["masking on"] = {"status": "not yet run"}
    (tmp_path / "half.json").write_text(json.dumps(half))
    in_process("--smoke", "--report-only", "--out", str(partial), "--json", str(tmp_path / "half.json"))
    merged = json.loads((tmp_path / "half.json").read_text())["findings"]["masking"]
    assert merged["status"] == "run" and merged["comparisons"][0]["em_gain"] == comparison["em_gain"]
    assert merged["arms"]["masking off"]["trials"] == masking["arms"]["masking off"]["trials"]
    # A run with other settings carries nothing over (its arms are not the same experiment).
    assert runner.carried_over(out / "findings.json", moved["run"]).keys() == {"masking"}
    assert runner.carried_over(out / "findings.json", {**moved["run"], "iterations": 2}) == {}
    # Each finding records the turn budget it was measured at (the smoke's 32). A file without it was
    # measured at study.EARLIER_TURN_BUDGETS: its findings carry over with those, and a run whose recipe has
    # another budget trains them again.
    assert moved["run"]["max_turn_tokens"] == {"search_r1": 32, "r_search": 32}
    assert moved["findings"]["masking"]["max_turn_tokens"] == 32
    assert "measured at: 32 (Retrieved-token masking)" in table
    earlier = tmp_path / "earlier.json"
    unstamped = {k: v for k, v in moved["findings"]["masking"].items() if k != "max_turn_tokens"}
    earlier.write_text(json.dumps({**moved, "findings": {**moved["findings"], "masking": unstamped}}))
    carried = runner.carried_over(earlier, moved["run"])
    assert carried["masking"]["max_turn_tokens"] == 48
    (masking_finding,) = study.select(["masking"])
    assert runner.to_run([masking_finding], carried, moved["run"], fresh=False) == [masking_finding]
    assert (
        runner.to_run(
            [masking_finding],
            runner.carried_over(out / "findings.json", moved["run"]),
            moved["run"],
            fresh=False,
        )
        == []
    )


def test_a_rerun_arm_is_compared_with_the_committed_one_seed_by_seed():
    from rllib_search.recipes.findings import check as findings_check

    committed = {"status": "run", "per_seed_em": {"0": 0.40, "1": 0.30, "2": 0.50}}

    def rerun(**per_seed):
        return {
            "status": "run",
            "seeds": [int(s[1:]) for s in per_seed],
            "questions_per_seed": 100,
            "per_seed_em": {s[1:]: em for s, em in per_seed.items()},
        }

    same = findings_check.compare_arm(committed, rerun(s0=0.40, s2=0.50))
    assert same["verdict"] == "the same EM at every seed" and same["seeds"] == [0, 2]
    assert same["committed_em"] == pytest.approx(0.45) and same["difference"]["value"] == pytest.approx(0.0)
    near = findings_check.compare_arm(committed, rerun(s0=0.36))
    assert near["verdict"] == "within the interval" and near["difference"]["value"] == pytest.approx(-0.04)
    # 0.40 against 0.20 over 100 answers each: 1.96 x sqrt((0.24 + 0.16) / 100) = 0.124 either side.
    far = findings_check.compare_arm(committed, rerun(s0=0.20))
    assert far["verdict"] == "differs"
    assert far["difference"]["high"] == pytest.approx(-0.20 + 0.124, abs=1e-3)
    assert findings_check.compare_arm(committed, rerun(s5=0.4))["status"] == "no common seed"
    assert (
        findings_check.compare_arm({"status": "not yet run"}, rerun(s0=0.4))["status"] == "nothing committed"
    )
    # Other settings are another experiment: no comparison.
    settings = {
        "scale": "embedded",
        "model": "m",
        "world_seed": 0,
        "iterations": 10,
        "held_out_per_hop": 50,
        "hops": [1, 2],
        "warm_start_steps": 8,
        "weak_warm_start_steps": 3,
        "max_turn_tokens": {"search_r1": 64, "r_search": 128},
    }
    document = {
        "run": settings,
        "findings": {"masking": {"status": "run", "max_turn_tokens": 64, "arms": {"masking on": committed}}},
    }
    arms = {"masking": ["masking on"]}
    reruns = {"masking": {"arms": {"masking on": rerun(s0=0.40)}}}
    (entry,) = findings_check.check(document, settings, reruns, arms)["arms"]
    assert entry["verdict"] == "the same EM at every seed"
    (entry,) = findings_check.check(document, {**settings, "iterations": 2}, reruns, arms)["arms"]
    assert entry["status"] == "other settings" and "iterations" in entry["verdict"]
    other_budget = {**settings, "max_turn_tokens": {"search_r1": 48, "r_search": 128}}
    (entry,) = findings_check.check(document, other_budget, reruns, arms)["arms"]
    assert entry["verdict"] == "not comparable: committed at 64 tokens"


def test_arms_are_chosen_by_name_within_the_selected_findings():
    runner = _findings_script()
    masking, retrievers = study.select(["masking", "retrievers"])
    assert runner.chosen_arms([masking], None) == {"masking": ["masking off", "masking on"]}
    chosen = runner.chosen_arms([masking, retrievers], ["masking ON", "dense (MiniLM, Flat)"])
    assert chosen == {"masking": ["masking on"], "retrievers": ["dense (MiniLM, Flat)"]}
    with pytest.raises(ValueError, match="masking off"):
        runner.chosen_arms([masking], ["masking sideways"])


def test_each_finding_says_the_turn_budget_it_was_measured_at():
    masking, evidence = study.BY_KEY["masking"], study.BY_KEY["evidence"]
    assert study.measured_turn_budget(masking, {}) == 48 and study.measured_turn_budget(evidence, {}) == 64
    assert study.measured_turn_budget(evidence, {"max_turn_tokens": 128}) == 128
    results = {"evidence": {"max_turn_tokens": 128}, "algorithms": {"max_turn_tokens": 64}, "masking": {}}
    assert study.turn_budgets_text(results) == (
        "48 (Retrieved-token masking); 64 (RL algorithm); 128 (R-Search evidence reward)"
    )
    assert study.turn_budgets_text({}) == "—"
    # An arm's Tune experiment is named with its budget: one trained at another is another experiment.
    on = masking.arm("masking on")
    assert study.experiment_name(masking, on, 64) == "masking__masking_on__64_tokens"
    assert study.experiment_name(masking, on, 48) != study.experiment_name(masking, on, 64)


def test_trials_carry_over_arm_by_arm_only_from_the_same_budget_judge_and_warm_start():
    runner = _findings_script()
    evidence = study.BY_KEY["evidence"]
    answers = [{"uid": "q1", "answer": "Vorvaux", "golden_answers": ["Vorvaux"], "hops": 1}]
    trial = {"seed": 0, "iterations": 2, "held_out_em": 1.0, "answers": answers, "curve": [0.5, 1.0]}
    analysis = study.analyse(evidence, {"evidence reward off": [trial]}, warm_start=answers)
    assert analysis["status"] == "partly run" and analysis["arms"]["evidence reward off"]["trials"] == [trial]
    run = {"max_turn_tokens": {"search_r1": 48, "r_search": 128}, "judge": runner.JUDGE}
    carried = {"evidence": {**analysis, "max_turn_tokens": 128, "judge": runner.JUDGE}}
    assert runner.reusable_trials(evidence, carried, run, answers) == {"evidence reward off": [trial]}
    assert runner.reusable_trials(evidence, carried, run, None) == {"evidence reward off": [trial]}
    other_warm_start = [{**answers[0], "answer": "Luebrisk"}]
    assert runner.reusable_trials(evidence, carried, run, other_warm_start) == {}
    assert runner.reusable_trials(evidence, carried, {**run, "judge": None}, answers) == {}
    other_budget = {**run, "max_turn_tokens": {"search_r1": 48, "r_search": 64}}
    assert runner.reusable_trials(evidence, carried, other_budget, answers) == {}
    # Arms analysed before trials were recorded cannot be analysed again.
    bare = {name: {k: v for k, v in arm.items() if k != "trials"} for name, arm in analysis["arms"].items()}
    assert study.carried_trials({**analysis, "arms": bare}) == {}


def test_a_main_warm_start_is_the_same_setting_from_any_folder():
    base = {key: None for key in study.RUN_SETTINGS}
    here = {
        **base,
        "main_warm_start": {"model": "/tmp/a/warm_start_model", "weights_sha256": "ab", "topk": 2},
    }
    there = {
        **base,
        "main_warm_start": {"model": "/work/b/warm_start_model", "weights_sha256": "ab", "topk": 2},
    }
    assert study.same_run_settings(here, there)
    other = {**there, "main_warm_start": {**there["main_warm_start"], "weights_sha256": "cd"}}
    assert not study.same_run_settings(here, other) and study.same_run_settings(base, dict(base))


def test_a_finding_that_serves_a_judge_runs_one_trial_at_a_time_unless_asked():
    runner = _findings_script()
    masking, evidence = study.BY_KEY["masking"], study.BY_KEY["evidence"]
    assert runner.trials_at_once(evidence, None) == 1 and runner.trials_at_once(masking, None) is None
    assert runner.trials_at_once(evidence, 2) == 2 and runner.trials_at_once(masking, 3) == 3


def test_a_finding_measured_with_another_judge_is_trained_again():
    """The evidence finding carried over from a run with another judge (or none recorded) is trained again;
    findings that need no judge are kept whatever the judge."""
    runner = _findings_script()
    masking, evidence = study.BY_KEY["masking"], study.BY_KEY["evidence"]
    run = {"max_turn_tokens": {"search_r1": 48, "r_search": 128}, "judge": runner.JUDGE}
    measured = {"status": "run", "max_turn_tokens": 128}
    carried = {"masking": {"status": "run", "max_turn_tokens": 48}, "evidence": {**measured}}
    assert runner.to_run([masking, evidence], carried, run, fresh=False) == [evidence]
    carried["evidence"]["judge"] = {**runner.JUDGE, "examples": 0}
    assert runner.to_run([masking, evidence], carried, run, fresh=False) == [evidence]
    carried["evidence"]["judge"] = dict(runner.JUDGE)
    assert runner.to_run([masking, evidence], carried, run, fresh=False) == []


def test_the_committed_report_is_what_the_code_writes_from_the_committed_results(tmp_path):
    """docs/findings.md is the report this module writes from docs/findings/findings.json and the re-checks
    beside it (only the generation time differs): its labels are the code's, not the run's."""
    committed = ROOT / "docs" / "findings"
    (tmp_path / "findings").mkdir()
    for document in committed.glob("*.json"):
        shutil.copy(document, tmp_path / "findings" / document.name)
    results_file = tmp_path / "findings" / "findings.json"
    run = json.loads(results_file.read_text())["run"]
    study.report(
        run, _findings_script().carried_over(results_file, run), tmp_path / "findings.md", results_file
    )

    def body(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if not line.startswith("- generated: ")]

    assert body(tmp_path / "findings.md") == body(ROOT / "docs" / "findings.md")


def test_labels_are_applied_again_to_stored_results_and_measurements_kept():
    algorithms = study.BY_KEY["algorithms"]
    figures = {"status": "run", "em": {"value": 0.3, "low": 0.25, "high": 0.35}}
    gain = {"value": -0.14, "low": -0.19, "high": -0.09}
    stored = {  # as an earlier version labelled it: "no difference" claimed, so "no"
        "status": "run",
        "arms": {"GRPO": figures, "PPO": figures, "REINFORCE++ (old name)": figures},
        "comparisons": [
            {
                "arm": "PPO",
                "versus": "GRPO",
                "status": "run",
                "expected": 0,
                "reproduced": "no",
                "pairs": 300,
                "em_gain": gain,
                "gain": {"pooled": {}},
                "direction": "similar final EM",
            },
        ],
    }
    relabelled = study.relabel(algorithms, stored)
    ppo, published, baseline = relabelled["comparisons"]
    # Search-R1 Table 3: GRPO ahead of PPO on evaluation, so PPO minus GRPO below 0 reproduces it.
    assert (ppo["expected"], ppo["reproduced"], ppo["em_gain"], ppo["pairs"]) == (-1, "yes", gain, 300)
    assert ppo["source"] == "Search-R1 section 5.1, Table 3" and "GRPO ahead" in ppo["direction"]
    assert "note" in ppo and "reason" not in ppo
    # R1-Searcher section 4.1 compares GRPO with REINFORCE++ as published (no baseline).
    assert published["arm"] == "REINFORCE++ (no baseline)" and published["expected"] == 1
    assert published["reproduced"] == "not yet run" and "58.4 vs 53.0" in published["direction"]
    assert baseline["arm"] == "REINFORCE++-baseline" and baseline["expected"] is None
    assert relabelled["status"] == "partly run"
    assert list(relabelled["arms"]) == ["GRPO", "PPO", "REINFORCE++ (no baseline)", "REINFORCE++-baseline"]
    assert relabelled["arms"]["REINFORCE++-baseline"] == {"status": "not yet run"}
    # An interval that covers 0 is inconclusive against a sign, whatever the stored verdict said.
    covering = {**stored["comparisons"][0], "em_gain": {"value": -0.01, "low": -0.05, "high": 0.03}}
    (ppo, *_) = study.relabel(algorithms, {**stored, "comparisons": [covering]})["comparisons"]
    assert ppo["reproduced"].startswith("inconclusive") and ppo["reason"].startswith("300 paired")


def test_the_evidence_term_is_described_with_the_weight_the_reward_gives_it():
    from rllib_search.env.rewards import ResponseSummary, r_search_reward

    reason = study.BY_KEY["evidence"].reason
    assert "0.2 x" not in reason and "weight 1" in reason
    summary = ResponseSummary(
        question="q",
        answer="x",
        evidence="quoted",
        num_searches=1,
        retrieved_blocks=(),
        format_valid=True,
        evidence_answer="paris",
    )
    breakdown = r_search_reward(summary, ["Paris"])
    assert breakdown.components["evidence_f1"] == 1.0
    assert breakdown.total == pytest.approx(
        breakdown.components["answer_f1"] + 1.0 + breakdown.components["format"]
    )


def test_a_recheck_that_differs_is_reported_beside_the_verdict(tmp_path):
    masking = study.BY_KEY["masking"]
    arm = {
        "status": "run",
        "seeds": [1],
        "em": {"value": 0.3, "low": 0.2, "high": 0.4},
        "scores": {"groups": {"1": {"em": {"value": 0.6}}}},
        "curves": {"1": [0.2, 0.3]},
    }
    analysis = {
        "status": "run",
        "arms": {"masking off": arm, "masking on": arm},
        "comparisons": [
            {
                "arm": "masking on",
                "versus": "masking off",
                "status": "run",
                "pairs": 100,
                "em_gain": {"value": 0.0, "low": -0.05, "high": 0.05},
                "gain": {},
            },
        ],
    }
    (tmp_path / "findings").mkdir()
    results_file = tmp_path / "findings" / "findings.json"
    markdown = tmp_path / "findings.md"
    study.report({"seeds": [1]}, {"masking": analysis}, markdown, results_file)
    assert "re-checked" not in markdown.read_text()  # no check file, no re-check
    check = {
        "committed": {"run": {"seeds": [1]}},  # the run the report holds
        "rerun": {
            "machine": {
                "cpu": "Some CPU",
                "cores": 2,
                "torch_threads": 2,
                "vector_unit": "AVX2",
                "native_bf16": False,
                "precision": "fp32",
                "torch": "2",
            }
        },
        "arms": [
            {
                "finding": "masking",
                "title": masking.title,
                "arm": "masking on",
                "status": "compared",
                "per_seed": [{"seed": 1, "committed_em": 0.0, "rerun_em": 0.39}],
                "committed_em": 0.0,
                "rerun_em": 0.39,
                "difference": {"value": 0.39, "low": 0.3, "high": 0.48},
                "verdict": "differs",
            },
            {
                "finding": "masking",
                "title": masking.title,
                "arm": "masking off",
                "status": "not run",
                "verdict": "the re-run has no results",
            },
        ],
    }
    (tmp_path / "findings" / "check.json").write_text(json.dumps(check))
    study.report({"seeds": [1]}, {"masking": analysis}, markdown, results_file)
    table = markdown.read_text()
    assert "| inconclusive (interval covers 0); re-checked on another machine: masking on differs |" in table
    assert "## Re-checks on another machine" in table
    assert "- **Retrieved-token masking, masking on** (`findings/check.json`, on Some CPU" in table
    assert "seed 1: 0.000 -> 0.390; pooled 0.000 -> 0.390, +0.390 [+0.300, +0.480]: differs." in table
    assert "masking off** (`findings" not in table  # an arm the re-check did not compare is not listed
    # A re-check of another run's results (here another world) does not bear on this report's verdicts.
    check["committed"]["run"] = {"seeds": [1], "world_seed": 7}
    (tmp_path / "findings" / "check.json").write_text(json.dumps(check))
    study.report({"seeds": [1]}, {"masking": analysis}, markdown, results_file)
    assert "re-checked" not in markdown.read_text()


def _findings_script():
    return tuned_example("findings")


def test_the_main_job_warm_start_is_read_and_checked_against_the_world(tmp_path):
    runner = _findings_script()
    with pytest.raises(ValueError, match="not a main job's output"):
        runner.read_main_warm_start(str(tmp_path), 1000)
    (tmp_path / "warm_start_model").mkdir()
    (tmp_path / "warm_start_model" / "config.json").write_text("{}")
    settings = {"world_seed": 1000, "protocol": "search_r1_compact", "max_turn_tokens": 64, "topk": 2}
    (tmp_path / "summary.json").write_text(json.dumps({"settings": settings}))
    with pytest.raises(ValueError, match="pass --seed 1000"):
        runner.read_main_warm_start(str(tmp_path), 0)
    (tmp_path / "warm_start_model" / "model.safetensors").write_bytes(b"weights")
    main = runner.read_main_warm_start(str(tmp_path), 1000)
    digest = weights_digest(tmp_path / "warm_start_model")
    assert main == {**settings, "model": str(tmp_path / "warm_start_model"), "weights_sha256": digest}
    run = {"main_warm_start": main}
    assert runner.uses_main_warm_start(study.BY_KEY["losses"], run)
    assert not runner.uses_main_warm_start(study.BY_KEY["lambda_format"], run)  # weak by design
    assert not runner.uses_main_warm_start(study.BY_KEY["evidence"], run)  # R-Search's protocol
    assert not runner.uses_main_warm_start(study.BY_KEY["masking"], {"main_warm_start": None})
    text = study._warm_start_text({"warm_start_steps": 8, **run})
    assert "main job's warm start" in text and "search_r1_compact" in text and "top-2" in text


def test_the_policy_loss_arms_set_their_loss_and_llds():
    losses = study.BY_KEY["losses"]
    base = search_r1_grpo(dataset=None, scale="cpu")
    configs = {arm.name: study.arm_config(base, arm, {}) for arm in losses.arms}
    assert {name: (c.policy_loss, c.llds_coeff) for name, c in configs.items()} == {
        "GRPO": ("grpo", 0.0),
        "GRPO + LLDS": ("grpo", 0.2),
        "GSPO": ("gspo", 0.0),
        "GSPO + LLDS": ("gspo", 0.2),
        "Dr. GRPO": ("dr_grpo", 0.0),
        "Dr. GRPO + LLDS": ("dr_grpo", 0.2),
    }
    assert base.llds_coeff == 0.0 and base.policy_loss == "grpo"  # the arms change copies
    assert {arm.versus for arm in losses.arms if arm.expected == 1} == {"GRPO", "GSPO", "Dr. GRPO"}


def test_what_the_data_show_is_computed_from_the_stored_figures():
    arm = {
        "status": "run",
        "per_seed_em": {"1": 0.4, "0": 0.5},
        "gain_over_warm_start": {"value": -0.1, "low": -0.2, "high": 0.0},
        "curve_mean": [0.2, 0.4, 0.6, 0.6],
        "format_curves": {"0": [1.0, 1.0, 1.0, 1.0], "1": [1.0, 0.5, 0.0, 0.25]},
    }
    text = study.observed({"a": arm, "b": {"status": "not yet run"}}, ("a", "b"))
    assert text == (
        "a: held-out EM per seed 0.50, 0.40 (seeds 0, 1), -0.100 [-0.200, +0.000] against the warm start, "
        "training answer reward 0.30 over iterations 1-2 and 0.60 over 3-4, lost its format (well-formed "
        "share of training trajectories over the last 3 iterations): seed 1 (0.25)"
    )
    # Figures an earlier analysis did not store are left out, not guessed.
    assert study.observed({"a": {"status": "run", "per_seed_em": {"0": 0.5}}}, ("a",)) == (
        "a: held-out EM per seed 0.50 (seeds 0)"
    )
