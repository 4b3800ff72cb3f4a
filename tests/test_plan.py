"""The resource and memory plan (``algos/plan``): its state terms against the bytes of real tensors, model
shapes against the models transformers builds from them, the shipped paper layouts on 8 x 80 GiB with their
services, refusals with the numbers, the ``plan`` command, and ``build_algo`` refusing a run the local Ray
cannot place before any actor starts."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from rllib_search.algos.plan import make_plan, model_shape
from rllib_search.algos.plan.memory import LearnerSetup, learner_terms
from rllib_search.algos.plan.resources import read_services
from rllib_search.algos.plan.shapes import PUBLISHED_SHAPES, ModelShape
from rllib_search.llm.models import linears_in_autocast_dtype
from rllib_search.recipes.train_cli import DEFAULT_SERVICES, PAPER_CONFIGS
from tests.helpers import build_tiny_qwen2_lm

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """The tiny Llama of ``llm/tiny.py``: untied output head, no biases."""
    from rllib_search.llm.tiny import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("plan_llama"), hidden_size=32)


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    """A tiny Qwen2: tied embeddings, biases on q, k and v, grouped-query attention."""
    return build_tiny_qwen2_lm(tmp_path_factory.mktemp("plan_qwen2"))


def real_state_bytes(model_dir: Path, *, value_head: bool) -> dict[str, int]:
    """The learner's state as real tensors: fp32 weights, their gradients after a backward, AdamW's state
    after one step, and a deep-copied reference with its Linear weights in bf16 (autocast); in bytes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = list(model.parameters())
    if value_head:
        head = torch.nn.Linear(model.config.hidden_size, 1)
        params += list(head.parameters())
    reference = linears_in_autocast_dtype(copy.deepcopy(model).requires_grad_(False), torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    out = model(input_ids=ids, output_hidden_states=True)
    loss = out.logits.float().logsumexp(-1).mean()
    if value_head:
        loss = loss + head(out.hidden_states[-1]).mean()
    loss.backward()
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    steps = [t for t in state if t.dim() == 0]  # AdamW's step counters: scalars torch keeps on the host
    assert len(steps) == len(params) and all(t.device.type == "cpu" for t in steps)
    return {
        "weights": sum(p.nbytes for p in params),
        "gradients": sum(p.grad.nbytes for p in params),
        "optimizer": sum(t.nbytes for t in state if t.dim() > 0),
        "reference": sum(p.nbytes for p in reference.parameters()),
    }


def one_learner(shape: ModelShape, *, value_head: bool = False, strategy: str = "ddp", learners: int = 1):
    return LearnerSetup(
        shape=shape,
        strategy=strategy,
        num_learners=learners,
        micro_batch_size=2,
        sequence_tokens=64,
        gradient_checkpointing=True,
        autocast=True,
        value_head=value_head,
    )


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("value_head", [False, True])
def test_state_terms_are_the_bytes_of_real_tensors(request, which, value_head):
    model_dir = request.getfixturevalue(which)
    terms = learner_terms(one_learner(model_shape(str(model_dir)), value_head=value_head)).items
    real = real_state_bytes(model_dir, value_head=value_head)
    assert {name: terms[name] for name in real} == real


def test_fsdp2_shards_the_state_over_the_learners(tiny_qwen2):
    shape = model_shape(str(tiny_qwen2))
    alone = learner_terms(one_learner(shape)).items
    sharded = learner_terms(one_learner(shape, strategy="fsdp2", learners=4)).items
    for name in ("weights", "gradients", "optimizer"):
        assert sharded[name] == pytest.approx(alone[name] / 4)
    assert sharded["reference"] == pytest.approx(4 * shape.parameters() / 4)  # fp32 shards, FSDP casts them
    assert alone["reference"] < 4 * shape.parameters()  # alone: its Linear weights in bf16, as autocast reads
    assert "autocast cache" in alone and "autocast cache" not in sharded and "fsdp2 gathered" in sharded
    ddp = learner_terms(one_learner(shape, learners=4)).items
    assert ddp["ddp buckets"] == alone["gradients"] and ddp["weights"] == alone["weights"]


def test_published_shapes_count_the_parameters_transformers_builds():
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    for shape in PUBLISHED_SHAPES.values():
        common = {
            "vocab_size": shape.vocab_size,
            "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "tie_word_embeddings": shape.tied_embeddings,
        }
        if shape.family == "qwen2":
            config = Qwen2Config(**common)
        elif shape.family == "gemma3":
            config = Gemma3TextConfig(**common, head_dim=shape.head_dim)
        else:
            config = LlamaConfig(**common, head_dim=shape.head_dim)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        assert shape.parameters() == sum(p.numel() for p in model.parameters()), shape.name
    assert model_shape("Qwen/Qwen2.5-3B").parameters() == 3_085_938_688
    assert model_shape("smollm2-135m-instruct") is PUBLISHED_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"]
    with pytest.raises(ValueError, match=r"config\.json"):
        model_shape("no-such-org/no-such-model")


def test_the_gpu_serve_configs_take_the_four_gpus_the_pairs_leave():
    for name in ("serve_gpu.yaml", "serve_gpu_llm.yaml"):
        apps = {app.name: app for app in read_services(ROOT / "tuned_examples" / name)}
        assert apps["retriever"].max_replicas * apps["retriever"].gpus_per_replica == 2, name
        assert apps["judge"].max_replicas * apps["judge"].gpus_per_replica == 2, name
        assert apps["judge"].model == "meta-llama/Llama-3.2-3B-Instruct"


@pytest.mark.parametrize("recipe", ["search_r1_grpo", "search_r1_ppo", "r1_searcher", "r_search_grpo"])
def test_each_paper_recipe_fits_eight_80_gib_gpus_with_its_services(recipe):
    config = PAPER_CONFIGS[recipe](None)
    config.validate()
    assert config.colocate and config.num_learners == config.num_env_runners == 4
    plan = make_plan(config, gpus=8, gpu_memory_gib=80, services=DEFAULT_SERVICES, name=recipe)
    assert plan.fits, str(plan)
    assert plan.gpus_needed == 8
    (pair,) = plan.gpu_kinds
    assert set(pair.phases) == {"rollout", "update"} and pair.peak <= 80 * 1024**3


def test_r_search_is_refused_on_one_24_gib_gpu_with_the_numbers():
    plan = make_plan(
        PAPER_CONFIGS["r_search_grpo"](None), gpus=1, gpu_memory_gib=24, services=DEFAULT_SERVICES
    )
    assert not plan.fits
    text = "\n".join(plan.reasons)
    assert "asks 8 GPUs" in text and "the cluster has 1" in text
    assert "> 24.00 GiB per GPU" in text and "optimizer 14.19" in text
    assert "fits: NO" in str(plan)


def test_ddp_without_sharding_does_not_fit_a_3b_learner_beside_its_engine_on_48_gib_where_fsdp2_does():
    config = PAPER_CONFIGS["search_r1_grpo"](None)
    config.sharding = None
    plan = make_plan(config, gpus=8, gpu_memory_gib=48, services=None)
    assert not plan.fits
    assert plan.learner.items["ddp buckets"] == plan.learner.items["gradients"]
    assert any("shard the learners" in reason for reason in plan.reasons)
    assert make_plan(PAPER_CONFIGS["search_r1_grpo"](None), gpus=8, gpu_memory_gib=48, services=None).fits


def run_plan_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rllib_search", "plan", *args],
        cwd=ROOT,
        env=OFFLINE,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_plan_command_exits_by_whether_the_recipe_fits():
    fits = run_plan_command("search_r1_grpo", "--gpus", "8", "--gpu-memory-gib", "80")
    assert fits.returncode == 0, fits.stderr
    assert "fits: yes" in fits.stdout and "retriever replica (serve_gpu.yaml)" in fits.stdout
    refused = run_plan_command("r_search_grpo", "--gpus", "1", "--gpu-memory-gib", "24")
    assert refused.returncode == 1, refused.stderr
    assert "fits: NO" in refused.stdout and "the cluster has 1" in refused.stdout


BUILD_ALGO_SCRIPT = """
import ray
from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.plan import PlanError
from rllib_search.recipes import search_r1_grpo

ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
learners = (
    SearchGRPOConfig()
    .rl_module(model_config={{"model": {model!r}}})
    .learners(num_learners=4, num_gpus_per_learner=1)
)
for config in (learners, search_r1_grpo(dataset=None)):  # 4 GPU learners; the paper's 4 colocated pairs
    try:
        config.build_algo()
    except PlanError as error:
        print(error)
        free = ray.available_resources()
        print("FREE", free.get("GPU"), free.get("CPU"))
    else:
        print("BUILT")
"""


def test_build_algo_refuses_more_gpus_than_ray_has_before_any_actor(tiny_llama):
    script = textwrap.dedent(BUILD_ALGO_SCRIPT.format(model=str(tiny_llama)))
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=OFFLINE, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BUILT" not in result.stdout
    assert "the run asks 4 GPUs (4 learner x 1 GPU) but the cluster has 2" in result.stdout
    colocated = "the run asks 4 GPUs (4 learner + vLLM EnvRunner (colocated) x 1 GPU) but the cluster has 2"
    assert colocated in result.stdout
    assert result.stdout.count("FREE 2.0 2.0") == 2  # nothing was placed or reserved


def test_cpu_configs_are_not_planned():
    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.algos.plan import check_config

    assert check_config(SearchGRPOConfig()) is None


def test_host_memory_counts_what_colocation_and_fsdp2_keep_off_the_gpus():
    config = PAPER_CONFIGS["r_search_grpo"](None).rollouts(engine_options={"sleep_level": 1})
    plan = make_plan(config, gpus=8, gpu_memory_gib=80, services=DEFAULT_SERVICES, host_memory_gib=128)
    params, host = model_shape("Qwen/Qwen2.5-7B-Instruct").parameters(), plan.host.items
    assert host["offloaded learners"] == pytest.approx(4 * params + 8 * params + 4 * params)
    assert host["sleeping engines' weights"] == 4 * 2 * params  # level 1 keeps the bf16 weights
    assert host["rank 0: gathered state + policy copy"] == 2 * 4 * params
    (reason,) = plan.reasons
    assert reason.startswith("host memory: the run keeps 226.96 GiB") and "128.00 GiB" in reason
    config.rollouts(engine_options={"sleep_level": 2})
    level2 = make_plan(config, gpus=8, gpu_memory_gib=80, services=DEFAULT_SERVICES, host_memory_gib=256)
    assert "sleeping engines' weights" not in level2.host.items and level2.fits


def colocated_hf_config(model_dir: Path) -> Any:
    """One learner and one HF-engine EnvRunner sharing a GPU: the learner-only colocated path."""
    from rllib_search.algos import SearchGRPOConfig

    return (
        SearchGRPOConfig()
        .rl_module(model_config={"model": str(model_dir)})
        .learners(num_learners=1, num_gpus_per_learner=0.5)
        .env_runners(num_env_runners=1, num_gpus_per_env_runner=0.5)
        .rollouts(engine="hf", colocate=True, engine_dtype="bfloat16", prompts_per_sample=2, group_size=3)
        .environment(env_config={"max_total_tokens": 40})
    )


def test_plan_counts_the_hf_engine_beside_its_colocated_learner_as_real_tensors(tiny_llama):
    from transformers import AutoModelForCausalLM

    config = colocated_hf_config(tiny_llama)
    plan = make_plan(config, gpus=1, gpu_memory_gib=80)
    assert plan.fits, str(plan)
    engine = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16)
    assert plan.hf_engine.items["weights"] == sum(p.nbytes for p in engine.parameters())
    ids = torch.randint(0, engine.config.vocab_size, (2 * 3, 40))  # every episode at its longest
    with torch.no_grad():
        cache = engine(input_ids=ids, use_cache=True).past_key_values
    kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert plan.hf_engine.items["kv cache"] == kv
    (pair,) = plan.gpu_kinds
    assert pair.name == "learner + HF EnvRunner (colocated)"
    weights = plan.hf_engine.items["weights"] + plan.hf_engine.items["cuda context"]
    assert pair.phases["update"] == plan.learner.total + weights  # the HF engine never sleeps
    assert pair.phases["rollout"] == plan.hf_engine.total + 1024**3  # beside the offloaded learner


