"""LLMEnvRunner: token-exact rollouts with a real engine, the real Serve retriever, stop strings, group ids,
weight sync, data position and metrics."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rllib_search import ENV_ID
from rllib_search.algos.config import SearchConfig
from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
from rllib_search.data.records import QARecord
from rllib_search.llm.engines import SamplingParams
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit
from tests.helpers import build_tiny_sliding_window_lm

pytestmark = pytest.mark.slow


class RecordingEngine(PrefixCachingHFEngine):
    """The runner's own engine class, keeping what each generate call returned (the sampler's output)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[list[int]], list]] = []

    def generate(self, prefixes, params, max_new_tokens=None):
        segments = super().generate(prefixes, params, max_new_tokens)
        self.calls.append(([list(p) for p in prefixes], segments))
        return segments


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner_model")
    return build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok"))


@pytest.fixture(scope="module")
def searching_model_dir(tmp_path_factory, tiny_model_dir, world):
    """A tiny model trained for a few steps to open every answer with a search, then keep talking: its
    segments end at the stop string only if the engine stops them there."""
    questions = [record.question for record in world.train[:4]]
    text = "<think> look </think>\n<search> lead singer </search> and more text"
    return teach_to_emit(tiny_model_dir, tmp_path_factory.mktemp("searching_model"), questions, text)


def make_config(model_dir, dataset, retriever, **rollouts) -> SearchConfig:
    env_config = {
        "retriever": retriever,
        "dataset": dataset,
        "protocol": "search_r1",
        "max_turns": 3,
        "max_total_tokens": 1200,
        "max_obs_tokens": 120,
    }
    settings = {"group_size": 2, "prompts_per_sample": 3, "max_turn_tokens": 30, **rollouts}
    return (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": str(model_dir)})
        .rollouts(**settings)
        .debugging(seed=7)
    )


def recording_runner(config) -> LLMEnvRunner:
    runner = LLMEnvRunner(config=config)
    runner.engine = RecordingEngine(runner.module.model, runner.tokenizer)
    return runner


def test_rollouts_are_token_exact_with_the_served_retriever(service, searching_model_dir, world):
    config = make_config(searching_model_dir, world.train, {"type": "serve", "timeout_s": 60})
    runner = recording_runner(config)
    rollouts = runner.sample()
    assert len(rollouts) == 6
    # Replay the engine's calls: every generated span is exactly a segment the engine sampled for exactly
    # the prefix before it (a group's episodes share their first prefix, so match (prefix, segment) pairs),
    # and everything else in the rollout is prompt or env-inserted observation with mask 0.
    produced = {
        (tuple(prefix), tuple(segment.token_ids)): segment
        for prefixes, segments in runner.engine.calls
        for prefix, segment in zip(prefixes, segments)
    }
    searched = 0
    for rollout in rollouts:
        ids, mask = rollout.token_ids.tolist(), rollout.loss_mask.tolist()
        assert set(mask[: rollout.prompt_length]) == {0}
        for start, end in rollout.turn_spans:
            segment = produced[(tuple(ids[:start]), tuple(ids[start:end]))]
            assert mask[start:end] == [1] * (end - start)
            np.testing.assert_allclose(rollout.logprobs[start:end], segment.logprobs, rtol=1e-6)
        generated_positions = {p for s, e in rollout.turn_spans for p in range(s, e)}
        assert all(m == (p in generated_positions) for p, m in enumerate(mask))
        assert np.isnan(rollout.logprobs[[p for p in range(len(ids)) if p not in generated_positions]]).all()
        searched += rollout.stats["searches"]
    assert searched > 0  # the served retriever answered
    assert all(r.weights_version == 0 for r in rollouts)


def test_no_token_is_generated_past_a_stop_tag(searching_model_dir, world, retriever):
    runner = recording_runner(make_config(searching_model_dir, world.train, retriever, temperature=0.0))
    runner.sample()
    stops = runner.sampling.stop
    stopped = 0
    for _, segments in runner.engine.calls:
        for segment in segments:
            text = runner.tokenizer.decode(segment.token_ids)
            if segment.finish_reason == "stop":
                stopped += 1
                assert text.endswith(segment.stop_string)
                shorter = runner.tokenizer.decode(segment.token_ids[:-1])
                assert not any(stop in shorter for stop in stops)
            else:
                assert not any(stop in text for stop in stops)
    assert stopped > 0  # the trained model does emit the stop tag, so the check above is not vacuous


