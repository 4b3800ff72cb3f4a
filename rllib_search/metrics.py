"""The project's Ray metrics: every name, kind, tag and meaning in one table, and :func:`record`.

Custom figures reach the Ray dashboard's metrics view (its Grafana) and Prometheus only through
``ray.util.metrics``; RLlib's own result dict goes to Tune's loggers. Three places record:

- training and rollout figures, once per ``Algorithm.train()``, from the result dict
  (``algos/dashboard_metrics.py``: an ``RLlibCallback.on_train_result``, on by default in ``SearchConfig``);
  each entry of :data:`TRAINING` names the result key (``source``) it is read from;
- the retriever and judge clients, per call (``serve/http/client.py``), tag ``service``;
- the Serve deployments, per batch (``serve/retrieval/deployment.py``, ``serve/judge/deployment.py``), tag
``service``.

Ray exports a metric named ``rllib_search_x`` as ``ray_rllib_search_x``; a Counter as
``ray_rllib_search_x_total``; a Histogram as ``..._bucket``/``_count``/``_sum`` (Ray 2.60 computes
``_sum`` from bucket midpoints, so quantiles and counts are exact, sums are not). Ray adds the labels
``SessionName``, ``NodeAddress``, ``WorkerId``, ``Component`` and ``Version``; aggregate them away in
PromQL (``max by (run) (...)``). A Counter that was never incremented (no retriever error yet) is absent,
not 0: use ``... or vector(0)``. ``docs/grafana/rllib_search_dashboard.json`` plots every one of them
(``rllib_search/grafana_dashboard.py`` writes it).

Gauges are per-iteration values that Ray 2.60 would drop from the endpoint two export intervals (about
20 s) after the last ``set``; :func:`hold` keeps setting them until the algorithm stops.

:func:`record` is a no-op in a process where Ray is not initialised (the clients also run as plain HTTP
clients in scripts and tests) and never raises for a Ray-side failure: a metric must not break a run.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

PREFIX = "rllib_search_"
RAY_PREFIX = "ray_"  # what Ray's exporter puts before every application metric

# Seconds: a retriever batch takes milliseconds, a judge call on CPU tens of seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
RUN_TAGS = ("run", "algorithm")
_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class MetricSpec:
    """One Ray metric: ``name`` (without :data:`PREFIX`), ``kind`` (``counter``, ``gauge`` or
    ``histogram``), ``description``, ``tags`` (tag keys), ``source`` (the result-dict key a training
    metric is read from; ``*`` ends a key whose children each become a series, their name in the last
    tag) and ``buckets`` (histograms)."""

    name: str
    kind: str
    description: str
    tags: tuple[str, ...] = RUN_TAGS
    source: str | None = None
    buckets: tuple[float, ...] = ()

    @property
    def full_name(self) -> str:
        """The name given to ``ray.util.metrics``."""
        return PREFIX + self.name

    @property
    def exported_name(self) -> str:
        """The name Prometheus sees (a Histogram's series add ``_bucket``, ``_count`` and ``_sum``)."""
        return RAY_PREFIX + self.full_name + ("_total" if self.kind == "counter" else "")


_RUNNERS, _LEARNER = "env_runners/", "learners/default_policy/"


def _runner(name: str, description: str, kind: str = "gauge", key: str | None = None) -> MetricSpec:
    """A figure of the EnvRunners (result key ``env_runners/<key or name>``)."""
    return MetricSpec(name, kind, description, RUN_TAGS, _RUNNERS + (key or name))


def _learner(name: str, description: str, kind: str = "gauge") -> MetricSpec:
    """A figure of the default policy's learner (result key ``learners/default_policy/<name>``)."""
    return MetricSpec(name, kind, description, RUN_TAGS, _LEARNER + name)


#: Training and rollout figures, tags ``run`` (``config.dashboard_metrics(run_name=...)``, else the Tune
#: trial's name, else ``default``) and ``algorithm`` (``SearchGRPO``, ``SearchPPO``, ...). Gauges hold the
#: last iteration's value; counters add each iteration's amount.
TRAINING: tuple[MetricSpec, ...] = (
    MetricSpec("training_iteration", "gauge", "Training iterations done", source="training_iteration"),
    MetricSpec(
        "iteration_seconds", "gauge", "Seconds of the last iteration", source="timers/training_iteration"
    ),
    _runner("episode_return_mean", "Mean episode reward"),
    MetricSpec(
        "reward_component",
        "gauge",
        "Mean of each reward component (em, f1, format, retrieval, evidence, ...)",
        (*RUN_TAGS, "component"),
        _RUNNERS + "reward/*",
    ),
    _runner("searches_per_episode", "Searches per episode"),
    _runner("turns_per_episode", "Model turns per episode"),
    _runner("generated_tokens_per_episode", "Generated tokens per episode"),
    _runner("valid_action_rate", "Share of turns the protocol could parse"),
    _runner("answer_rate", "Share of episodes that gave an answer"),
    _runner("format_valid_rate", "Share of episodes that followed the protocol's format"),
    _runner("correct_logprob_mean", "Mean log-probability of the correct episodes' generated tokens"),
    MetricSpec(
        "collapse_breaches",
        "gauge",
        "Collapse monitors outside their bands (config.collapse_guard)",
        source="collapse/breaches",
    ),
    _runner("truncation_rate", "Share of episodes cut by a budget"),
    _runner("generation_tokens_per_s", "Generated tokens/s inside the engine"),
    _runner("rollout_tokens_per_s", "Generated tokens/s over the whole sample()"),
    _runner("reward_stage", "Reward schedule stage (R1-Searcher's two stages)"),
    _runner("judge_seconds", "Seconds of a sample's evidence-judge call"),
    MetricSpec(
        "trained_tokens_per_s",
        "gauge",
        "Trained (loss-masked) tokens/s",
        source="learners/trained_tokens_per_s",
    ),
    _learner("kl", "KL to the reference policy"),
    _learner("policy_loss", "Policy loss"),
    _learner("entropy", "Entropy of generated tokens"),
    _learner("value_loss", "Value loss (PPO)"),
    _learner("clip_fraction", "Share of clipped ratios"),
    _learner("llds_penalty", "LLDS penalty before its coefficient (training(llds_coeff>0))"),
    _learner("llds_displaced_actions", "Share of non-negative-advantage turns whose likelihood fell (LLDS)"),
    _learner("learning_rate", "Policy learning rate"),
    MetricSpec("weights_lag", "gauge", "Learner weights version minus the one the samples were drawn with"),
    _runner("episodes", "Episodes sampled", "counter", "num_episodes"),
    _runner("turns", "Model turns (env steps) sampled", "counter", "num_env_steps_sampled"),
    _runner("retriever_errors", "Episodes that got a retriever error", "counter"),
    _runner("judge_calls", "Evidence-judge calls (one per sample)", "counter"),
    _runner("judge_prompts", "Evidences sent to the judge", "counter"),
    _runner("judge_errors", "Evidence-judge calls that failed", "counter"),
    _runner("judge_held_groups", "Groups held back to judge their evidence again", "counter"),
    _runner("judge_recovered_groups", "Held groups judged on a later try", "counter"),
    _runner("judge_unjudged_groups", "Held groups trained unjudged after their last try", "counter"),
    _learner("skipped_updates", "Updates skipped for a non-finite loss", "counter"),
)

#: The retriever and judge clients (tag ``service``: ``retriever`` | ``judge``) and their deployments.
SERVICES: tuple[MetricSpec, ...] = (
    MetricSpec(
        "service_call_seconds",
        "histogram",
        "Seconds of a client call, retries included (outcome: ok | error)",
        ("service", "outcome"),
        buckets=LATENCY_BUCKETS,
    ),
    MetricSpec("service_items", "counter", "Queries or prompts sent by the clients", ("service",)),
    MetricSpec("service_retries", "counter", "Client attempts retried after a failure", ("service",)),
    MetricSpec(
        "service_errors",
        "counter",
        "Client calls that failed (kind: rejected = 4xx | unavailable = every attempt failed)",
        ("service", "kind"),
    ),
    MetricSpec(
        "serve_batch_items",
        "histogram",
        "Queries or prompts in one batch of a Serve replica",
        ("service",),
        buckets=BATCH_BUCKETS,
    ),
    MetricSpec(
        "serve_batch_seconds",
        "histogram",
        "Seconds of one batch's index search or generation in a Serve replica",
        ("service",),
        buckets=LATENCY_BUCKETS,
    ),
)

SPECS: dict[str, MetricSpec] = {spec.name: spec for spec in (*TRAINING, *SERVICES)}

_created: dict[str, Any] = {}
_held: dict[str, list[tuple[str, float, Mapping[str, Any]]]] = {}
_refresher: threading.Thread | None = None
_lock = threading.RLock()
REFRESH_S = 1.0  # below Ray's gauge lifetime: two export intervals of at least 1 s (10 s by default)


def _ray_initialized() -> bool:
    try:
        import ray

        return bool(ray.is_initialized())
    except Exception:
        return False


def _metric(spec: MetricSpec) -> Any:
    """This process's ``ray.util.metrics`` object for ``spec`` (made on first use, after ``ray.init``)."""
    metric = _created.get(spec.name)
    if metric is None:
        from ray.util import metrics

        with _lock:
            metric = _created.get(spec.name)
            if metric is None:
                options: dict[str, Any] = {"description": spec.description, "tag_keys": spec.tags}
                if spec.kind == "counter":
                    metric = metrics.Counter(spec.full_name, **options)
                elif spec.kind == "gauge":
                    metric = metrics.Gauge(spec.full_name, **options)
                else:
                    metric = metrics.Histogram(spec.full_name, boundaries=list(spec.buckets), **options)
                _created[spec.name] = metric
    return metric


def record(name: str, value: float, tags: Mapping[str, Any]) -> None:
    """Record ``value`` for metric ``name`` of :data:`SPECS` (a counter adds it, a gauge sets it, a
    histogram observes it) with ``tags`` (values turned into strings). Non-finite values and counter
    increments that are not positive are dropped. A no-op where Ray is not initialised."""
    spec = SPECS[name]  # an unknown name or a missing tag is a programming error
    tag_values = {key: str(tags[key]) for key in spec.tags}
    value = float(value)
    if not math.isfinite(value) or (spec.kind == "counter" and value <= 0) or not _ray_initialized():
        return
    try:
        metric = _metric(spec)
        if spec.kind == "counter":
            metric.inc(value, tags=tag_values)
        elif spec.kind == "gauge":
            metric.set(value, tags=tag_values)
        else:
            metric.observe(value, tags=tag_values)
    except Exception as error:
        logger.debug("metric %s not recorded: %s", spec.full_name, error)


def hold(key: str, records: list[tuple[str, float, Mapping[str, Any]]]) -> None:
    """Record gauge ``records`` (``(name, value, tags)``) now and again every :data:`REFRESH_S` seconds,
    in place of what ``key`` held before, until :func:`release` (``key``). Ray 2.60 drops a gauge that was
    not set for two export intervals (about 20 s), and a training iteration often takes longer; a gauge that
    is no longer held (an earlier reward stage's component) drops out."""
    global _refresher
    if not _ray_initialized():
        return
    for name, value, tags in records:
        record(name, value, tags)
    with _lock:
        _held[key] = list(records)
        if _refresher is None:
            _refresher = threading.Thread(target=_refresh, name="rllib_search-metrics", daemon=True)
            _refresher.start()


def release(key: str) -> None:
    """Stop refreshing what ``key`` holds (the gauges then leave the endpoint within about 20 s)."""
    with _lock:
        _held.pop(key, None)


def _refresh() -> None:
    while True:
        time.sleep(REFRESH_S)
        with _lock:
            records = [item for items in _held.values() for item in items]
        for name, value, tags in records:
            record(name, value, tags)


def check_specs(specs: Mapping[str, MetricSpec] = SPECS) -> None:
    """Raise if a name is not Prometheus-legal, a kind unknown, or a histogram lacks buckets."""
    for spec in specs.values():
        if not _NAME_RE.match(spec.full_name) or spec.full_name.endswith("_total"):
            raise ValueError(f"bad metric name {spec.full_name!r}")
        if spec.kind not in ("counter", "gauge", "histogram"):
            raise ValueError(f"{spec.name}: unknown kind {spec.kind!r}")
        if (spec.kind == "histogram") != bool(spec.buckets):
            raise ValueError(f"{spec.name}: histograms (only) need buckets")
        if any(not _NAME_RE.match(tag) for tag in spec.tags):
            raise ValueError(f"{spec.name}: bad tag key in {spec.tags}")


check_specs()
