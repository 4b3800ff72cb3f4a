"""SearchLearner and the Search algorithms: masks on every loss term, KL at init, the direction of one
update, micro-batching, the NaN guard, SFT, 2 learners = 1, checkpoint/resume and export."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from rllib_search.algos import (
    SearchGRPOConfig,
    SearchPPOConfig,
    SearchReinforcePPConfig,
    SearchSFTConfig,
)
from rllib_search.algos.algorithm import train_batch
from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
from rllib_search.data.formats import write_qa_jsonl
from rllib_search.env.search_env import SearchEnvConfig
from rllib_search.llm.models import load_tokenizer
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from tests.helpers import ENV_SETTINGS, generated_logprobs, make_config, policy_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("learner_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


@pytest.fixture(scope="module")
def demonstrations(model_dir, world):
    """Teacher episodes: real observations between the teacher's turns, so masks have holes."""
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    return teacher_rollouts(load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:8], config)


def learner_of(algo):
    return algo.learner_group._learner


def with_advantages(rollouts, values, config, pad_token_id=0):
    batch = train_batch(rollouts, config, pad_token_id)
    batch.policy_batches["default_policy"]["episode_advantages"] = np.asarray(values, dtype=np.float32)
    return batch


def test_every_loss_term_ignores_observation_tokens(ray_cluster, model_dir, world, corpus, demonstrations):
    config = make_config(
        SearchPPOConfig, model_dir, world, corpus, entropy_coeff=0.01, old_logprobs="recompute"
    )
    algo = config.build_algo()
    learner = learner_of(algo)
    batch = with_advantages(demonstrations[:4], [1.0, -0.5, 0.2, 0.0], algo.config)
    prepared_batch = learner.prepare_batch(batch).policy_batches["default_policy"]
    prepared = {k: np.asarray(v) for k, v in prepared_batch.items()}
    columns = {k: torch.as_tensor(v) for k, v in prepared.items()}
    mask = columns["loss_mask"]
    observation = (columns["response_mask"] > 0) & (mask == 0)
    assert observation.any(), "demonstrations must contain observation tokens"
    for key in ("advantages", "returns", "old_values"):
        if key != "old_values":
            assert torch.all(columns[key][mask == 0] == 0), key

    module = learner.module["default_policy"].unwrapped()
    fwd_out = module.forward_train(columns)
    for key in ("logprobs", "entropy", "values"):
        fwd_out[key].retain_grad()
    loss, stats = learner.masked_loss(columns, fwd_out)
    assert {"policy_loss", "kl", "value_loss"} <= set(stats)
    loss.backward()
    for key in ("logprobs", "entropy"):
        grad = fwd_out[key].grad
        assert torch.all(grad[mask == 0] == 0), key
        assert grad[mask == 1].abs().sum() > 0, key
    value_grad = fwd_out["values"].grad[:, :-1]
    assert torch.all(value_grad[mask == 0] == 0) and value_grad[mask == 1].abs().sum() > 0

    # Advantage whitening and GAE do not look at observation positions at all.
    noisy = dict(prepared)
    noisy["old_values"] = prepared["old_values"] + 100.0 * observation.numpy()
    again = learner.token_advantages(noisy)
    np.testing.assert_allclose(again["advantages"], prepared["advantages"], rtol=1e-5, atol=1e-6)
    algo.stop()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_kl_is_zero_at_initialisation(ray_cluster, model_dir, world, corpus, lora):
    model = {"lora": {"r": 4, "alpha": 8}} if lora else None
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus, model=model).build_algo()
    results = algo.train()
    assert results["learners"]["default_policy"]["kl"] == 0.0
    assert results["learners"]["default_policy"]["optimizer_steps"] == 1
    assert "episode_return_mean" in results["env_runners"]
    # A LoRA sync carries the adapters only: the engine keeps its base weights through updates.
    assert algo.env_runner.drop_weights() is not lora
    algo.stop()


