"""The project's Ray metrics: names, the result-to-metric mapping, the callback beside a user's callbacks,
the clients outside Ray, the committed Grafana dashboard, and one training iteration scraped from a local
node's Prometheus endpoint (in a subprocess: it needs its own Ray with a known metrics export port)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from rllib_search.algos.dashboard_metrics import DashboardMetricsCallback, result_records
from rllib_search.metrics import PREFIX, SERVICES, SPECS, TRAINING, check_specs
from tests.test_learner import make_config, model_dir  # noqa: F401  (the tiny model's fixture)

ROOT = Path(__file__).resolve().parents[1]
RUN = "metrics-test"

# The keys of a real one-iteration SearchGRPO result (tiny model), values chosen to be told apart.
RESULT = {
    "training_iteration": 3,
    "timers": {"training_iteration": 0.5},
    "env_runners": {
        "episode_return_mean": 0.25,
        "reward": {"em": 0.5, "format": 0.75, "retrieval_hit": 0.125},
        "searches_per_episode": 1.5,
        "turns_per_episode": 2.5,
        "num_episodes": 4,
        "num_env_steps_sampled": 10,
        "generation_tokens_per_s": 300.0,
        "rollout_tokens_per_s": 200.0,
        "weights_version": 2.0,
        "reward_stage": 0.0,
        "retriever_errors": 0,
        "judge_calls": 1,
        "judge_prompts": 4,
        "judge_errors": 1,
        "judge_seconds": 1.75,
    },
    "learners": {
        "trained_tokens_per_s": 900.0,
        "default_policy": {"kl": 0.01, "policy_loss": -0.2, "skipped_updates": 0, "weights_seq_no": 3.0},
        "__all_modules__": {"num_env_steps_trained": 10},
    },
}


def test_metric_names_are_prometheus_legal_prefixed_and_unique():
    check_specs()
    exported = [spec.exported_name for spec in SPECS.values()]
    assert len(set(exported)) == len(exported) == len(TRAINING) + len(SERVICES)
    assert all(name.startswith("ray_" + PREFIX) for name in exported)
    assert SPECS["episodes"].exported_name == "ray_rllib_search_episodes_total"
    assert SPECS["kl"].exported_name == "ray_rllib_search_kl"
    assert all(spec.tags[:2] == ("run", "algorithm") for spec in TRAINING)
    assert all(spec.tags[0] == "service" for spec in SERVICES)


def test_result_records_map_every_figure():
    records = {(name, tuple(sorted(tags.items()))): value for name, value, tags in result_records(RESULT)}
    expected = {
        "training_iteration": 3,
        "iteration_seconds": 0.5,
        "episode_return_mean": 0.25,
        "searches_per_episode": 1.5,
        "turns_per_episode": 2.5,
        "episodes": 4,
        "turns": 10,
        "generation_tokens_per_s": 300.0,
        "rollout_tokens_per_s": 200.0,
        "trained_tokens_per_s": 900.0,
        "kl": 0.01,
        "policy_loss": -0.2,
        "skipped_updates": 0,
        "retriever_errors": 0,
        "judge_calls": 1,
        "judge_prompts": 4,
        "judge_errors": 1,
        "judge_seconds": 1.75,
        "reward_stage": 0.0,
        "weights_lag": 1.0,
    }
    for name, value in expected.items():
        assert records.pop((name, ())) == value, name
    for component, value in RESULT["env_runners"]["reward"].items():
        assert records.pop(("reward_component", (("component", component),))) == value
    assert not records, f"unexpected records {records}"

    # An SFT iteration has no rollouts: no rollout figures, no weights lag, and nothing raises.
    sft = {"training_iteration": 1, "learners": RESULT["learners"]}
    assert {name for name, _, _ in result_records(sft)} == {
        "training_iteration",
        "trained_tokens_per_s",
        "kl",
        "policy_loss",
        "skipped_updates",
    }


def test_grafana_dashboard_is_committed_and_queries_only_known_metrics():
    from rllib_search.grafana_dashboard import DEFAULT_PATH, build_dashboard

    committed = json.loads((ROOT / DEFAULT_PATH).read_text())
    assert committed == build_dashboard(), "run: python -m rllib_search.grafana_dashboard"
    exprs = [t["expr"] for p in committed["panels"] for t in p.get("targets", [])]
    queried = set(re.findall(r"ray_rllib_search_\w+", " ".join(exprs)))

    def series(spec) -> set[str]:
        suffixes = ("_bucket", "_count", "_sum") if spec.kind == "histogram" else ("",)
        return {spec.exported_name + suffix for suffix in suffixes}

    assert queried <= set().union(*map(series, SPECS.values())), "a panel queries an unknown metric"
    missing = {spec.name for spec in SPECS.values() if not series(spec) & queried}
    assert not missing, f"metrics without a panel: {missing}"


OUTSIDE_RAY = textwrap.dedent(
    """
    import json, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import ray
    from rllib_search import metrics
    from rllib_search.serve.retrieval.client import (
        RetrieverClient,
        RetrieverRequestError,
        RetrieverUnavailable,
    )
    from rllib_search.serve.judge.client import JudgeClient

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/retrieve" and len(body["queries"][0]) > 10:
                status, reply = 422, {"detail": "query too long"}
            elif self.path == "/retrieve":
                doc = {"document": {"id": "p1", "contents": '"Velmora"\\nVelmora is a city.'}, "score": 1.0}
                status, reply = 200, {"result": [[doc] for _ in body["queries"]]}
            else:
                choices = [{"index": i, "text": " Velmora"} for i in range(len(body["prompt"]))]
                status, reply = 200, {"choices": choices}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    retriever = RetrieverClient(url=base + "/retrieve", max_retries=1, backoff_s=0.01)
    assert retriever.search(["velmora", "city"], 1)[0][0].id == "p1"
    try:
        retriever.search(["a much too long query"], 1)
        raise AssertionError("a 4xx must raise")
    except RetrieverRequestError:
        pass
    dead = RetrieverClient(url="http://127.0.0.1:9/retrieve", max_retries=1, backoff_s=0.01, timeout_s=2)
    try:
        dead.search(["q"], 1)
        raise AssertionError("an unreachable retriever must raise")
    except RetrieverUnavailable:
        pass
    judge = JudgeClient(url=base + "/v1", max_retries=1, backoff_s=0.01)
    assert judge.answer_evidence(["where?"], ["Velmora is a city."]) == ["Velmora"]
    metrics.record("episodes", 3, {"run": "r", "algorithm": "a"})
    assert not ray.is_initialized() and not metrics._created
    print(json.dumps([retriever.stats.__dict__, dead.stats.__dict__, judge.stats.calls]))
    """
)


def _python(code: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_clients_work_outside_ray_and_record_nothing():
    done = _python(OUTSIDE_RAY, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    retriever, dead, judge_calls = json.loads(done.stdout.strip().splitlines()[-1])
    assert (retriever["calls"], retriever["failures"]) == (2, 1)
    assert (dead["retries"], dead["failures"]) == (1, 1)
    assert judge_calls == 1


@pytest.mark.slow
def test_the_callback_runs_beside_the_users_callbacks(ray_cluster, model_dir, world, corpus):  # noqa: F811
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.algos.dashboard_metrics import run_tags

    seen = []

    class UserCallback(RLlibCallback):
        def on_train_result(self, *, result, **kwargs):
            seen.append(("class", result["training_iteration"]))

    config = make_config(SearchGRPOConfig, model_dir, world, corpus).callbacks(
        UserCallback, on_train_result=lambda *, result, **kwargs: seen.append(("fn", 1))
    )
    algo = config.dashboard_metrics(run_name=RUN).build_algo()
    assert [type(c) for c in algo.callbacks] == [UserCallback, DashboardMetricsCallback]
    assert run_tags(algo) == {"run": RUN, "algorithm": "SearchGRPO"}
    algo.train()
    assert seen == [("class", 1), ("fn", 1)]
    algo.stop()

    listed = make_config(SearchGRPOConfig, model_dir, world, corpus).callbacks([DashboardMetricsCallback])
    algo = listed.build_algo()  # listed by the user: not installed twice
    assert [type(c) for c in algo.callbacks] == [DashboardMetricsCallback]
    assert run_tags(algo) == {"run": "default", "algorithm": "SearchGRPO"}
    algo.stop()

    algo = (
        make_config(SearchGRPOConfig, model_dir, world, corpus).dashboard_metrics(enabled=False).build_algo()
    )
    assert not any(isinstance(c, DashboardMetricsCallback) for c in algo.callbacks)
    algo.stop()


# --- one training iteration, scraped from the node's Prometheus endpoint ---------------------------------
def scrape(port: int) -> list[dict]:
    """The project's samples on the node's metrics endpoint: ``{"name", "labels", "value"}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [
        {"name": sample.name, "labels": sample.labels, "value": sample.value}
        for family in text_string_to_metric_families(text)
        if family.name.startswith("ray_" + PREFIX)
        for sample in family.samples
    ]


