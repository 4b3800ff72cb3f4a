"""Sharded learners (``training(sharding="fsdp2")``) on CPU over gloo, with two remote learners of a real Ray:
their updates equal one plain learner's, a checkpoint resumes to the uninterrupted run's next update, and
the weights that leave the learners (weight sync, vLLM packing, export) are whole tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchGRPOConfig, SearchPPOConfig
from rllib_search.algos.algorithm import train_batch
from rllib_search.algos.learners.fsdp import transformer_blocks
from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
from rllib_search.env.search_env import SearchEnvConfig
from rllib_search.llm.models import load_tokenizer
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from tests.helpers import ENV_SETTINGS, make_config

pytestmark = pytest.mark.slow

ADVANTAGES = ([1.0, -1.0, 0.5, -0.5], [-0.5, 1.0, -1.0, 0.25])
CLIP = 0.01  # between the two updates' gradient norms (about 0.0015 and 0.033): the second is clipped
NORM = "gradients_policy_global_norm"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


@pytest.fixture(scope="module")
def demonstrations(model_dir, world):
    """Teacher episodes: real observations between the teacher's turns, so masks have holes."""
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    return teacher_rollouts(load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:8], config)


def initial_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """The policy module's state names (``model.`` + the causal LM's) of the untrained model."""
    from transformers import AutoModelForCausalLM

    return {f"model.{k}": v for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}


def learner_weights(algo) -> dict[str, torch.Tensor]:
    """A copy of the policy's weights as the learner group reports them (sharded learners: gathered; a
    local learner's are views of its live tensors)."""
    state = algo.learner_group.get_state(components="learner/rl_module/default_policy")
    return {k: torch.as_tensor(v).clone() for k, v in state["learner"]["rl_module"]["default_policy"].items()}


def held_and_total_elements(learner) -> tuple[int, int]:
    """(elements of the policy's parameters this learner holds, elements of the whole policy)."""
    params = list(learner.policy().parameters())
    return sum(p.to_local().numel() for p in params), sum(p.numel() for p in params)


def sharded(config, learners: int = 2):
    return config.training(sharding="fsdp2").learners(num_learners=learners, num_cpus_per_learner=1)


def with_advantages(rollouts, values, config):
    batch = train_batch(rollouts, config, 0)
    batch.policy_batches["default_policy"]["episode_advantages"] = np.asarray(values, dtype=np.float32)
    return batch


def test_config_takes_fsdp2_or_none(model_dir, world, corpus):
    from rllib_search.algos.learners.fsdp import SearchFSDPLearner
    from rllib_search.algos.learners.torch_learner import SearchTorchLearner

    config = make_config(SearchGRPOConfig, model_dir, world, corpus)
    assert config.sharding is None and config.get_default_learner_class() is SearchTorchLearner
    assert sharded(config).get_default_learner_class() is SearchFSDPLearner
    with pytest.raises(ValueError, match="sharding must be one of"):
        make_config(SearchGRPOConfig, model_dir, world, corpus, sharding="zero3").validate()
    with pytest.raises(ValueError, match="torch_compile_learner"):
        make_config(SearchGRPOConfig, model_dir, world, corpus, sharding="fsdp2").learners(
            num_learners=2
        ).framework(torch_compile_learner=True).validate()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sharded_learners_give_the_one_learner_updates(
    ray_cluster, model_dir, world, corpus, demonstrations, lora
):
    """Two updates (so that Adam's second step sees each step's clipping), the second against a moved
    reference (the KL term reads the sharded reference; with LoRA, the base model): each of 2 FSDP learners
    trains on half the rows, one plain learner on all of them, and the weights agree."""
    model = {"lora": {"r": 4, "alpha": 8}} if lora else None
    rows = demonstrations[:4]
    weights, norms, before = [], [], None
    for sharding in (None, "fsdp2"):
        config = make_config(
            SearchGRPOConfig, model_dir, world, corpus, model=model, grad_clip=CLIP, kl_coeff=0.1
        )
        if sharding:
            config = sharded(config)
        algo = config.build_algo()
        before = before or learner_weights(algo)
        for advantages in ADVANTAGES:
            results = algo.learner_group.update(batch=with_advantages(rows, advantages, algo.config))
            norms.append([float(r["default_policy"][NORM].peek()) for r in results])  # one per learner
        if sharding:  # each learner holds half of every parameter
            held = [r.get() for r in algo.learner_group.foreach_learner(held_and_total_elements)]
            assert [h for h, _ in held] == [held[0][1] // 2] * 2 and held[0][1] == held[1][1]
        weights.append(learner_weights(algo))
        algo.stop()
    plain, fsdp = weights
    # The whole gradient's norm, on every learner as on the plain one; the second step is clipped.
    plain_norms, fsdp_norms = norms[: len(ADVANTAGES)], norms[len(ADVANTAGES) :]
    for (plain_norm,), learner_norms in zip(plain_norms, fsdp_norms, strict=True):
        assert learner_norms == pytest.approx([plain_norm] * 2, rel=1e-4)
    if not lora:
        assert plain_norms[0][0] < CLIP < plain_norms[1][0]
    assert set(fsdp) == set(plain) == set(before)  # with LoRA: the adapters
    assert any(not torch.equal(plain[k], v) for k, v in before.items())  # it trained
    for name, value in plain.items():
        assert fsdp[name].shape == value.shape == before[name].shape  # whole tensors, not shards
        torch.testing.assert_close(fsdp[name], value, atol=1e-5, rtol=1e-4)


def test_sharded_checkpoint_resumes_to_the_identical_next_update(
    ray_cluster, model_dir, world, corpus, tmp_path
):
    """PPO (the policy's and the value head's AdamW): full weights and full moments are saved from rank 0
    and sharded back into a new run."""
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = sharded(make_config(SearchPPOConfig, model_dir, world, corpus, grad_clip=None)).build_algo()
    algo.train()
    algo.save_to_path(str(tmp_path / "ckpt"))
    results = algo.train()
    expected = learner_weights(algo)
    assert results["learners"]["default_policy"]["optimizer_steps"] == 2
    algo.stop()

    resumed = Algorithm.from_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.iteration == 1 and resumed.config.sharding == "fsdp2"
    results = resumed.train()
    assert results["learners"]["default_policy"]["optimizer_steps"] == 2
    got = learner_weights(resumed)
    initial = initial_weights(model_dir)
    assert any(not torch.equal(expected[k], v) for k, v in initial.items())  # it trained
    assert expected["value_head.weight"].abs().sum() > 0  # the critic too (it starts at zero)
    assert set(got) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=1e-5)
    resumed.stop()


