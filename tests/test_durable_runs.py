"""Runs that outlive their driver: where a recipe job writes (standalone, and as a submitted Ray job whose
working directory Ray deletes), the default periodic checkpoints, a driver killed mid-run and resumed, a
finished run trained further, and checkpoint saves that stay atomic when they are interrupted between
their renames or share a directory with another writer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rllib_search.algos.checkpoints import periodic
from rllib_search.algos.checkpoints.periodic import (
    METADATA_FILE,
    PeriodicCheckpoints,
    checkpoint_iteration,
    latest_checkpoint,
    recover_checkpoint,
    save_atomically,
)
from rllib_search.recipes import jobs
from rllib_search.recipes.jobs import RecipeJob, job_arguments, output_directory
from tests.helpers import RayHead

ROOT = Path(__file__).resolve().parents[1]
JOB_VARIABLES = ("RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_JOB_ID", "RLLIB_SEARCH_RUNS")


# --- where the outputs go ---------------------------------------------------------------------------------
@pytest.fixture
def standalone(monkeypatch, tmp_path):
    """A driver started by hand in ``tmp_path/work``, with ``tmp_path/home`` as its home."""
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_a_standalone_run_writes_under_runs_in_its_working_directory(standalone):
    assert output_directory("search_r1_grpo", None) == standalone / "work" / "runs" / "search_r1_grpo"
    assert output_directory("x", "elsewhere/run") == standalone / "work" / "elsewhere" / "run"
    assert output_directory("x", str(standalone / "abs")) == standalone / "abs"
    assert output_directory("x", "~/mine") == standalone / "home" / "mine"
    assert jobs.submitted_job() is None


def test_a_submitted_job_writes_outside_the_working_directory_ray_unpacked(standalone, monkeypatch):
    """``ray job submit --working-dir .`` runs the driver in Ray's unpacked copy, which Ray deletes: the
    default and a relative ``--out`` go under ``~/rllib_search_runs`` (or ``$RLLIB_SEARCH_RUNS``)."""
    home_runs = standalone / "home" / "rllib_search_runs"
    metadata = {"metadata": {"job_submission_id": "raysubmit_abc"}, "runtime_env": {}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(metadata))
    assert jobs.submitted_job() == "Ray job raysubmit_abc"
    assert output_directory("search_r1_grpo", None) == home_runs / "search_r1_grpo"
    assert output_directory("x", "runs/x") == home_runs / "runs" / "x"
    assert output_directory("x", str(standalone / "shared" / "x")) == standalone / "shared" / "x"
    monkeypatch.setenv("RLLIB_SEARCH_RUNS", str(standalone / "nfs"))
    assert output_directory("search_r1_grpo", None) == standalone / "nfs" / "search_r1_grpo"

    # Known by its working directory alone, as in Ray's session directory layout.
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    monkeypatch.delenv("RLLIB_SEARCH_RUNS")
    package = standalone / "session_2026" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0a1b"
    package.mkdir(parents=True)
    monkeypatch.chdir(package)
    assert jobs.submitted_job() == "a Ray job"
    out = output_directory("search_r1_grpo", None)
    assert out == home_runs / "search_r1_grpo" and not out.is_relative_to(package)
    monkeypatch.chdir(standalone / "work")
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    assert jobs.submitted_job() == "Ray job 02000000"


def test_the_job_prints_its_absolute_output_directory_at_the_start_and_the_end(
    standalone, monkeypatch, capsys
):
    monkeypatch.setattr(jobs, "connect", lambda *args, **kwargs: [])
    args = job_arguments("an example", iterations=3).parse_args(["--out", "relative/out"])
    with RecipeJob("example", args) as job:
        assert job.out == standalone / "work" / "relative" / "out" and job.out.is_dir()
        assert args.out == str(job.out)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"output directory: {job.out}") and lines[-1].endswith(
        f"output directory: {job.out}"
    )

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"metadata": {"job_submission_id": "j1"}}))
    with RecipeJob("example", job_arguments("an example", iterations=3).parse_args([])) as job:
        pass
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(
        f"output directory: {standalone / 'home' / 'rllib_search_runs' / 'example'} "
        "(Ray job j1: outside its temporary working directory)"
    )


def test_recipes_checkpoint_periodically_by_default(standalone):
    parser = job_arguments("an example", iterations=100)
    every = {
        flags: RecipeJob("example", parser.parse_args(list(flags))).checkpoint_every
        for flags in [
            (),
            ("--embedded",),
            ("--smoke",),
            ("--checkpoint-every", "0"),
            ("--checkpoint-every", "3"),
        ]
    }
    assert list(every.values()) == [10, 5, 1, 0, 3]


def test_a_new_run_over_an_earlier_runs_checkpoints_stops_and_says_to_resume(standalone, monkeypatch):
    monkeypatch.setattr(jobs, "connect", lambda *args, **kwargs: [])
    out = standalone / "run"
    (out / "checkpoints" / "checkpoint_000010").mkdir(parents=True)
    (out / "checkpoint").mkdir()
    parser = job_arguments("an example", iterations=20)
    with (
        pytest.raises(SystemExit, match="--resume continues it"),
        RecipeJob("example", parser.parse_args(["--out", str(out)])),
    ):
        pass
    assert (out / "checkpoint").is_dir() and (out / "checkpoints" / "checkpoint_000010").is_dir()
    # --smoke starts over in place.
    job = RecipeJob("example", parser.parse_args(["--out", str(out), "--smoke"]))
    job._start_over()
    assert not (out / "checkpoint").exists() and not list((out / "checkpoints").iterdir())


# --- atomic saves -----------------------------------------------------------------------------------------
class FakeAlgo:
    """What ``save_atomically`` needs of an Algorithm: ``iteration`` and ``save_to_path``."""

    def __init__(self, iteration: int, tag: str) -> None:
        self.iteration, self.tag = iteration, tag

    def save_to_path(self, path: str) -> str:
        Path(path).mkdir(parents=True)
        (Path(path) / "state.json").write_text(json.dumps({"tag": self.tag}))
        (Path(path) / "weights.bin").write_bytes(b"w" * 64)
        return path


def tag_of(path: Path) -> str:
    return json.loads((path / "state.json").read_text())["tag"]


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def live_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def stamp_of(pid: int, host: str | None = None) -> str:
    return f"{host or periodic._host()}-{pid}-{periodic._process_start(pid)}-0123abcd"


def test_a_resave_replaces_the_checkpoint_and_records_its_iteration(tmp_path):
    final = tmp_path / "checkpoint"
    assert save_atomically(FakeAlgo(2, "old"), final) == final
    assert save_atomically(FakeAlgo(3, "new"), final) == final
    assert tag_of(final) == "new" and checkpoint_iteration(final) == 3
    assert json.loads((final / METADATA_FILE).read_text())["iteration"] == 3
    assert hidden(tmp_path) == []


class Killed(Exception):
    """Stands for a kill at that point of a save."""


def stop_after_renames(monkeypatch, count: int) -> None:
    """Make the next saves stop right after their ``count``-th rename (raising :class:`Killed`)."""
    rename, done = periodic._rename, []

    def interrupted(source: Path, target: Path) -> None:
        rename(source, target)
        done.append(target)
        if len(done) == count:
            raise Killed(f"killed after rename {count}")

    monkeypatch.setattr(periodic, "_rename", interrupted)


@pytest.mark.parametrize("renames", [1, 2])
def test_a_resave_interrupted_between_its_steps_leaves_a_loadable_checkpoint(tmp_path, monkeypatch, renames):
    """A re-save stopped after its first rename (the old checkpoint moved aside, the new one not yet in
    place) or after its second (the old one not yet deleted): the loader's check finds the new checkpoint,
    and the next save clears what the stopped one left."""
    from rllib_search.algos.checkpoints.check import check_checkpoint

    final = tmp_path / "checkpoint"
    save_atomically(FakeAlgo(2, "old"), final)
    with monkeypatch.context() as patch:
        stop_after_renames(patch, renames)
        with pytest.raises(Killed):
            save_atomically(FakeAlgo(3, "new"), final)
    assert final.exists() == (renames == 2)
    assert len(hidden(tmp_path)) == (2 if renames == 1 else 1)  # the replaced one (and the new one)
    assert check_checkpoint(final) == final
    assert tag_of(final) == "new" and checkpoint_iteration(final) == 3
    save_atomically(FakeAlgo(4, "newer"), final)
    assert tag_of(final) == "newer" and hidden(tmp_path) == []


def test_when_only_the_replaced_checkpoint_is_complete_it_comes_back(tmp_path):
    """A writer killed between its renames whose new checkpoint lacks its completion mark (a kill while the
    mark was written): the checkpoint it was replacing is the one put back."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    pid = int(gone.stdout)  # a process that has exited: its directories are leftovers
    stamp = f"{periodic._host()}-{pid}-1-0123abcd"
    final = tmp_path / "checkpoints" / "checkpoint_000004"
    FakeAlgo(4, "old").save_to_path(str(final.parent / f".replaced-checkpoint_000004-{stamp}"))
    FakeAlgo(4, "torn").save_to_path(str(final.parent / f".tmp-checkpoint_000004-{stamp}"))
    assert latest_checkpoint(final.parent) == final and tag_of(final) == "old"
    save_atomically(FakeAlgo(5, "next"), final.parent / "checkpoint_000005")
    assert hidden(final.parent) == [] and checkpoint_iteration(final) == 4