def test_one_update_raises_positively_advantaged_tokens(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, old_logprobs="recompute")
    algo = config.build_algo()
    learner = learner_of(algo)
    rollouts = demonstrations[:2]
    batch = with_advantages(rollouts, [1.0, -1.0], algo.config)
    before = generated_logprobs(learner, batch)
    learner.update(batch=batch)
    after = generated_logprobs(learner, batch)
    assert after[0] > before[0] and after[1] < before[1]
    algo.stop()


def test_policy_weights_snapshot_survives_updates_and_loads_back_everywhere(
    ray_cluster, model_dir, world, corpus
):
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3).build_algo()
    before = policy_weights(algo)
    snapshot = algo.policy_weights()
    algo.train()
    trained = policy_weights(algo)
    assert any(not torch.equal(before[k], trained[k]) for k in before)
    algo.load_policy_weights(snapshot)
    loaded = policy_weights(algo)
    assert all(torch.equal(before[k], loaded[k]) for k in before)
    runner_model = algo.env_runner.module.model
    assert all(torch.equal(before[k], v) for k, v in runner_model.state_dict().items())
    algo.stop()


def test_an_update_beside_the_engine_frees_its_weights_until_the_sync(ray_cluster, model_dir, world, corpus):
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3).build_algo()
    runner_model = algo.env_runner.module.model
    with algo.engine_weights_dropped():
        assert not any(p.untyped_storage().nbytes() for p in runner_model.parameters())
        with pytest.raises(RuntimeError, match="dropped"):
            algo.env_runner.sample()
    algo.sync_runner_weights()
    with pytest.raises(RuntimeError, match="update failed"), algo.engine_weights_dropped():
        raise RuntimeError("update failed")  # a failed update: the weights come back at once
    assert all(p.untyped_storage().nbytes() for p in runner_model.parameters())
    algo.train()  # drops them for its update, then syncs the trained ones
    trained = policy_weights(algo)
    assert all(torch.equal(trained[k], v) for k, v in runner_model.state_dict().items())
    algo.stop()


def test_a_checkpoint_reads_the_optimizer_state_without_copying_it(ray_cluster, model_dir, world, corpus):
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3).build_algo()
    algo.train()
    learner = learner_of(algo)
    saved = learner.get_state(components="optimizer")["optimizer"]
    for name, optimizer in learner._named_optimizers.items():
        live = optimizer.state_dict()["state"]
        arrays = saved[name]["state"]["state"]
        assert live and arrays.keys() == live.keys()
        for index, moments in live.items():
            assert arrays[index]["step"] == moments["step"].item()
            for key in ("exp_avg", "exp_avg_sq"):
                assert np.shares_memory(arrays[index][key], moments[key].numpy())
    algo.stop()


