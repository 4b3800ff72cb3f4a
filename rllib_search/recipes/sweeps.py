"""What the Ray Tune studies of ``tuned_examples/`` share (``lambda_sweep.py``, ``findings.py``).

- :func:`fit_or_restore`: fit a Tune experiment of an RLlib Algorithm, or resume it from its checkpoints
  (``tune.Tuner.restore``) when it exists under the storage directory; given a ``spec`` (what the study
  sweeps: its grid, seeds, iterations), it records the spec in the experiment directory and resumes only an
  experiment that recorded the same one (:func:`check_spec`; :class:`SpecMismatch` names the differences);
  :func:`restored_results` reads a finished (or partial) experiment's results without training;
- :func:`markdown_table`: rows of dicts as a markdown table;
- :func:`metric_curve` and :func:`plot_mean_curves`: a trial's metric per iteration, and curves averaged
  over seeds, one line per label, as a PNG.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The file in a Tune experiment's directory that records the spec it was started with.
SPEC_FILE = "sweep_spec.json"


class SpecMismatch(ValueError):
    """An existing experiment was started with another spec (or records none): resuming it would not run
    the study asked for."""


def fit_or_restore(
    trainable: Any,
    param_space: Any,
    *,
    storage: Path,
    name: str,
    iterations: int,
    fresh: bool = False,
    max_concurrent: int | None = None,
    say: Callable[[str], None] = print,
    what: str = "experiment",
    keep_checkpoints: bool = True,
    metric: str | None = None,
    mode: str | None = None,
    spec: Mapping[str, Any] | None = None,
) -> Any:
    """Fit (or resume) the Tune experiment ``storage/name`` of ``trainable`` over ``param_space`` (an
    AlgorithmConfig with ``tune.grid_search`` values), each trial stopping after ``iterations`` and
    checkpointing every iteration; returns the ResultGrid. Raises when a trial failed, and before any
    trial starts when a GPU trial cannot be placed on the cluster or does not fit its GPUs
    (``algos/plan.check_trials``).

    ``metric`` and ``mode`` go to the ``TuneConfig`` (``ResultGrid.get_best_result()`` ranks trials by
    them; every result a trial reports must carry ``metric``). With a ``spec`` (JSON-able), a new
    experiment records it in ``SPEC_FILE``, and an existing one is resumed only when it recorded the same
    spec: otherwise :class:`SpecMismatch` (``fresh`` starts over whatever it recorded).

    With ``keep_checkpoints=False`` the checkpoints of trials that ran all ``iterations`` are deleted once
    the experiment ends (their metrics and results stay, which is all a study reads back; an unfinished
    trial keeps its checkpoint to resume from): a study of many trials then needs disk for the trials in
    flight only (about 1.6 GB each for SmolLM2-135M with its optimizer state)."""
    from ray import tune

    from rllib_search.algos.plan import check_trials

    check_trials(trainable, param_space)  # a GPU trial that cannot be placed or fit is refused before Tune
    storage = Path(storage).resolve()
    experiment = storage / name
    if experiment.exists() and not fresh and tune.Tuner.can_restore(str(experiment)):
        if spec is not None:
            check_spec(experiment, spec, what=what)
        say(f"resuming the {what} in {experiment}")
        # The param space goes back in: Tune keeps its non-primitive values (classes, records) out of the
        # saved state as placeholders, and a trial the restored search creates later (a seed not yet
        # started when the run stopped) can only be configured with them resolved.
        tuner = tune.Tuner.restore(
            str(experiment), trainable=trainable, param_space=param_space, resume_errored=True
        )
    else:
        if spec is not None:
            record_spec(experiment, spec)
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            # Trials run side by side as the cluster's resources allow (one CPU each on a CPU-only Ray, where
            # Ray gives each trial one torch thread).
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, metric=metric, mode=mode),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(storage),
                stop={"training_iteration": iterations},
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1),
                verbose=1,
            ),
        )
    results = tuner.fit()
    if results.errors:
        raise RuntimeError(f"{len(results.errors)} trials failed: {results.errors[0]}")
    if not keep_checkpoints:
        for result in results:
            if (result.metrics or {}).get("training_iteration", 0) >= iterations:
                delete_checkpoints(Path(result.path))
    return results


def resumable(experiment: Path) -> bool:
    """Whether ``experiment`` holds a Tune experiment that ``tune.Tuner.restore`` can resume."""
    from ray import tune

    return experiment.exists() and tune.Tuner.can_restore(str(experiment.resolve()))


def check_spec(experiment: Path, spec: Mapping[str, Any], *, what: str = "experiment") -> None:
    """Raise :class:`SpecMismatch` unless the experiment in ``experiment`` recorded ``spec`` (compared as
    JSON); the message names each difference and how to go on (``--fresh``, or another ``--out``)."""
    path = Path(experiment) / SPEC_FILE
    remedy = "pass --fresh to start it over there, or another --out to keep it"
    if not path.exists():
        raise SpecMismatch(
            f"{experiment} holds a {what} that records no spec ({SPEC_FILE}), so it cannot be told to be "
            f"the one asked for: {remedy}"
        )
    recorded = json.loads(path.read_text())
    differences = spec_differences(recorded, spec)
    if differences:
        raise SpecMismatch(
            f"{experiment} holds a {what} started with another spec ({'; '.join(differences)}): it is not "
            f"resumed; {remedy}"
        )


def spec_differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """``"key: recorded X, asked Y"`` for each key whose value differs (compared as JSON)."""
    recorded, asked = json.loads(json.dumps(recorded)), json.loads(json.dumps(asked))
    return [
        f"{key}: recorded {recorded.get(key)!r}, asked {asked.get(key)!r}"
        for key in sorted(set(recorded) | set(asked))
        if recorded.get(key) != asked.get(key)
    ]


def record_spec(experiment: Path, spec: Mapping[str, Any]) -> None:
    """Write ``spec`` to ``experiment``/``SPEC_FILE`` (by a rename: a kill leaves the old file or the new)."""
    experiment = Path(experiment)
    experiment.mkdir(parents=True, exist_ok=True)
    temp = experiment / f".{SPEC_FILE}.tmp-{os.getpid()}"
    temp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    os.replace(temp, experiment / SPEC_FILE)


def delete_checkpoints(trial_dir: Path) -> None:
    """Remove a Tune trial's ``checkpoint_*`` directories (its result files stay)."""
    import shutil

    for checkpoint in trial_dir.glob("checkpoint_*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


def restored_results(trainable: Any, experiment: Path) -> Any | None:
    """The ResultGrid of the experiment in ``experiment`` as it stands (nothing is trained), or None when
    there is none."""
    from ray import tune

    if not experiment.exists() or not tune.Tuner.can_restore(str(experiment)):
        return None
    return tune.Tuner.restore(str(experiment.resolve()), trainable=trainable).get_results()


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows (dicts with the same keys) as a markdown table; floats with three decimals."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metric_curve(result: Any, columns: Sequence[str]) -> Any:
    """A trial's metric per iteration (numpy): the first of ``columns`` its results have (NaN-free
    iterations only at the end are kept as NaN)."""
    import numpy as np

    frame = result.metrics_dataframe
    for column in columns:
        if frame is not None and column in frame:
            return frame[column].to_numpy(dtype=float)
    return np.asarray([], dtype=float)


def plot_mean_curves(
    curves: Mapping[str, Sequence[Any]], path: Path, *, title: str, ylabel: str = "training reward"
) -> None:
    """One line per label: the mean over its runs (seeds) of a metric per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in curves.items():
        runs = [run for run in runs if len(run)]
        if not runs:
            continue
        length = min(len(run) for run in runs)
        mean = np.mean([run[:length] for run in runs], axis=0)
        ax.plot(range(1, length + 1), mean, marker="o", label=f"{label} ({len(runs)} seeds)")
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
