"""The tuned examples end to end in subprocesses (each starts its own local Ray and Serve, or joins the
cluster it is submitted to): the README's main job, every paper recipe's --smoke path, the λ sweep with its
tables and resume, and an example submitted with the Job Submission API to a `ray start` head."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rllib_search.llm.models import cpu_precision, decide_cpu_precision, describe_cpu
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import tuned_example

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_tiny_cpu_grpo_runs_every_stage_and_saves_a_checkpoint(tmp_path, capsys, monkeypatch):
    """The main job with most of its options, run as one seed of tuned_examples/main_job_seeds.py (which
    passes it ``--seed 0 --out <sweep>/seed_0`` and the flags after ``--``). The runs that start Ray are
    subprocesses; the sweep's re-run and the warm start's readers, which start none, run in this process
    (a Python start-up each less)."""
    model = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    sweep = tmp_path / "sweep"
    out = sweep / "seed_0"
    flags = [
        *("--model", str(model), "--threads", "1"),
        *("--sft-steps", "2", "--sft-batch", "4", "--rl-iterations", "2", "--eval-questions", "2"),
        *("--demonstrations", "6", "--two-hop-demonstrations", "2", "--prompts", "2", "--group-size", "2"),
        *("--max-turn-tokens", "12", "--state-plan", "--early-answer", "0.5", "--no-scale-by-std"),
        *("--plan-weight", "8", "--sft-lr-decay", "linear", "--sft-balance", "--hesitate-by-kind"),
        *("--rl-one-hop", "4", "--rl-one-hop-likeliest", "3", "--rl-balance-hops"),
        *("--lambda-retrieval", "0.1", "--search-cost", "0.1"),
        *("--sft-fork-window", "--sft-fork-from", "1", "--sft-max-steps", "2"),
        *("--fork-calibration", "--calibration-steps", "2", "--calibration-turns", "2"),
        *("--calibration-questions", "1"),
        *("--rl-read-forks", "--rl-recipe", "auto"),
        *("--rl-validate-at", "1", "--validation-questions", "2", "--rl-validation-held-out"),
        *("--rl-dynamic-sampling", "2", "--rl-guidance", "--rl-counter-guidance", "plan"),
        *("--rl-interpolate", ""),  # no WiSE-FT reading: --score-readings scores only runs without one
    ]
    argv = [sys.executable, str(ROOT / "tuned_examples" / "main_job_seeds.py")]
    argv += ["--seeds", "0", "--out", str(sweep), "--keep-checkpoints", "--score-readings", "1", "1,2"]
    argv += ["--", *flags]
    env = {**os.environ, "RLLIB_SEARCH_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("RLLIB_SEARCH_CACHE", env["RLLIB_SEARCH_CACHE"])  # for the in-process runs
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out evaluation" in done.stdout and "grpo iter  2/2" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [row["stage"] for row in summary["evaluation"]] == ["before", "after warm start", "after RL"]
    assert len(summary["grpo"]) == 2
    # --rl-read-forks: the policy's forks after each GRPO iteration, on its line and in its row.
    for row in summary["grpo"]:
        assert all(0.0 <= p <= 1.0 for hops in ("1", "2") for p in row["forks"][hops].values())
    assert "forks: P(',')" in done.stdout.split("grpo iter  2/2")[1].splitlines()[0]
    assert summary["rl_stopped_at"] is None  # no --rl-stop-on-fork-rise: every iteration runs
    # --max-turn-tokens 12 cuts the teacher's turns: the job says so and counts them.
    assert summary["demonstrated_turns_over_budget"] > 0
    assert "demonstrated turns are longer than --max-turn-tokens 12" in done.stdout
    # --rl-dynamic-sampling 2: at most 2 rounds an iteration, the second only while fewer than 2 (--prompts)
    # groups with differing rewards are held.
    for row in summary["grpo"]:
        assert 1 <= row["sample_rounds"] <= 2 and 0 <= row["informative_groups"] <= 2
        assert row["informative_groups"] == 2 or row["sample_rounds"] == 2
    assert "informative groups" in done.stdout
    # --rl-guidance: the tiny model never answers right, so every sampled group of every round is guided.
    for row in summary["grpo"]:
        assert row["guided_groups"] == 2 * row["sample_rounds"] and 0 <= row["guided_solved"] <= 2
    assert "guided groups" in done.stdout and summary["settings"]["rl_guidance"]
    # --rl-counter-guidance: no group answered right, so none stopped with a right answer to counter.
    assert all(row["counter_groups"] == row["counter_right"] == 0 for row in summary["grpo"])
    assert "counter groups 0 (0 right)" in done.stdout
    # --rl-validate-at 1: readings after iterations 1 and 2 (the last), the kept one's weights evaluated.
    validation = summary["rl_validation"]
    assert [r["iteration"] for r in validation["readings"]] == [1, 2]
    assert validation["questions_per_hop"] == {"1": 2, "2": 2}
    for reading in validation["readings"]:  # which questions each reading answered right, in order
        right = [reading[f"right_{h}hop"] for h in (1, 2)]
        assert [len(r) for r in right] == [2, 2] and all(x in (0, 1) for r in right for x in r)
        assert sum(map(sum, right)) == reading["correct"]
        assert [sum(r) / 2 for r in right] == [reading["em_1hop"], reading["em_2hop"]]
    best = max(r["correct"] for r in validation["readings"])
    assert validation["kept_iteration"] == max(
        r["iteration"] for r in validation["readings"] if r["correct"] == best
    )
    assert f"RL keeps iteration {validation['kept_iteration']}'s weights" in done.stdout
    # --rl-validation-held-out: each reading's held-out EMs and the paired gain had RL kept it; the kept
    # reading's gain is the summary's.
    for row in summary["grpo"]:
        assert set(row["held_out"]) >= {"em_1hop", "em_2hop", "gain"}
        assert all(g["low"] <= g["value"] <= g["high"] for g in row["held_out"]["gain"].values())
    kept = summary["grpo"][validation["kept_iteration"] - 1]["held_out"]["gain"]
    assert kept["2hop"]["value"] == summary["rl_gain_2hop"]
    assert f"RL gain if iteration {validation['kept_iteration']} were kept" in done.stdout
    settings = summary["settings"]
    assert settings["plan_weight"] == 8 and settings["sft_lr_decay"] == "linear"
    assert settings["sft_balance"] and settings["hesitate_by_kind"] and settings["rl_balance_hops"]
    assert settings["lambda_retrieval"] == 0.1 and settings["calibration_turns"] == 2
    assert settings["search_cost"] == 0.1  # and the reward took it: a mean cost an episode, on each line
    assert all(0.0 <= row["search_cost"] <= 1.0 for row in summary["grpo"])
    assert "search cost" in done.stdout.split("grpo iter  1/2")[1].splitlines()[0]
    assert settings["calibration_questions"] == 1
    # --sft-fork-window: the forks read after every step until they lie in the window or step 2 is done.
    read = summary["sft_forks"]
    assert [row["step"] for row in read] == list(range(1, summary["sft_steps_run"] + 1))
    assert summary["sft_steps_run"] == 2 or read[-1]["in_window"]
    assert not any(row["in_window"] for row in read[:-1])
    for row in read:
        assert all(0.0 <= p <= 1.0 for hops in ("1", "2") for p in row["forks"][hops].values())
    assert f"sft step   {summary['sft_steps_run']}/2" in done.stdout and "forks: P(',')" in done.stdout
    assert read[-1]["in_window"] or "never in the window" in done.stdout
    # --fork-calibration: steps after SFT, each read, until in the window or step 2 is done.
    calibration = summary["fork_calibration"]
    assert [row["step"] for row in calibration] == list(range(1, len(calibration) + 1))
    assert len(calibration) == 2 or calibration[-1]["in_window"]
    assert "fork calibration: " in done.stdout and f"calibration step {len(calibration)}/2" in done.stdout
    # --rl-recipe auto: the warm start's forks read on the 30 + 30 fork questions choose what GRPO credits;
    # --prompts and --rl-one-hop given here override the recipe's.
    recipe = summary["rl_recipe"]
    warm_forks = recipe["warm_start_forks"]
    assert all(0.0 <= p <= 1.0 for hops in ("1", "2") for p in warm_forks[hops].values())
    expected = "after-fork" if warm_forks["1"]["goes_on"] > 0.5 else "whole-turn"
    assert recipe["name"] == expected and recipe["chosen"] == "by the warm start's forks"
    assert recipe["credit_after"] == (", then" if expected == "after-fork" else None)
    # --rl-one-hop-likeliest 3: of the 4, the 3 whose warm-start plans go on likeliest, likeliest first.
    assert (recipe["prompts"], recipe["one_hop"]) == (2, 3) and recipe["balance_hops"]
    goes_on = recipe["one_hop_likeliest_to_go_on"]
    assert len(goes_on) == 3 and goes_on == sorted(goes_on, reverse=True)
    assert all(0.0 <= p <= 1.0 for p in goes_on)
    assert "RL's 1-hop questions: the 3 of 4 whose warm-start plans go on likeliest" in done.stdout
    assert f"RL recipe: {expected} (the warm start's forks: P(',') 1-hop" in done.stdout
    low, high = summary["rl_gain_2hop_interval"]
    assert low <= summary["rl_gain_2hop"] <= high
    stages = summary["em"]
    assert summary["rl_gain_2hop"] == pytest.approx(
        stages["after RL"]["2hop"] - stages["after warm start"]["2hop"]
    )
    assert set(summary["searches_per_episode"]["after RL"]) == {"1hop", "2hop"}
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 3 * 2 * 2  # stages x hop counts x questions per hop count
    # --eval-cache (default): the base model's answers before training are stored for the next run.
    assert summary["evaluation"][0]["cached"] is False
    (stored,) = (tmp_path / "cache" / "evaluations").glob("*.json")
    before = json.loads(stored.read_text())["result"]["answers"]
    assert [p["answer"] for p in predictions if p["stage"] == "before"] == before["1"] + before["2"]
    assert (out / "training.png").stat().st_size > 0
    assert (out / "warm_start_model" / "config.json").exists()

    assert Path(summary["checkpoint"], "learner_group").is_dir()

    # The sweep's report: the seed's verdict on the goal of issue 13, read from its summary.
    document = json.loads((sweep / "seeds.json").read_text())
    (row,) = document["rows"]
    assert row["seed"] == 0 and document["failed_seeds"] == []
    assert row["rl_gain_2hop"] == summary["rl_gain_2hop"] and row["em"] == summary["em"]
    assert row["meets_goal"] == (not row["why_not"]) and document["passes"] == int(row["meets_goal"])
    assert row["kept_iteration"] == validation["kept_iteration"]
    assert validation["interpolations"] == [] and validation["kept_alpha"] == 1.0 == row["kept_alpha"]
    assert row["machine"] == summary["machine"]
    # --score-readings 1 1,2, from the held-out readings: the run stopped after iteration 1, and the run.
    stopped, whole = row["schedules"]["1"], row["schedules"]["1,2"]
    assert stopped["kept_iteration"] == 1
    assert stopped["rl_gain_2hop"] == summary["grpo"][0]["held_out"]["gain"]["2hop"]["value"]
    assert whole["kept_iteration"] == validation["kept_iteration"]
    assert whole["meets_goal"] == row["meets_goal"]
    assert whole["rl_gain_2hop"] == summary["rl_gain_2hop"]
    assert document["schedules"]["1,2"]["passes"] == document["passes"]
    assert "| seed | `1` | `1,2` |" in (sweep / "seeds.md").read_text()
    assert f"machine: {describe_cpu(summary['machine'])}\n" in done.stdout
    # The machine's product speed, measured at the start and the end, and the hypervisor's share of the
    # run's CPU time beside the run's seconds.
    speeds = [summary["machine"][f"matmul_gflops_{when}"] for when in ("start", "end")]
    assert all(speed > 0 for speed in speeds) and f"({speeds[0]:.0f} at the start)" in done.stdout
    steal = summary["machine"]["cpu_steal_share"]
    assert steal is None or 0.0 <= steal <= 1.0
    stolen = "" if steal is None else f", {steal:.1%} stolen"
    # The precision the default chose by timing both products (where bf16 is native), printed with why.
    recorded = summary["machine"]
    chosen = decide_cpu_precision(recorded["native_bf16"], recorded["fp32_gflops"], recorded["bf16_gflops"])
    assert recorded["precision"] == ("bf16" if chosen.bf16 else "fp32")
    assert f"({chosen.reason()}; --" in done.stdout
    assert f"({speeds[0]:.0f} -> {speeds[1]:.0f} GFLOP/s{stolen}) |" in (sweep / "seeds.md").read_text()
    assert "| 0 |" in (sweep / "seeds.md").read_text() and (sweep / "seeds.png").stat().st_size > 0
    assert "[1/1 seeds, " in done.stdout and "[seed 0] " in done.stdout
    # Run again with the same flags: the seed is read back, not run.
    reused = in_process("main_job_seeds", argv[2:], capsys)
    assert f"[seed 0] reusing {out / 'summary.json'}" in reused and "grpo iter" not in reused
    assert json.loads((sweep / "seeds.json").read_text())["rows"] == document["rows"]

    # plan_forks.py reads the warm start's probabilities at the plan's forks.
    forks_argv = [str(out / "warm_start_model"), "--questions", "3", "--threads", "1"]
    forks = in_process("plan_forks", forks_argv, capsys)
    assert "1-hop (3 questions)" in forks and "2-hop (3 questions)" in forks
    report = json.loads((out / "warm_start_model" / "plan_forks.json").read_text())
    for hops in ("1hop", "2hop"):
        for fork in ("goes_on", "its"):
            assert 0.0 <= report[hops][fork]["mean"] <= 1.0 and 0 <= report[hops][fork]["above_half"] <= 3
    # and how it reads each hop's answer in the teacher's episodes: turn 1 of each question, turn 2 of 2-hop.
    readings = {k: v for k, v in report["readings"].items() if k != "topk"}
    assert report["readings"]["topk"] == 2 and "2-hop turn 2 reads the hop's answer" in forks
    assert {k: v["count"] for k, v in readings.items()} == {
        "1-hop turn 1": 3,
        "2-hop turn 1": 3,
        "2-hop turn 2": 3,
    }
    assert all(0.0 <= v["mean"] <= 1.0 and 0 <= v["greedy_right"] <= 3 for v in readings.values())

    # sampled_plans.py samples it as GRPO does and counts each plan kind's searches and right answers;
    # with --topk 1 each observation shows the best passage alone.
    sampled_out = tmp_path / "sampled"
    sampled_argv = [str(out / "warm_start_model"), "--topk", "1"]
    sampled_argv += ["--questions", "2", "--samples", "2", "--threads", "1", "--out", str(sampled_out)]
    sampled = in_process("sampled_plans", sampled_argv, capsys)
    assert "1-hop: 4 episodes" in sampled and "2-hop: 4 episodes" in sampled
    report = json.loads((sampled_out / "sampled_plans.json").read_text())
    funnel = report["funnel"]
    assert report["settings"]["topk"] == 1
    for row in funnel.values():
        assert sum(p["episodes"] for p in row["plans"].values()) == 4 and row["questions"] == 2
    episodes = [
        json.loads(line) for line in (sampled_out / "sampled_episodes.jsonl").read_text().splitlines()
    ]
    assert len(episodes) == 8 and all(episode["turns"] for episode in episodes)
    for episode in episodes:
        assert len(episode["observations"]) == len(episode["turns"]) - 1
        # An invalid action's observation says so instead; a search's shows one passage.
        assert all("Doc 2(" not in seen for seen in episode["observations"])

    # --warm-start: GRPO from that export, no SFT; its evaluation of the warm start is the first run's.
    again = tmp_path / "again"
    argv = [sys.executable, str(ROOT / "tuned_examples" / "tiny_cpu_grpo.py"), "--out", str(again), *flags]
    argv += ["--warm-start", str(out / "warm_start_model")]
    argv += ["--rl-trained-turns", "1", "--rl-credit-after", ", then", "--rl-credit-after-hops", "2"]
    argv += ["--rl-iterations", "2", "--rl-stop-on-fork-rise", "-1"]  # any reading is a rise above -1
    argv += ["--rl-interpolate", "0.5"]  # one WiSE-FT reading halfway between the warm start and RL
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sft step" not in done.stdout and "no SFT here" in done.stdout
    resumed = json.loads((again / "summary.json").read_text())
    # --rl-stop-on-fork-rise: the warm start's forks read, then RL stopped after its first iteration.
    assert resumed["rl_stopped_at"] == 1 and len(resumed["grpo"]) == 1 and "forks" in resumed["grpo"][0]
    assert "RL stops after iteration 1" in done.stdout and "grpo iter  2/2" not in done.stdout
    assert [row["stage"] for row in resumed["evaluation"]] == ["after warm start", "after RL"]
    assert resumed["em"]["after warm start"] == stages["after warm start"]
    # The recipe's forks, read from the exported warm start, are those read from the SFT learner's module.
    for hops in ("1", "2"):
        for fork, p in resumed["rl_recipe"]["warm_start_forks"][hops].items():
            assert p == pytest.approx(warm_forks[hops][fork], abs=1e-4)
    assert resumed["rl_recipe"]["credit_after"] == ", then"  # the flag overrides the recipe
    assert resumed["rl_recipe"]["credit_after_hops"] == [2]
    mixes = resumed["rl_validation"]["interpolations"]
    assert [mix["alpha"] for mix in mixes] == [1.0, 0.5] and mixes[0]["iteration"] == mixes[1][
        "iteration"
    ] == 1
    best = max(mix["correct"] for mix in mixes)
    assert resumed["rl_validation"]["kept_alpha"] == next(m["alpha"] for m in mixes if m["correct"] == best)
    assert "validation at 0.5 x RL + 0.5 x warm start" in done.stdout
    first = [p for p in predictions if p["stage"] == "after warm start"]
    second = [json.loads(line) for line in (again / "predictions.jsonl").read_text().splitlines()]
    assert [p for p in second if p["stage"] == "after warm start"] == first
    assert not (again / "warm_start_model").exists()


def in_process(script: str, argv: list[str], capsys) -> str:
    """``tuned_examples/<script>.py`` run by its ``main(argv)`` in this process; returns what it printed."""
    module = tuned_example(script)
    capsys.readouterr()
    assert module.main(argv) == 0
    return capsys.readouterr().out


def test_tiny_cpu_grpo_recipes_and_defaults(monkeypatch):
    import importlib.util

    path = ROOT / "tuned_examples" / "tiny_cpu_grpo.py"
    spec = importlib.util.spec_from_file_location("tiny_cpu_grpo_job", path)
    job = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, job)  # dataclasses resolve their module by name
    spec.loader.exec_module(job)

    def forks(one_hop_goes_on: float) -> dict[int, dict[str, float]]:
        return {1: {"goes_on": one_hop_goes_on, "its": 0.9}, 2: {"goes_on": 0.9, "its": 0.9}}

    # Seeds 2 and 5's warm starts (1-hop P(",") 0.79, 0.60) against seeds 0 and 8's (0.05, 0.35).
    assert job.choose_rl_recipe(forks(0.79), 0.5) == job.choose_rl_recipe(forks(0.6), 0.5) == "after-fork"
    assert job.choose_rl_recipe(forks(0.05), 0.5) == job.choose_rl_recipe(forks(0.5), 0.5) == "whole-turn"
    assert job.RL_RECIPES["after-fork"] == job.RLRecipe(credit_after=", then", one_hop=0, prompts=3)
    assert job.RL_RECIPES["whole-turn"] == job.RLRecipe(credit_after=None, one_hop=100, prompts=4)
    assert job.RL_RECIPES["balanced"] == job.RLRecipe(
        credit_after=None, one_hop=150, prompts=4, balance_hops=True
    )
    # The default (stop 44): fork calibration after SFT, then 8 iterations of the balanced recipe.
    defaults = job.parse_args([])
    assert defaults.rl_recipe == "balanced" and defaults.fork_calibration and defaults.rl_iterations == 8
    assert not defaults.rl_read_forks and defaults.calibration_turns == 2  # and the turn after (stop 64)
    assert defaults.calibration_questions == 6 and defaults.calibration_second_turn == "all"
    # bf16 where the CPU has AVX512-BF16 or AMX (0.7x the time, stop 63) and its products pay (not where a
    # hypervisor hides AMX, stop 83), fp32 where bf16 is emulated or slower.
    assert defaults.bf16 == cpu_precision().bf16 and defaults.precision_measured
    assert not job.parse_args(["--no-bf16"]).precision_measured
    assert job.parse_args(["--bf16"]).bf16 and not job.parse_args(["--no-bf16"]).bf16
    # Off-policy guidance of groups with no right answer (stop 62); --no-rl-guidance turns it off.
    assert defaults.rl_guidance and not job.parse_args(["--no-rl-guidance"]).rl_guidance
    # GRPO's micro-batch is its minibatch (each group's prompt read once); SFT and calibration keep 4.
    assert (defaults.rl_micro_batch, defaults.micro_batch) == (defaults.minibatch, 4)
    assert defaults.search_cost == 0.0  # the papers' EM (0.1 in stops 85-87: one seed lifted, two lost)
    # Every 1-hop RL question (the 16 likeliest to go on: two seeds lifted, two lost, stop 92); no per-hop KL.
    assert defaults.rl_one_hop_likeliest == 0 and defaults.rl_kl_by_hops == {}
    assert job.parse_args(["--rl-kl-by-hops", "1:0.5,2:0.001"]).rl_kl_by_hops == {1: 0.5, 2: 0.001}
    for bad in ("1", "0:0.1", "1:-1", "x:1"):
        with pytest.raises(SystemExit):
            job.parse_args(["--rl-kl-by-hops", bad])
    # Counter-guidance is off; from iteration 5 (stop 89) it lifted no failing seed, from 1 it undid 2-hop.
    assert defaults.rl_counter_guidance is None and defaults.rl_counter_from == 1
    with pytest.raises(SystemExit):
        job.parse_args(["--rl-counter-guidance", "plan", "--rl-counter-from", "0"])
    assert defaults.topk == 2  # passages an observation shows
    assert defaults.reading_weight == 1.0  # what a thought after a search reads: plain NLL
    # The turn budget fits every turn the teacher writes on the embedded world (48 cut a 2-hop question's
    # second search on a quarter of them, so RL and the evaluation could not answer those: stop 58).
    assert defaults.max_turn_tokens == 64
    assert longest_teacher_turns(defaults) == (60, 57)  # 1-2 hops (a 2-hop second search), 3 hops
    for flag in (
        "--calibration-questions",
        "--micro-batch",
        "--rl-micro-batch",
        "--topk",
        "--reading-weight",
    ):
        with pytest.raises(SystemExit):
            job.parse_args([flag, "0"])
    # Calibration pairs 1-hop and 2-hop questions and needs SFT: off without either, an error if asked for.
    assert job.parse_args(["--two-hop-demonstrations", "0"]).fork_calibration is False
    assert job.parse_args(["--warm-start", "runs/x/warm_start_model"]).fork_calibration is False
    assert job.parse_args(["--no-fork-calibration"]).fork_calibration is False
    smoke = job.parse_args(["--smoke"])
    assert smoke.fork_calibration and smoke.two_hop_demonstrations == 2 and smoke.calibration_steps == 1
    assert job.parse_args(["--smoke", "--no-fork-calibration"]).two_hop_demonstrations == 0
    with pytest.raises(SystemExit):
        job.parse_args(["--fork-calibration", "--two-hop-demonstrations", "0"])
    assert defaults.prompts is defaults.rl_credit_after is defaults.rl_balance_hops is None  # the recipe's
    assert defaults.rl_credit_after_hops == ()  # the credit marker, where set, cuts every episode
    # WiSE-FT readings between the warm start and RL's kept weights (stop 90): a quarter of the way from
    # the warm start, wherever RL is read; '' reads none; fractions in (0, 1).
    assert defaults.rl_interpolate == job.RL_INTERPOLATION == (0.25,)
    assert job.parse_args(["--rl-validate-at", ""]).rl_interpolate == ()
    assert job.parse_args(["--rl-interpolate", ""]).rl_interpolate == ()
    assert job.parse_args(["--rl-interpolate", "0.5,0.75,0.5"]).rl_interpolate == (0.75, 0.5)
    for bad in (
        ["--rl-interpolate", "1"],
        ["--rl-interpolate", "half"],
        ["--rl-interpolate", "0.5", "--rl-validate-at", ""],
    ):
        with pytest.raises(SystemExit):
            job.parse_args(bad)
    assert job.parse_args(["--rl-credit-after-hops", "2"]).rl_credit_after_hops == (2,)
    with pytest.raises(SystemExit):
        job.parse_args(["--rl-credit-after-hops", "0"])
    assert (
        defaults.rl_stop_on_fork_rise is None
        and job.parse_args(["--rl-stop-on-fork-rise", "0.05"]).rl_read_forks
    )
    # Validation readings (stop 45's default: after iterations 4, 6 and 8, 20 + 20 questions): the asked-for
    # iterations RL reaches, always with its last; the most right answers win, the latest on a tie (stop 66).
    assert defaults.rl_validate_at == (4, 6, 8) and defaults.validation_questions == 20
    assert job.parse_args(["--rl-iterations", "5"]).rl_validate_at == (4, 5)
    assert job.parse_args(["--smoke"]).rl_validate_at == (1,)
    assert job.parse_args(["--rl-validate-at", "4,6,12"]).rl_validate_at == (4, 6, 8)
    assert job.parse_args(["--rl-validate-at", "6,2", "--rl-iterations", "6"]).rl_validate_at == (2, 6)
    assert job.parse_args(["--rl-validate-at", ""]).rl_validate_at == ()
    for bad in (["--rl-validate-at", "0,4"], ["--rl-validate-at", "four"], ["--validation-questions", "31"]):
        with pytest.raises(SystemExit):
            job.parse_args(bad)
    readings = [
        {"iteration": 4, "correct": 30},
        {"iteration": 6, "correct": 33},
        {"iteration": 8, "correct": 33},
    ]
    assert job.kept_reading(readings)["iteration"] == 8
    assert job.kept_reading(readings[:2])["iteration"] == 6
    assert job.kept_reading([*readings[:2], {"iteration": 8, "correct": 32}])["iteration"] == 6
    assert job.kept_reading([{"iteration": 4, "correct": 35}, *readings[1:]])["iteration"] == 4
    assert job.kept_reading([{"iteration": 4, "correct": 33}, *readings[1:]])["iteration"] == 8


# search_r1_grpo's --smoke runs in test_an_example_submitted_with_ray_job_submit_succeeds (the same checks,
# as a submitted job): one local Ray fewer in the suite.
EXAMPLES = ["search_r1_ppo", "r1_searcher", "r_search_grpo"]


def longest_teacher_turns(args) -> tuple[int, int]:
    """The token count of the longest turn the main job's teacher writes on its world's questions with 1-2
    hops and with 3 (its plan and search turns; the answer turn's evidence is empty here: the compact
    protocol has none), in SmolLM2's tokens."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
    from rllib_search.env.teacher import TeacherPolicy, hops_of
    from rllib_search.llm.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    protocol = MultiTurnSearchEnv(tokenizer, None, None, SearchEnvConfig(protocol=args.protocol)).protocol
    assert args.state_plan and args.lazy_plan and args.echo_plan  # the lazy echo
    teacher = TeacherPolicy(protocol, state_plan=True, lazy_plan=True, echo_plan=True)
    world = generate_world(SyntheticWorldConfig(seed=args.world_seed))
    longest = {False: 0, True: 0}
    for record in world.train + world.test:
        hops = len(hops_of(record))
        for turn in range(hops + 1):
            ids = tokenizer(teacher.segment(record, turn, []), add_special_tokens=False)["input_ids"]
            longest[hops == 3] = max(longest[hops == 3], len(ids))
    return longest[False], longest[True]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples_policy")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def run_example(name: str, *args: str, env: dict | None = None, timeout: int = 600):
    argv = [sys.executable, str(ROOT / "tuned_examples" / f"{name}.py"), *args]
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        argv, cwd=ROOT, env={**environment, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_tuned_example_runs_its_smoke_path(name, tiny_policy, tmp_path):
    """Each example's --smoke: a local Ray with the dashboard, the embedded world, the served retriever (and
    the bundled Gemma judge for R-Search), one training iteration (two for R1-Searcher: one per stage),
    held-out evaluation, a checkpoint, summary.json and training.png (a tiny policy stands in for SmolLM2)."""
    out = tmp_path / "out"
    stdout = run_example(name, "--smoke", "--model", tiny_policy, "--out", str(out), "--num-cpus", "2")
    assert "Ray dashboard: http://127.0.0.1:" in stdout and "Prometheus metrics: http://127.0.0.1:" in stdout
    iterations = assert_smoke_outputs(out, 2 if name == "r1_searcher" else 1)
    if name == "r1_searcher":
        assert [row["reward_stage"] for row in iterations] == [0, 1]
        assert "retrieval" in iterations[0]["reward_components"]
        assert "retrieval" not in iterations[1]["reward_components"]
    if name == "r_search_grpo":
        assert "evidence_f1" in iterations[0]["reward_components"] and iterations[0]["judge_errors"] == 0


def assert_smoke_outputs(out: Path, iterations: int) -> list[dict]:
    """A --smoke run's summary (scale, checkpoint, a row per iteration with 8 held-out questions), plot."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scale"] == "smoke" and Path(summary["checkpoint"], "learner_group").is_dir()
    assert len(summary["iterations"]) == iterations
    assert all(row["held_out"]["num_questions"] == 8 for row in summary["iterations"])
    assert (out / "training.png").stat().st_size > 0
    return summary["iterations"]


def test_the_lambda_sweep_writes_its_tables_and_resumes(tiny_policy, tmp_path):
    out = tmp_path / "sweep"
    argv = ["--smoke", "--seeds", "0,1", "--model", tiny_policy, "--out", str(out), "--num-cpus", "2"]
    run_example("lambda_sweep", *argv)
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((float(r["lambda_format"]), int(r["seed"])) for r in rows) == [
        (0.2, 0),
        (0.2, 1),
        (0.6, 0),
        (0.6, 1),
    ]
    assert all(0.0 <= float(r["held_out_em"]) <= 1.0 for r in rows)
    assert all(int(r["iterations"]) == 1 for r in rows)
    table = (out / "results.md").read_text()
    assert "Mean over seeds" in table and "| 0.600 | 0.000 | 2 |" in table
    assert (out / "curves.png").stat().st_size > 0
    # Run again: the finished experiment is restored, not retrained.
    stdout = run_example("lambda_sweep", *argv)
    assert "resuming the sweep" in stdout
    with (out / "results.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows


@pytest.mark.timing
def test_an_example_submitted_with_ray_job_submit_succeeds(tiny_policy, tmp_path):
    """`ray start --head` on 127.0.0.1, then the README's `RAY_AUTH_MODE=token ray job submit --working-dir .
    -- python tuned_examples/...`: the job joins the cluster without passing resources, SUCCEEDS (the CLI
    waits for it through the Job Submission API) and writes its outputs."""
    import signal

    import psutil

    from rllib_search.serve.ports import free_port

    ray_cli = str(Path(sys.executable).parent / "ray")
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # As in an activated venv: the job's `python` is this interpreter.
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    gcs_port, dashboard_port, agent_port, client_port = free_port(), free_port(), free_port(), free_port()
    # Its own temp dir: `ray start` records its address there, not in /tmp/ray where every later `ray.init()`
    # on this machine would find it (and, once this head is gone, fail to reach it). Short: socket paths.
    temp_dir = tempfile.mkdtemp(prefix="rayjob", dir="/tmp")
    head = subprocess.Popen(
        [
            ray_cli,
            *("start", "--head", "--block", "--temp-dir", temp_dir),
            *("--node-ip-address", "127.0.0.1", "--port", str(gcs_port)),
            *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port), "--num-cpus", "2"),
            # Every fixed default port elsewhere: the test session's own Ray already holds them.
            *("--dashboard-agent-listen-port", str(agent_port), "--ray-client-server-port", str(client_port)),
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    out = tmp_path / "job_out"
    submit = [
        ray_cli,
        *("job", "submit", "--address", f"http://127.0.0.1:{dashboard_port}", "--working-dir", str(ROOT)),
        "--runtime-env-json",
        json.dumps({"excludes": [".venv/", "runs/", "benchmarks/results/"]}),
        "--",
        *("python", "tuned_examples/search_r1_grpo.py", "--smoke", "--model", tiny_policy, "--out", str(out)),
    ]
    try:
        deadline = time.monotonic() + 600
        while True:  # the head's dashboard and job agent take a few seconds to answer
            done = subprocess.run(
                submit,
                env={**environment, "RAY_AUTH_MODE": "token"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            logs = done.stdout + done.stderr
            starting = any(text in logs for text in ("Failed to connect", "No available agent"))
            # A head still starting on a loaded machine can drop the working dir's upload check or the
            # hand-over to its job agent (stop 85: RemoteDisconnected in _package_exists, a 500 with
            # ServerDisconnectedError from submit_job_internal); the job did not start, so submit again.
            starting |= "RemoteDisconnected" in logs and "_upload_package_if_needed" in logs
            starting |= "ServerDisconnectedError" in logs and "submit_job_internal" in logs
            if done.returncode == 0 or not starting:  # else the head is still coming up
                break
            assert time.monotonic() < deadline, done.stderr[-2000:]
            time.sleep(3)
        logs = done.stdout + done.stderr
        assert done.returncode == 0, logs[-4000:]
        assert "succeeded" in logs and "Connecting to existing Ray cluster" in logs
        assert "iter   1/1" in logs and "Ray dashboard: http://127.0.0.1:" in logs
        assert "Prometheus metrics: http://127.0.0.1:" in logs
        assert_smoke_outputs(out, 1)
        assert (out / "checkpoint").is_dir()
    finally:
        for process in [head, *psutil.Process(head.pid).children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.send_signal(signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_relative_out_becomes_absolute(tmp_path, monkeypatch):
    """Tune trials and Serve replicas run in their own working directories: a warm start or checkpoint
    path handed to them must not be relative to the driver's."""
    from rllib_search.recipes.jobs import RecipeJob, job_arguments

    monkeypatch.chdir(tmp_path)
    args = job_arguments("an example", iterations=1).parse_args(["--out", "runs/example"])
    job = RecipeJob("example", args)
    assert job.out.is_absolute() and job.out == tmp_path / "runs" / "example" and job.out.is_dir()