def test_disk_offload_keeps_the_reference_and_moments_in_a_file_with_the_same_updates(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    def moments(learner):
        return [
            tensor
            for optimizer in learner._named_optimizers.values()
            for state in optimizer.state.values()
            for tensor in state.values()
            if tensor.dim()
        ]

    runs = {}
    for offload in (False, True):
        config = make_config(
            SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, kl_coeff=0.05, disk_offload=offload
        )
        algo = config.build_algo()
        learner = learner_of(algo)
        batch = with_advantages(demonstrations[:2], [1.0, -1.0], algo.config)
        for _ in range(2):
            learner.update(batch=batch)
            if offload:  # between updates neither the reference nor the moments are in memory
                assert not any(p.numel() for p in learner.reference.parameters())
                assert moments(learner) and not any(t.numel() for t in moments(learner))
        scored = learner.prepare_batch(batch).policy_batches["default_policy"]
        optimizer = learner.get_state(components="optimizer")["optimizer"]  # a checkpoint reads them back
        runs[offload] = (policy_weights(algo), scored, optimizer, algo)
    (weights, scored, optimizer, plain), (offloaded_weights, offloaded_scored, offloaded_optimizer, algo) = (
        runs[False],
        runs[True],
    )
    assert all(torch.equal(weights[name], offloaded_weights[name]) for name in weights)
    # the reference read back from the file scores as the one kept in memory, and the trained policy not
    np.testing.assert_array_equal(scored["ref_logprobs"], offloaded_scored["ref_logprobs"])
    assert not np.array_equal(scored["ref_logprobs"], scored["old_logprobs"])
    for name, saved in optimizer.items():
        for index, state in saved["state"]["state"].items():
            for key, value in state.items():
                assert np.array_equal(value, offloaded_optimizer[name]["state"]["state"][index][key])
    # A restored optimizer state replaces the offloaded moments; the next update offloads the new ones.
    learner = learner_of(algo)
    learner.set_state({"optimizer": offloaded_optimizer})
    learner.update(batch=batch)
    assert not any(t.numel() for t in moments(learner))
    plain.stop()
    algo.stop()
    with pytest.raises(ValueError, match="disk_offload is for CPU learners"):
        sharded = make_config(SearchGRPOConfig, model_dir, world, corpus, disk_offload=True, sharding="fsdp2")
        sharded.validate()


def test_train_top_layers_updates_the_top_block_and_final_norm_only(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    top_only = {"train_top_layers": 1}
    config = make_config(
        SearchGRPOConfig, model_dir, world, corpus, model=top_only, lr=5e-3, old_logprobs="recompute"
    )
    algo = config.build_algo()
    before = policy_weights(algo)
    learner_of(algo).update(batch=with_advantages(demonstrations[:2], [1.0, -1.0], algo.config))
    after = policy_weights(algo)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    # The tiny model has 2 blocks: only block 1 and the final norm train; the tied embeddings stay.
    in_top = {name for name in changed if name.startswith("model.layers.1.")}
    assert in_top and changed - in_top <= {"model.norm.weight"}
    algo.stop()


def test_micro_batches_accumulate_to_the_whole_batch_update(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    batch_rows = demonstrations[:4]
    weights = []
    for micro in (1, 4):
        config = make_config(
            SearchGRPOConfig, model_dir, world, corpus, micro_batch_size=micro, grad_clip=None
        )
        algo = config.build_algo()
        learner_of(algo).update(batch=with_advantages(batch_rows, [1.0, -1.0, 0.5, -0.5], algo.config))
        weights.append(policy_weights(algo))
        algo.stop()
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], atol=2e-6, rtol=1e-4)


def test_a_nan_loss_is_skipped_and_reported(ray_cluster, model_dir, world, corpus, demonstrations):
    algo = make_config(SearchGRPOConfig, model_dir, world, corpus).build_algo()
    before = policy_weights(algo)
    results = learner_of(algo).update(batch=with_advantages(demonstrations[:2], [np.nan, 1.0], algo.config))
    after = policy_weights(algo)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert results["default_policy"]["skipped_updates"].peek() == 1
    # The next finite batch trains as usual.
    learner_of(algo).update(batch=with_advantages(demonstrations[:2], [1.0, -1.0], algo.config))
    assert any(not torch.equal(after[k], v) for k, v in policy_weights(algo).items())
    algo.stop()


def test_sft_learns_the_demonstrated_tokens_only(ray_cluster, model_dir, world, corpus, demonstrations):
    tokenizer = load_tokenizer(model_dir)
    first = demonstrations[0]
    generated = tokenizer.decode(first.token_ids[first.loss_mask.astype(bool)])
    assert "<search>" in generated and "<information>" not in generated
    config = make_config(SearchSFTConfig, model_dir, world, corpus, lr=3e-3).sft(
        demonstrations=demonstrations, sft_batch_size=4
    )
    algo = config.build_algo()
    losses = [algo.train()["learners"]["default_policy"]["sft_nll"] for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0]
    algo.stop()


def test_sft_balance_by_gives_every_batch_the_labels_mix(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    """``sft(balance_by=labels)``: each batch holds the labels in the demonstrations' proportions (6 "a" and 2
    "b" give 3 and 1 of every 4), and a checkpointed state resumes the same draws."""
    labels = ["b" if i % 4 == 0 else "a" for i in range(len(demonstrations))]
    label_of = {d.uid: label for d, label in zip(demonstrations, labels, strict=True)}
    assert len(label_of) == len(demonstrations)  # one question each
    config = make_config(SearchSFTConfig, model_dir, world, corpus).sft(
        demonstrations=demonstrations, sft_batch_size=4, balance_by=labels
    )
    algo = config.build_algo()
    for _ in range(4):
        batch = [label_of[d.uid] for d in algo.next_demonstrations()]
        assert sorted(batch) == ["a", "a", "a", "b"]
    state = algo.get_state()
    expected = [d.uid for d in algo.next_demonstrations()]
    algo.set_state(state)
    assert [d.uid for d in algo.next_demonstrations()] == expected
    algo.stop()
    with pytest.raises(ValueError, match="one label per demonstration"):
        config.copy(copy_frozen=False).sft(balance_by=labels[:-1]).validate()


def test_sft_weights_each_tokens_nll_by_its_nll_weight(ray_cluster, model_dir, world, corpus):
    """Decision-token weights: the SFT loss is the masked mean of the weighted NLL, and one update raises
    the up-weighted tokens' log-probs more than the same update without weights does."""
    settings = SearchEnvConfig.from_dict(ENV_SETTINGS)
    tokenizer = load_tokenizer(model_dir)
    retriever = BM25Retriever(world.passages)
    weighted = teacher_rollouts(
        tokenizer, retriever, world.train[:4], settings, state_plan=True, decision_weight=30.0
    )
    plain = [dataclasses.replace(d, nll_weights=None) for d in weighted]
    decisions = [np.flatnonzero(d.nll_weights == 30.0) for d in weighted]
    assert all(len(positions) >= 1 for positions in decisions)

    def one_update(demos):
        config = make_config(SearchSFTConfig, model_dir, world, corpus, lr=1e-3, grad_clip=None)
        algo = config.sft(demonstrations=demos, sft_batch_size=4).build_algo()
        batch = train_batch(demos, algo.config, 0)
        columns = {k: torch.as_tensor(v) for k, v in batch.policy_batches["default_policy"].items()}
        module = learner_of(algo).module["default_policy"].unwrapped()
        with torch.no_grad():
            before = module.forward_train(columns)["logprobs"]
        reported = learner_of(algo).update(batch=batch)["default_policy"]["sft_nll"].peek()
        with torch.no_grad():
            after = module.forward_train(columns)["logprobs"]
        algo.stop()
        gain = np.mean([float((after - before)[row, p - 1].mean()) for row, p in enumerate(decisions)])
        return columns, before, reported, gain

    columns, before, reported, weighted_gain = one_update(weighted)
    mask, weights = columns["loss_mask"], columns["nll_weights"]
    per_sequence = (-before * weights * mask).sum(-1) / mask.sum(-1)
    assert reported == pytest.approx(float(per_sequence.mean()), rel=1e-4)
    plain_columns, plain_before, plain_reported, plain_gain = one_update(plain)
    assert "nll_weights" not in plain_columns
    plain_per_sequence = (-plain_before * mask).sum(-1) / mask.sum(-1)
    assert plain_reported == pytest.approx(float(plain_per_sequence.mean()), rel=1e-4)
    assert weighted_gain > plain_gain + 0.05


def test_each_algorithm_trains_with_the_served_retriever(service, model_dir, world, corpus):
    for cls in (SearchGRPOConfig, SearchPPOConfig, SearchReinforcePPConfig):
        config = make_config(cls, model_dir, world, corpus)
        config.env_config["retriever"] = {"type": "serve", "timeout_s": 60}
        algo = config.build_algo()
        results = algo.train()
        learner = results["learners"]["default_policy"]
        assert learner["optimizer_steps"] == 1 and learner["skipped_updates"] == 0
        assert results["env_runners"]["num_episodes"] == 4
        assert algo.env_runner.weights_version >= 1  # the new weights reached the sampler
        algo.stop()


def test_two_learners_equal_one(ray_cluster, model_dir, world, corpus, demonstrations):
    rows = demonstrations[:4]
    weights = []
    for learners in (0, 2):
        config = make_config(SearchGRPOConfig, model_dir, world, corpus, grad_clip=None).learners(
            num_learners=learners, num_cpus_per_learner=1
        )
        algo = config.build_algo()
        algo.learner_group.update(batch=with_advantages(rows, [1.0, -1.0, 0.5, -0.5], algo.config))
        state = algo.learner_group.get_state(components="learner/rl_module/default_policy")
        module_state = state["learner"]["rl_module"]["default_policy"]
        weights.append({k: torch.as_tensor(v) for k, v in module_state.items()})
        algo.stop()
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], atol=1e-5, rtol=1e-4)


