"""The controlled experiment on the main job: the placebo's reward permutation, the experiment's statistics,
its resumable plan, its report, and (slow) one smoke of the driver through the real job with a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from benchmarks import evidence as driver
from rllib_search.algos.learners.advantages import episode_signals
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.recipes.tiny_cpu import evidence
from rllib_search.recipes.tiny_cpu.cli import parse_config
from rllib_search.recipes.tiny_cpu.placebo import PlaceboRewards, permute_rewards, sample_seed

ROOT = Path(__file__).resolve().parents[1]


# --- the placebo --------------------------------------------------------------------------------------------
def rollout(group: str, reward: float, answer: str) -> Rollout:
    return Rollout(
        token_ids=np.arange(6),
        loss_mask=np.array([0, 0, 1, 1, 1, 1]),
        logprobs=np.full(6, -1.0),
        prompt_length=2,
        turn_spans=[(2, 6)],
        reward=reward,
        reward_components={"em": reward},
        group_id=group,
        uid=group.split("@")[0],
        data_source="synthetic",
        weights_version=0,
        terminated=True,
        truncated=False,
        answer=answer,
        golden_answers=["paris"],
    )


def sample(groups: int = 4, size: int = 4) -> tuple[list, list[Rollout]]:
    """A sample of ``groups`` groups: the first all right, the others all wrong."""
    episodes, rollouts = [], []
    for g in range(groups):
        group = f"q{g}@1.{g}"
        for _ in range(size):
            right = g == 0
            episodes.append((None, group))
            rollouts.append(rollout(group, float(right), "paris" if right else "rome"))
    return episodes, rollouts


def test_placebo_permutes_the_sample_rewards_seeded_and_keeps_the_true_answers():
    _, rollouts = sample()
    permuted = permute_rewards(rollouts, seed=7)
    assert sorted(r.reward for r in permuted) == sorted(r.reward for r in rollouts)
    assert [r.reward for r in permuted] == [r.reward for r in permute_rewards(rollouts, seed=7)]
    assert [r.reward for r in permuted] != [r.reward for r in permute_rewards(rollouts, seed=8)]
    # Everything but the reward stays the episode's own: answers, true reward components, groups.
    for before, after in zip(rollouts, permuted):
        assert (after.answer, after.reward_components, after.group_id) == (
            before.answer,
            before.reward_components,
            before.group_id,
        )
    # Across groups: the right group's rewards spread to the others, so the advantages GRPO gets change.
    groups = [r.group_id for r in rollouts]
    true = episode_signals("grpo", [r.reward for r in rollouts], groups)
    placebo = episode_signals("grpo", [r.reward for r in permuted], groups)
    assert not np.allclose(true, placebo)
    assert np.all(true == 0)  # every group uniform: GRPO learns nothing from the true rewards here
    assert np.any(placebo != 0)


def test_placebo_hook_permutes_across_all_groups_of_the_sample_and_counts_moved_rewards():
    episodes, rollouts = sample()
    runner = SimpleNamespace(metrics=MetricsLogger())  # the hook only logs on the runner
    hook = PlaceboRewards(seed=0)
    out = hook(runner, episodes, list(rollouts))
    moved = sum(a.reward != b.reward for a, b in zip(rollouts, out))
    assert moved > 0 and runner.metrics.peek("placebo_moved_rewards") == moved
    assert any(r.reward == 1.0 for r in out[4:])  # a wrong group now holds a right group's reward
    assert [r.reward for r in out] == [
        r.reward for r in hook(SimpleNamespace(metrics=MetricsLogger()), episodes, rollouts)
    ]
    # Another sample (other group ids) draws another permutation.
    assert sample_seed(0, [g for _, g in episodes]) != sample_seed(0, [g + "x" for _, g in episodes])


def test_job_flags_placebo_and_the_warm_start_alone():
    config, _ = parse_config(["--no-bf16"])
    assert not config.placebo_rewards and config.rl_iterations == 8
    config, _ = parse_config(["--no-bf16", "--placebo-rewards", "--rl-iterations", "0"])
    assert config.placebo_rewards and config.rl_iterations == 0
    with pytest.raises(SystemExit):
        parse_config(["--no-bf16", "--rl-iterations", "0", "--warm-start", "somewhere"])
    with pytest.raises(SystemExit):
        parse_config(["--no-bf16", "--rl-iterations", "-1"])


# --- statistics ---------------------------------------------------------------------------------------------
def answers(right_1hop: list[bool], right_2hop: list[bool]) -> list[dict]:
    rows = []
    for hops, rights in ((1, right_1hop), (2, right_2hop)):
        for i, right in enumerate(rights):
            gold = f"g{hops}{i}"
            rows.append(
                {
                    "uid": f"u{hops}-{i}",
                    "hops": hops,
                    "answer": gold if right else "x",
                    "golds": [gold],
                    "correct": right,
                }
            )
    return rows


def experiment(pairs: int = 4, questions: int = 20) -> list[dict]:
    """Recipe right on every 2-hop question, placebo and no RL on a fifth of them; all right on 1-hop."""
    runs = []
    rng = np.random.default_rng(0)
    for world in range(1000, 1000 + pairs):
        base = [bool(right) for right in rng.random(questions) < 0.2]
        runs.append(evidence.run_entry("no_rl", world, 0, answers([True] * questions, base)))
        runs.append(evidence.run_entry("placebo", world, 0, answers([True] * questions, base)))
        runs.append(evidence.run_entry("recipe", world, 0, answers([True] * questions, [True] * questions)))
    return runs


def test_arm_em_and_gains_have_intervals_around_their_points_and_a_clear_effect_above_zero():
    runs = experiment()
    summary = evidence.summarize(runs, resamples=500)
    for arm in evidence.ARMS:
        for hops in ("1hop", "2hop"):
            e = summary["em"][arm][hops]
            assert e["low"] <= e["value"] <= e["high"]
    assert summary["em"]["recipe"]["2hop"]["value"] == 1.0
    for name in ("recipe-placebo", "recipe-no_rl"):
        gain = summary["gains"][name]["2hop"]
        assert gain["low"] > 0 and gain["low"] <= gain["value"] <= gain["high"]
        assert summary["gains"][name]["1hop"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    placebo = summary["gains"]["placebo-no_rl"]["2hop"]
    assert placebo["value"] == 0.0 and placebo["low"] <= 0 <= placebo["high"]
    assert "recipe beats the placebo" in evidence.placebo_verdict(summary)
    assert summary["pass_rates"]["recipe"]["passes"] == 4 and summary["pass_rates"]["placebo"]["passes"] == 0
    low, high = summary["pass_rates"]["recipe"]["interval"]
    assert low > 0.4 and high == pytest.approx(1.0)


def test_paired_gain_pairs_by_world_seed_and_question_uid():
    runs = experiment(pairs=2, questions=10)
    shuffled = []
    for run in runs:  # the question order of every recipe run reversed: pairing goes by uid, not position
        if run["arm"] == "recipe":
            run = {**run, "answers": run["answers"][::-1]}
        shuffled.append(run)
    assert evidence.paired_differences(runs, "recipe", "no_rl", 2) == evidence.paired_differences(
        shuffled, "recipe", "no_rl", 2
    )
    # A run of a pair the baseline never ran is not paired.
    lone = evidence.run_entry("recipe", 2000, 0, answers([True], [True]))
    assert set(evidence.paired_differences([*runs, lone], "recipe", "no_rl", 2)) == {(1000, 0), (1001, 0)}
    # One question of one pair differs: the pairwise difference sees exactly it.
    one = [
        evidence.run_entry("no_rl", 1, 0, answers([True], [False, True])),
        evidence.run_entry("recipe", 1, 0, answers([True], [True, True])),
    ]
    assert evidence.paired_differences(one, "recipe", "no_rl", 2) == {(1, 0): [1.0, 0.0]}


def test_nested_bootstrap_without_variation_is_a_point():
    estimate = evidence.nested_bootstrap([[1.0, 0.0], [1.0, 0.0]], resamples=50)
    assert estimate.value == 0.5 and estimate.low <= 0.5 <= estimate.high
    assert evidence.nested_bootstrap([[1.0, 1.0], [1.0]], resamples=50).low == 1.0


def test_read_answers_scores_a_stage_of_predictions(tmp_path):
    path = tmp_path / "predictions.jsonl"
    lines = [
        {"stage": "after warm start", "hops": 2, "uid": "a", "answer": "Paris", "golds": ["paris"]},
        {"stage": "after RL", "hops": 2, "uid": "a", "answer": "Rome", "golds": ["paris"]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert evidence.read_answers(path, "after warm start")[0]["correct"] is True
    assert evidence.read_answers(path, "after RL")[0]["correct"] is False
    with pytest.raises(ValueError):
        evidence.read_answers(path, "before")


# --- the driver: plan, resume, report ----------------------------------------------------------------------
def test_the_rule_takes_the_first_pairs_of_worlds_1000_to_1009_with_seed_0():
    assert driver.pairs_of(list(driver.WORLD_SEEDS), [driver.SEED], 2) == [(1000, 0), (1001, 0)]
    assert len(driver.pairs_of(list(driver.WORLD_SEEDS), [0], None)) == 10
    assert driver.pairs_of([5, 6], [1, 2], None) == [(5, 1), (6, 2)]
    with pytest.raises(ValueError):
        driver.pairs_of([5, 6, 7], [1, 2], None)
    assert driver.parse_numbers("1000-1002,7") == [1000, 1001, 1002, 7]


def test_plan_skips_runs_whose_summary_exists_and_starts_the_arms_from_the_pair_warm_start(tmp_path):
    pairs = [(1000, 0), (1001, 0)]
    planned = driver.plan(pairs, tmp_path, ["--smoke"])
    assert [(r.name, r.world_seed) for r in planned] == [
        (name, world) for world in (1000, 1001) for name in ("warm_start", "recipe", "placebo")
    ]
    assert not any(r.done for r in planned)
    warm, recipe, placebo = planned[:3]
    assert warm.flags[-2:] == ("--rl-iterations", "0") and "--smoke" in warm.flags
    model = str(warm.out / "warm_start_model")
    assert recipe.flags[-2:] == ("--warm-start", model) and "--placebo-rewards" not in recipe.flags
    assert placebo.flags[-3:] == ("--warm-start", model, "--placebo-rewards")
    (recipe.out).mkdir(parents=True)
    (recipe.out / "summary.json").write_text("{}")
    again = driver.plan(pairs, tmp_path, ["--smoke"])
    assert [r.done for r in again] == [False, True, False, False, False, False]


def fake_document() -> dict:
    runs = experiment(pairs=3, questions=10)
    return {
        "benchmark": "evidence",
        "plan": {
            "rule": driver.RULE,
            "pairs": [[1000 + i, 0] for i in range(10)],
            "command": "python benchmarks/evidence.py --pairs 3",
        },
        "summary": evidence.summarize(runs, resamples=200),
        "failed": [],
        "runs": runs,
    }


def test_report_from_a_results_document(tmp_path):
    results = tmp_path / "evidence.json"
    results.write_text(json.dumps(fake_document()))
    report, figure = driver.write_report(results, tmp_path / "docs")
    text = report.read_text()
    assert "1000-1009, each paired with seed 0" in text
    assert "| recipe | 1.000 [1.000, 1.000] |" in text
    assert "| recipe − placebo |" in text and "| recipe − no_rl |" in text
    assert "The recipe beats the placebo" in text
    assert "python benchmarks/evidence.py --pairs 3" in text and "Pairs run: 3 of 10" in text
    assert "- recipe: 3 of 3" in text
    assert "| 1002 | 0 | 1.00 / 1.00 |" in text and "not run" not in text  # the per-pair table
    assert figure.stat().st_size > 10_000


def test_report_says_so_when_the_placebo_matches():
    document = fake_document()
    document["summary"]["gains"]["recipe-placebo"]["2hop"] = {"value": 0.02, "low": -0.05, "high": 0.09}
    assert "matches the recipe within the interval" in evidence.markdown(document, "cmd")
    document["summary"]["gains"]["recipe-no_rl"]["1hop"] = {"value": -0.06, "low": -0.12, "high": -0.02}
    assert "the recipe loses EM against its warm start" in evidence.markdown(document, "cmd")


def test_finished_pairs_of_results_files_are_kept_with_their_commit_and_machine(tmp_path, capsys):
    """A pair whose three runs a results file holds is not run again: its runs are carried into the new
    results file with the commit and machine they ran on; a pair missing an arm is not kept."""
    document = fake_document()
    elsewhere = {"cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2, "cores": 2}
    document.update(commit="abc1234", machine=elsewhere)
    document["runs"] = [
        run for run in document["runs"] if (run["world_seed"], run["arm"]) != (1001, "placebo")
    ]
    merged_from = tmp_path / "elsewhere.json"
    merged_from.write_text(json.dumps(document))
    assert set(driver.kept_pairs([merged_from, tmp_path / "missing.json"])) == {(1000, 0), (1002, 0)}
    results = tmp_path / "evidence.json"
    flags = ["--world-seeds", "1000,1002", "--out", str(tmp_path / "runs"), "--results", str(results)]
    assert driver.main([*flags, "--merge", str(merged_from)]) == 0
    assert "6 done (6 of them kept from results files)" in capsys.readouterr().out
    written = json.loads(results.read_text())
    assert len(written["runs"]) == 6 and not (tmp_path / "runs").exists()
    assert {(run["commit"], run["machine"]["cpu_family"]) for run in written["runs"]} == {("abc1234", 26)}
    assert written["plan"]["command"] == "python benchmarks/evidence.py --world-seeds 1000,1002"
    assert driver.reproducing(
        ["--out", "x", "--merge", "a", "b", "--pairs", "2", "--results=r", "--smoke"]
    ) == [
        "--pairs",
        "2",
        "--smoke",
    ]
    assert written["summary"]["pairs"] == [[1000, 0], [1002, 0]]
    # --plan-only lists what is left (the pair whose placebo is missing) and runs nothing.
    assert (
        driver.main(
            [
                "--world-seeds",
                "1001",
                "--out",
                str(tmp_path / "runs"),
                "--results",
                str(tmp_path / "left.json"),
                "--merge",
                str(merged_from),
                "--plan-only",
            ]
        )
        == 0
    )
    left = capsys.readouterr().out
    assert "to run: world 1001 seed 0 warm_start" in left and "to run: world 1001 seed 0 placebo" in left
    assert not (tmp_path / "runs").exists() and json.loads((tmp_path / "left.json").read_text())["runs"] == []
    # Run again without --merge: the results file's own finished pairs are kept.
    assert driver.main(flags) == 0 and json.loads(results.read_text())["runs"] == written["runs"]
    text = evidence.markdown(written, "cmd")
    assert "ran the code of commit abc1234" in text and "- A: AMD EPYC (family 26 model 2)" in text


def test_the_report_names_each_pairs_machine_when_they_differ():
    document = fake_document()
    for run in document["runs"]:
        run["machine"] = {
            "cpu": "EPYC",
            "cpu_family": 25 if run["world_seed"] == 1002 else 26,
            "cpu_model": 1,
        }
    text = evidence.markdown(document, "cmd")
    assert "- A: EPYC (family 25 model 1)" in text and "- B: EPYC (family 26 model 1)" in text
    assert "| 1000 | 0 | 1.00 / 1.00 |" in text and text.count(" | B |") == 2 and text.count(" | A |") == 1


# --- one smoke through the real job ------------------------------------------------------------------------
@pytest.mark.slow
def test_driver_smoke_runs_a_pair_through_the_real_job_and_resumes(tmp_path):
    """One pair at the main job's smallest sizes with a tiny policy: the warm start alone (no RL), the
    recipe and the placebo from it, the results file; then a second call reruns nothing."""
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    model = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    env = {**os.environ, "RLLIB_SEARCH_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    results = tmp_path / "evidence.json"
    command = [
        *(sys.executable, str(ROOT / "benchmarks" / "evidence.py"), "--smoke", "--pairs", "1"),
        *("--out", str(tmp_path / "runs"), "--results", str(results), "--"),
        *("--model", str(model), "--threads", "1", "--group-size", "2", "--rl-interpolate", "", "--no-bf16"),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(results.read_text())
    assert not document["failed"], done.stdout[-3000:]
    assert sorted(run["arm"] for run in document["runs"]) == ["no_rl", "placebo", "recipe"]
    for run in document["runs"]:
        assert (run["world_seed"], run["seed"]) == (1000, 0) and set(run["em"]) == {"1hop", "2hop"}
        assert {"uid", "hops", "answer", "golds", "correct"} <= set(run["answers"][0])
    pair = tmp_path / "runs" / "world_1000_seed_0"
    warm = json.loads((pair / "warm_start" / "summary.json").read_text())
    assert [row["stage"] for row in warm["evaluation"]] == ["before", "after warm start"]
    assert warm["grpo"] == [] and warm["rl_gain_2hop"] is None and warm["settings"]["rl_iterations"] == 0
    placebo = json.loads((pair / "placebo" / "summary.json").read_text())
    assert placebo["settings"]["placebo_rewards"] and "placebo_moved_rewards" in placebo["grpo"][0]
    assert not json.loads((pair / "recipe" / "summary.json").read_text())["settings"]["placebo_rewards"]
    assert not (pair / "recipe" / "checkpoint").exists()
    assert document["summary"]["em"].keys() == {"recipe", "placebo", "no_rl"}
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "3 done" in again.stdout and "running" not in again.stdout
