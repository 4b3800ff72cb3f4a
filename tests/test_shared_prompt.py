"""Shared-prompt forward: the same log-probs, values and gradients as the plain forward, with each
distinct prompt read once; grouping by token ids; where it does not apply; bucketed micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from benchmarks.learner_bench import search_batch
from rllib_search.algos import SearchGRPOConfig
from rllib_search.algos.learners.batching import bucket_order, micro_batches
from rllib_search.algos.model.rl_module import LLMRLModule
from rllib_search.algos.model.shared_prompt import computed_positions, group_prompts, supports
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from tests.helpers import build_tiny_qwen2_lm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("shared_prompt_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def build(model_dir: str, **model_config) -> LLMRLModule:
    torch.manual_seed(1)  # the same LoRA adapters for both modules of a comparison
    space = spaces.Sequence(spaces.Discrete(440), stack=True)
    return LLMRLModule(
        observation_space=space, action_space=space, model_config={"model": model_dir, **model_config}
    )


def grouped_rows(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two prompts (9 and 5 tokens) with three continuations each (0 to 6 tokens), rows interleaved so
    that a group's rows are not adjacent; ``score_mask`` on the continuations, as a learner scores."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 400, (n,), generator=generator).tolist() for n in (9, 5)]
    rows, prompt_lengths = [], []
    for k in range(3):
        for prompt in prompts:
            length = int(torch.randint(0, 7, (1,), generator=generator)) if k else 0
            rows.append(prompt + torch.randint(3, 400, (length,), generator=generator).tolist())
            prompt_lengths.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    score = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        score[i, prompt_lengths[i] - 1 : len(row) - 1] = True
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "score_mask": score,
        "prompt_lengths": torch.tensor(prompt_lengths),
    }


def forward_and_grads(module: LLMRLModule, batch: dict[str, torch.Tensor]):
    """Outputs, parameter gradients of a loss that reads every output, and decoder tokens processed."""
    processed = []
    embeddings = module.model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda m, args, out: processed.append(args[0].numel()))
    out = module.forward_train(batch)
    handle.remove()
    score = batch["score_mask"].float()
    loss = (out["logprobs"] * score).sum() + (out["entropy"] * score).sum()
    if "values" in out:
        loss = loss + (out["values"][:, :-1] * score).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return out, grads, sum(processed)


@pytest.mark.parametrize("kind", ["full", "lora", "value_head"])
def test_shared_prompts_give_the_plain_forwards_outputs_and_gradients(model_dir, kind):
    config = {"lora": {"r": 4, "alpha": 8}} if kind == "lora" else {}
    config |= {"value_head": True} if kind == "value_head" else {}
    batch = grouped_rows()
    results = []
    for share in (False, True):
        module = build(model_dir, share_prompts=share, **config)
        with torch.no_grad():  # nonzero LoRA B and critic, so that every gradient path carries signal
            for name, param in module.named_parameters():
                if "lora_B" in name or (
                    module.value_head is not None and param in set(module.value_head.parameters())
                ):
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
        results.append(forward_and_grads(module, batch))
    (plain, plain_grads, plain_tokens), (shared, shared_grads, shared_tokens) = results
    score = batch["score_mask"]
    torch.testing.assert_close(shared["logprobs"], plain["logprobs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared["entropy"], plain["entropy"], atol=1e-5, rtol=1e-5)
    if kind == "value_head":
        valid = batch["attention_mask"].bool()
        torch.testing.assert_close(shared["values"][valid], plain["values"][valid], atol=1e-5, rtol=1e-5)
    assert score.sum() > 0 and set(shared_grads) == set(plain_grads) and plain_grads
    for name, grad in plain_grads.items():
        assert grad.abs().max() > 0, name
        scale = float(grad.abs().max())  # float32 sums in another order: within 1e-6 of the largest entry
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6 * scale, rtol=1e-4, msg=name)
    # 6 rows of width 15 read plainly; shared: 2 prompts of width 9, then 6 continuations of width 6.
    assert plain_tokens == 6 * 15 and shared_tokens == 2 * 9 + 6 * 6


def test_prompts_are_grouped_by_their_token_ids():
    ids = np.array([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 4, 9], [1, 2, 3, 7]])
    groups = group_prompts(ids, np.array([3, 3, 3, 2]))
    # rows 0 and 1 share "1 2 3"; row 2 differs in an id; row 3 has a shorter prompt ("1 2").
    assert groups.group_of_row.tolist() == [0, 0, 1, 2]
    assert groups.prompt_rows.tolist() == [0, 2, 3]
    assert groups.shares
    assert not group_prompts(ids[1:3], np.array([3, 3])).shares


def test_the_plain_forward_runs_where_sharing_would_not_be_exact(model_dir):
    module = build(model_dir)
    decoder = module.model.get_decoder()
    assert supports(decoder)
    module.model.config._attn_implementation = "flash_attention_2"  # varlen kernels: no holes in a mask
    assert not supports(decoder)
    module.model.config._attn_implementation = "sdpa"
    assert build(model_dir, share_prompts=False).prompt_groups(grouped_rows(), module.model) is None
    assert module.prompt_groups(grouped_rows(), module.model) is not None


def test_micro_batches_keep_a_prompts_rows_together_and_cover_every_row_once():
    batch = search_batch(rows=12, length=90, vocab=400, seed=5, group_size=4)
    order = np.arange(12)
    np.random.default_rng(0).shuffle(order)  # as RLlib's per-epoch shuffle leaves a mini-batch
    shuffled = {k: v[order] for k, v in batch.items()}
    seen = []
    for index, micro in micro_batches(shuffled, 4):
        groups = group_prompts(micro["input_ids"], micro["prompt_lengths"])
        assert len(groups.prompt_rows) == 1  # one GRPO group per micro-batch of group_size rows
        lengths = micro["attention_mask"].sum(-1)
        assert list(lengths) == sorted(lengths)  # by length within the group
        assert micro["input_ids"].shape[1] == lengths.max()
        np.testing.assert_array_equal(micro["input_ids"], shuffled["input_ids"][index][:, : lengths.max()])
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(12))
    # without shared prompts, rows go by length
    own = search_batch(rows=6, length=90, vocab=400, seed=6)
    lengths = own["attention_mask"].sum(-1)
    assert list(lengths[bucket_order(own)]) == sorted(lengths)


def test_computed_positions_count_each_shared_prompt_once():
    lengths, prompts = np.array([10, 12, 7, 9]), np.array([5, 5, 4, 4])
    groups = group_prompts(np.array([[1] * 12, [1] * 12, [2] * 12, [2] * 12]), prompts)
    assert computed_positions(lengths, prompts, None) == (4 * 12, 38)
    # 2 prompts padded to 5, 4 continuations padded to 7: 10 + 28 computed; real 5 + 4 + (5+7+3+5)
    assert computed_positions(lengths, prompts, groups) == (38, 29)


def test_the_learners_scores_are_the_same_with_shared_prompts(model_dir):
    """``score_batch`` runs micro-batches in bucketed order and puts each row's reference and recomputed
    log-probs back in its own row."""
    batch = search_batch(rows=8, length=96, vocab=440, seed=7, group_size=4)
    order = np.random.default_rng(1).permutation(8)
    batch = {k: v[order] for k, v in batch.items()}
    space = spaces.Sequence(spaces.Discrete(440), stack=True)
    prepared = []
    for share in (False, True):
        config = (
            SearchGRPOConfig()
            .rl_module(model_config={"model": model_dir, "share_prompts": share})
            .training(micro_batch_size=3, kl_coeff=0.05, old_logprobs="recompute")
        )
        learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (space, space)})
        multi = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=8)
        prepared.append(learner.prepare_batch(multi).policy_batches[DEFAULT_MODULE_ID])
    plain, shared = prepared
    mask = batch["loss_mask"] > 0
    for key in ("ref_logprobs", "old_logprobs"):
        assert np.abs(plain[key][mask]).min() > 0
        np.testing.assert_allclose(shared[key][mask], plain[key][mask], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, model_dir) -> str:
    """A tiny Qwen2 over the tiny tokenizer (the other decoder family the layered forward runs)."""
    return str(build_tiny_qwen2_lm(tmp_path_factory.mktemp("shared_prompt_qwen2"), model_dir, hidden_size=64))


def saved_bytes_and_result(module: LLMRLModule, batch: dict[str, torch.Tensor]):
    """Bytes of the tensors autograd keeps for backward in one forward, its log-probs and gradients."""
    kept = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs = module.forward_train(batch)["logprobs"]
    logprobs.sum().backward()
    return sum(kept), logprobs.detach(), [p.grad.clone() for p in module.model.parameters()]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_under_gradient_checkpointing_a_shared_prompt_batch_computes_exactly_what_it_did_without(
    model_dir, qwen2_dir, family
):
    """Transformers drops a checkpointed layer's cache, so the shared forward checkpoints layer by layer
    itself: the same log-probs and gradients, bit for bit, with less kept for backward."""
    batch = grouped_rows()
    results = []
    for checkpointing in (False, True):
        module = build(model_dir if family == "llama" else qwen2_dir, gradient_checkpointing=checkpointing)
        module.train()
        assert module.prompt_groups(batch, module.model) is not None
        results.append(saved_bytes_and_result(module, batch))
        flags = [getattr(m, "gradient_checkpointing", False) for m in module.model.modules()]
        assert any(flags) == checkpointing  # the layers checkpoint again after the shared forward
    (plain_kept, plain, plain_grads), (checkpointed_kept, checkpointed, checkpointed_grads) = results
    assert torch.equal(plain, checkpointed)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, checkpointed_grads, strict=True))
    assert checkpointed_kept < 0.6 * plain_kept


def test_a_decoder_the_layered_forward_does_not_know_runs_the_two_calls_with_checkpointing_paused(model_dir):
    """Outside the layered families the two-call forward runs, with checkpointing off while it does."""
    batch = grouped_rows()
    results = []
    for checkpointing in (False, True):
        module = build(model_dir, gradient_checkpointing=checkpointing).train()
        module.model.config.model_type = "another"  # as the layered forward sees a family it does not know
        results.append(saved_bytes_and_result(module, batch))
    (plain_kept, plain, plain_grads), (kept, paused, paused_grads) = results
    assert torch.equal(plain, paused) and kept == plain_kept
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, paused_grads, strict=True))
