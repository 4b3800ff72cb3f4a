"""The shipped Serve configs (``tuned_examples/serve_*.yaml``) and the embedded default's own Serve apps.

Each config holds both applications (``serve deploy`` replaces a cluster's whole config): the CPU one is
deployed with the Serve CLI onto a ``ray start --head`` cluster and answers on both routes; the GPU ones
are checked against Serve's own schema and built by our builders. The embedded default's
``serve_retriever``/``serve_judge`` run apps of their own beside a user's ``retriever`` and ``judge``,
never reusing or deleting them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rllib_search.recipes.r_search import CPU_JUDGE_SPEC
from rllib_search.serve.judge.deployment import DEPLOYMENT_NAME as JUDGE_DEPLOYMENT
from rllib_search.serve.judge.deployment import build_judge_app
from rllib_search.serve.retrieval.deployment import DEPLOYMENT_NAME as RETRIEVER_DEPLOYMENT
from rllib_search.serve.retrieval.deployment import build_retriever_app, gpu_shortfall
from tests.helpers import RayHead

EXAMPLES = Path(__file__).resolve().parents[1] / "tuned_examples"
CONFIGS = ("serve_cpu.yaml", "serve_gpu.yaml", "serve_gpu_llm.yaml")


def load_config(name: str):
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_holds_both_apps_on_loopback(name):
    """Valid for Serve's own schema; a retriever at / (Search-R1's /retrieve) and a judge at /judge."""
    config = load_config(name)
    assert config.http_options.host == "127.0.0.1"
    assert {(app.name, app.route_prefix) for app in config.applications} == {
        ("retriever", "/"),
        ("judge", "/judge"),
    }


def test_the_cpu_config_asks_for_no_gpus_and_builds_its_apps():
    apps = {app.name: app for app in load_config("serve_cpu.yaml").applications}
    for app in apps.values():
        assert not app.args["ray_actor_options"].get("num_gpus")
    retriever = build_retriever_app(apps["retriever"].args)._bound_deployment
    assert retriever.name == RETRIEVER_DEPLOYMENT
    assert retriever.init_kwargs["synthetic_world_seed"] == 0
    judge = build_judge_app(apps["judge"].args)._bound_deployment
    assert judge.name == JUDGE_DEPLOYMENT and judge.init_kwargs["model"] == "gemma3-270m"


def test_the_gpu_configs_give_each_replica_a_gpu_and_build_their_apps():
    apps = {app.name: app for app in load_config("serve_gpu.yaml").applications}
    retriever = build_retriever_app(apps["retriever"].args)._bound_deployment
    assert retriever.name == RETRIEVER_DEPLOYMENT
    assert retriever.ray_actor_options["num_gpus"] == 1
    assert retriever.init_kwargs["encoder"] == "intfloat/e5-base-v2"
    judge = build_judge_app(apps["judge"].args)._bound_deployment
    assert judge.name == JUDGE_DEPLOYMENT and judge.ray_actor_options["num_gpus"] == 1
    assert judge.init_kwargs["engine"] == "vllm"

    llm = {app.name: app for app in load_config("serve_gpu_llm.yaml").applications}
    assert llm["retriever"].args == apps["retriever"].args
    assert llm["judge"].import_path == "ray.serve.llm:build_openai_app"
    # ray.serve.llm itself imports only where vLLM is installed; its LLMConfig is this class.
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    (config,) = [LLMConfig.model_validate(c) for c in llm["judge"].args["llm_configs"]]
    assert config.model_id == "llama-3.2-3b-judge"


def test_the_retriever_needs_one_index_source():
    with pytest.raises(ValueError, match="index_dir"):
        build_retriever_app({})
    with pytest.raises(ValueError, match="one of them"):
        build_retriever_app({"index_dir": "/data/idx", "synthetic_world_seed": 0})


def test_gpus_the_cluster_lacks_are_named():
    assert gpu_shortfall(0, 0) is None and gpu_shortfall(1, 2) is None
    problem = gpu_shortfall(1, 0)
    assert "1 GPU(s) per replica but the cluster has 0" in problem and "serve_cpu.yaml" in problem


# --- the embedded default beside a user's apps -----------------------------------------------------------
@pytest.mark.slow
def test_embedded_apps_never_reuse_nor_delete_a_users_apps(
    service, judge_url, corpus, judge_model_dir, tmp_path
):
    """With a user's ``retriever`` (the session's dense index) and ``judge`` running, the embedded
    retriever over a BM25 index and the embedded judge run as apps of their own names, are reused by a
    second call, and ``stop_apps`` with the role names deletes them, not the user's."""
    from ray import serve

    from rllib_search.recipes import embedded
    from rllib_search.serve.retrieval.build import ensure_index
    from rllib_search.serve.retrieval.client import build_retriever

    index = ensure_index(corpus, tmp_path / "bm25", kind="bm25", progress=False)
    spec, started = embedded.serve_retriever(index)
    assert started and spec["app"] == embedded.retriever_app_name(index)
    assert spec["app"].startswith("embedded-retriever-")
    stats = serve.get_app_handle(spec["app"]).stats.remote().result(timeout_s=60)
    assert stats["manifest"]["kind"] == "bm25"  # this job's index, not the user's flat one
    (passages,) = build_retriever(spec).search(["who founded the company"], 2)
    assert len(passages) == 2
    assert embedded.serve_retriever(index) == (spec, False)

    judge_spec, judge_started = embedded.serve_judge(str(judge_model_dir))
    assert judge_started and judge_spec["app"].startswith("embedded-judge-")
    # the embedded judge prompts as the CPU R-Search recipe's does (worked examples, plain completions)
    assert {key: judge_spec[key] for key in ("api", "examples")} == {
        key: CPU_JUDGE_SPEC[key] for key in ("api", "examples")
    }
    assert embedded.serve_judge(str(judge_model_dir)) == (judge_spec, False)

    embedded.stop_apps([embedded.RETRIEVER_APP, embedded.JUDGE_APP])
    apps = serve.status().applications
    assert spec["app"] not in apps and judge_spec["app"] not in apps
    assert apps["retriever"].status == "RUNNING" and apps["judge"].status == "RUNNING"
    embedded.stop_apps([embedded.RETRIEVER_APP, embedded.JUDGE_APP])  # none of this process's left
    assert {"retriever", "judge"} <= set(serve.status().applications)