def test_group_ids_are_unique_across_data_sources(tiny_model_dir, retriever):
    # Same ids and questions in two datasets: Search-R1's per-dataset row indices collided here.
    dataset = [
        QARecord(str(i), f"Who founded company {i}?", ["x"], source)
        for source in ("nq", "hotpotqa")
        for i in range(3)
    ]
    runner = LLMEnvRunner(
        config=make_config(tiny_model_dir, dataset, retriever, prompts_per_sample=6, max_turn_tokens=4)
    )
    first, second = runner.sample(), runner.sample()
    groups: dict[str, set[str]] = {}
    for rollout in first + second:
        groups.setdefault(rollout.group_id, set()).add(rollout.uid)
    assert len(groups) == 12  # 2 samples x 6 prompts, each its own group
    assert all(len(uids) == 1 for uids in groups.values())
    sizes = {g: sum(r.group_id == g for r in first + second) for g in groups}
    assert set(sizes.values()) == {2}
    assert {r.data_source for r in first} == {"nq", "hotpotqa"}


def test_a_sliding_window_model_rolls_out_on_the_prefix_caching_engine(tmp_path, world, retriever):
    """Gemma-3's sliding-window layers are served by the prefix-caching engine too (exact: tested in
    test_prefix_cache_engine)."""
    from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine

    model_dir = build_tiny_sliding_window_lm(tmp_path / "gemma", build_tiny_tokenizer(tmp_path / "tok"))
    runner = LLMEnvRunner(config=make_config(model_dir, world.train, retriever, max_turn_tokens=6))
    assert type(runner.engine) is PrefixCachingHFEngine
    rollouts = runner.sample()
    assert len(rollouts) == 6 and all(r.num_generated_tokens > 0 for r in rollouts)


def test_weight_sync_changes_the_engine_and_the_version(tiny_model_dir, world, retriever):
    runner = LLMEnvRunner(config=make_config(tiny_model_dir, world.train, retriever, temperature=0.0))
    prefix = [runner.new_env().render_prompt("Who founded Quellon Works?")[1]]
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = runner.engine.generate(prefix, params)[0].token_ids
    weights = runner.module.get_state()  # numpy arrays, as a learner's state travels
    rng = np.random.default_rng(0)
    changed = {k: v + 0.5 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in weights.items()}
    runner.set_state({"rl_module": {"default_policy": changed}, "weights_version": 5})
    after = runner.engine.generate(prefix, params)[0].token_ids
    assert after != before
    assert runner.weights_version == 5
    assert all(r.weights_version == 5 for r in runner.sample())


def test_data_position_survives_get_and_set_state(tiny_model_dir, world, retriever):
    config = make_config(tiny_model_dir, world.train, retriever, max_turn_tokens=4)
    runner = LLMEnvRunner(config=config)
    runner.sample()
    state = runner.get_state()
    expected = [r.uid for r in runner.sample()]
    resumed = LLMEnvRunner(config=config)
    resumed.set_state(state)
    assert [r.uid for r in resumed.sample()] == expected


def test_metrics_go_through_the_metrics_logger(tiny_model_dir, world, retriever):
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    runner = LLMEnvRunner(config=make_config(tiny_model_dir, world.train, retriever))
    rollouts = runner.sample()
    metrics = MetricsLogger.peek_results(runner.get_metrics())
    assert metrics["num_episodes"] == len(rollouts)
    assert metrics["episode_return_mean"] == pytest.approx(np.mean([r.reward for r in rollouts]))
    for key in (
        "turns_per_episode",
        "searches_per_episode",
        "valid_action_rate",
        "answer_rate",
        "generated_tokens_per_episode",
        "observation_tokens_per_episode",
        "truncation_rate",
        "generation_tokens_per_s",
        "retriever_errors",
    ):
        assert key in metrics
    assert set(metrics["reward"]) == {"em", "format", "retrieval_hit"}


