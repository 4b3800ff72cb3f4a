"""The Ray version's learner hooks that SearchTorchLearner relies on, and the one learning-rate writer
(warmup boundary, a critic optimizer; the torch and the FSDP2-sharded learner)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import ray
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from benchmarks.learner_bench import search_batch
from rllib_search.algos import SearchPPOConfig
from rllib_search.algos.learners.fsdp import SearchFSDPLearner
from rllib_search.algos.learners.lr_warmup import LearningRateWarmup
from rllib_search.algos.learners.search_learner import SearchLearner
from rllib_search.algos.learners.torch_learner import SearchTorchLearner
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer


def source(function) -> str:
    return inspect.getsource(function)


def test_ray_version_and_the_hooks_we_use():
    """A Ray upgrade that moves any of these must fail here, not silently in training."""
    assert ray.__version__.startswith("2.60."), ray.__version__
    # Learner.update runs the mini-batches through `_update`; TorchLearner._update runs the (maybe
    # compiled) `_uncompiled_update`, which calls the hooks we override, in this order.
    assert "self._update(" in source(Learner.update)
    assert "self.after_gradient_based_update(" in source(Learner.update)
    assert "_possibly_compiled_update" in source(TorchLearner._update)
    update = source(TorchLearner._uncompiled_update)
    calls = [
        "forward_train(",
        "compute_losses(",
        "compute_gradients(",
        "postprocess_gradients(",
        "apply_gradients(",
    ]
    positions = [update.index(call) for call in calls]
    assert positions == sorted(positions)
    assert "compute_loss_for_module(" in source(Learner.compute_losses)
    # RLlib's AMP scaler (read by our compute_gradients) and the DDP hook the FSDP learner replaces; it
    # shards in _make_module, which RLlib's build runs before it registers the optimizers.
    assert "self._grad_scalers" in source(TorchLearner.__init__)
    assert "self._make_modules_ddp_if_necessary()" in source(TorchLearner.build)
    build = source(Learner.build)
    assert build.index("self._make_module()") < build.index("self.configure_optimizers()")
    # The optimizer state hooks the FSDP learner fills with full state dicts.
    assert "self._get_optimizer_state()" in source(Learner.get_state)
    assert "self._set_optimizer_state(" in source(Learner.set_state)
    assert "self.postprocess_gradients_for_module(" in source(Learner.postprocess_gradients)
    # Optimizers registered without an lr schedule get none from RLlib (our warmup is the one writer).
    assert "lr_or_lr_schedule" in inspect.signature(Learner.register_optimizer).parameters
    assert "if lr_or_lr_schedule is not None" in source(Learner.register_optimizer)
    assert "self._optimizer_lr_schedules.get(optimizer)" in source(Learner.after_gradient_based_update)
    # Public accessors used instead of private attributes.
    for name in ("get_parameters", "get_param_ref", "get_optimizers_for_module", "get_optimizer"):
        assert callable(getattr(TorchLearner, name))
    # Every method our learners define that RLlib's learners also define is one of RLlib's hooks.
    hooks = {
        "build", "update", "get_state", "set_state", "configure_optimizers_for_module", "_update",
        "compute_loss_for_module", "compute_gradients", "postprocess_gradients", "apply_gradients",
        "_make_modules_ddp_if_necessary", "_make_module", "_get_optimizer_state", "_set_optimizer_state",
        "postprocess_gradients_for_module",
    }  # fmt: skip
    for cls in (SearchLearner, SearchTorchLearner, SearchFSDPLearner):
        shadowing = {
            name for name in vars(cls) if hasattr(TorchLearner, name) and not name.startswith(("__", "_abc"))
        }
        assert shadowing <= hooks, (cls.__name__, shadowing - hooks)


def test_warmup_factor_is_linear_then_constant():
    warmup = LearningRateWarmup(0.3, 10)  # 3 warmup steps
    factors = [warmup.factor(step) for step in range(5)]
    np.testing.assert_allclose(factors, [1 / 3, 2 / 3, 1.0, 1.0, 1.0], rtol=1e-6)
    assert LearningRateWarmup(0.0, None).factor(0) == 1.0


def test_linear_decay_falls_from_the_warmup_peak_to_zero_at_the_last_step():
    decay = LearningRateWarmup(0.2, 10, decay="linear")  # 2 warmup steps, peak at step 1, 0 at step 10
    factors = [decay.factor(step) for step in range(11)]
    np.testing.assert_allclose(factors[:2], [0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(factors[1:], [(10 - step) / 9 for step in range(1, 11)], rtol=1e-6, atol=1e-9)
    no_warmup = LearningRateWarmup(0.0, 4, decay="linear")
    np.testing.assert_allclose([no_warmup.factor(s) for s in range(5)], [1, 0.75, 0.5, 0.25, 0], atol=1e-9)
    with pytest.raises(ValueError, match="total_training_steps"):
        LearningRateWarmup(0.0, None, decay="linear")
    with pytest.raises(ValueError, match="decay"):
        LearningRateWarmup(0.0, 4, decay="cosine")
    with pytest.raises(ValueError, match="lr_decay='linear' needs total_training_steps"):
        SearchPPOConfig().training(lr_decay="linear").validate_training()
    SearchPPOConfig().training(lr_decay="linear", total_training_steps=4).validate_training()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hooks_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def ppo_learner(model_dir: str, **training):
    from rllib_search.llm.models import load_tokenizer

    config = (
        SearchPPOConfig()
        .rl_module(model_config={"model": model_dir, "value_head": True})
        .training(lr=1e-3, critic_lr=1e-2, micro_batch_size=2, warmup_ratio=0.5, total_training_steps=4)
        .training(**training)
    )
    space = spaces.Sequence(spaces.Discrete(len(load_tokenizer(model_dir))), stack=True)
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (space, space)}), len(load_tokenizer(model_dir))


def group_lrs(learner) -> list[float]:
    return [group["lr"] for group in learner.param_groups()]


@pytest.mark.slow
@pytest.mark.parametrize("sharding", [None, "fsdp2"], ids=["torch", "fsdp2"])
def test_one_learning_rate_writer_at_the_warmup_boundary_with_a_critic(model_dir, sharding):
    torch.manual_seed(0)
    learner, vocab = ppo_learner(model_dir, sharding=sharding)
    assert isinstance(learner, SearchFSDPLearner if sharding else SearchTorchLearner)
    # Two optimizers, each with its own base rate.
    assert sorted(group["base_lr"] for group in learner.param_groups()) == [1e-3, 1e-2]
    batch = search_batch(rows=2, length=64, vocab=vocab, seed=5)
    multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=2)
    expected_factors = [0.5, 1.0, 1.0]  # warmup = ceil(0.5 * 4) = 2 optimizer steps
    for step, factor in enumerate(expected_factors):
        # RLlib's after_gradient_based_update runs at the end of update: nothing resets the rates.
        results = learner.update(batch=multi, timesteps={"num_env_steps_sampled_lifetime": 1000 * (step + 1)})
        assert learner.optimizer_steps == step + 1
        assert sorted(group_lrs(learner)) == pytest.approx([1e-3 * factor, 1e-2 * factor], rel=1e-6)
        stats = results[DEFAULT_MODULE_ID]
        assert stats["learning_rate"].peek() == pytest.approx(1e-3 * factor, rel=1e-6)
    state = learner.get_state()
    assert state["optimizer_steps"] == 3
