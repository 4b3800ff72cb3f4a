"""The retriever on real Ray Serve over 127.0.0.1: Search-R1's HTTP schema, bounds, the in-cluster client,
dynamic batching, surviving a killed replica, and the env using it."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.serve.http.ports import free_port
from rllib_search.serve.retrieval.client import RetrieverClient, RetrieverRequestError, RetrieverUnavailable
from rllib_search.serve.retrieval.deployment import (
    APP_NAME,
    DEPLOYMENT_NAME,
    build_retriever_app,
    search_in_shards,
    search_in_shards_blocking,
    shard_rows,
)
from rllib_search.serve.retrieval.load import load_index

pytestmark = pytest.mark.slow


def test_http_schema_is_search_r1s(service, index_dir, world):
    queries = [world.test[0].extra["hops"][0]["query"], "lead singer"]
    response = requests.post(service, json={"queries": queries, "topk": 3, "return_scores": True}, timeout=30)
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(r) == 3 for r in result)
    first = result[0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"].startswith('"')
    # Same passages as the index in-process, best first.
    local = load_index(index_dir).search(queries, 3)
    assert [item["document"]["id"] for item in result[0]] == [p.id for p in local[0]]
    scores = [item["score"] for item in result[0]]
    assert scores == sorted(scores, reverse=True)

    no_scores = requests.post(
        service, json={"queries": queries[:1], "topk": 2, "return_scores": False}, timeout=30
    )
    assert all(set(item) == {"document"} for item in no_scores.json()["result"][0])


def test_search_r1_client_usage(service, world):
    """Search-R1's rollout posts {queries, topk, return_scores: True} and reads result[i][j]['document']
    ['contents'], splitting the title off the first line to write 'Doc i(Title: t) text'."""
    payload = {
        "queries": [r.extra["hops"][0]["query"] for r in world.test[:4]],
        "topk": 3,
        "return_scores": True,
    }
    results = requests.post(service, json=payload, timeout=30).json()["result"]
    for retrieval in results:
        lines = []
        for i, item in enumerate(retrieval):
            content = item["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            lines.append(f"Doc {i + 1}(Title: {title}) {text}")
        assert len(lines) == 3 and all(line.startswith("Doc ") for line in lines)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json at all", 422),
        (b"", 422),
        ({"topk": 3}, 422),
        ({"queries": "a string, not a list", "topk": 3}, 422),
        ({"queries": [1, 2], "topk": 3}, 422),
        ({"queries": ["q"], "topk": 0}, 422),
        ({"queries": ["q"], "topk": 11}, 422),
        ({"queries": ["q"], "topk": "many"}, 422),
        ({"queries": ["q" * 501], "topk": 3}, 422),
        ({"queries": ["q"] * 65, "topk": 3}, 413),
    ],
)
def test_malformed_requests_get_4xx_with_a_message(service, body, status):
    if isinstance(body, bytes):
        response = requests.post(service, data=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        response = requests.post(service, json=body, timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["detail"]


def test_empty_query_list(service):
    response = requests.post(service, json={"queries": [], "topk": 3}, timeout=30)
    assert response.status_code == 200 and response.json() == {"result": []}


def test_handle_client_matches_http_and_rejects_bad_requests(service):
    client = RetrieverClient.from_app(timeout_s=30)
    via_handle = client.search(["lead singer", "capital"], 2)
    via_http = RetrieverClient(url=service).search(["lead singer", "capital"], 2)
    assert [[p.id for p in r] for r in via_handle] == [[p.id for p in r] for r in via_http]
    assert via_handle[0][0].title and via_handle[0][0].score is not None
    with pytest.raises(RetrieverRequestError, match="topk"):
        client.search(["q"], 50)
    with pytest.raises(RetrieverRequestError, match="HTTP 422"):
        RetrieverClient(url=service).search(["q" * 600], 3)


def test_concurrent_requests_are_batched(service):
    from ray import serve

    handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
    before = [handle.stats.remote().result() for _ in range(6)]  # both replicas answer at least once
    client = RetrieverClient.from_app(timeout_s=60)
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: client.search([f"question number {i}"], 3), range(64)))
    assert all(len(r) == 1 and len(r[0]) == 3 for r in results)
    after = [handle.stats.remote().result() for _ in range(6)]
    batches = max(s["batches"] for s in after) + min(s["batches"] for s in after)
    assert batches < 64 + sum(s["batches"] for s in before)  # fewer encoder calls than requests
    assert max(s["mean_queries_per_batch"] for s in after) > 1.0
    assert all(s["rss_mb"] > 0 for s in after)


def stats_by_replica(handle, replicas: int = 2) -> dict[str, dict]:
    """Each replica's stats, by replica id (a stats call goes to whichever replica the router picks)."""
    seen: dict[str, dict] = {}
    for _ in range(100):
        stats = handle.stats.remote().result()
        seen[stats["replica_id"]] = stats
        if len(seen) == replicas:
            return seen
    raise AssertionError(f"only {len(seen)} of {replicas} replicas answered")


