"""The Grafana dashboard of the project's Ray metrics (``rllib_search/metrics.py``).

``python -m rllib_search.grafana_dashboard [out.json]`` writes it (default
``docs/grafana/rllib_search_dashboard.json``, the committed copy, which a test keeps equal to this). Import
it in Grafana (Dashboards > New > Import), or copy it into the folder Ray provisions, next to Ray's own
dashboards: ``/tmp/ray/session_latest/metrics/grafana/dashboards/``. Its data source is a variable over
the Prometheus data sources (Ray's provisioning names one ``Prometheus``); ``run`` picks training runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rllib_search.metrics import SPECS

DEFAULT_PATH = Path("docs/grafana/rllib_search_dashboard.json")
UID = "rllibSearchDashboard"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'run=~"$run"'
RUN_BY = "run, algorithm"  # an SFT warm start and the RL run after it may share a run name
RATE = "[$__rate_interval]"
SERVE_LATENCY = "ray_serve_deployment_processing_latency_ms_bucket"  # Serve's own, per deployment


def name(metric: str, suffix: str = "") -> str:
    """The exported (Prometheus) name of a metric of :data:`SPECS`, plus a histogram ``suffix``."""
    return SPECS[metric].exported_name + suffix


def gauge(metric: str, by: str = RUN_BY) -> str:
    """A per-run gauge with Ray's per-process labels aggregated away."""
    return f"max by ({by}) ({name(metric)}{{{RUN}}})"


def rate(metric: str, by: str = RUN_BY, selector: str = RUN, suffix: str = "") -> str:
    selector = f"{{{selector}}}" if selector else ""
    return f"sum by ({by}) (rate({name(metric, suffix)}{selector}{RATE}))"


def increase(metric: str, by: str = RUN_BY) -> str:
    return f"sum by ({by}) (increase({name(metric)}{{{RUN}}}{RATE})) or vector(0)"


def quantile(q: float, metric: str, by: str = "service") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({name(metric, '_bucket')}{RATE})))"


# (title, unit, description, [(PromQL, legend)]): two panels a row, in this order. The training panels'
# legends start with the run and the algorithm.
TRAINING_PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    (
        "Episode reward",
        "short",
        "Mean episode reward of the iteration's samples",
        [(gauge("episode_return_mean"), "")],
    ),
    (
        "Reward components (EM, F1, format, retrieval, evidence)",
        "short",
        "Mean of each reward component",
        [(gauge("reward_component", RUN_BY + ", component"), "{{component}}")],
    ),
    (
        "Searches and turns per episode",
        "short",
        "",
        [
            (gauge("searches_per_episode"), "searches"),
            (gauge("turns_per_episode"), "turns"),
        ],
    ),
    (
        "Answer, valid-action, format-valid and truncation rates",
        "percentunit",
        "",
        [
            (gauge("answer_rate"), "answered"),
            (gauge("valid_action_rate"), "valid actions"),
            (gauge("format_valid_rate"), "format valid"),
            (gauge("truncation_rate"), "truncated"),
        ],
    ),
    (
        "Collapse monitors",
        "short",
        "Mean log-probability of correct episodes' tokens; monitors outside their bands",
        [
            (gauge("correct_logprob_mean"), "correct-episode log-prob"),
            (gauge("collapse_breaches"), "breaches"),
        ],
    ),
    (
        "Tokens/s",
        "short",
        "Generated tokens/s (engine; whole sample()) and trained tokens/s",
        [
            (gauge("generation_tokens_per_s"), "generation"),
            (gauge("rollout_tokens_per_s"), "rollout"),
            (gauge("trained_tokens_per_s"), "trained"),
        ],
    ),
    (
        "Generated tokens per episode",
        "short",
        "",
        [(gauge("generated_tokens_per_episode"), "")],
    ),
    ("KL to the reference", "short", "", [(gauge("kl"), "")]),
    (
        "Losses and entropy",
        "short",
        "",
        [
            (gauge("policy_loss"), "policy"),
            (gauge("value_loss"), "value"),
            (gauge("entropy"), "entropy"),
        ],
    ),
    (
        "Weights lag",
        "short",
        "Learner weights version minus the version the samples were drawn with "
        "(1 for synchronous on-policy training)",
        [(gauge("weights_lag"), "")],
    ),
    (
        "Episodes and turns/s",
        "short",
        "",
        [
            (rate("episodes"), "episodes"),
            (rate("turns"), "turns"),
        ],
    ),
    (
        "Errors and skipped updates",
        "short",
        "Increase over the interval",
        [
            (increase("retriever_errors"), "retriever errors (episodes)"),
            (increase("judge_errors"), "judge errors (calls)"),
            (increase("skipped_updates"), "skipped updates"),
        ],
    ),
    (
        "Evidence judge retries",
        "short",
        "Groups held back for the judge, judged on a later try, trained unjudged",
        [
            (increase("judge_held_groups"), "held"),
            (increase("judge_recovered_groups"), "recovered"),
            (increase("judge_unjudged_groups"), "unjudged"),
        ],
    ),
    (
        "Evidence judge per sample",
        "s",
        "Seconds of a sample's judge call; judge calls and evidences/s",
        [
            (gauge("judge_seconds"), "seconds"),
            (rate("judge_calls"), "calls/s"),
            (rate("judge_prompts"), "evidences/s"),
        ],
    ),
    ("Iteration seconds", "s", "", [(gauge("iteration_seconds"), "")]),
    (
        "Training iteration and reward stage",
        "short",
        "",
        [
            (gauge("training_iteration"), "iteration"),
            (gauge("reward_stage"), "reward stage"),
        ],
    ),
    (
        "Learning rate and clip fraction",
        "short",
        "",
        [
            (gauge("learning_rate"), "lr"),
            (gauge("clip_fraction"), "clip fraction"),
        ],
    ),
    (
        "LLDS (likelihood displacement)",
        "short",
        "With training(llds_coeff>0): turns whose likelihood fell, and the penalty",
        [
            (gauge("llds_displaced_actions"), "displaced turns"),
            (gauge("llds_penalty"), "penalty"),
        ],
    ),
]