def test_smollm2_rollout_is_token_exact(world, retriever):
    config = make_config(
        "smollm2-135m-instruct",
        world.train[:1],
        retriever,
        group_size=2,
        prompts_per_sample=1,
        max_turn_tokens=16,
    )
    runner = recording_runner(config)
    rollouts = runner.sample()
    produced = {
        (tuple(p), tuple(s.token_ids))
        for prefixes, segments in runner.engine.calls
        for p, s in zip(prefixes, segments)
    }
    for rollout in rollouts:
        ids = rollout.token_ids.tolist()
        for start, end in rollout.turn_spans:
            assert (tuple(ids[:start]), tuple(ids[start:end])) in produced
        prompt_text = runner.tokenizer.decode(ids[: rollout.prompt_length])
        assert prompt_text.startswith("<|im_start|>") and world.train[0].question in prompt_text


def test_balanced_sampling_draws_every_kind_equally_and_resumes(tiny_model_dir, world, retriever):
    hops = {r.uid: r.extra["num_hops"] for r in world.train}
    kinds = sorted(set(hops.values()))
    assert len(kinds) > 1 and len({list(hops.values()).count(k) for k in kinds}) > 1  # unequal kinds
    config = make_config(
        tiny_model_dir,
        world.train,
        retriever,
        max_turn_tokens=4,
        prompts_per_sample=len(kinds),
        balance_by="num_hops",
    )
    runner = LLMEnvRunner(config=config)
    for _ in range(3):
        drawn = sorted(hops[r.uid] for r in runner.sample())
        assert drawn == sorted(kinds * config.group_size)  # each kind once per sample, group_size times
    state = runner.get_state()
    expected = [r.uid for r in runner.sample()]
    resumed = LLMEnvRunner(config=config)
    resumed.set_state(state)
    assert [r.uid for r in resumed.sample()] == expected


def test_stratified_sampler_walks_each_stratum_in_its_own_shuffle():
    from rllib_search.algos.rollouts.sampler import StratifiedSampler

    labels = ["a"] * 5 + ["b"] * 2 + ["c"] * 3
    sampler = StratifiedSampler(labels, np.random.default_rng(0))
    drawn = sampler.take(30)
    assert [labels[i] for i in drawn] == ["a", "b", "c"] * 10
    for kind, size in (("a", 5), ("b", 2), ("c", 3)):
        mine = [i for i in drawn if labels[i] == kind]
        for start in range(0, len(mine) - size + 1, size):  # every pass over a stratum holds each member once
            assert sorted(mine[start : start + size]) == [i for i, x in enumerate(labels) if x == kind]
    assert sampler.epoch == 4  # "b" (2 members, 10 draws) is on its fifth pass


def test_a_proportional_stratified_sampler_gives_every_batch_the_strata_mix():
    """Strata of 60, 45 and 15 (the main job's 1-hop, 2-hop and early-answered 2-hop demonstrations): every
    8 consecutive draws hold 4, 3 and 1, each stratum walks its own shuffle, and a restored state goes on
    exactly where the original would."""
    from rllib_search.algos.rollouts.sampler import StratifiedSampler

    labels = ["one"] * 60 + ["two"] * 45 + ["early"] * 15
    sampler = StratifiedSampler(labels, np.random.default_rng(3), proportional=True)
    drawn = sampler.take(240)  # two passes over the demonstrations
    for start in range(0, 240, 8):
        batch = [labels[i] for i in drawn[start : start + 8]]
        assert (batch.count("one"), batch.count("two"), batch.count("early")) == (4, 3, 1)
    for kind in ("one", "two", "early"):
        members = [i for i, x in enumerate(labels) if x == kind]
        mine = [i for i in drawn if labels[i] == kind]
        assert sorted(mine[: len(members)]) == members == sorted(mine[len(members) :])  # a pass each
        assert mine[: len(members)] != mine[len(members) :]  # reshuffled between passes
    state = sampler.get_state()
    expected = sampler.take(13)
    restored = StratifiedSampler(labels, np.random.default_rng(99), proportional=True)
    restored.set_state(state)
    assert restored.take(13) == expected
    uneven = StratifiedSampler(["a"] * 5 + ["b"] * 2, np.random.default_rng(0), proportional=True)
    assert [("a" if i < 5 else "b") for i in uneven.take(7)].count("b") == 2  # sizes that do not divide


