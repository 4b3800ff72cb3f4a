"""A colocated learner's offload (``algos/learners/offload.py``) on a real SearchTorchLearner: between two
AdamW steps its weights, buffers and optimizer moments move to fresh host tensors and its gradients are
freed, the parameters and the optimizers' references to them stay the same objects, and the learner that
went through offload and onload takes the very step the one that stayed put takes.

On a CPU the host is the compute device, so "moved" is checked as "copied into new storage": each
parameter's and moment's storage after the offload is another than before, holding the same values."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.learners.offload import OFFLOAD, ONLOAD
from rllib_search.llm.models import load_tokenizer
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def local_learner(model_dir):
    """A local SearchTorchLearner of the tiny model, with a frozen reference (kl_coeff > 0)."""
    vocab = len(load_tokenizer(model_dir))
    space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
    config = SearchGRPOConfig().rl_module(model_config={"model": model_dir}).training(lr=1e-2, kl_coeff=0.01)
    return config.build_learner_group(spaces={DEFAULT_MODULE_ID: (space, space)})._learner


def adamw_step(learner, seed: int) -> None:
    """One AdamW step of every optimizer on a loss of the policy's logits for seeded token ids (gradients
    zeroed first, as the learner's first micro-batch does)."""
    learner.zero_grads()
    generator = torch.Generator().manual_seed(seed)
    model = learner.policy().model
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=generator)
    loss = model(input_ids=ids).logits.float().pow(2).mean()
    loss.backward()
    for _, optimizer in learner.optimizers():
        optimizer.step()


def moments(learner) -> list[torch.Tensor]:
    return [
        value
        for _, optimizer in learner.optimizers()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]


def test_offload_copies_out_frees_gradients_and_onload_trains_on_as_if_nothing_moved(model_dir):
    moved, stayed = local_learner(model_dir), local_learner(model_dir)
    for learner in (moved, stayed):
        adamw_step(learner, seed=0)
    params = list(moved.policy().model.parameters())
    reference = list(moved.reference.parameters())
    assert reference and all(p.grad is not None for p in params if p.requires_grad)
    before = {id(p): (p.data_ptr(), p.detach().clone()) for p in params + reference}
    moments_before = [(m.data_ptr(), m.clone()) for m in moments(moved)]
    optimizer_params = [p for _, opt in moved.optimizers() for g in opt.param_groups for p in g["params"]]

    moved.colocation(OFFLOAD)
    moved.colocation(OFFLOAD)  # a second offload is a no-op
    assert moved.offload_state.offloaded
    assert all(p.grad is None for p in params)
    for p in params + reference:
        pointer, values = before[id(p)]
        assert p.device.type == "cpu" and p.data_ptr() != pointer and torch.equal(p.detach(), values)
    after = moments(moved)
    assert len(after) == len(moments_before) > 0
    for moment, (pointer, values) in zip(after, moments_before):
        assert moment.device.type == "cpu" and moment.data_ptr() != pointer and torch.equal(moment, values)
    # The parameters are the same objects, so the optimizers still step them.
    assert list(moved.policy().model.parameters()) == params
    assert [
        p for _, opt in moved.optimizers() for g in opt.param_groups for p in g["params"]
    ] == optimizer_params

    moved.colocation(ONLOAD)
    assert not moved.offload_state.offloaded
    assert [phase for phase, _ in moved.offload_state.events] == [OFFLOAD, ONLOAD]
    for learner in (moved, stayed):
        adamw_step(learner, seed=1)
    for name, tensor in stayed.policy().model.state_dict().items():
        assert torch.equal(moved.policy().model.state_dict()[name], tensor), name
    for mine, theirs in zip(moments(moved), moments(stayed), strict=True):
        assert torch.equal(mine, theirs)


def test_an_unknown_phase_is_refused(model_dir):
    with pytest.raises(ValueError, match="colocation phase"):
        local_learner(model_dir).colocation("sleep")
