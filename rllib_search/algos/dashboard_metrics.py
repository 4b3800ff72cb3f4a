"""Training and rollout figures as Ray metrics (dashboard, Prometheus), after every ``Algorithm.train()``.

:class:`DashboardMetricsCallback` is an ``RLlibCallback`` whose ``on_train_result`` publishes the result
dict's figures through ``ray.util.metrics``: every :data:`rllib_search.metrics.TRAINING` metric whose
``source`` key the result holds (reward and its components, EM among them; searches and turns per episode;
generated and trained tokens/s; KL and losses; episodes, retriever and judge errors as counters) and the
weights lag (the learner's ``weights_seq_no`` minus the runners' ``weights_version``), tagged ``run`` and
``algorithm``. The names, kinds and sources are in ``rllib_search/metrics.py``.

Every ``SearchConfig`` algorithm installs it next to the user's callbacks (``callbacks_class`` and
``callbacks(on_train_result=...)`` still run): ``config.dashboard_metrics(enabled=False)`` turns it off,
``config.dashboard_metrics(run_name="nq-grpo-lr1e-6")`` sets the ``run`` tag (default: the Tune trial's
name, or ``default`` outside Tune). Any other RLlib algorithm can use it too:
``config.callbacks(DashboardMetricsCallback)``.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Mapping
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rllib_search.metrics import SPECS, TRAINING, hold, record, release

LEARNER_WEIGHTS_VERSION = "learners/default_policy/weights_seq_no"
RUNNER_WEIGHTS_VERSION = "env_runners/weights_version"


def _lookup(result: Mapping[str, Any], path: str) -> Any:
    node: Any = result
    for key in path.split("/"):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def result_records(result: Mapping[str, Any]) -> list[tuple[str, float, dict[str, str]]]:
    """``(metric name, value, extra tags)`` for every training metric ``result`` (an ``Algorithm.train()``
    result) holds; keys it lacks (an SFT run has no rollouts) are left out."""
    records: list[tuple[str, float, dict[str, str]]] = []
    for spec in TRAINING:
        if spec.source is None:
            continue
        if spec.source.endswith("/*"):
            children = _lookup(result, spec.source[:-2])
            if isinstance(children, Mapping):
                records += [
                    (spec.name, float(value), {spec.tags[-1]: str(key)})
                    for key, value in children.items()
                    if _number(value)
                ]
            continue
        value = _lookup(result, spec.source)
        if _number(value):
            records.append((spec.name, float(value), {}))
    learner, runners = _lookup(result, LEARNER_WEIGHTS_VERSION), _lookup(result, RUNNER_WEIGHTS_VERSION)
    if _number(learner) and _number(runners):
        records.append(("weights_lag", float(learner) - float(runners), {}))
    return records


def run_tags(algorithm: Any) -> dict[str, str]:
    """``run``: the config's ``dashboard_run_name``, else the Tune trial's name (``default`` outside
    Tune); ``algorithm``: the Algorithm's class name."""
    run = getattr(algorithm.config, "dashboard_run_name", None) or getattr(algorithm, "trial_name", None)
    return {"run": str(run or "default"), "algorithm": type(algorithm).__name__}


class DashboardMetricsCallback(RLlibCallback):
    """Publishes each ``train()`` result as Ray metrics (see the module docstring). Gauges are held (set
    again every second, :func:`rllib_search.metrics.hold`) until :meth:`close`, the Algorithm's ``stop()``
    or its garbage collection."""

    def __init__(self) -> None:
        super().__init__()
        self._key = f"train-{id(self)}"
        self._finalizer: weakref.finalize | None = None

    def on_train_result(
        self, *, algorithm: Any, metrics_logger: Any = None, result: dict, **kwargs: Any
    ) -> None:
        tags = run_tags(algorithm)
        gauges = []
        for name, value, extra in result_records(result):
            if SPECS[name].kind == "gauge":
                gauges.append((name, value, {**tags, **extra}))
            else:
                record(name, value, {**tags, **extra})
        hold(self._key, gauges)
        if self._finalizer is None:
            self._finalizer = weakref.finalize(algorithm, release, self._key)

    def close(self) -> None:
        """Stop holding this run's gauges (they leave the endpoint within about 20 s)."""
        release(self._key)


def uninstall(algorithm: Any) -> None:
    """Close the algorithm's :class:`DashboardMetricsCallback` (from its ``stop()``)."""
    callbacks = getattr(algorithm, "callbacks", None)
    for callback in callbacks if isinstance(callbacks, list) else []:
        if isinstance(callback, DashboardMetricsCallback):
            callback.close()


def install(algorithm: Any) -> None:
    """Add a :class:`DashboardMetricsCallback` to ``algorithm.callbacks`` unless one is there (the user
    listed it in ``callbacks_class``)."""
    callbacks = algorithm.callbacks
    if isinstance(callbacks, list) and not any(isinstance(c, DashboardMetricsCallback) for c in callbacks):
        callbacks.append(DashboardMetricsCallback())
