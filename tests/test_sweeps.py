"""The Tune sweeps: ``rllib_search.recipes.sweeps.fit_or_restore`` (the metric and mode it gives the
TuneConfig, the spec it records and checks before resuming, and a resumed experiment whose driver was killed
before all its trials existed) and the λ sweep's designs, guard and tables (``recipes/train_cli.py``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from rllib_search.recipes import sweeps, train_cli
from rllib_search.recipes.train_cli import (
    HELD_OUT_EM,
    STUDY_LAMBDA_FORMAT,
    STUDY_LAMBDA_RETRIEVAL,
    TRAINING_EM,
    LambdaSweep,
    sweep_points,
)

ROOT = Path(__file__).resolve().parents[1]


# --- the designs -----------------------------------------------------------------------------------------
def test_one_at_a_time_varies_lambda_f_at_zero_then_lambda_r_at_the_study_lambda_f():
    points = sweep_points("one-at-a-time", STUDY_LAMBDA_FORMAT, STUDY_LAMBDA_RETRIEVAL)
    assert points == [
        (0.2, 0.0),
        (0.4, 0.0),
        (0.6, 0.0),
        (0.8, 0.0),  # λ_f at λ_r = 0; (0.2, 0.0) is also λ_r = 0 of the second part, trained once
        (0.2, 0.1),
        (0.2, 0.3),
        (0.2, 0.5),
    ]
    assert len(set(points)) == len(points)


def test_one_at_a_time_takes_the_fixed_lambda_f_asked_for_else_the_first():
    assert sweep_points("one-at-a-time", (0.2, 0.6), (0.0, 0.1), 0.6) == [(0.2, 0.0), (0.6, 0.0), (0.6, 0.1)]
    # 0.2 is not among the λ_f values: the first of them
    assert sweep_points("one-at-a-time", (0.4, 0.8), (0.1,)) == [(0.4, 0.0), (0.8, 0.0), (0.4, 0.1)]
    # the smoke sweep: the λ_r part is the shared pair only
    assert sweep_points("one-at-a-time", (0.2, 0.6), (0.0,)) == [(0.2, 0.0), (0.6, 0.0)]


def test_the_grid_design_is_the_cross_product_each_pair_once():
    points = sweep_points("grid", STUDY_LAMBDA_FORMAT, STUDY_LAMBDA_RETRIEVAL)
    assert len(points) == 16 and len(set(points)) == 16
    assert set(points) == {(f, r) for f in STUDY_LAMBDA_FORMAT for r in STUDY_LAMBDA_RETRIEVAL}
    assert sweep_points("grid", (0.2, 0.2), (0.0,)) == [(0.2, 0.0)]
    with pytest.raises(ValueError, match="unknown design"):
        sweep_points("diagonal", (0.2,), (0.0,))


def parsed(*argv: str):
    return train_cli.with_embedded_iterations(train_cli.parser("lambda_sweep").parse_args(list(argv)), 10)


def test_the_flags_choose_the_design_and_one_at_a_time_is_the_default():
    paper = train_cli.lambda_sweep(parsed(), 300, held_out=True)
    assert paper.design == "one-at-a-time" and paper.fixed_lambda_format == 0.2
    assert len(paper.points()) == 7 and paper.metric == HELD_OUT_EM
    assert paper.describe() == (
        "one-at-a-time: λ_f [0.2, 0.4, 0.6, 0.8] at λ_r = 0, then λ_r [0.0, 0.1, 0.3, 0.5] at λ_f = 0.2"
    )
    grid = train_cli.lambda_sweep(parsed("--embedded", "--design", "grid"), 10, held_out=True)
    assert grid.design == "grid" and grid.fixed_lambda_format is None and len(grid.points()) == 8
    assert grid.describe().startswith("grid: ")
    fixed = train_cli.lambda_sweep(
        parsed("--lambda-format", "0.2,0.6", "--fixed-lambda-format", "0.6"), 5, held_out=False
    )
    assert fixed.points()[-3:] == [(0.6, 0.1), (0.6, 0.3), (0.6, 0.5)] and fixed.metric == TRAINING_EM
    with pytest.raises(SystemExit, match="--fixed-lambda-format is for --design one-at-a-time"):
        train_cli.lambda_sweep(parsed("--design", "grid", "--fixed-lambda-format", "0.2"), 5, held_out=True)


# --- metric, mode and the spec guard ---------------------------------------------------------------------
class FakeTuner:
    """``tune.Tuner`` without Ray: records how it was made (new, or restored) and fits to no trials."""

    made: ClassVar[list[tuple[str, dict]]] = []

    def __init__(self, trainable, **kwargs):
        FakeTuner.made.append(("new", kwargs))

    @classmethod
    def restore(cls, path, **kwargs):
        FakeTuner.made.append(("restore", {"path": path, **kwargs}))
        return cls.__new__(cls)

    @staticmethod
    def can_restore(path):
        return Path(path, "tuner.pkl").exists()

    def fit(self):
        return SimpleNamespace(errors=[])


@pytest.fixture
def fake_tuner(monkeypatch):
    from ray import tune

    FakeTuner.made = []
    monkeypatch.setattr(tune, "Tuner", FakeTuner)
    return FakeTuner


def smoke_sweep(**changes) -> LambdaSweep:
    fields = {
        "design": "one-at-a-time",
        "lambda_format": (0.2, 0.6),
        "lambda_retrieval": (0.0,),
        "seeds": (0, 1),
        "iterations": 1,
        "scale": "smoke",
        "metric": HELD_OUT_EM,
        "fixed_lambda_format": 0.2,
    }
    return LambdaSweep(**{**fields, **changes})


def test_the_sweep_gives_the_tune_config_its_metric_and_mode(fake_tuner, tmp_path):
    """run_sweep: one grid search over the design's (λ_f, λ_r) pairs and one over the seeds, the callback
    that puts the metric in every result, and TuneConfig(metric="held_out_em", mode="max")."""
    from rllib_search.recipes import search_r1_grpo

    recipe = search_r1_grpo(dataset=[], retriever={"type": "bm25", "corpus": "c"}, scale="cpu")
    job = SimpleNamespace(out=tmp_path, iterations=1, say=print)
    args = SimpleNamespace(fresh=False, max_concurrent=None)
    train_cli.run_sweep(job, recipe, smoke_sweep(), args)

    ((how, made),) = fake_tuner.made
    assert how == "new"
    assert made["tune_config"].metric == "held_out_em" and made["tune_config"].mode == "max"
    space = made["param_space"]
    assert space.env_config["reward_config"] == {
        "grid_search": [
            {"lambda_format": 0.2, "lambda_retrieval": 0.0},
            {"lambda_format": 0.6, "lambda_retrieval": 0.0},
        ]
    }
    assert space.seed == {"grid_search": [0, 1]}
    assert train_cli.report_sweep_metrics in space.callbacks_on_train_result
    assert made["run_config"].stop == {"training_iteration": 1}
    assert json.loads((tmp_path / "tune" / sweeps.SPEC_FILE).read_text()) == smoke_sweep().spec()


def test_every_result_carries_the_metrics_nan_where_an_iteration_has_none():
    evaluated = {"evaluation": {"em": 0.25}, "env_runners": {"reward": {"em": 0.5, "format": 1.0}}}
    train_cli.report_sweep_metrics(algorithm=None, metrics_logger=None, result=evaluated)
    assert evaluated[HELD_OUT_EM] == 0.25 and evaluated[TRAINING_EM] == 0.5
    not_evaluated = {"env_runners": {}}
    train_cli.report_sweep_metrics(algorithm=None, metrics_logger=None, result=not_evaluated)
    assert math.isnan(not_evaluated[HELD_OUT_EM]) and math.isnan(not_evaluated[TRAINING_EM])


def fit(tmp_path: Path, spec: dict, *, fresh: bool = False):
    return sweeps.fit_or_restore(
        object,
        {},
        storage=tmp_path,
        name="tune",
        iterations=1,
        fresh=fresh,
        say=print,
        spec=spec,
        metric="held_out_em",
        mode="max",
    )


def test_a_matching_spec_resumes_and_another_grid_is_refused(fake_tuner, tmp_path):
    experiment = tmp_path / "tune"
    fit(tmp_path, smoke_sweep().spec())
    (experiment / "tuner.pkl").write_bytes(b"")  # what Tune leaves to restore from
    assert [how for how, _ in fake_tuner.made] == ["new"]

    fit(tmp_path, smoke_sweep().spec())  # the same sweep: resumed
    assert [how for how, _ in fake_tuner.made] == ["new", "restore"]

    another = smoke_sweep(lambda_format=(0.2, 0.4)).spec()
    with pytest.raises(sweeps.SpecMismatch) as refused:
        fit(tmp_path, another)
    message = str(refused.value)
    assert "lambda_format: recorded [0.2, 0.6], asked [0.2, 0.4]" in message
    assert "--fresh" in message and "another --out" in message and str(experiment) in message
    with pytest.raises(sweeps.SpecMismatch, match="design: recorded 'one-at-a-time', asked 'grid'"):
        fit(tmp_path, smoke_sweep(design="grid", fixed_lambda_format=None).spec())
    with pytest.raises(sweeps.SpecMismatch, match="iterations: recorded 1, asked 3"):
        fit(tmp_path, smoke_sweep(iterations=3).spec())
    with pytest.raises(sweeps.SpecMismatch, match=r"seeds: recorded \[0, 1\], asked \[0\]"):
        fit(tmp_path, smoke_sweep(seeds=(0,)).spec())
    assert [how for how, _ in fake_tuner.made] == ["new", "restore"]

    fit(tmp_path, another, fresh=True)  # --fresh: a new experiment, which records the new spec
    assert [how for how, _ in fake_tuner.made] == ["new", "restore", "new"]
    assert json.loads((experiment / sweeps.SPEC_FILE).read_text()) == another
    fit(tmp_path, another)
    assert [how for how, _ in fake_tuner.made][-1] == "restore"


def test_an_experiment_that_records_no_spec_is_not_resumed_for_one(fake_tuner, tmp_path):
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "tuner.pkl").write_bytes(b"")
    with pytest.raises(sweeps.SpecMismatch, match="records no spec"):
        fit(tmp_path, smoke_sweep().spec())
    sweeps.fit_or_restore(object, {}, storage=tmp_path, name="tune", iterations=1, say=print)  # no spec asked
    assert [how for how, _ in fake_tuner.made] == ["restore"]


def test_the_command_refuses_another_grid_in_the_same_out_before_starting_ray(tmp_path):
    out = tmp_path / "sweep"
    experiment = out / "tune"
    experiment.mkdir(parents=True)
    sweeps.record_spec(experiment, smoke_sweep(seeds=(0,)).spec())
    (experiment / "tuner.pkl").write_bytes(b"")
    with pytest.raises(SystemExit) as refused:
        train_cli.train("lambda_sweep", ["--smoke", "--out", str(out), "--lambda-format", "0.2,0.4"])
    message = str(refused.value.code)
    assert (
        message.startswith("lambda_sweep: ")
        and "lambda_format: recorded [0.2, 0.6], asked [0.2, 0.4]" in message
    )
    assert "--fresh" in message
    # the recorded sweep itself passes the guard (it is then resumed)
    args = parsed("--smoke", "--out", str(out))
    job = SimpleNamespace(out=out, args=args)
    train_cli.refuse_another_spec(job, train_cli.lambda_sweep(args, 1, held_out=True))
    job.args.fresh = True
    train_cli.refuse_another_spec(
        job, train_cli.lambda_sweep(parsed("--smoke", "--design", "grid"), 1, held_out=True)
    )


# --- tables ----------------------------------------------------------------------------------------------
def fake_result(lf: float, lr: float, seed: int, em: float):
    return SimpleNamespace(
        config={"env_config": {"reward_config": {"lambda_format": lf, "lambda_retrieval": lr}}, "seed": seed},
        metrics={
            "training_iteration": 1,
            "env_runners": {"episode_return_mean": 0.5},
            "evaluation": {"em": em, "format_valid": 1.0, "searches_per_episode": 1.0},
            HELD_OUT_EM: em,
            TRAINING_EM: 0.1,
        },
        metrics_dataframe=None,
    )


class FakeResults(list):
    def get_best_result(self):
        return max(self, key=lambda result: result.metrics[HELD_OUT_EM])


def test_the_tables_name_the_design_and_the_best_of_each_part(tmp_path):
    sweep = smoke_sweep(lambda_retrieval=(0.0, 0.1), seeds=(0,))
    results = FakeResults(
        [fake_result(0.2, 0.0, 0, 0.3), fake_result(0.6, 0.0, 0, 0.5), fake_result(0.2, 0.1, 0, 0.4)]
    )
    rows = train_cli.trial_rows(results, sweep)
    train_cli.write_tables(rows, tmp_path, sweep, train_cli.best_lines(results, rows, sweep))
    text = (tmp_path / "results.md").read_text()
    assert "Design: one-at-a-time: λ_f [0.2, 0.6] at λ_r = 0, then λ_r [0.0, 0.1] at λ_f = 0.2" in text
    assert "## Best (one-at-a-time design)" in text
    assert (
        "best trial (`ResultGrid.get_best_result()`): λ_f = 0.6, λ_r = 0.0, seed 0: held-out EM 0.500" in text
    )
    assert "best λ_f at λ_r = 0: λ_f = 0.6, λ_r = 0.0: held-out EM 0.500" in text
    assert "best λ_r at λ_f = 0.2: λ_f = 0.2, λ_r = 0.1: held-out EM 0.400" in text
    assert (tmp_path / "results.csv").read_text().splitlines()[1].startswith("one-at-a-time,0.2,0.0,0,")

    grid = smoke_sweep(design="grid", fixed_lambda_format=None, lambda_retrieval=(0.0, 0.1), seeds=(0,))
    rows = train_cli.trial_rows(results, grid)
    train_cli.write_tables(rows, tmp_path, grid, train_cli.best_lines(results, rows, grid))
    text = (tmp_path / "results.md").read_text()
    assert "Design: grid: λ_f [0.2, 0.6] x λ_r [0.0, 0.1]" in text and "## Best (grid design)" in text
    assert "best λ_r at" not in text


# --- a killed driver -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_sweep_resumes_and_configures_the_trials_it_had_not_started(tmp_path):
    """A Tune experiment whose driver was killed before all its trials existed resumes: the restored run
    creates the missing trial with its param space resolved (Tune keeps non-primitive values as placeholders
    that only the param space given back on restore resolves)."""
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / "tests" / "interrupted_sweep.py"), str(tmp_path)]

    first = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert first.returncode == -9, first.stdout[-2000:] + first.stderr[-2000:]  # killed by its trial
    assert (tmp_path / "driver_killed").exists()
    assert not list((tmp_path / "sweep").glob("*seed=1*")), "the seed-1 trial must not exist yet"

    second = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "finished 2 trials (marker existed: True)" in second.stdout
    finals = {}
    for result_file in (tmp_path / "sweep").glob("*/result.json"):
        last = json.loads(result_file.read_text().strip().splitlines()[-1])
        finals[last["config"]["seed"]] = (last["count"], last["payload_tag"])
    assert finals == {0: (3, "resolved"), 1: (3, "resolved")}
