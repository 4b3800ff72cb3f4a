"""The paper recipes' actors, placed: on a Ray with 8 logical GPUs (a CPU host: Ray counts GPUs it never
touches), each recipe at ``scale="paper"`` keeps its layout (colocated learner/EnvRunner pairs, fractional
GPUs) and gets the tiny model and HF engine in place of Qwen and vLLM. For every recipe: the pairs'
placement group is created, each of its bundles holds exactly one learner and one EnvRunner (same group,
same GPU id), every actor answered (nothing pending), and the driver's EnvRunner built no policy and no
engine (no model object lives in the driver). For Search-R1 GRPO one colocated iteration runs and the
events its actors recorded are in the colocated order (``algos/learners/offload.py``):
sample -> engine sleep -> learner onload -> update -> weight sync -> learner offload -> engine wake.

It runs in a subprocess (its own Ray, with GPUs; the session's has none). On a CPU host the learners must
not take the logical GPU for a CUDA device: RLlib picks ``cuda:0`` for a learner Ray gave a GPU and Ray
Train picks NCCL, so the subprocess runs the recipes' own learner classes with their device fixed to the
CPU and Ray Train's process group on gloo, as a CPU run has them; everything else is the recipes' own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# 8 + 3 x 4 actors started on 2 cores: minutes, more on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
UNREACHABLE_JUDGE = {"type": "url", "url": "http://127.0.0.1:9/v1", "api": "completions", "model": "none"}


# --- the subprocess --------------------------------------------------------------------------------------
def cpu_learner_class(base: type) -> type:
    """``base`` with its device fixed to the CPU (RLlib would pick ``cuda:0`` for a logical GPU)."""
    import torch

    def get_device(self: Any) -> Any:
        return torch.device("cpu")

    def set_device(self: Any, value: Any) -> None:
        del value

    return type(f"CPU{base.__name__}", (base,), {"_device": property(get_device, set_device)})


def gloo_process_groups() -> None:
    """Ray Train's torch process group on gloo (it picks NCCL for learners that hold a GPU)."""
    from ray.rllib.core.learner import learner_group

    original = learner_group._get_backend_config

    def gloo(learner_class: type) -> Any:
        config = original(learner_class)
        config.backend = "gloo"
        return config

    learner_group._get_backend_config = gloo


def recipe_layout(name: str, model: str, world: Any, corpus: str) -> Any:
    """The recipe at paper scale with the tiny model, the HF engine, BM25 and short budgets."""
    from rllib_search.recipes import RECIPES

    kwargs: dict[str, Any] = {"dataset": world.train, "retriever": {"type": "bm25", "corpus": corpus}}
    if name == "r_search":
        kwargs["judge"] = UNREACHABLE_JUDGE
    config = RECIPES[name](scale="paper", **kwargs)
    env_config = {**config.env_config, "max_turns": 2, "max_total_tokens": 400, "max_obs_tokens": 40}
    config.environment(env_config=env_config)
    config.rl_module(model_config={**config.model_config, "model": model, "gradient_checkpointing": False})
    config.rollouts(engine="hf", engine_options={}, group_size=2, prompts_per_sample=1, max_turn_tokens=8)
    config.training(
        learner_class=cpu_learner_class(config.get_default_learner_class()),
        minibatch_size=2,
        micro_batch_size=2,
        total_training_steps=100,
    )
    config.debugging(seed=7)
    return config


def placement(algo: Any) -> dict[str, Any]:
    """Where each remote EnvRunner and learner runs (placement group, GPU ids) and what each recorded."""
    from rllib_search.algos.colocation import placement_of_actor

    runners = algo.env_runner_group.foreach_env_runner(
        lambda runner: {"index": runner.worker_index, "events": list(runner.events), **placement_of_actor()},
        local_env_runner=False,
    )
    learners = [
        result.get()
        for result in algo.learner_group.foreach_learner(
            lambda learner: {
                "events": list(learner.offload_state.events),
                "offloaded": learner.offload_state.offloaded,
                **placement_of_actor(),
            }
        )
    ]
    return {"runners": runners, "learners": learners}


def driver_models() -> int:
    """How many transformers models live in this (the driver's) process."""
    import gc

    from transformers import PreTrainedModel

    return sum(isinstance(obj, PreTrainedModel) for obj in gc.get_objects())