def test_a_large_request_is_searched_off_the_loop_in_order_and_counted(service, index_dir, world):
    """40 queries (a batch big enough for the worker thread) come back in order, each with the passages
    the index gives it in-process; the replicas' counters show exactly those 40 queries and busy time."""
    from ray import serve

    handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
    records = world.test + world.train
    queries = list(dict.fromkeys(hop["query"] for record in records for hop in record.extra["hops"]))[:40]
    assert len(queries) == 40
    before = stats_by_replica(handle)
    via_handle = RetrieverClient.from_app(timeout_s=60).search(queries, 3)
    after = stats_by_replica(handle)
    local = load_index(index_dir).search(queries, 3)
    assert [[p.id for p in r] for r in via_handle] == [[p.id for p in r] for r in local]
    assert sum(after[r]["queries"] - before[r]["queries"] for r in after) == 40
    assert sum(after[r]["busy_seconds"] - before[r]["busy_seconds"] for r in after) > 0
    assert all(s["threads"] == 1 and s["concurrent_batches"] == 1 for s in after.values())
    body = requests.post(service, json={"queries": queries, "topk": 3}, timeout=60).json()["result"]
    assert [[item["document"]["id"] for item in r] for r in body] == [[p.id for p in r] for r in local]


def test_a_batch_searched_in_shards_answers_as_one_search(index_dir, world):
    """What a replica on several CPUs does with a big batch: shards of similar length mix, searched on
    worker threads at once, answered in the queries' order with the passages one search gives."""
    import asyncio

    index = load_index(index_dir, dtype="float32")
    queries = [hop["query"] for record in world.test for hop in record.extra["hops"]][:41]
    rows = shard_rows(queries, 3)
    assert sorted(i for shard in rows for i in shard) == list(range(41))
    assert [len(shard) for shard in rows] == [14, 14, 13]
    longest = max(range(41), key=lambda i: len(queries[i]))
    assert rows[0][0] == longest
    assert shard_rows(queries[:2], 3) == [[0], [1]] or shard_rows(queries[:2], 3) == [[1], [0]]
    with ThreadPoolExecutor(3) as workers:
        sharded = asyncio.run(search_in_shards(index, queries, 3, 3, workers))
        blocking = search_in_shards_blocking(index, queries[:9], 3, 3, workers)
    whole = index.search(queries, 3)
    assert [[p.id for p in r] for r in sharded] == [[p.id for p in r] for r in whole]
    assert [[p.id for p in r] for r in blocking] == [[p.id for p in r] for r in whole[:9]]
    sharded_scores = [p.score for r in sharded for p in r]
    assert sharded_scores == pytest.approx([p.score for r in whole for p in r], abs=1e-5)


def assert_queries_survive_a_kill(client: RetrieverClient, kill) -> None:
    """Query in a loop, call ``kill()`` (a replica dies) mid-run, and require every query to succeed and
    queries to go on after the kill."""
    answers, errors = [], []
    stop = threading.Event()

    def query_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                answers.append(client.search([f"capital {i}"], 2))
            except Exception as error:  # counted: the assertion below wants none
                errors.append(error)
            i += 1

    thread = threading.Thread(target=query_loop)
    thread.start()
    time.sleep(1.0)
    kill()
    killed_at = len(answers)
    time.sleep(6.0)
    stop.set()
    thread.join(timeout=120)
    assert not errors
    assert len(answers) > killed_at  # queries went on after the kill


@pytest.mark.timing
def test_client_survives_a_killed_replica(service):
    import ray

    def kill() -> None:
        replicas = [
            a
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and DEPLOYMENT_NAME in a["name"] and "REPLICA" in a["name"].upper()
        ]
        assert replicas, "no replica actor found"
        ray.kill(ray.get_actor(replicas[0]["name"], namespace="serve"), no_restart=True)

    assert_queries_survive_a_kill(RetrieverClient.from_app(timeout_s=20, max_retries=8, backoff_s=0.25), kill)


def test_env_searches_through_the_service_and_counts_failures(service, tiny_tokenizer, world):
    record = world.test[0]
    env = MultiTurnSearchEnv(tiny_tokenizer, RetrieverClient.from_app(timeout_s=30), [record])
    env.reset(options={"index": 0})
    segment = tiny_tokenizer(
        env.protocol.render_search(record.extra["hops"][0]["query"], thought="t"), add_special_tokens=False
    )["input_ids"]
    obs, *_, info = env.step(segment)
    assert info["searches"] == 1 and "Doc 1(Title:" in tiny_tokenizer.decode(obs)

    dead = RetrieverClient(
        url=f"http://127.0.0.1:{free_port()}/retrieve", timeout_s=1, max_retries=1, backoff_s=0.01
    )
    env = MultiTurnSearchEnv(tiny_tokenizer, dead, [record])
    env.reset(options={"index": 0})
    obs, *_, info = env.step(segment)
    assert info["retriever_errors"] == 1 and "Search failed: RetrieverUnavailable" in tiny_tokenizer.decode(
        obs
    )
    assert dead.stats.failures == 1 and dead.stats.retries == 1
    with pytest.raises(RetrieverUnavailable):
        dead.search(["q"], 1)