class ParamsRecordingEngine(PrefixCachingHFEngine):
    """The runner's own engine class, keeping the sampling parameters of each generate call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params: list[SamplingParams] = []

    def generate(self, prefixes, params, max_new_tokens=None):
        self.params.append(params)
        return super().generate(prefixes, params, max_new_tokens)


def test_turns_after_the_trained_ones_run_at_the_execution_temperature(tiny_model_dir, world, retriever):
    """``rollouts(execution_temperature=0)`` with ``trained_turns=1``: the first turn is sampled at the
    temperature, every later one greedily (each of its tokens the model's argmax after the prefix)."""
    import torch

    config = make_config(tiny_model_dir, world.train, retriever, temperature=1.0, execution_temperature=0.0)
    with pytest.raises(ValueError, match="needs training"):
        config.validate_rollouts()
    config.training(trained_turns=1)
    runner = LLMEnvRunner(config=config)
    runner.engine = ParamsRecordingEngine(runner.module.model, runner.tokenizer)
    rollouts = runner.sample()
    temperatures = [params.temperature for params in runner.engine.params]
    assert len(temperatures) >= 2 and temperatures[0] == 1.0 and set(temperatures[1:]) == {0.0}
    model = runner.module.model.eval()
    later = first_not_greedy = 0
    for rollout in rollouts:
        with torch.no_grad():
            best = model(torch.as_tensor(rollout.token_ids)[None]).logits[0].argmax(-1).numpy()
        (start, end), *rest = rollout.turn_spans
        first_not_greedy += int((rollout.token_ids[start:end] != best[start - 1 : end - 1]).any())
        for start, end in rest:
            np.testing.assert_array_equal(rollout.token_ids[start:end], best[start - 1 : end - 1])
            later += end - start
    assert later > 0 and first_not_greedy > 0  # the first turns were sampled, not greedy


def test_a_bf16_engine_on_the_cpu_generates_with_the_learners_weights_cast(
    tiny_model_dir, world, retriever, caplog
):
    """``rollouts(engine_dtype="bfloat16")``: the runner's copy (the engine's weights) is bf16 on the CPU too,
    a learner's fp32 state loads into it cast, and episodes still come out token-exact and finite. On a CPU
    that only emulates bf16 the runner says so."""
    import torch

    from rllib_search.llm.models import cpu_has_native_bf16

    greedy = {"temperature": 0.0}
    fp32 = LLMEnvRunner(config=make_config(tiny_model_dir, world.train, retriever, **greedy))
    with caplog.at_level(logging.WARNING, logger="rllib_search.algos.rollouts.env_runner"):
        bf16 = LLMEnvRunner(
            config=make_config(tiny_model_dir, world.train, retriever, **greedy, engine_dtype="bfloat16")
        )
    assert ("PyTorch emulates bf16" in caplog.text) == (not cpu_has_native_bf16())
    assert {p.dtype for p in fp32.module.model.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.module.model.parameters()} == {torch.bfloat16}
    rng = np.random.default_rng(0)
    learner_state = {  # fp32, as a learner's weights travel
        k: (v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in fp32.module.get_state().items()
    }
    bf16.set_state({"rl_module": {"default_policy": learner_state}, "weights_version": 3})
    for name, parameter in bf16.module.model.named_parameters():
        expected = torch.as_tensor(learner_state[f"model.{name}"]).to(torch.bfloat16)
        assert torch.equal(parameter.detach(), expected), name
    episodes = bf16.sample()
    assert episodes and all(e.weights_version == 3 for e in episodes)
    for episode in episodes:
        assert np.isfinite(episode.logprobs[episode.loss_mask > 0]).all()


def test_an_unknown_engine_dtype_is_refused():
    with pytest.raises(ValueError, match="engine_dtype must be one of"):
        SearchConfig().rollouts(engine_dtype="int8").validate_rollouts()