SERVICE_PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    (
        "Client call latency (retries included)",
        "s",
        "Retriever and judge clients, p50 and p99",
        [
            (quantile(0.5, "service_call_seconds"), "{{service}} p50"),
            (quantile(0.99, "service_call_seconds"), "{{service}} p99"),
        ],
    ),
    (
        "Client calls/s",
        "reqps",
        "",
        [(rate("service_call_seconds", "service, outcome", "", "_count"), "{{service}} {{outcome}}")],
    ),
    ("Queries and prompts/s", "short", "", [(rate("service_items", "service", ""), "{{service}}")]),
    (
        "Client retries and errors/s",
        "short",
        "",
        [
            (rate("service_retries", "service", ""), "{{service}} retries"),
            (rate("service_errors", "service, kind", ""), "{{service}} {{kind}}"),
        ],
    ),
    (
        "Serve batch size (queries or prompts)",
        "short",
        "Items in one batch of a replica, p50 and p90",
        [
            (quantile(0.5, "serve_batch_items"), "{{service}} p50"),
            (quantile(0.9, "serve_batch_items"), "{{service}} p90"),
        ],
    ),
    (
        "Serve batch seconds",
        "s",
        "Index search or generation of one batch, p50 and p99",
        [
            (quantile(0.5, "serve_batch_seconds"), "{{service}} p50"),
            (quantile(0.99, "serve_batch_seconds"), "{{service}} p99"),
        ],
    ),
    (
        "Serve request latency (Serve's own metric)",
        "ms",
        "p99 per deployment",
        [
            (
                "histogram_quantile(0.99, sum by (deployment, le) (rate("
                f'{SERVE_LATENCY}{{deployment=~"Retriever|EvidenceJudge"}}{RATE})))',
                "{{deployment}} p99",
            )
        ],
    ),
]


def _panel(panel_id: int, x: int, y: int, title: str, unit: str, description: str, targets: list) -> dict:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0}},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row_title, rows, legend in (
        ("Training and rollouts", TRAINING_PANELS, "{{run}} {{algorithm}} "),
        ("Retriever and judge", SERVICE_PANELS, ""),
    ):
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            }
        )
        y += 1
        for i, (title, unit, description, targets) in enumerate(rows):
            targets = [(expr, (legend + label).strip()) for expr, label in targets]
            panels.append(
                _panel(len(panels) + 1, 12 * (i % 2), y + 8 * (i // 2), title, unit, description, targets)
            )
        y += 8 * ((len(rows) + 1) // 2)
    variables = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "hide": 0,
            "refresh": 1,
            "current": {},
        },
        {
            "name": "run",
            "label": "Run",
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": f"label_values({name('training_iteration')}, run)", "refId": "run"},
            "definition": f"label_values({name('training_iteration')}, run)",
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": ["All"], "value": ["$__all"]},
            "sort": 1,
            "hide": 0,
        },
    ]
    return {
        "uid": UID,
        "title": "rllib-search: training, rollouts, retriever and judge",
        "description": "Ray metrics of rllib-search (rllib_search/metrics.py)",
        "tags": ["rllib-search", "ray"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": variables},
        "panels": panels,
    }


def write_dashboard(path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build_dashboard(), indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(write_dashboard(*sys.argv[1:2]))