def test_another_writers_temporary_directory_survives_a_save(tmp_path):
    writer = live_process()
    try:
        theirs = tmp_path / f".tmp-checkpoint_000007-{stamp_of(writer.pid)}"
        other_host = tmp_path / f".tmp-checkpoint_000008-{stamp_of(os.getpid(), host='another_node')}"
        mine_before = tmp_path / f".tmp-checkpoint_000006-{stamp_of(os.getpid())}"  # this process's leftover
        for directory in (theirs, other_host, mine_before):
            FakeAlgo(0, "partial").save_to_path(str(directory))
        (tmp_path / ".tmp-checkpoint_000003-1").mkdir()  # no owner stamp: not a save in progress
        saver = PeriodicCheckpoints(tmp_path, every_n_iterations=1, keep_last=1)
        saver.save(FakeAlgo(9, "nine"), 9)
        assert theirs.is_dir() and other_host.is_dir()
        assert not mine_before.exists() and not (tmp_path / ".tmp-checkpoint_000003-1").exists()
        assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint_000009"
    finally:
        writer.kill()
        writer.wait()
    saver.save(FakeAlgo(10, "ten"), 10)  # its writer is gone now: a leftover
    assert not theirs.exists() and other_host.is_dir()
    assert [p.name for p in periodic.checkpoints(tmp_path)] == ["checkpoint_000010"]