# --- the CPU config deployed with the Serve CLI ----------------------------------------------------------
def serve_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "serve"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def app_statuses(dashboard: str, env: dict[str, str]) -> tuple[dict[str, str], str]:
    """Each application's status per ``serve status``, and its output (for a failure's message)."""
    done = serve_cli("status", "-a", dashboard, env=env)
    if done.returncode != 0:
        return {}, done.stdout + done.stderr
    status = yaml.safe_load(done.stdout) or {}
    apps = status.get("applications") or {}
    return {name: app.get("status") for name, app in apps.items()}, done.stdout


@pytest.mark.slow
@pytest.mark.timing
def test_serve_deploy_of_the_cpu_config_answers_on_both_routes(tmp_path):
    """``ray start --head``, then ``serve deploy tuned_examples/serve_cpu.yaml`` (on a free HTTP port): both
    applications come up RUNNING on a cluster without GPUs, the retriever finds a passage by its own
    words on /retrieve and the judge completes a prompt on /judge/v1."""
    import requests

    from rllib_search.serve.http.ports import free_port
    from rllib_search.serve.retrieval.deployment import synthetic_world_index

    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    http_port = free_port()
    config = yaml.safe_load((EXAMPLES / "serve_cpu.yaml").read_text())
    config["http_options"]["port"] = http_port  # the shipped 8000 may be taken on a shared machine
    config_path = tmp_path / "serve_cpu.yaml"
    config_path.write_text(yaml.safe_dump(config))
    head = RayHead("rayserve", environment)
    dashboard = head.dashboard
    cli_env = {**environment, "RAY_AUTH_MODE": "token"}
    try:
        deadline = time.monotonic() + 180
        while True:  # the head's job agent takes a few seconds more than its dashboard
            done = serve_cli("deploy", str(config_path), "-a", dashboard, env=cli_env)
            if done.returncode == 0:
                break
            assert time.monotonic() < deadline, (done.stdout + done.stderr)[-3000:]
            time.sleep(2)

        deadline = time.monotonic() + 420
        statuses, output = app_statuses(dashboard, cli_env)
        while statuses != {"retriever": "RUNNING", "judge": "RUNNING"}:
            assert "DEPLOY_FAILED" not in statuses.values(), output[-4000:]
            assert time.monotonic() < deadline, output[-4000:]
            time.sleep(2)
            statuses, output = app_statuses(dashboard, cli_env)

        base = f"http://127.0.0.1:{http_port}"
        passage = next(iter(_corpus_rows(synthetic_world_index(0)[1])))
        answer = requests.post(
            f"{base}/retrieve",
            json={"queries": [passage["contents"]], "topk": 3, "return_scores": True},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        (results,) = answer.json()["result"]
        assert len(results) == 3 and results[0]["score"] >= results[-1]["score"]
        assert passage["id"] in [r["document"]["id"] for r in results]

        models = requests.get(f"{base}/judge/v1/models", timeout=60).json()
        assert [m["id"] for m in models["data"]] == ["gemma3-270m"]
        completion = requests.post(
            f"{base}/judge/v1/completions",
            json={"model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 8},
            timeout=300,
        )
        assert completion.status_code == 200, completion.text
        body = completion.json()
        (choice,) = body["choices"]
        assert choice["text"].strip() and choice["finish_reason"] in ("stop", "length")
        assert 1 <= body["usage"]["completion_tokens"] <= 8
    finally:
        head.stop()


def _corpus_rows(index_dir: Path):
    """The passages of an index directory (its memory-mapped corpus), as dicts."""
    import pyarrow as pa

    from rllib_search.serve.retrieval.manifest import read_manifest

    with pa.memory_map(str(index_dir / read_manifest(index_dir)["corpus_file"])) as source:
        table = pa.ipc.open_file(source).read_all()
    return table.slice(0, 5).to_pylist()