def test_sharded_learners_send_whole_tensors(ray_cluster, model_dir, world, corpus, tmp_path):
    """After a training iteration: the EnvRunner's model holds the learners' gathered weights, whole;
    the vLLM packing and the export read the same whole weights."""
    from transformers import AutoModelForCausalLM

    from rllib_search.algos.checkpoints.export import export_module

    algo = sharded(make_config(SearchGRPOConfig, model_dir, world, corpus)).build_algo()
    algo.train()
    gathered = learner_weights(algo)
    initial = initial_weights(model_dir)
    runner = {k: v.detach() for k, v in algo.env_runner.module.state_dict().items()}
    assert set(runner) == set(gathered) == set(initial)
    for name, value in gathered.items():
        assert value.shape == initial[name].shape
        torch.testing.assert_close(runner[name], value, atol=0, rtol=0)
    assert any(not torch.equal(gathered[k], v) for k, v in initial.items())  # the synced weights trained

    packed = next(
        result
        for result in algo.learner_group.foreach_learner(lambda learner: learner.inference_weights())
        if result.get() is not None
    ).get()
    engine = packed.state_dict()
    assert set(engine) == {name.removeprefix("model.") for name in gathered}
    for name, value in engine.items():
        assert value.dtype == torch.bfloat16
        torch.testing.assert_close(value, gathered[f"model.{name}"].to(torch.bfloat16), atol=0, rtol=0)

    out = algo.learner_group.on_policy_module(lambda module: str(export_module(module, tmp_path / "export")))
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, value in exported.items():
        torch.testing.assert_close(value, gathered[f"model.{name}"], atol=0, rtol=0)
    algo.stop()


def test_bf16_gathers_keep_fp32_masters(ray_cluster, model_dir, world, corpus, demonstrations):
    """The GPU precision (FSDP gathers bf16 copies, gradients reduced in fp32, autocast on), run on CPU by a
    local sharded learner (a world of one): the update is finite and trains, and what each rank holds and
    steps stays fp32."""
    config = make_config(SearchPPOConfig, model_dir, world, corpus, autocast=True, sharding="fsdp2")
    algo = config.build_algo()
    learner = algo.learner_group._learner
    before = learner_weights(algo)
    computed_in = []  # the dtype a block's weight has while it computes: the gathered copy's
    projection = transformer_blocks(learner.policy().model)[0].self_attn.q_proj
    hook = projection.register_forward_hook(lambda module, args, out: computed_in.append(module.weight.dtype))
    results = learner.update(batch=with_advantages(demonstrations[:2], [1.0, -1.0], algo.config))
    hook.remove()
    assert computed_in and set(computed_in) == {torch.bfloat16}
    stats = results["default_policy"]
    assert stats["skipped_updates"].peek() == 0 and np.isfinite(stats["policy_loss"].peek())
    after = learner_weights(algo)
    assert any(not torch.equal(before[k], v) for k, v in after.items())
    assert all(v.dtype == torch.float32 for v in after.values())
    assert all(p.dtype == torch.float32 and hasattr(p, "to_local") for p in learner.policy().parameters())
    algo.stop()