# Exported names the child waits for: training figures of its run, and both services' client metrics.
REQUIRED = {
    "ray_rllib_search_episodes_total",
    "ray_rllib_search_turns_total",
    "ray_rllib_search_episode_return_mean",
    "ray_rllib_search_reward_component",
    "ray_rllib_search_searches_per_episode",
    "ray_rllib_search_turns_per_episode",
    "ray_rllib_search_generation_tokens_per_s",
    "ray_rllib_search_trained_tokens_per_s",
    "ray_rllib_search_kl",
    "ray_rllib_search_policy_loss",
    "ray_rllib_search_weights_lag",
    "ray_rllib_search_training_iteration",
    "ray_rllib_search_service_call_seconds_count",
    "ray_rllib_search_service_items_total",
    "ray_rllib_search_service_retries_total",
    "ray_rllib_search_service_errors_total",
    "ray_rllib_search_serve_batch_items_count",
}


GAUGE_LIFETIME_S = 20  # two of Ray's default 10 s metric export intervals


def child(out: str, workdir: str, metrics_port: int, deadline_s: float = 150.0) -> None:
    """In a fresh process: a local Ray exporting metrics on ``metrics_port``, the BM25 retriever on Serve,
    one GRPO iteration of a tiny model, one retriever call and one failing judge call; then poll the node's
    endpoint until every :data:`REQUIRED` name is there, once more after a gauge's lifetime, and write what
    it held to ``out``."""
    import ray
    import torch
    from ray import serve

    from rllib_search import ENV_ID
    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
    from rllib_search.serve.cluster import patient_serve_proxies
    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.judge.client import JudgeClient, JudgeUnavailable
    from rllib_search.serve.retrieval.build import build_index
    from rllib_search.serve.retrieval.client import RetrieverClient
    from rllib_search.serve.retrieval.deployment import APP_NAME, build_retriever_app

    started = time.perf_counter()
    torch.set_num_threads(1)
    root = Path(workdir)
    world = generate_world(SyntheticWorldConfig(seed=3, num_passages=300, num_train=20, num_test=4))
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    build_index(root / "corpus.jsonl", root / "bm25", kind="bm25", progress=False)
    model = str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))

    # A new local cluster even where another one runs on this machine (address="local").
    patient_serve_proxies()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        log_to_driver=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    serve.run(
        build_retriever_app(
            {"index_dir": str(root / "bm25"), "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
        ),
        name=APP_NAME,
        route_prefix="/",
    )
    env_config = {
        "retriever": {"type": "serve", "timeout_s": 60},
        "dataset": world.train,
        **{"protocol": "search_r1", "max_turns": 3, "max_total_tokens": 700, "max_obs_tokens": 80},
    }
    config = (
        SearchGRPOConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model})
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=16)
        .training(lr=1e-3, micro_batch_size=2)
        .debugging(seed=11)
        .dashboard_metrics(run_name=RUN)
    )
    algo = config.build_algo()
    result = algo.train()
    trained_s = time.perf_counter() - started
    # The tiny random policy rarely writes a search: one direct call through the same served retriever.
    RetrieverClient.from_app(timeout_s=60).search(["Velmora", "capital of Dravenia"], 2)
    with contextlib.suppress(JudgeUnavailable):
        JudgeClient(url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1, backoff_s=0.01).complete(["p"])

    samples: list[dict] = []
    while time.perf_counter() - started < trained_s + deadline_s:
        try:
            samples = scrape(metrics_port)
        except OSError:
            samples = []
        if {s["name"] for s in samples} >= REQUIRED:
            break
        time.sleep(2)
    scraped_s = time.perf_counter() - started - trained_s
    time.sleep(GAUGE_LIFETIME_S + 5)  # Ray drops a gauge not set for this long: the run's are held
    report = {
        "samples": samples,
        "later": scrape(metrics_port),
        "train_s": trained_s,
        "scraped_s": scraped_s,
        "result": {key: result["env_runners"][key] for key in ("num_episodes", "num_env_steps_sampled")}
        | {"reward": result["env_runners"]["reward"], "kl": result["learners"]["default_policy"]["kl"]},
    }
    Path(out).write_text(json.dumps(report))
    algo.stop()
    serve.shutdown()
    ray.shutdown()