def run(out: str, workdir: str) -> None:
    import ray

    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
    from rllib_search.recipes import RECIPES

    root = Path(workdir)
    world = generate_world(SyntheticWorldConfig(seed=3, num_passages=200, num_train=16, num_test=4))
    corpus = str(root / "corpus.jsonl")
    write_corpus_jsonl(world.passages, corpus)
    model = str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))
    gloo_process_groups()
    ray.init(address="local", num_cpus=6, num_gpus=8, include_dashboard=False, log_to_driver=False)
    report: dict[str, Any] = {}
    for name in RECIPES:
        config = recipe_layout(name, model, world, corpus)
        if name != "search_r1_grpo":  # its four pairs are the paper's layout; two show the others' pairing
            config.learners(num_learners=2).env_runners(num_env_runners=2)
        algo = config.build_algo()
        pairs = algo._pairs
        entry: dict[str, Any] = {
            "layout": {
                "colocate": config.colocate,
                "num_learners": config.num_learners,
                "num_env_runners": config.num_env_runners,
                "num_gpus_per_learner": config.num_gpus_per_learner,
                "num_gpus_per_env_runner": config.num_gpus_per_env_runner,
            },
            "pairs_group": pairs.id.hex() if pairs is not None else None,
            "pairs_state": ray.util.placement_group_table(pairs)["state"] if pairs is not None else None,
            "bundles": pairs.bundle_specs if pairs is not None else None,
            "driver_runner": {
                "hollow": algo.env_runner.hollow,
                "engine": algo.env_runner.engine is not None,
                "module": algo.env_runner.module is not None,
            },
            "driver_models": driver_models(),
            "cluster_gpus_free": ray.available_resources().get("GPU", 0.0),
        }
        if name == "search_r1_grpo":
            entry["before"] = placement(algo)
            algo.train()
            entry["driver_events"] = list(algo.colocation_events)
            entry["driver_models_after_train"] = driver_models()
        entry["after"] = placement(algo)
        algo.stop()
        entry["pairs_removed"] = ray.util.placement_group_table(pairs)["state"] if pairs is not None else None
        report[name] = entry
    Path(out).write_text(json.dumps(report))
    ray.shutdown()


# --- the test --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("placement")
    out = workdir / "report.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_placement", str(out), str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def check_pairs(entry: dict[str, Any]) -> None:
    """One learner and one EnvRunner per bundle of the pairs' group, on the same GPU."""
    layout = entry["layout"]
    pairs = layout["num_learners"]
    assert layout["colocate"] and pairs == layout["num_env_runners"] > 1
    share = layout["num_gpus_per_learner"] + layout["num_gpus_per_env_runner"]
    assert entry["pairs_state"] == "CREATED" and len(entry["bundles"]) == pairs
    assert all(bundle["GPU"] == pytest.approx(share) for bundle in entry["bundles"])
    where = entry["after"]
    assert sorted(runner["index"] for runner in where["runners"]) == list(range(1, pairs + 1))
    assert len(where["learners"]) == pairs
    for actor in where["runners"] + where["learners"]:  # every actor answered: none is pending
        assert actor["placement_group"] == entry["pairs_group"]
        assert len(actor["gpu_ids"]) == 1
    runner_gpus = sorted(runner["gpu_ids"][0] for runner in where["runners"])
    learner_gpus = sorted(learner["gpu_ids"][0] for learner in where["learners"])
    assert runner_gpus == learner_gpus and len(set(runner_gpus)) == pairs  # one pair per GPU
    assert entry["cluster_gpus_free"] == pytest.approx(8 - pairs * share)


@pytest.mark.parametrize("recipe", ["search_r1_grpo", "search_r1_ppo", "r1_searcher", "r_search"])
def test_each_paper_recipe_places_one_learner_and_one_env_runner_per_gpu(report, recipe):
    entry = report[recipe]
    check_pairs(entry)
    assert entry["driver_runner"] == {"hollow": True, "engine": False, "module": False}
    assert entry["driver_models"] == 0  # no policy and no engine in the driver
    assert entry["pairs_removed"] == "REMOVED"  # the Algorithm gives its placement group back on stop
    assert all(learner["offloaded"] for learner in entry["after"]["learners"])  # sampling comes first


def test_one_colocated_iteration_runs_in_the_colocated_order(report):
    entry = report["search_r1_grpo"]
    assert entry["driver_models_after_train"] == 0
    runners, learners = entry["after"]["runners"], entry["after"]["learners"]
    (update,) = [time for name, time in entry["driver_events"] if name == "update"]
    for learner in learners:
        assert [name for name, _ in learner["events"]] == ["offload", "onload", "offload"]
    first_offload = max(learner["events"][0][1] for learner in learners)
    onload = [learner["events"][1][1] for learner in learners]
    offload = [learner["events"][2][1] for learner in learners]
    for runner in runners:
        names = [name for name, _ in runner["events"]]
        # The setup's weight sync, then one iteration: sample, sleep, the new weights, wake.
        assert names == ["sync", "sample", "sleep", "sync", "wake"], names
        times = dict(zip(["setup_sync", "sample", "sleep", "sync", "wake"], [t for _, t in runner["events"]]))
        assert first_offload < times["sample"]  # the learners were off the GPU while the engine sampled
        assert times["sleep"] < min(onload)  # the engine slept before any learner came back
        assert max(onload) < update < times["sync"]  # the update, then the weights to the engine
        assert times["sync"] < min(offload)  # the learners left once the weights were out
        assert max(offload) < times["wake"]  # and the engine woke into the freed memory


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
