"""The tuned examples end to end in subprocesses (each starts its own local Ray and Serve, or joins the
cluster it is submitted to): the README's main job, every paper recipe's --smoke path, the λ sweep with its
tables and resume, and an example submitted with the Job Submission API to a `ray start` head."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_search.llm.models import cpu_precision, decide_cpu_precision, describe_cpu
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import RayHead, tuned_example

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_tiny_cpu_grpo_runs_every_stage_and_saves_a_checkpoint(tmp_path):
    """The main job at its smallest sizes with a tiny policy, two GRPO iterations read after each: every
    stage, the table, summary.json, predictions.jsonl, the plot, the warm start and the checkpoint; then
    GRPO again from that warm start (no SFT), with a WiSE-FT check."""
    model = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    out = tmp_path / "run"
    flags = [
        *("--smoke", "--model", str(model), "--threads", "1", "--group-size", "2"),
        *("--rl-iterations", "2", "--rl-validate-at", "1", "--calibration-steps", "2"),
        *("--rl-interpolate", ""),
    ]
    env = {**os.environ, "RLLIB_SEARCH_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    main_job = str(ROOT / "tuned_examples" / "tiny_cpu_grpo.py")
    done = subprocess.run(
        [sys.executable, main_job, "--out", str(out), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out evaluation" in done.stdout and "grpo iter  2/2" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [row["stage"] for row in summary["evaluation"]] == ["before", "after warm start", "after RL"]
    assert len(summary["grpo"]) == 2
    # The job's peak memory over its processes, by stage and by process, and the line that says it.
    memory = summary["memory"]
    assert memory["peak_pss_mb"] > 100 and {"warm start", "rl"} <= set(memory["peak_pss_mb_by_stage"])
    assert memory["peak_pss_mb_by_process"]["driver"] > 100 and "memory: peak " in done.stdout
    assert not (out / ".weights").exists()  # weight snapshots are removed once RL is done
    # The smoke's 32-token turns cut the teacher's: the job says so and counts them.
    assert summary["demonstrated_turns_over_budget"] > 0
    assert "demonstrated turns are longer than the 32-token turn budget" in done.stdout
    # Guidance: the tiny model never answers right, so every sampled group is guided.
    for row in summary["grpo"]:
        assert row["guided_groups"] == 1 and 0 <= row["guided_solved"] <= 1
    assert "guided groups" in done.stdout and summary["settings"]["rl_guidance"]
    # Plan calibration: steps after SFT, each read, until in the window or step 2 is done.
    calibration = summary["fork_calibration"]
    assert [row["step"] for row in calibration] == list(range(1, len(calibration) + 1))
    assert len(calibration) == 2 or calibration[-1]["in_window"]
    assert "fork calibration: " in done.stdout and f"calibration step {len(calibration)}/2" in done.stdout
    # --rl-validate-at 1: validations after iterations 1 and 2 (the last), the kept one's weights evaluated.
    validation = summary["rl_validation"]
    assert [r["iteration"] for r in validation["validations"]] == [1, 2]
    assert validation["questions_per_hop"] == {"1": 2, "2": 2}
    for checked in validation["validations"]:  # which questions each validation answered right, in order
        right = [checked[f"right_{h}hop"] for h in (1, 2)]
        assert [len(r) for r in right] == [2, 2] and all(x in (0, 1) for r in right for x in r)
        assert sum(map(sum, right)) == checked["correct"]
        assert [sum(r) / 2 for r in right] == [checked["em_1hop"], checked["em_2hop"]]
    best = max(r["correct"] for r in validation["validations"])
    assert validation["kept_iteration"] == max(
        r["iteration"] for r in validation["validations"] if r["correct"] == best
    )
    assert f"RL keeps iteration {validation['kept_iteration']}'s weights" in done.stdout
    assert validation["interpolations"] == [] and validation["kept_alpha"] == 1.0
    settings = summary["settings"]
    assert settings["rl_iterations"] == 2 and settings["sft_steps"] == 1  # a flag, and the smoke's size
    low, high = summary["rl_gain_2hop_interval"]
    assert low <= summary["rl_gain_2hop"] <= high
    stages = summary["em"]
    assert summary["rl_gain_2hop"] == pytest.approx(
        stages["after RL"]["2hop"] - stages["after warm start"]["2hop"]
    )
    assert set(summary["searches_per_episode"]["after RL"]) == {"1hop", "2hop"}
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 3 * 2 * 2  # stages x hop counts x questions per hop count
    # The base model's answers before training are stored for the next run.
    assert summary["evaluation"][0]["cached"] is False
    (stored,) = (tmp_path / "cache" / "evaluations").glob("*.json")
    before = json.loads(stored.read_text())["result"]["answers"]
    assert [p["answer"] for p in predictions if p["stage"] == "before"] == before["1"] + before["2"]
    assert (out / "training.png").stat().st_size > 0
    assert (out / "warm_start_model" / "config.json").exists()
    assert Path(summary["checkpoint"], "learner_group").is_dir()
    assert f"machine: {describe_cpu(summary['machine'])}\n" in done.stdout
    # The machine's product speed at the start and the end, and the hypervisor's share of the run.
    speeds = [summary["machine"][f"matmul_gflops_{when}"] for when in ("start", "end")]
    assert all(speed > 0 for speed in speeds) and f"({speeds[0]:.0f} at the start)" in done.stdout
    steal = summary["machine"]["cpu_steal_share"]
    assert steal is None or 0.0 <= steal <= 1.0
    # The precision the default chose by timing both products (where bf16 is native), printed with why.
    recorded = summary["machine"]
    chosen = decide_cpu_precision(recorded["native_bf16"], recorded["fp32_gflops"], recorded["bf16_gflops"])
    assert recorded["precision"] == ("bf16" if chosen.bf16 else "fp32")
    assert f"({chosen.reason()}; --" in done.stdout

    # --warm-start: GRPO from that export, no SFT; its evaluation of the warm start is the first run's.
    again = tmp_path / "again"
    argv = [sys.executable, main_job, "--out", str(again), *flags[:-2]]
    argv += ["--warm-start", str(out / "warm_start_model"), "--rl-interpolate", "0.5"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sft step" not in done.stdout and "no SFT here" in done.stdout
    resumed = json.loads((again / "summary.json").read_text())
    assert [row["stage"] for row in resumed["evaluation"]] == ["after warm start", "after RL"]
    assert resumed["em"]["after warm start"] == stages["after warm start"]
    mixes = resumed["rl_validation"]["interpolations"]
    assert [mix["alpha"] for mix in mixes] == [1.0, 0.5]
    assert mixes[0]["iteration"] == mixes[1]["iteration"] == resumed["rl_validation"]["kept_iteration"]
    best = max(mix["correct"] for mix in mixes)
    assert resumed["rl_validation"]["kept_alpha"] == next(m["alpha"] for m in mixes if m["correct"] == best)
    assert "validation at 0.5 x RL + 0.5 x warm start" in done.stdout
    first = [p for p in predictions if p["stage"] == "after warm start"]
    second = [json.loads(line) for line in (again / "predictions.jsonl").read_text().splitlines()]
    assert [p for p in second if p["stage"] == "after warm start"] == first
    assert not (again / "warm_start_model").exists()


def test_tiny_cpu_grpo_flags_and_defaults():
    job = tuned_example("tiny_cpu_grpo")
    from rllib_search.recipes.tiny_cpu.config import TinyCPUConfig
    from rllib_search.recipes.tiny_cpu.job import best_validation

    defaults, measured = job.parse_config([])
    assert measured and defaults == TinyCPUConfig(bf16=cpu_precision().bf16)
    # Calibration after SFT, then 8 GRPO iterations read after 4, 6 and 8, and a WiSE-FT check at 0.25.
    assert defaults.calibrates and defaults.rl_iterations == 8 and defaults.validation_iterations == (4, 6, 8)
    assert defaults.validation_questions == 20 and defaults.rl_interpolate == (0.25,)
    assert defaults.calibration_turns == 2 and defaults.calibration_questions == 6
    # bf16 where the CPU multiplies it natively and fast enough; --bf16 / --no-bf16 choose.
    assert job.parse_config(["--bf16"]) == (TinyCPUConfig(bf16=True), False)
    assert not job.parse_config(["--no-bf16"])[0].bf16
    assert defaults.rl_guidance and not job.parse_config(["--no-rl-guidance"])[0].rl_guidance
    # GRPO's micro-batch is its minibatch (each group's prompt read once); SFT and calibration keep 4.
    assert (defaults.rl_micro_batch, defaults.micro_batch) == (defaults.minibatch, 4)
    # The turn budget fits every turn the teacher writes on the embedded world.
    assert defaults.max_turn_tokens == 64 and defaults.topk == 2
    assert longest_teacher_turns(defaults) == (60, 57)  # 1-2 hops (a 2-hop second search), 3 hops
    # Calibration pairs 1-hop and 2-hop questions and needs SFT.
    assert not job.parse_config(["--two-hop-demonstrations", "0"])[0].calibrates
    assert not job.parse_config(["--warm-start", "runs/x/warm_start_model"])[0].calibrates
    smoke = job.parse_config(["--smoke", "--no-bf16"])[0]
    assert smoke == TinyCPUConfig().smoke() and smoke.calibrates and smoke.validation_iterations == (1,)
    assert job.parse_config(["--smoke", "--no-bf16", "--rl-iterations", "3"])[0].validation_iterations == (3,)
    # The validations RL chooses among: the asked-for iterations it reaches, always with its last.
    assert job.parse_config(["--rl-iterations", "5", "--no-bf16"])[0].validation_iterations == (4, 5)
    assert job.parse_config(["--rl-validate-at", "4,6,12", "--no-bf16"])[0].validation_iterations == (4, 6, 8)
    assert (
        job.parse_config(["--rl-validate-at", "", "--rl-interpolate", "", "--no-bf16"])[
            0
        ].validation_iterations
        == ()
    )
    assert job.parse_config(["--rl-interpolate", "0.5,0.75", "--no-bf16"])[0].rl_interpolate == (0.5, 0.75)
    for bad in (
        ["--rl-interpolate", "1"],
        ["--rl-interpolate", "half"],
        ["--rl-validate-at", ""],  # the WiSE-FT check chooses by validations
        ["--rl-validate-at", "0,4"],
        ["--validation-questions", "31"],
        ["--group-size", "0"],
    ):
        with pytest.raises(SystemExit):
            job.parse_config([*bad, "--no-bf16"])
    # The most right answers win, the latest on a tie.
    validations = [
        {"iteration": 4, "correct": 30},
        {"iteration": 6, "correct": 33},
        {"iteration": 8, "correct": 33},
    ]
    assert best_validation(validations)["iteration"] == 8
    assert best_validation(validations[:2])["iteration"] == 6
    assert best_validation([*validations[:2], {"iteration": 8, "correct": 32}])["iteration"] == 6
    assert best_validation([{"iteration": 4, "correct": 35}, *validations[1:]])["iteration"] == 4
    # At most 25 flags: the example reads top to bottom.
    assert len([a for a in job.build_parser()._actions if a.option_strings and a.dest != "help"]) <= 25


# search_r1_grpo's --smoke runs in test_an_example_submitted_with_ray_job_submit_succeeds (the same checks,
# as a submitted job): one local Ray fewer in the suite.
EXAMPLES = ["search_r1_ppo", "r1_searcher", "r_search_grpo"]


def longest_teacher_turns(config) -> tuple[int, int]:
    """The token count of the longest turn the main job's teacher writes on its world's questions with 1-2
    hops and with 3 (its plan and search turns; the answer turn's evidence is empty here: the compact
    protocol has none), in SmolLM2's tokens."""
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
    from rllib_search.env.teacher import TeacherPolicy, hops_of
    from rllib_search.llm.models import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    protocol = MultiTurnSearchEnv(tokenizer, None, None, SearchEnvConfig(protocol=config.protocol)).protocol
    teacher = TeacherPolicy(protocol, **config.teacher)
    world = generate_world(SyntheticWorldConfig(seed=config.world_seed))
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
    assert "Ray dashboard: http://127.0.0.1:" in stdout and "Prometheus metrics: http://" in stdout
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
    assert all(r["design"] == "one-at-a-time" for r in rows)
    table = (out / "results.md").read_text()
    assert "Mean over seeds" in table and "| 0.600 | 0.000 | 2 |" in table
    assert "Design: one-at-a-time: λ_f [0.2, 0.6] at λ_r = 0, then λ_r [0.0] at λ_f = 0.2" in table
    assert "## Best (one-at-a-time design)" in table
    assert "best trial (`ResultGrid.get_best_result()`)" in table
    assert (out / "curves.png").stat().st_size > 0
    assert json.loads((out / "tune" / "sweep_spec.json").read_text())["seeds"] == [0, 1]
    # Run again: the finished experiment is restored, not retrained.
    stdout = run_example("lambda_sweep", *argv)
    assert "resuming the λ sweep" in stdout
    with (out / "results.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows


@pytest.mark.timing
def test_an_example_submitted_with_ray_job_submit_succeeds(tiny_policy, tmp_path):
    """`ray start --head` on 127.0.0.1, then the README's `RAY_AUTH_MODE=token ray job submit --working-dir .
    -- python tuned_examples/...`: the job joins the cluster without passing resources, SUCCEEDS (the CLI
    waits for it through the Job Submission API) and writes its outputs."""

    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # As in an activated venv: the job's `python` is this interpreter.
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    head = RayHead("rayjob", environment)
    out = tmp_path / "job_out"
    submit = [
        *("--working-dir", str(ROOT)),
        "--runtime-env-json",
        json.dumps({"excludes": [".venv/", "runs/", "benchmarks/results/"]}),
        "--",
        *("python", "tuned_examples/search_r1_grpo.py", "--smoke", "--model", tiny_policy, "--out", str(out)),
    ]
    try:
        done = head.submit(submit, environment)
        logs = done.stdout + done.stderr
        assert done.returncode == 0, logs[-4000:]
        assert "succeeded" in logs and "Connecting to existing Ray cluster" in logs
        assert "iter   1/1" in logs and "Ray dashboard: http://127.0.0.1:" in logs
        assert "Prometheus metrics: http://" in logs
        assert_smoke_outputs(out, 1)
        assert (out / "checkpoint").is_dir()
    finally:
        head.stop()


def test_a_relative_out_becomes_absolute(tmp_path, monkeypatch):
    """Tune trials and Serve replicas run in their own working directories: a warm start or checkpoint
    path handed to them must not be relative to the driver's."""
    from rllib_search.recipes.jobs import RecipeJob, job_arguments

    monkeypatch.chdir(tmp_path)
    args = job_arguments("an example", iterations=1).parse_args(["--out", "runs/example"])
    job = RecipeJob("example", args)
    assert job.out.is_absolute() and job.out == tmp_path / "runs" / "example" and job.out.is_dir()