def test_plan_keeps_ddp_buckets_on_the_gpu_of_an_offloaded_learner():
    config = PAPER_CONFIGS["search_r1_grpo"](None)
    config.sharding = None
    plan = make_plan(config, gpus=8, gpu_memory_gib=160)
    (pair,) = plan.gpu_kinds
    buckets = plan.learner.items["ddp buckets"]
    assert pair.phases["rollout"] == plan.engine.budget + 1024**3 + buckets


def gpu_retriever_services(path: Path, index: Path) -> Path:
    path.write_text(
        textwrap.dedent(f"""
        applications:
          - name: retriever
            import_path: rllib_search.serve.retrieval.deployment:build_retriever_app
            args:
              index_dir: {index}
              num_replicas: 1
              ray_actor_options: {{num_gpus: 1}}
        """)
    )
    return path


def test_plan_counts_a_gpu_retriever_index_from_its_manifest(tmp_path, index_dir):
    import faiss
    from transformers import AutoModel

    from rllib_search.serve.retrieval.encoders import resolve_model_path

    config = PAPER_CONFIGS["search_r1_grpo"](None)
    services = gpu_retriever_services(tmp_path / "serve.yaml", index_dir)
    plan = make_plan(config, gpus=8, gpu_memory_gib=80, services=services)
    assert plan.fits, str(plan)
    ((app, terms),) = plan.retrievers
    assert app.index_dir == str(index_dir)
    index = faiss.read_index(str(index_dir / "index.faiss"))
    assert terms.items["index (fp16)"] == index.ntotal * index.d * 2  # the float32 vectors, in fp16
    encoder = AutoModel.from_pretrained(resolve_model_path("all-minilm-l6-v2"))
    assert terms.items["query encoder (fp16)"] == sum(p.numel() for p in encoder.parameters()) * 2
    assert terms.items["faiss temporary memory"] == 1.5 * 1024**3
    assert any(kind.name == "retriever replica" for kind in plan.gpu_kinds)


