"""The GPU path's parts that a CPU can check: fp32 master weights under bf16 autocast at lr 1e-6, the
weights a vLLM EnvRunner gets (the plain model's own parameter names, LoRA merged, one flat buffer through
the object store), no HF policy copy in a vLLM runner, sleep/wake around a colocated learner update, and
bundled aliases resolved before vLLM sees them. vLLM itself runs in tests/test_vllm_engine.py (GPU only).

A vLLM runner is stood in for by the runner with engine="vllm" whose ``_make_engine`` returns our own
HFEngine over a separate plain copy of the model (what vLLM holds): everything else (config, learner,
sync, the runner's vLLM branch) is the real one."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

from rllib_search import ENV_ID
from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.llm.engines.hf import HFEngine
from rllib_search.llm.models import (
    apply_lora,
    engine_weights,
    load_causal_lm,
    load_tokenizer,
    merged_parameters,
    resolve_model_path,
)
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.llm.weight_sync import FlatWeights

LORA = {"r": 4, "alpha": 8}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_path_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def make_config(model_dir, world, corpus, *, lora=None, engine="hf", **training):
    env_config = {
        "retriever": {"type": "bm25", "corpus": corpus},
        "dataset": world.train,
        "protocol": "search_r1",
        "max_turns": 2,
        "max_total_tokens": 600,
        "max_obs_tokens": 60,
    }
    return (
        SearchGRPOConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model_dir, "lora": lora})
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=12, engine=engine)
        .training(**{"lr": 1e-3, "micro_batch_size": 2, **training})
        .debugging(seed=5)
    )


def randomised_lora(model_dir):
    """A peft model whose adapters are not zero (B starts at 0, which would make every merge trivial)."""
    model = apply_lora(load_causal_lm(model_dir, device="cpu")[0], **LORA)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def spaces_of(model_dir):
    vocab = len(load_tokenizer(model_dir))
    space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
    return {DEFAULT_MODULE_ID: (space, space)}


# --- the weights vLLM gets -------------------------------------------------------------------------------
def test_flat_weights_round_trip_through_the_object_store(ray_cluster):
    import ray

    generator = torch.Generator().manual_seed(1)
    tensors = {
        "a.weight": torch.randn(3, 5, generator=generator),
        "b.bias": torch.randn(7, generator=generator).to(torch.bfloat16),  # odd sizes: alignment
        "c.scale": torch.tensor(2.5),
        "d.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "e.empty": torch.zeros(0, 4),
    }
    flat = FlatWeights.pack(tensors)
    assert flat.buffer.dtype == np.uint8 and flat.buffer.ndim == 1
    assert all(offset % 16 == 0 for offset in flat.offsets)
    back = ray.get(ray.put(flat))  # one numpy buffer, read back from shared memory without a copy
    assert not back.buffer.flags.writeable
    got = back.state_dict()
    assert list(got) == list(tensors)
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor)
    cast = FlatWeights.pack(tensors, "bfloat16").state_dict()
    assert cast["a.weight"].dtype == torch.bfloat16 and cast["d.ids"].dtype == torch.int64
    assert torch.equal(cast["a.weight"], tensors["a.weight"].to(torch.bfloat16))


def test_engine_weights_are_the_plain_models_own_parameters(model_dir):
    plain, _ = load_causal_lm(model_dir, device="cpu")
    plain_names = [name for name, _ in plain.named_parameters()]
    full = engine_weights(plain, "bfloat16")
    assert full.names == plain_names
    for name, tensor in full.tensors():
        assert torch.equal(tensor, dict(plain.named_parameters())[name].detach().to(torch.bfloat16))

    peft_model = randomised_lora(model_dir)
    merged = merged_parameters(peft_model)
    assert list(merged) == plain_names
    assert not any("lora_" in name or "base_layer" in name or "base_model" in name for name in merged)
    reference = dict(copy.deepcopy(peft_model).merge_and_unload().named_parameters())  # peft's own merge
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name].detach(), atol=1e-6, rtol=1e-6)
    assert any(not torch.equal(merged[name], p) for name, p in plain.named_parameters())  # adapters count
    assert engine_weights(peft_model).names == plain_names
    assert any("lora_A" in name for name in peft_model.state_dict())  # its raw state_dict has adapters


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_the_learner_sends_a_vllm_runner_merged_plain_weights(ray_cluster, model_dir, world, corpus, lora):
    config = make_config(model_dir, world, corpus, lora=lora, engine="vllm")
    group = config.build_learner_group(spaces=spaces_of(model_dir))
    # What RLlib's sync_weights, checkpoint restore and runner recovery all ask the learners for:
    state = group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True)
    sent = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
    assert isinstance(sent, FlatWeights)
    plain, _ = load_causal_lm(model_dir, device="cpu")
    assert sent.names == [name for name, _ in plain.named_parameters()]
    assert set(sent.dtypes) == {"bfloat16"}  # the engine's dtype: half the bytes of the fp32 masters
    policy = group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    expected = merged_parameters(policy.model)
    for name, tensor in sent.tensors():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16))
    # A checkpoint still holds the module's own state (adapters only with LoRA).
    saved = group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}")
    module_state = saved[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
    assert isinstance(module_state, dict) and any("lora_" in k for k in module_state) == (lora is not None)
    group.shutdown()


@pytest.mark.parametrize("engine_dtype", ["float16", "float32"])
def test_the_packed_weights_come_in_the_rollouts_engine_dtype(
    ray_cluster, model_dir, world, corpus, engine_dtype
):
    config = make_config(model_dir, world, corpus, engine="vllm").rollouts(engine_dtype=engine_dtype)
    group = config.build_learner_group(spaces=spaces_of(model_dir))
    state = group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True)
    sent = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
    assert set(sent.dtypes) == {engine_dtype}
    policy = group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    for name, tensor in sent.tensors():
        assert torch.equal(tensor, dict(policy.model.named_parameters())[name].detach().to(tensor.dtype))
    group.shutdown()


def test_a_float32_learner_syncs_its_weights_cast_into_a_bfloat16_hf_runner(
    ray_cluster, model_dir, world, corpus
):
    algo = make_config(model_dir, world, corpus).rollouts(engine_dtype="bfloat16").build_algo()
    learner = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # steps no bf16 number holds, so only a cast on the way reaches the runner
        for param in learner.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    runner = dict(algo.env_runner.module.model.named_parameters())
    for name, param in learner.model.named_parameters():
        assert param.dtype == torch.float32
        assert runner[name].dtype == torch.bfloat16
        assert torch.equal(runner[name].detach(), param.detach().to(torch.bfloat16)), name
    algo.stop()


# --- precision -------------------------------------------------------------------------------------------
def test_an_update_at_lr_1e6_under_bf16_autocast_moves_the_fp32_master_weights(
    ray_cluster, model_dir, world, corpus
):
    from rllib_search.algos.algorithm import train_batch
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
    from rllib_search.env.search_env import SearchEnvConfig
    from rllib_search.serve.retrieval.bm25 import BM25Retriever

    config = make_config(model_dir, world, corpus, lr=1e-6, autocast=True, grad_clip=None)
    group = config.build_learner_group(spaces=spaces_of(model_dir))
    learner = group._learner
    policy = learner.module[DEFAULT_MODULE_ID].unwrapped()
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    assert all(p.dtype == torch.float32 for p in before.values())  # the default load: fp32 masters
    env_config = SearchEnvConfig.from_dict({"protocol": "search_r1", "max_turns": 2, "max_total_tokens": 600})
    rollouts = teacher_rollouts(
        load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:2], env_config
    )
    batch = train_batch(rollouts, config, 0)
    batch.policy_batches[DEFAULT_MODULE_ID]["episode_advantages"] = np.asarray([1.0, -1.0], np.float32)
    learner.update(batch=batch)
    assert learner.optimizer_steps == 1
    changed = total = 0
    rounded_away = 0
    for name, param in policy.model.named_parameters():
        assert param.dtype == torch.float32
        delta = param.detach() - before[name]
        changed += int((delta != 0).sum())
        total += delta.numel()
        # The same update applied to bf16 weights (what loading the policy in bf16 trained): lost.
        low = before[name].to(torch.bfloat16)
        rounded_away += int(((low + delta.to(torch.bfloat16)) == low)[delta != 0].sum())
    assert changed > 0.5 * total  # Adam moves every weight with a gradient by about lr
    assert rounded_away > 0.9 * changed  # ... and in bf16 almost all of those steps round to nothing
    for _, optimizer in learner.optimizers():
        moments = [v for state in optimizer.state.values() for k, v in state.items() if k != "step"]
        assert moments and all(m.dtype == torch.float32 for m in moments)
    group.shutdown()

    bf16 = make_config(model_dir, world, corpus).rl_module(
        model_config={"model": model_dir, "dtype": "bfloat16"}
    )
    with pytest.raises(ValueError, match="float32 master weights"):
        bf16.build_learner_group(spaces=spaces_of(model_dir))


# --- the vLLM runner: no HF copy, merged weights in, sleep/wake around the update ------------------------
class RecordingEngine(HFEngine):
    """Our own engine over a separate plain model (vLLM's copy in a real run), recording each call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def generate(self, *args, **kwargs):
        self.calls.append("generate")
        return super().generate(*args, **kwargs)

    def load_weights(self, state_dict):
        self.calls.append("load_weights")
        super().load_weights(state_dict)

    def sleep(self, level=None):
        self.calls.append("sleep" if level is None else f"sleep{level}")

    def wake_up(self):
        self.calls.append("wake_up")


class StandInVLLMRunner(LLMEnvRunner):
    """The real runner (engine="vllm") with RecordingEngine in vLLM's place."""

    def _make_engine(self):
        model, _ = load_causal_lm(resolve_model_path(self.model_name), device="cpu")
        return RecordingEngine(model, self.tokenizer)


def test_a_colocated_vllm_runner_sleeps_through_the_update_and_loads_merged_weights(
    ray_cluster, model_dir, world, corpus, tmp_path
):
    config = make_config(model_dir, world, corpus, lora=LORA, engine="vllm").rollouts(colocate=True)
    config.env_runners(env_runner_cls=StandInVLLMRunner)
    # Not build_algo: its GPU plan counts a vLLM runner's GPU, and this stand-in needs none.
    algo = config.algo_class(config=config)
    runner = algo.env_runner
    assert runner.module is None  # no HF policy beside the engine's own copy
    engine = runner.engine
    engine.calls.clear()  # building the Algorithm syncs the initial weights once
    version = runner.weights_version
    algo.train()
    calls = list(engine.calls)
    first_sleep = calls.index("sleep")
    assert set(calls[:first_sleep]) == {"generate"}
    assert calls[first_sleep:] == ["sleep", "load_weights", "wake_up"]  # update, then sync, then wake
    algo.train()
    assert engine.calls[len(calls)] == "generate" and engine.calls[-3:] == [
        "sleep",
        "load_weights",
        "wake_up",
    ]
    assert runner.weights_version == version + 2
    policy = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    learned = merged_parameters(policy.model)
    for name, tensor in engine.model.named_parameters():
        assert torch.equal(tensor.detach(), learned[name].to(torch.bfloat16).float())
    # A checkpoint reads the learner's whole state on its device: the engine sleeps at level 1 (its weights
    # kept), the learner comes back for the save and leaves again, the engine wakes with no new weights.
    offload = algo.learner_group._learner.offload_state
    calls, moves = len(engine.calls), len(offload.events)
    algo.save_to_path(str(tmp_path / "checkpoint"))
    assert engine.calls[calls:] == ["sleep1", "wake_up"]
    assert [phase for phase, _ in list(offload.events)[moves:]] == ["onload", "offload"]
    assert offload.offloaded
    algo.stop()


def test_bundled_aliases_reach_vllm_resolved():
    from transformers import AutoConfig

    from rllib_search.llm.engines.vllm import llm_arguments

    arguments = llm_arguments("smollm2-135m-instruct", dtype="bfloat16", enable_sleep_mode=True)
    path = arguments["model"]
    assert path == resolve_model_path("smollm2-135m-instruct") and path != "smollm2-135m-instruct"
    assert AutoConfig.from_pretrained(path).model_type == "llama"
    assert any(p.name.endswith(".safetensors") for p in __import__("pathlib").Path(path).iterdir())
    assert arguments["enable_sleep_mode"] and arguments["worker_extension_cls"].endswith(
        "WeightLoaderExtension"
    )
    assert llm_arguments("Qwen/Qwen2.5-3B")["model"] == "Qwen/Qwen2.5-3B"  # hub names pass as they are