def value(samples: list[dict], name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [s for s in samples if s["name"] == name and labels.items() <= s["labels"].items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]["value"]


@pytest.mark.timing
@pytest.mark.slow
def test_one_training_iteration_reaches_the_nodes_prometheus_endpoint(tmp_path):
    from rllib_search.serve.http.ports import free_port

    out = tmp_path / "scraped.json"
    code = (
        f"from tests.test_metrics_export import child; child({str(out)!r}, {str(tmp_path)!r}, {free_port()})"
    )
    done = _python(code, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(out.read_text())
    samples, result = report["samples"], report["result"]
    missing = REQUIRED - {s["name"] for s in samples}
    assert not missing, f"not exported after {report['scraped_s']:.0f} s: {missing}"

    run = {"run": RUN, "algorithm": "SearchGRPO"}
    assert value(samples, "ray_rllib_search_episodes_total", **run) == result["num_episodes"] == 4
    assert value(samples, "ray_rllib_search_turns_total", **run) == result["num_env_steps_sampled"]
    assert value(samples, "ray_rllib_search_training_iteration", **run) == 1
    assert value(samples, "ray_rllib_search_weights_lag", **run) == 1  # sampled with v0, learner at v1
    for component, mean in result["reward"].items():  # em, format, retrieval_hit for search_r1
        assert value(samples, "ray_rllib_search_reward_component", component=component, **run) == mean
    assert "em" in result["reward"]
    assert value(samples, "ray_rllib_search_kl", **run) == pytest.approx(result["kl"])
    assert 1 <= value(samples, "ray_rllib_search_turns_per_episode", **run) <= 3
    assert value(samples, "ray_rllib_search_generation_tokens_per_s", **run) > 0
    assert value(samples, "ray_rllib_search_trained_tokens_per_s", **run) > 0

    retriever, judge = {"service": "retriever"}, {"service": "judge"}
    assert value(samples, "ray_rllib_search_service_call_seconds_count", outcome="ok", **retriever) >= 1
    assert value(samples, "ray_rllib_search_service_items_total", **retriever) >= 2
    assert value(samples, "ray_rllib_search_serve_batch_items_count", **retriever) >= 1
    assert value(samples, "ray_rllib_search_service_call_seconds_count", outcome="error", **judge) == 1
    assert value(samples, "ray_rllib_search_service_retries_total", **judge) == 1
    assert value(samples, "ray_rllib_search_service_errors_total", kind="unavailable", **judge) == 1

    # A gauge is held past the time Ray would drop it (an iteration can take minutes).
    gauges = {SPECS[name].exported_name for name in SPECS if SPECS[name].kind == "gauge"}
    held = [s for s in samples if s["name"] in gauges]
    assert len(held) >= 10
    for sample in held:
        assert value(report["later"], sample["name"], **sample["labels"]) == sample["value"]
    print(f"trained in {report['train_s']:.0f} s, metrics on the endpoint {report['scraped_s']:.0f} s later")