def test_a_live_writer_in_the_middle_of_its_swap_is_waited_for_not_robbed(tmp_path):
    writer = live_process()
    try:
        final = tmp_path / "checkpoint"
        FakeAlgo(1, "old").save_to_path(str(tmp_path / f".replaced-checkpoint-{stamp_of(writer.pid)}"))
        assert recover_checkpoint(final, wait_s=0.3) is None  # its own rename comes next
        threading.Timer(0.3, lambda: FakeAlgo(2, "new").save_to_path(str(final))).start()
        assert recover_checkpoint(final, wait_s=10) == final and tag_of(final) == "new"
    finally:
        writer.kill()
        writer.wait()


# --- the recipe job resumed ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def searching_model(tmp_path_factory, world) -> str:
    """A tiny policy taught to open its answers with a search, so that rollouts call the retriever."""
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit

    root = tmp_path_factory.mktemp("durable_model")
    model = build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok"))
    questions = [record.question for record in world.train[:6]]
    return str(teach_to_emit(model, root / "searching", questions, "<search> capital city </search>"))


def run_until(command: list[str], marker: str | None, timeout_s: float = 500) -> list[str]:
    """Run ``command`` (this repository's root on PYTHONPATH) in a session of its own and return its lines:
    up to the first that contains ``marker``, after which its whole process group is killed with SIGKILL
    (the driver and the Ray it started), or all of them once it exits by itself."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    watchdog = threading.Timer(timeout_s, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if marker is not None and marker in line:
                os.killpg(process.pid, signal.SIGKILL)
                break
        process.wait()
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert marker is not None or process.returncode == 0, "\n".join(lines[-30:])
    return lines


def history_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_recipe_job_killed_mid_run_resumes_with_its_history(searching_model, world, corpus, tmp_path):
    """The driver killed with SIGKILL after iteration 3 (checkpoint at 2): ``--resume`` continues from
    iteration 2; history keeps rows 1 and 2 as they were and gets 3 and 4 (3 trained again, the same)."""
    from rllib_search.data.formats import write_qa_jsonl

    questions = tmp_path / "questions.jsonl"
    write_qa_jsonl(world.train, questions)
    out = tmp_path / "run"
    run = [sys.executable, "-m", "tests.resumable_run", str(out), "--model", searching_model, "--job"]
    run += ["--corpus", corpus, "--questions", str(questions), "--iterations", "4", "--checkpoint-every", "2"]
    lines = run_until(run, "iter   3/4")
    before = history_rows(out)
    assert [row["iteration"] for row in before] == [1, 2, 3]
    assert [p.name for p in periodic.checkpoints(out / "checkpoints")] == ["checkpoint_000002"]
    assert not (out / "checkpoint").exists() and any(f"output directory: {out}" in line for line in lines)

    lines = run_until([*run, "--resume"], None)
    assert any(f"resumed from {out / 'checkpoints' / 'checkpoint_000002'} at iteration 2" in x for x in lines)
    assert not any("iter   1/4" in line or "iter   2/4" in line for line in lines)
    after = history_rows(out)
    assert [row["iteration"] for row in after] == [1, 2, 3, 4]
    assert json.dumps(after[:2]) == json.dumps(before[:2])
    for key in ("reward", "searches", "kl"):  # the same data and weights: iteration 3 trained the same
        assert after[2][key] == pytest.approx(before[2][key], rel=1e-5, abs=1e-6, nan_ok=True)
    summary = json.loads((out / "summary.json").read_text())
    assert json.dumps(summary["iterations"]) == json.dumps(after)
    assert checkpoint_iteration(out / "checkpoint") == 4
    assert lines[-1].endswith(f"output directory: {out}")


@pytest.mark.slow
def test_a_finished_run_resumed_trains_only_the_extra_iterations(
    ray_cluster, searching_model, world, corpus, tmp_path, monkeypatch, capsys
):
    """The default at paper scale (a periodic checkpoint every 10 iterations) over 2 iterations leaves only
    the final checkpoint: ``--resume --iterations 3`` continues from it; asked again for 3 there is nothing
    left to do; a final re-save interrupted between its renames is recovered by the next ``--resume``."""
    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.data.formats import write_qa_jsonl
    from tests.helpers import make_config

    questions = tmp_path / "questions.jsonl"
    write_qa_jsonl(world.train, questions)
    out = tmp_path / "out"
    common = ["--out", str(out), "--data", str(questions), "--seed", "11"]
    parser = job_arguments("a tiny GRPO run", iterations=2)

    def train(*flags: str) -> dict:
        with RecipeJob("tiny", parser.parse_args([*common, *flags])) as job:
            return job.train(make_config(SearchGRPOConfig, searching_model, world, corpus))

    first = train()
    assert not (out / "checkpoints").exists() and checkpoint_iteration(out / "checkpoint") == 2
    capsys.readouterr()
    more = train("--resume", "--iterations", "3")
    printed = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoint'} at iteration 2" in printed
    assert "iter   3/3" in printed and "iter   1/3" not in printed and "iter   2/3" not in printed
    assert json.dumps(more["iterations"][:2]) == json.dumps(first["iterations"])
    assert [row["iteration"] for row in history_rows(out)] == [1, 2, 3]
    assert checkpoint_iteration(out / "checkpoint") == 3

    kept = {name: (out / name).read_bytes() for name in ("history.jsonl", "summary.json")}
    state_file = next((out / "checkpoint").glob("algorithm_state.*"))
    state_time = state_file.stat().st_mtime_ns
    again = train("--resume", "--iterations", "3")
    assert "nothing left to do" in capsys.readouterr().out
    assert json.dumps(again) == json.dumps(json.loads(kept["summary.json"]))
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert state_file.stat().st_mtime_ns == state_time

    # A new run without --resume would train over this one: it stops and says so.
    with pytest.raises(SystemExit, match="--resume continues it"):
        train("--iterations", "3")

    # Trained on to 4, the final save stops between its renames (a kill there): the next --resume finds the
    # complete new checkpoint, trains nothing, and writes the outputs that the stopped run did not.
    with monkeypatch.context() as patch:
        stop_after_renames(patch, 1)
        with pytest.raises(Killed):
            train("--resume", "--iterations", "4")
    assert not (out / "checkpoint").exists()
    capsys.readouterr()
    done = train("--resume", "--iterations", "4")
    printed = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoint'} at iteration 4" in printed and "nothing to train" in printed
    assert [row["iteration"] for row in done["iterations"]] == [1, 2, 3, 4]
    assert json.dumps(done["iterations"][:3]) == json.dumps(more["iterations"])
    assert hidden(out) == [] and checkpoint_iteration(out / "checkpoint") == 4


@pytest.mark.slow
def test_an_example_submitted_without_out_keeps_its_outputs(tmp_path):
    """``ray job submit --working-dir . -- python tuned_examples/search_r1_grpo.py --smoke``, no ``--out``:
    the outputs land in ``$RLLIB_SEARCH_RUNS/search_r1_grpo`` (here a temporary directory passed through
    the job's runtime env), not in the unpacked working directory Ray deletes, and the job prints where."""

    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    policy = str(build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok")))
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    head = RayHead("rayruns", environment)
    temp_dir = head.temp_dir
    runs = tmp_path / "runs"
    runtime_env = {
        "excludes": [".venv/", "runs/", "benchmarks/results/"],
        "env_vars": {"RLLIB_SEARCH_RUNS": str(runs), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    }
    submit = [
        *("--working-dir", str(ROOT), "--runtime-env-json", json.dumps(runtime_env), "--"),
        *("python", "tuned_examples/search_r1_grpo.py", "--smoke", "--model", policy),
    ]
    try:
        done = head.submit(submit, environment)
        logs = done.stdout + done.stderr
        assert done.returncode == 0, logs[-4000:]
        out = runs / "search_r1_grpo"
        assert f"output directory: {out} (Ray job raysubmit_" in logs
        assert logs.count(f"output directory: {out}") == 2
        summary = json.loads((out / "summary.json").read_text())
        assert summary["scale"] == "smoke" and [row["iteration"] for row in summary["iterations"]] == [1]
        assert (out / "checkpoint").is_dir() and (out / "checkpoints" / "checkpoint_000001").is_dir()
        assert (out / "history.jsonl").read_text().count("\n") == 1
        unpacked = temp_dir.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*")
        assert not any((package / "runs").exists() for package in unpacked)
    finally:
        head.stop()
