"""HFEngine on real tiny models (and SmolLM2): padding, stop strings, limits, log-probs, weight sync."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_search.llm.engines import HFEngine, SamplingParams, truncate_at_stop
from rllib_search.llm.engines.base import decode
from rllib_search.llm.models import apply_lora, load_causal_lm, lora_state_dict, merged_state_dict
from rllib_search.llm.tiny import build_tiny_causal_lm

STOPS = ("</search>", "</answer>")
TARGET = "<search> query </search> tail"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"))


@pytest.fixture
def engine(tiny_path):
    return HFEngine(*load_causal_lm(str(tiny_path)))


def chat_prompt(tokenizer, question: str = "Who founded the company?") -> list[int]:
    messages = [{"role": "user", "content": question}]
    return tokenizer.encode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )


def memorise(model, prompt: list[int], target: list[int], steps: int = 100) -> None:
    """Train ``model`` until greedy decoding continues ``prompt`` with ``target`` (100 Adam steps suffice
    for the default tiny model)."""
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids, labels=labels).loss.backward()
        optimizer.step()


@pytest.fixture(scope="module")
def trained(tiny_path):
    """A tiny model trained to answer the chat prompt with TARGET then EOS (greedy decoding follows it)."""
    model, tokenizer = load_causal_lm(str(tiny_path))
    prompt, target = chat_prompt(tokenizer), [*tokenizer.encode(TARGET), tokenizer.eos_token_id]
    memorise(model, prompt, target)
    engine = HFEngine(model, tokenizer)
    assert engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=40))[0].token_ids == target
    return engine, prompt, target


def forward_logprobs(model, prefix: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """Log-probabilities of ``tokens`` after ``prefix`` by one forward pass of the unpadded sequence."""
    ids = torch.tensor([prefix + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prefix) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


# --- truncate_at_stop: the shared rule -----------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_truncate_at_stop_keeps_the_shortest_prefix_holding_a_stop(tiny_tokenizer, data):
    vocab = st.integers(0, len(tiny_tokenizer) - 1)
    before, after = data.draw(st.lists(vocab, max_size=30)), data.draw(st.lists(vocab, max_size=30))
    stop = data.draw(st.sampled_from(["</search>", "</answer>", "<|end_of_query|>"]))
    ids = before + tiny_tokenizer.encode(stop) + after
    kept, found = truncate_at_stop(ids, tiny_tokenizer, ["</search>", "</answer>", "<|end_of_query|>"])
    assert ids[: len(kept)] == kept
    assert found is not None and found in decode(tiny_tokenizer, kept)
    assert not any(
        s in decode(tiny_tokenizer, kept[:-1]) for s in ("</search>", "</answer>", "<|end_of_query|>")
    )
    assert len(kept) <= len(before) + len(tiny_tokenizer.encode(stop))


def test_truncate_at_stop_without_a_stop_keeps_everything(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<search> query </search>")
    assert truncate_at_stop(ids, tiny_tokenizer, ["</answer>"]) == (ids, None)
    assert truncate_at_stop(ids, tiny_tokenizer, []) == (ids, None)


# --- generation -----------------------------------------------------------------------------------------
def test_left_padding_does_not_change_a_row(engine):
    tokenizer = engine.tokenizer
    short = tokenizer.encode("Who founded the company?")
    long = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 12)
    assert len(long) > 5 * len(short)
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    alone = engine.generate([short], greedy)[0]
    in_batch = engine.generate([long, short], greedy)[1]
    assert in_batch.token_ids == alone.token_ids and len(alone.token_ids) == 24
    torch.testing.assert_close(in_batch.logprobs, alone.logprobs, atol=1e-4, rtol=0)


def test_generation_stops_at_the_stop_string(trained):
    engine, prompt, target = trained
    segment = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=40, stop=STOPS))[0]
    assert segment.finish_reason == "stop" and segment.stop_string == "</search>"
    text = decode(engine.tokenizer, segment.token_ids)
    assert text.endswith("</search>") and "tail" not in text
    assert segment.token_ids == target[: len(segment.token_ids)]
    assert len(segment.logprobs) == len(segment.token_ids)


def test_eos_ends_a_segment_and_is_kept(trained):
    engine, prompt, target = trained
    segment = engine.generate(
        [prompt], SamplingParams(temperature=0, max_new_tokens=40, stop=("</answer>",))
    )[0]
    assert segment.finish_reason == "eos" and segment.stop_string is None
    assert segment.token_ids == target and segment.token_ids[-1] == engine.tokenizer.eos_token_id


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["hf", "prefix_cache"])
def test_ignore_eos_generates_through_eos_to_the_row_limit(trained, prefix_cache):
    from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine

    engine, prompt, target = trained
    if prefix_cache:
        engine = PrefixCachingHFEngine(engine.model, engine.tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=40, stop=("</answer>",), ignore_eos=True)
    segment = engine.generate([prompt], params, max_new_tokens=[len(target) + 5])[0]
    assert segment.finish_reason == "length" and len(segment.token_ids) == len(target) + 5
    assert segment.token_ids[: len(target)] == target  # the EOS is in there, and generation went on


def test_rows_stop_independently(trained):
    engine, prompt, target = trained
    other = engine.tokenizer.encode("The quick brown fox")
    params = SamplingParams(temperature=0, max_new_tokens=40, stop=STOPS)
    stopped, running = engine.generate([prompt, other], params, max_new_tokens=[40, 30])
    assert stopped.finish_reason == "stop" and stopped.token_ids == target[: len(stopped.token_ids)]
    assert running.finish_reason in ("length", "eos")


def test_a_stop_string_in_the_prefix_does_not_stop_generation(engine):
    prefix = engine.tokenizer.encode("<search> query </search> <information> doc </information>")
    segment = engine.generate([prefix], SamplingParams(temperature=0, max_new_tokens=8, stop=STOPS))[0]
    assert len(segment.token_ids) > 0


def test_per_row_token_limits(engine):
    prefixes = [engine.tokenizer.encode("Who founded"), engine.tokenizer.encode("Where was he born?")]
    # Seeded, and EOS ignored: this test is about the limits, not about which token the model draws.
    params = SamplingParams(max_new_tokens=50, seed=0, ignore_eos=True)
    segments = engine.generate(prefixes, params, max_new_tokens=[3, 7])
    assert [len(s.token_ids) for s in segments] == [3, 7]
    assert [s.finish_reason for s in segments] == ["length", "length"]
    empty = engine.generate(prefixes, params, max_new_tokens=[0, 2])
    assert empty[0].token_ids == [] and empty[0].finish_reason == "length" and len(empty[1].token_ids) == 2
    with pytest.raises(ValueError):
        engine.generate(prefixes, SamplingParams(), max_new_tokens=[1])


def test_greedy_logprobs_match_a_forward_pass(engine):
    prefixes = [engine.tokenizer.encode("Who founded the company?"), engine.tokenizer.encode("Velmora")]
    segments = engine.generate(prefixes, SamplingParams(temperature=0, max_new_tokens=16))
    for prefix, segment in zip(prefixes, segments):
        assert len(segment.logprobs) == len(segment.token_ids) == 16
        assert all(math.isfinite(lp) and lp <= 0 for lp in segment.logprobs)
        expected = forward_logprobs(engine.model, prefix, segment.token_ids)
        torch.testing.assert_close(segment.logprobs, expected, atol=1e-4, rtol=0)


def test_sampled_logprobs_are_under_the_tempered_nucleus(engine):
    prefix = engine.tokenizer.encode("Who founded the company?")
    full = engine.generate([prefix], SamplingParams(temperature=0.7, max_new_tokens=16, seed=1))[0]
    torch.testing.assert_close(
        full.logprobs, forward_logprobs(engine.model, prefix, full.token_ids, 0.7), atol=1e-4, rtol=0
    )
    nucleus = engine.generate(
        [prefix], SamplingParams(temperature=0.7, top_p=0.3, max_new_tokens=16, seed=1)
    )[0]
    unrestricted = forward_logprobs(engine.model, prefix, nucleus.token_ids, 0.7)
    assert all(lp <= 0 and lp >= base - 1e-5 for lp, base in zip(nucleus.logprobs, unrestricted))
    assert sum(nucleus.logprobs) > sum(unrestricted) + 1e-3  # renormalised over the nucleus


def test_seeded_sampling_is_reproducible(engine):
    prefixes = [engine.tokenizer.encode("Who founded"), engine.tokenizer.encode("The quick brown fox")]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=7)
    first, second = engine.generate(prefixes, params), engine.generate(prefixes, params)
    assert first == second
    other = engine.generate(prefixes, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=8))
    assert [s.token_ids for s in other] != [s.token_ids for s in first]


def test_batches_split_by_max_batch_size_give_the_same_rows(tiny_path):
    model, tokenizer = load_causal_lm(str(tiny_path))
    prefixes = [tokenizer.encode(text) for text in ("Who founded", "Velmora is a city. " * 4, "Where", "doc")]
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    whole = HFEngine(model, tokenizer).generate(prefixes, greedy)
    split = HFEngine(model, tokenizer, max_batch_size=2).generate(prefixes, greedy)
    assert [s.token_ids for s in split] == [s.token_ids for s in whole]


def test_generation_leaves_the_training_mode_as_it_was(engine):
    engine.model.train()
    engine.generate([engine.tokenizer.encode("Who")], SamplingParams(max_new_tokens=2, seed=0))
    assert engine.model.training


# --- weights --------------------------------------------------------------------------------------------
def test_load_weights_changes_outputs_and_bumps_the_version(tmp_path, tiny_path, engine):
    other_path = build_tiny_causal_lm(tmp_path / "other", tokenizer_dir_or_none=tiny_path, seed=1)
    other, _ = load_causal_lm(str(other_path))
    prefix = [engine.tokenizer.encode("Who founded the company?")]
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    before = engine.generate(prefix, greedy)[0]
    assert engine.weights_version == 0
    engine.load_weights(other.state_dict())
    assert engine.weights_version == 1
    after = engine.generate(prefix, greedy)[0]
    assert after.token_ids != before.token_ids
    assert after == HFEngine(other, engine.tokenizer).generate(prefix, greedy)[0]
    with pytest.raises(KeyError):
        engine.load_weights({"not.a.weight": torch.zeros(1)})


def test_lora_weights_sync_into_a_peft_engine_and_merged_into_a_plain_one(tiny_path):
    learner, tokenizer = load_causal_lm(str(tiny_path))
    learner = apply_lora(learner, r=4)
    with torch.no_grad():
        for name, param in learner.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_engine = HFEngine(apply_lora(load_causal_lm(str(tiny_path))[0], r=4), tokenizer)
    plain_engine = HFEngine(load_causal_lm(str(tiny_path))[0], tokenizer)
    prefix = [tokenizer.encode("Who founded the company?")]
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    before = peft_engine.generate(prefix, greedy)[0]
    peft_engine.load_weights(lora_state_dict(learner))
    plain_engine.load_weights(merged_state_dict(learner))
    synced = peft_engine.generate(prefix, greedy)[0]
    assert synced.token_ids != before.token_ids
    merged = plain_engine.generate(prefix, greedy)[0]
    assert merged.token_ids == synced.token_ids
    torch.testing.assert_close(merged.logprobs, synced.logprobs, atol=1e-4, rtol=0)


# --- the bundled model ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_smoke():
    engine = HFEngine(*load_causal_lm("smollm2-135m-instruct"))
    prefixes = [
        chat_prompt(engine.tokenizer, q) for q in ("Who wrote Hamlet?", "What is the capital of France?")
    ]
    segments = engine.generate(
        prefixes, SamplingParams(temperature=1.0, max_new_tokens=16, stop=STOPS, seed=0)
    )
    for segment in segments:
        assert 0 < len(segment.token_ids) <= 16 and len(segment.logprobs) == len(segment.token_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in segment.logprobs)
        # The finish reason is the one the tokens show: a stop string, else EOS as the last token, else
        # the row's limit.
        text = decode(engine.tokenizer, segment.token_ids)
        stops = [stop for stop in STOPS if stop in text]
        stop = min(stops, key=text.find) if stops else None
        at_eos = segment.token_ids[-1] in engine.eos_token_ids
        expected = "stop" if stop else "eos" if at_eos else "length"
        assert (segment.finish_reason, segment.stop_string) == (expected, stop)
        assert expected != "length" or len(segment.token_ids) == 16
