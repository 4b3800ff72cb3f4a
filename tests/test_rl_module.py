"""LLMRLModule: per-token log-probs and entropy (chunked), value head, LoRA state, gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rllib_search.algos.model.rl_module import LLMRLModule
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("module_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def build(model_dir: str, **model_config) -> LLMRLModule:
    space = spaces.Sequence(spaces.Discrete(440), stack=True)
    return LLMRLModule(
        observation_space=space, action_space=space, model_config={"model": model_dir, **model_config}
    )


def batch_of(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right-padded ids and mask, as a learner batches sequences."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


ROWS = [[5, 17, 33, 80, 91, 120, 7], [9, 44, 12]]


def test_logprobs_match_the_models_own_log_softmax(model_dir):
    module = build(model_dir, logprob_chunk=2)
    out = module.forward_train(batch_of(ROWS))
    for i, row in enumerate(ROWS):
        with torch.no_grad():
            logits = module.model(torch.tensor([row])).logits[0].float()
        expected = (
            torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(row[1:]).unsqueeze(-1)).squeeze(-1)
        )
        torch.testing.assert_close(out["logprobs"][i, : len(row) - 1], expected, atol=1e-5, rtol=1e-5)
        p = torch.softmax(logits[:-1], -1)
        entropy = -(p * torch.log_softmax(logits[:-1], -1)).sum(-1)
        torch.testing.assert_close(out["entropy"][i, : len(row) - 1], entropy, atol=1e-5, rtol=1e-5)


def test_chunking_changes_nothing_and_gradients_flow(model_dir):
    whole, chunked = build(model_dir, logprob_chunk=4096), build(model_dir, logprob_chunk=1)
    batch = batch_of(ROWS)
    a, b = whole.forward_train(batch)["logprobs"], chunked.forward_train(batch)["logprobs"]
    torch.testing.assert_close(a, b)
    a.sum().backward()
    b.sum().backward()
    for (name, pa), (_, pb) in zip(whole.model.named_parameters(), chunked.model.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_chunk_counts_positions_of_the_whole_batch_not_per_row(model_dir):
    """The projection's transient memory is set by ``logprob_chunk`` alone: 5-position chunks over the
    batch's 2 x 6 projected positions (padding included) are 3 projections, whatever the row count."""
    module = build(model_dir, logprob_chunk=5)
    widths = []
    head = module.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _, inputs, __: widths.append(inputs[0].shape[0]))
    try:
        with torch.no_grad():
            module.forward_train(batch_of(ROWS))
    finally:
        handle.remove()
    assert widths == [5, 5, 2]


def test_value_head_gives_one_value_per_position(model_dir):
    module = build(model_dir, value_head=True)
    batch = batch_of(ROWS)
    values = module.compute_values(batch)
    assert values.shape == batch["input_ids"].shape
    assert torch.count_nonzero(values) == 0  # zero-initialised: the critic starts neutral
    assert module.forward_train(batch)["values"].shape == values.shape
    with pytest.raises(ValueError, match="no value head"):
        build(model_dir).compute_values(batch)


def test_lora_trains_and_syncs_only_adapters(model_dir):
    module = build(model_dir, lora={"r": 4, "alpha": 8})
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    state = module.get_state()
    assert set(state) == trainable
    other = build(model_dir, lora={"r": 4, "alpha": 8})
    changed = {k: torch.as_tensor(v) + 1.0 for k, v in state.items()}
    other.set_state(changed)
    for name, param in other.named_parameters():
        if name in changed:
            torch.testing.assert_close(param.detach(), changed[name])


def test_plain_state_round_trip(model_dir):
    module, other = build(model_dir), build(model_dir)
    state = {k: np.asarray(v) + 0.25 for k, v in module.get_state().items()}
    other.set_state(state)
    batch = batch_of(ROWS)
    assert not torch.allclose(module.forward_train(batch)["logprobs"], other.forward_train(batch)["logprobs"])


def test_inference_forward_gives_next_token_logits_at_each_rows_end(model_dir):
    module = build(model_dir)
    out = module.forward_inference(batch_of(ROWS))["action_dist_inputs"]
    with torch.no_grad():
        expected = module.model(torch.tensor([ROWS[1]])).logits[0, -1].float()
    torch.testing.assert_close(out[1], expected, atol=1e-5, rtol=1e-5)


def test_score_mask_projects_only_masked_positions_with_the_same_values(model_dir):
    module = build(model_dir, logprob_chunk=2)
    batch = batch_of(ROWS)
    score_mask = torch.zeros(2, 6, dtype=torch.bool)
    score_mask[0, [1, 2, 5]] = True
    score_mask[1, 1] = True
    full = module.forward_train(batch)
    masked = module.forward_train({**batch, "score_mask": score_mask})
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(masked[key][score_mask], full[key][score_mask])
        assert torch.all(masked[key][~score_mask] == 0)
    masked["logprobs"].sum().backward()  # gradients flow through the scattered positions
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_gradient_checkpointing_gives_the_same_gradients_under_bf16_autocast(model_dir):
    """The main job's warm start recomputes activations in backward to halve its memory: nothing else
    may change, bit for bit, in the loss or any gradient (the module trains in train mode, as RLlib's
    learner leaves it)."""
    batch = batch_of(ROWS)
    grads = []
    for checkpointing in (False, True):
        module = build(model_dir, gradient_checkpointing=checkpointing).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = -module.forward_train(batch)["logprobs"].sum()
            loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in module.model.parameters()]))
    (loss_plain, plain), (loss_checkpointed, checkpointed) = grads
    assert torch.equal(loss_plain, loss_checkpointed)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed, strict=True))
    assert any(
        getattr(m, "gradient_checkpointing", False)
        for m in build(model_dir, gradient_checkpointing=True).modules()
    )