def test_checkpoint_then_resume_gives_the_identical_next_update(
    ray_cluster, model_dir, world, corpus, tmp_path
):
    """In process (``save_to_path`` / ``Algorithm.from_checkpoint``), and a driver killed with SIGKILL
    mid-run (``tests/resumable_run.py``: periodic checkpoints, ``restore_latest``): both resumed runs
    continue with the uninterrupted run's data position and iteration count, and update as it does."""
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, warmup_ratio=0.5, total_training_steps=4)
    algo = config.build_algo()
    algo.train()
    algo.save_to_path(str(tmp_path / "ckpt"))
    algo.train()
    expected = policy_weights(algo)
    expected_steps = learner_of(algo).optimizer_steps
    algo.train()
    expected_third = policy_weights(algo)
    algo.stop()

    from ray.rllib.algorithms.algorithm import Algorithm

    resumed = Algorithm.from_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.iteration == 1
    resumed.train()
    got = policy_weights(resumed)
    assert learner_of(resumed).optimizer_steps == expected_steps == 2
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5)
    resumed.stop()

    # The driver killed with SIGKILL during iteration 3, after its checkpoints of iterations 1 and 2.
    questions = tmp_path / "questions.jsonl"
    write_qa_jsonl(world.train, questions)
    run = [sys.executable, "-m", "tests.resumable_run", str(tmp_path / "run"), "--model", model_dir]
    run += ["--corpus", corpus, "--questions", str(questions), "--iterations", "3"]
    lines = run_until(run, "iteration 2 ")
    assert lines[-1].startswith("iteration 2 checkpoint") and "checkpoint_000002" in lines[-1]
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [p.name for p in sorted(checkpoints.iterdir())] == ["checkpoint_000001", "checkpoint_000002"]
    # What a kill during a save leaves: a half-written temporary directory, never taken for the latest.
    (checkpoints / ".tmp-checkpoint_000003-1").mkdir()
    (checkpoints / ".tmp-checkpoint_000003-1" / "algorithm_state.pkl").write_bytes(b"\x80trunc")
    lines = run_until([*run, "--resume"], None)
    assert lines[0].startswith(f"resumed from {checkpoints / 'checkpoint_000002'} at iteration 2")
    assert lines[1].startswith("iteration 3 checkpoint") and len(lines) == 2
    assert [p.name for p in sorted(checkpoints.iterdir())] == ["checkpoint_000002", "checkpoint_000003"]
    got = torch.load(tmp_path / "run" / "weights.pt")
    for name in expected_third:
        torch.testing.assert_close(got[name], expected_third[name], atol=1e-6, rtol=1e-5)


