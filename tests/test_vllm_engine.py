"""VLLMEngine on a GPU (skipped without CUDA and vllm): the contract HFEngine keeps, checked the same way."""

from __future__ import annotations

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("VLLMEngine needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from rllib_search.llm.engines import SamplingParams, VLLMEngine
from rllib_search.llm.engines.base import decode
from rllib_search.llm.models import engine_weights, load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm
from tests.test_hf_engine import STOPS, TARGET, chat_prompt, forward_logprobs, memorise

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def trained_path(tmp_path_factory):
    """A tiny model trained to answer the chat prompt with TARGET then EOS, saved for vLLM to load."""
    path = build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"))
    model, tokenizer = load_causal_lm(str(path), device="cpu", dtype=torch.float32)
    memorise(model, chat_prompt(tokenizer), [*tokenizer.encode(TARGET), tokenizer.eos_token_id])
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engine(trained_path):
    return VLLMEngine(str(trained_path), dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)


def test_stop_strings_eos_and_limits(engine):
    tokenizer = engine.tokenizer
    prompt = chat_prompt(tokenizer)
    target = [*tokenizer.encode(TARGET), tokenizer.eos_token_id]
    greedy = SamplingParams(temperature=0, max_new_tokens=40, stop=STOPS)
    stopped, cut = engine.generate([prompt, prompt], greedy, max_new_tokens=[40, 3])
    assert stopped.finish_reason == "stop" and decode(tokenizer, stopped.token_ids).endswith("</search>")
    assert stopped.token_ids == target[: len(stopped.token_ids)]
    assert cut.finish_reason == "length" and cut.token_ids == target[:3]
    ended = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=40))[0]
    assert ended.finish_reason == "eos" and ended.token_ids == target


def test_logprobs_match_a_forward_pass(engine, trained_path):
    model, tokenizer = load_causal_lm(str(trained_path), device="cpu", dtype=torch.float32)
    prefix = tokenizer.encode("Who founded the company?")
    for params in (
        SamplingParams(temperature=0, max_new_tokens=8),
        SamplingParams(temperature=0.7, max_new_tokens=8, seed=0),
    ):
        segment = engine.generate([prefix], params)[0]
        assert len(segment.logprobs) == len(segment.token_ids) and all(
            math.isfinite(lp) for lp in segment.logprobs
        )
        expected = forward_logprobs(model, prefix, segment.token_ids, params.temperature or 1.0)
        torch.testing.assert_close(segment.logprobs, expected, atol=1e-2, rtol=0)


def test_load_weights_sleep_and_wake_up(engine, trained_path, tmp_path):
    other_path = build_tiny_causal_lm(tmp_path / "other", tokenizer_dir_or_none=trained_path, seed=1)
    other, _ = load_causal_lm(str(other_path), device="cpu", dtype=torch.float32)
    prefix = [chat_prompt(engine.tokenizer)]
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    before = engine.generate(prefix, greedy)[0]
    version = engine.weights_version
    engine.load_weights(other.state_dict())
    assert engine.weights_version == version + 1
    assert engine.generate(prefix, greedy)[0].token_ids != before.token_ids
    # The colocated order: sleep, the learner trains, the new weights (one flat buffer of the plain
    # model's parameter names) wake the weights only, then wake_up brings the KV cache back. Level 2 (the
    # default) dropped the weights: nothing wakes or generates before the new ones are in.
    trained, _ = load_causal_lm(str(trained_path), device="cpu", dtype=torch.float32)
    engine.sleep()
    with pytest.raises(RuntimeError, match="level 2"):
        engine.wake_up()
    engine.load_weights(engine_weights(trained, "float32"))
    assert engine.asleep and not engine.weights_asleep
    engine.wake_up()
    assert engine.generate(prefix, greedy)[0].token_ids == before.token_ids