def test_serve_config_yaml_builds_the_app(index_dir):
    import yaml
    from ray.serve.schema import ServeDeploySchema

    config_path = Path(__file__).parents[1] / "tuned_examples" / "serve_gpu.yaml"
    config = ServeDeploySchema.parse_obj(yaml.safe_load(config_path.read_text()))
    (app_config,) = [app for app in config.applications if app.name == "retriever"]
    assert app_config.import_path == "rllib_search.serve.retrieval.deployment:build_retriever_app"
    args = {**app_config.args, "index_dir": str(index_dir), "encoder": "all-minilm-l6-v2"}
    app = build_retriever_app(args)
    deployment = app._bound_deployment
    assert deployment.name == DEPLOYMENT_NAME
    assert (
        deployment._deployment_config.autoscaling_config.max_replicas
        == args["autoscaling_config"]["max_replicas"]
    )


INGRESSES = {"proxy actor": [], "HAProxy": ["--high-throughput"]}


def start_serve_retriever(index_dir: Path, log_path: Path, extra: list[str], port: int, taken: list[int]):
    """``rllib-search serve retriever`` on its own local Ray (two replicas) in a subprocess, on ``port``;
    returns the process and its port."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "rllib_search.cli", "serve", "retriever", "--index", str(index_dir)]
    command += ["--port", str(port), "--address", "local", "--num-cpus", "0.5"]
    command += ["--min-replicas", "2", "--max-replicas", "2", "--duration-s", "600", *extra]
    # HAProxy's stats and metrics frontends bind fixed ports (8404, 9101) on all interfaces unless told
    # otherwise; a CI run had them taken and HAProxy exited at start, so each server gets free ones.
    haproxy_ports = [free_port(exclude=taken)]
    haproxy_ports.append(free_port(exclude=[*taken, *haproxy_ports]))
    taken.extend(haproxy_ports)
    env = {
        **os.environ,
        "RAY_SERVE_HAPROXY_STATS_PORT": str(haproxy_ports[0]),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(haproxy_ports[1]),
    }
    with log_path.open("w") as log:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env), port


def check_serve_retriever(process, port: int, log_path: Path, ingress: str) -> None:
    """The command answers Search-R1 requests on 127.0.0.1 through ``ingress``, rejects a bad one with a
    422 and a message, and an HTTP client survives one of its replica processes killed mid-run."""
    import signal

    import psutil

    url = f"http://127.0.0.1:{port}/retrieve"
    response = None
    deadline = time.monotonic() + 240  # two local Rays start side by side on two cores
    while time.monotonic() < deadline and process.poll() is None:
        try:
            response = requests.post(url, json={"queries": ["lead singer"], "topk": 2}, timeout=10)
            if response.status_code == 200:
                break
        except requests.RequestException:
            response = None
        time.sleep(1.0)
    assert response is not None and response.status_code == 200, log_path.read_text()[-3000:]
    assert len(response.json()["result"][0]) == 2
    bad = requests.post(url, json={"queries": ["x"], "topk": 0}, timeout=10)
    assert bad.status_code == 422 and "topk" in bad.json()["detail"]
    deadline = time.monotonic() + 30  # the app can answer just before serve.run returns and prints
    while "retriever ready" not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert f"retriever ready ({ingress})" in log_path.read_text()

    def kill() -> None:  # a replica of THIS command's Ray: a descendant of its process
        replicas = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "ServeReplica" in " ".join(child.cmdline())
        ]
        assert len(replicas) == 2, [" ".join(r.cmdline()) for r in replicas]
        replicas[0].send_signal(signal.SIGKILL)

    assert_queries_survive_a_kill(RetrieverClient(url=url, timeout_s=20, max_retries=8, backoff_s=0.25), kill)


def test_serve_retriever_command(index_dir, tmp_path):
    """`rllib-search serve retriever` twice, side by side (each on its own local Ray, to halve the suite's
    wait for Ray to start): through Serve's proxy actor, and through HAProxy straight to the replicas
    (``--high-throughput``). Each answers on 127.0.0.1 and survives a replica killed mid-run."""
    ports: list[int] = []
    for _ in INGRESSES:  # distinct: neither server has bound its port when the other's is drawn
        ports.append(free_port(exclude=ports))
    logs = [tmp_path / f"{i}.log" for i in range(len(INGRESSES))]
    taken = list(ports)  # the servers' ports, then each HAProxy's stats and metrics ports
    started = {
        ingress: (*start_serve_retriever(index_dir, log, extra, port, taken), log)
        for (ingress, extra), port, log in zip(INGRESSES.items(), ports, logs, strict=True)
    }
    try:
        for ingress, (process, port, log_path) in started.items():
            check_serve_retriever(process, port, log_path, ingress)
    finally:
        for process, _, _ in started.values():
            process.terminate()
        for process, _, _ in started.values():
            process.wait(timeout=60)