def run_until(command: list[str], line_start: str | None, timeout_s: float = 400) -> list[str]:
    """Run ``command`` (this repository's root on PYTHONPATH) in a session of its own and return the lines
    it printed: up to the first that starts with ``line_start``, after which its whole process group is
    killed with SIGKILL (the driver and the Ray it started), or all of them once it exits by itself."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    watchdog = threading.Timer(timeout_s, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line.strip())
            if line_start is not None and line.startswith(line_start):
                os.killpg(process.pid, signal.SIGKILL)
                break
        code = process.wait()
    finally:
        watchdog.cancel()
    expected = -signal.SIGKILL if line_start is not None else 0
    assert code == expected, f"exit {code}; printed: {lines}"
    return lines


def test_export_loads_in_transformers_with_the_same_logprobs(ray_cluster, model_dir, world, corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    algo = make_config(
        SearchGRPOConfig, model_dir, world, corpus, model={"lora": {"r": 4, "alpha": 8}}
    ).build_algo()
    algo.train()
    module = learner_of(algo).module["default_policy"].unwrapped()
    out = algo.export(tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tokenizer("who sang it <search> lead singer </search>")["input_ids"]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = module.forward_train(batch)["logprobs"]
        logits = model(ids).logits[0, :-1].float()
    got = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got, expected[0], atol=1e-4, rtol=1e-4)
    algo.stop()


def test_config_validation(model_dir, world, corpus):
    with pytest.raises(ValueError, match="value_head"):
        make_config(SearchPPOConfig, model_dir, world, corpus, model={"value_head": False}).validate()
    with pytest.raises(ValueError, match="total_training_steps"):
        make_config(SearchGRPOConfig, model_dir, world, corpus, warmup_ratio=0.1).validate()
    with pytest.raises(ValueError, match="demonstrations"):
        make_config(SearchSFTConfig, model_dir, world, corpus).validate()
    with pytest.raises(ValueError, match="advantage_estimator"):
        make_config(SearchGRPOConfig, model_dir, world, corpus, advantage_estimator="a2c").validate()
    with pytest.raises(ValueError, match="needs a directory"):
        make_config(SearchGRPOConfig, model_dir, world, corpus).checkpointing(every_n_iterations=5).validate()
    with pytest.raises(ValueError, match="trained_turns must be"):
        make_config(SearchGRPOConfig, model_dir, world, corpus, trained_turns=0).validate()
    with pytest.raises(ValueError, match="use one or the other"):
        no_mask = {"trained_turns": 1, "mask_retrieved_tokens": False}
        make_config(SearchGRPOConfig, model_dir, world, corpus, **no_mask).validate()
    with pytest.raises(ValueError, match="sample_retries"):
        make_config(SearchGRPOConfig, model_dir, world, corpus).fault_tolerance(sample_retries=-1).validate()
    config = make_config(SearchGRPOConfig, model_dir, world, corpus).fault_tolerance(
        max_num_env_runner_restarts=7
    )
    assert config.restart_failed_env_runners  # ours, and RLlib's settings pass through:
    assert config.max_num_env_runner_restarts == 7


def test_bf16_autocast_update_is_finite_and_trains(ray_cluster, model_dir, world, corpus, demonstrations):
    """The GPU default (bf16 autocast of forward passes), exercised on CPU where torch supports it too."""
    config = make_config(SearchPPOConfig, model_dir, world, corpus, autocast=True, kl_coeff=0.001)
    algo = config.build_algo()
    before = policy_weights(algo)
    results = learner_of(algo).update(batch=with_advantages(demonstrations[:2], [1.0, -1.0], algo.config))
    stats = results["default_policy"]
    assert stats["skipped_updates"].peek() == 0 and np.isfinite(stats["policy_loss"].peek())
    assert any(not torch.equal(before[k], v) for k, v in policy_weights(algo).items())
    assert all(v.dtype == torch.float32 for v in policy_weights(algo).values())  # master weights stay fp32
    assert all(p.grad is None for p in learner_of(algo).policy().model.parameters())  # freed after the step
    reference = dict(learner_of(algo).reference.named_parameters())  # frozen, read only under autocast
    assert reference["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert reference["model.embed_tokens.weight"].dtype == torch.float32
    algo.stop()


def test_ptx_demonstrations_train_by_their_nll_only(ray_cluster, model_dir, world, corpus, demonstrations):
    """PPO-ptx: demonstration rows carry no advantage and no RL term (with coeff 0 the update is the plain
    RL one); with a coeff they raise their own tokens' log-probs; the Algorithm draws them each iteration
    and checkpoints its position."""
    episodes, demos = demonstrations[:2], demonstrations[2:4]
    settings = {"micro_batch_size": 8, "grad_clip": None, "old_logprobs": "recompute"}

    def weights_after(batch, coeff):
        config = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, **settings)
        algo = config.ptx(demonstrations=demos, coeff=coeff).build_algo() if coeff else config.build_algo()
        results = learner_of(algo).update(batch=batch)["default_policy"]
        weights = policy_weights(algo)
        algo.stop()
        return weights, results["policy_loss"].peek()

    config = make_config(SearchGRPOConfig, model_dir, world, corpus)
    mixed = train_batch(episodes, config, 0, demonstrations=demos).policy_batches["default_policy"]
    assert mixed["ptx"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert mixed["episode_advantages"][2:].tolist() == [0.0, 0.0]
    plain = with_advantages(episodes, [1.0, 0.5], config)
    with_demos = train_batch(episodes, config, 0, demonstrations=demos)
    with_demos.policy_batches["default_policy"]["episode_advantages"][:2] = [1.0, 0.5]
    baseline, baseline_loss = weights_after(plain, 0.0)
    weights, loss = weights_after(with_demos, 0.0)
    assert loss == pytest.approx(baseline_loss, rel=1e-4, abs=1e-6)
    for name, value in weights.items():  # Adam moves each weight ~lr (5e-3)
        torch.testing.assert_close(value, baseline[name], atol=5e-4, rtol=0)

    # With a coeff and no RL signal (advantages 0) the update is the demonstrations' NLL step.
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, lr=5e-3, **settings)
    algo = config.ptx(demonstrations=demos, coeff=1.0, batch_size=2).build_algo()
    batch = train_batch(episodes, algo.config, 0, demonstrations=demos)
    batch.policy_batches["default_policy"]["episode_advantages"][:] = 0.0
    columns = {k: torch.as_tensor(v) for k, v in batch.policy_batches["default_policy"].items()}
    module = learner_of(algo).module["default_policy"].unwrapped()

    def demo_logprob() -> float:
        with torch.no_grad():
            logprobs = module.forward_train(columns)["logprobs"][2:]
        mask = columns["loss_mask"][2:]
        return float((logprobs * mask).sum() / mask.sum())

    before = demo_logprob()
    results = learner_of(algo).update(batch=batch)
    assert demo_logprob() > before and results["default_policy"]["ptx_nll"].peek() > 0
    # The Algorithm mixes ptx_batch_size demonstrations into every iteration, position checkpointed.
    assert "ptx_nll" in algo.train()["learners"]["default_policy"]
    state = algo.get_state()
    assert state["ptx_position"] == algo._ptx_sampler.get_state()
    following = algo.next_ptx_demonstrations()
    algo.set_state({"ptx_position": state["ptx_position"]})
    assert [d.token_ids.tolist() for d in algo.next_ptx_demonstrations()] == [
        d.token_ids.tolist() for d in following
    ]
    algo.stop()
    with pytest.raises(ValueError, match="needs demonstrations"):
        make_config(SearchGRPOConfig, model_dir, world, corpus).ptx(coeff=0.5).validate()


def test_trained_turns_credits_the_first_turns_only(model_dir, world, corpus, demonstrations):
    """With trained_turns=1 each episode enters the batch cut after its first turn (the plan and first
    query), its loss mask there the whole episode's, advantages unchanged; PPO-ptx demonstrations keep every
    turn; an episode of at most trained_turns turns is kept whole."""
    episodes, demos = demonstrations[:2], demonstrations[2:4]
    assert all(len(r.turn_spans) >= 2 for r in episodes), "the test needs episodes of several turns"
    every = make_config(SearchGRPOConfig, model_dir, world, corpus)
    first = make_config(SearchGRPOConfig, model_dir, world, corpus, trained_turns=1)
    full = train_batch(episodes, every, 0, demonstrations=demos).policy_batches["default_policy"]
    kept = train_batch(episodes, first, 0, demonstrations=demos).policy_batches["default_policy"]
    np.testing.assert_array_equal(kept["episode_advantages"], full["episode_advantages"])
    for row, episode in enumerate(episodes):
        end = episode.turn_spans[0][1]
        np.testing.assert_array_equal(kept["input_ids"][row, :end], full["input_ids"][row, :end])
        assert kept["attention_mask"][row].sum() == end  # nothing after the first turn
        np.testing.assert_array_equal(kept["loss_mask"][row, : end - 1], full["loss_mask"][row, : end - 1])
        assert kept["loss_mask"][row, end - 1 :].sum() == 0
        assert full["loss_mask"][row].sum() > kept["loss_mask"][row].sum() > 0
    for row in (2, 3):  # the demonstrations, whole
        width = int(full["attention_mask"][row].sum())
        np.testing.assert_array_equal(kept["input_ids"][row, :width], full["input_ids"][row, :width])
        np.testing.assert_array_equal(
            kept["loss_mask"][row], full["loss_mask"][row, : kept["loss_mask"].shape[1]]
        )
        assert kept["loss_mask"][row].sum() == full["loss_mask"][row].sum()
    every_turn = make_config(
        SearchGRPOConfig, model_dir, world, corpus, trained_turns=len(episodes[0].turn_spans)
    )
    whole = train_batch(episodes[:1], every_turn, 0).policy_batches["default_policy"]
    np.testing.assert_array_equal(whole["loss_mask"][0], full["loss_mask"][0, : whole["loss_mask"].shape[1]])
    assert whole["loss_mask"][0].sum() == full["loss_mask"][0].sum()


def test_trained_turns_loss_equals_the_whole_episodes_loss_masked_after_the_first_turn(
    ray_cluster, model_dir, world, corpus, demonstrations
):
    """Cutting the episodes after the credited turns changes nothing the loss sees: the same loss and
    statistics as the whole episodes with their later turns masked out."""
    episodes = demonstrations[:3]
    config = make_config(SearchGRPOConfig, model_dir, world, corpus, kl_coeff=0.01, trained_turns=1)
    algo = config.build_algo()
    learner = learner_of(algo)
    module = learner.module["default_policy"].unwrapped()
    cut = with_advantages(episodes, [1.0, -0.5, 0.25], algo.config)
    whole = with_advantages(
        episodes, [1.0, -0.5, 0.25], make_config(SearchGRPOConfig, model_dir, world, corpus)
    )
    masked = whole.policy_batches["default_policy"]["loss_mask"]
    for row, episode in enumerate(episodes):
        masked[row, episode.turn_spans[0][1] - 1 :] = 0

    def loss_of(batch):
        prepared = learner.prepare_batch(batch).policy_batches["default_policy"]
        columns = {k: torch.as_tensor(np.asarray(v)) for k, v in prepared.items()}
        with torch.no_grad():
            loss, stats = learner.masked_loss(columns, module.forward_train(columns))
        return float(loss), {k: float(v) for k, v in stats.items()}

    (cut_loss, cut_stats), (whole_loss, whole_stats) = loss_of(cut), loss_of(whole)
    assert cut_stats["kl"] > 0 or cut_stats["policy_loss"] != 0
    assert cut_loss == pytest.approx(whole_loss, rel=1e-4, abs=1e-6)
    for key, value in whole_stats.items():
        assert cut_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    algo.stop()