def test_plan_refuses_an_index_larger_than_the_replica_gpus(tmp_path, index_dir):
    import json
    import shutil

    big = tmp_path / "wiki"
    shutil.copytree(index_dir, big)
    manifest = json.loads((big / "manifest.json").read_text())
    manifest.update(count=21_015_324, dim=768)  # Search-R1's wiki-18 with E5-base
    (big / "manifest.json").write_text(json.dumps(manifest))
    services = gpu_retriever_services(tmp_path / "serve.yaml", big)
    plan = make_plan(PAPER_CONFIGS["search_r1_grpo"](None), gpus=8, gpu_memory_gib=24, services=services)
    reason = next(reason for reason in plan.reasons if reason.startswith("retriever replica GPU"))
    assert "30.06 GiB" in str(plan) and "give each retriever replica more GPUs" in reason
    missing = make_plan(
        PAPER_CONFIGS["search_r1_grpo"](None),
        gpus=8,
        gpu_memory_gib=80,
        services=gpu_retriever_services(tmp_path / "other.yaml", tmp_path / "nowhere"),
    )
    assert missing.fits and any("index's GPU memory is not counted" in note for note in missing.notes)


TUNE_PLAN_SCRIPT = """
import os
import ray
from ray import tune
from rllib_search.algos import SearchGRPO
from rllib_search.algos.plan import PlanError, check_trials
from rllib_search.recipes import search_r1_grpo
from rllib_search.recipes.sweeps import fit_or_restore

os.environ["RLLIB_SEARCH_GPU_MEMORY_GIB"] = "80"
ray.init(address="local", num_cpus=2, num_gpus=8, include_dashboard=False, log_to_driver=False)
config = search_r1_grpo(dataset=None)
config.env_config["reward_config"] = tune.grid_search([{"format_weight": 0.0}, {"format_weight": 0.2}])
print("PLANS", len(check_trials(SearchGRPO, config)))
config.learners(num_learners=tune.grid_search([4, 16]))  # 16 learners cannot pair with 4 EnvRunners
try:
    fit_or_restore(SearchGRPO, config, storage=os.environ["STORAGE"], name="refused", iterations=1)
except PlanError as error:
    print(error)
    print("FREE", ray.available_resources().get("GPU"))
"""


def test_tune_plans_every_trial_of_the_grid_and_refuses_one_that_cannot_be_placed(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TUNE_PLAN_SCRIPT)],
        cwd=ROOT,
        env={**OFFLINE, "STORAGE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "PLANS 2" in out  # each λ trial planned: 4 colocated pairs on 8 x 80 GiB
    assert "a trial of this Tune experiment does not fit" in out and "the cluster has 8" in out
    assert "num_learners=16" in out and "num_learners=4," not in out  # the 16-learner trials, named
    assert "FREE 8.0" in out and not (tmp_path / "refused").exists()  # refused before Tune started
