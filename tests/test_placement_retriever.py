"""Retriever replicas and the GPUs of their node: a replica that asks for no GPU sees none
(``CUDA_VISIBLE_DEVICES=""``; Ray no longer hides them from such an actor), one that asks for a GPU sees
its own, and a replica given GPUs for a flat or IVF-PQ index refuses a faiss without GPU support, naming
the fix. The replicas run on a Ray with 2 logical GPUs, in a subprocess (the session's Ray has none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rllib_search.serve.retrieval.deployment import faiss_gpu_problem, replica_actor_options

ROOT = Path(__file__).resolve().parents[1]


def run(out: str, workdir: str) -> None:
    import ray
    from ray import serve

    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.serve.cluster import patient_serve_proxies
    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.retrieval.build import build_index
    from rllib_search.serve.retrieval.deployment import build_retriever_app

    root = Path(workdir)
    world = generate_world(SyntheticWorldConfig(seed=3, num_passages=60, num_train=4, num_test=4))
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    build_index(root / "corpus.jsonl", root / "bm25", kind="bm25", progress=False)
    patient_serve_proxies()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    seen: dict[str, Any] = {}
    for name, gpus in (("cpu_replica", 0), ("gpu_replica", 1)):
        options = {"num_cpus": 0, "num_gpus": gpus}
        app = build_retriever_app(
            {"index_dir": str(root / "bm25"), "num_replicas": 1, "ray_actor_options": options}
        )
        handle = serve.run(app, name=name, route_prefix=f"/{name}")
        seen[name] = handle.stats.remote().result()["cuda_visible_devices"]
    Path(out).write_text(json.dumps(seen))
    serve.shutdown()
    ray.shutdown()


@pytest.mark.slow
def test_a_replica_without_gpus_sees_none_and_one_with_a_gpu_sees_its_own(tmp_path):
    out = tmp_path / "seen.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_placement_retriever", str(out), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    seen = json.loads(out.read_text())
    assert seen["cpu_replica"] == ""
    assert seen["gpu_replica"] in ("0", "1")


def test_replica_options_hide_the_gpus_only_from_replicas_that_ask_for_none():
    assert replica_actor_options(None)["runtime_env"] == {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    kept = replica_actor_options({"num_cpus": 4, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "4"}}})
    assert kept == {
        "num_cpus": 4,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": ""}},
    }
    assert replica_actor_options({"num_gpus": 1}) == {"num_gpus": 1}


def test_a_replica_given_gpus_refuses_a_cpu_faiss_for_indexes_that_would_use_them():
    import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("this faiss has GPU support and sees GPUs")
    problem = faiss_gpu_problem(["0"], "flat")
    assert problem is not None and "faiss-gpu-cu12" in problem and "faiss-cpu" in problem
    assert faiss_gpu_problem(["0"], "ivfpq") is not None
    assert faiss_gpu_problem([], "flat") is None  # no GPUs: the CPU build is the right one
    assert faiss_gpu_problem(["0"], "hnsw") is None  # faiss has no GPU HNSW
    assert faiss_gpu_problem(["0"], "bm25") is None
    assert faiss_gpu_problem(["0"], "flat", device="cpu") is None  # the replica asked for the CPU


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
