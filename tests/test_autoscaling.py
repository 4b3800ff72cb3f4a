"""The retriever's ``autoscaling_config`` seen working: under load from concurrent HTTP clients on
127.0.0.1 the deployment scales from 1 replica to 2, and back to 1 when the load stops.

Nothing here is timed tightly: the test polls ``serve.status()`` with wide deadlines (Serve's handles push
their request counts every 10 s by default, and the look-back window averages them). The load is made
heavy by the deployment's own knob: a long ``batch_wait_timeout_s`` holds every request in the replica for
about that long, so each client keeps one request ongoing nearly all the time, whatever the machine's
speed.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from rllib_search.data.formats import write_corpus_jsonl
from rllib_search.serve.replicas import running_replicas
from rllib_search.serve.retrieval.build import build_index
from rllib_search.serve.retrieval.deployment import DEPLOYMENT_NAME, build_retriever_app

pytestmark = pytest.mark.slow

APP = "autoscaled_retriever"
ROUTE = "/autoscaled"
CLIENTS = 8
DEADLINE_S = 120.0
AUTOSCALING = {
    "min_replicas": 1,
    "initial_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 2,  # 8 clients ongoing on one replica: 4x the target
    "upscale_delay_s": 2.0,
    "downscale_delay_s": 5.0,
    "look_back_period_s": 12.0,  # above the 10 s default metrics interval (Serve warns otherwise)
}


def wait_for_replicas(predicate, deadline_s: float, timeline: list[tuple[float, int]], t0: float) -> int:
    """Poll the running replica count every 0.5 s until ``predicate(count)`` or the deadline; returns the
    last count."""
    deadline = time.monotonic() + deadline_s
    count = running_replicas(APP, DEPLOYMENT_NAME)
    while not predicate(count) and time.monotonic() < deadline:
        time.sleep(0.5)
        count = running_replicas(APP, DEPLOYMENT_NAME)
        timeline.append((round(time.monotonic() - t0, 1), count))
    return count


@pytest.mark.timing
def test_retriever_scales_up_under_load_and_down_when_idle(service, world, tmp_path):
    from ray import serve

    write_corpus_jsonl(world.passages, tmp_path / "corpus.jsonl")
    build_index(tmp_path / "corpus.jsonl", tmp_path / "bm25", kind="bm25", progress=False)
    app = build_retriever_app(
        {
            "index_dir": str(tmp_path / "bm25"),
            "batch_wait_timeout_s": 0.25,
            "autoscaling_config": AUTOSCALING,
            "ray_actor_options": {"num_cpus": 0.25},  # two replicas fit beside the session's others
        }
    )
    serve.run(app, name=APP, route_prefix=ROUTE)
    url = service.rsplit("/", 1)[0] + ROUTE + "/retrieve"
    queries = [hop["query"] for record in world.test for hop in record.extra["hops"]]
    stop = threading.Event()
    outcomes: dict[int, int] = {}
    lock = threading.Lock()

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            try:
                code = requests.post(
                    url, json={"queries": [queries[i % len(queries)]], "topk": 2}, timeout=60
                ).status_code
            except requests.RequestException:
                code = -1
            with lock:
                outcomes[code] = outcomes.get(code, 0) + 1
            i += CLIENTS

    timeline: list[tuple[float, int]] = []
    t0 = time.monotonic()
    try:
        assert running_replicas(APP, DEPLOYMENT_NAME) == 1
        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(CLIENTS)]
        for thread in threads:
            thread.start()
        peak = wait_for_replicas(lambda n: n >= 2, DEADLINE_S, timeline, t0)
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
        assert peak >= 2, f"no upscale under load; replicas over time {timeline}, responses {outcomes}"
        final = wait_for_replicas(lambda n: n == 1, DEADLINE_S, timeline, t0)
        assert final == 1, f"no downscale when idle; replicas over time {timeline}"
        # Every request of the ramp was answered, including those routed while a replica started.
        assert set(outcomes) == {200} and outcomes[200] >= CLIENTS, outcomes
        print(f"replicas over time (s, running): {timeline}; responses {outcomes}")
    finally:
        stop.set()
        serve.delete(APP)
