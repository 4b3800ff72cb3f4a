"""PrefixCachingHFEngine: the same segments and log-probs as HFEngine, turn after turn, while feeding only
the tokens its kept caches do not cover."""

from __future__ import annotations

import pytest
import torch

from rllib_search.llm.engines import SamplingParams
from rllib_search.llm.engines.hf import HFEngine
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm, teach_to_emit

STOPS = ("</search>", "</answer>")
QUESTIONS = [
    "Who founded Quellon Works?",
    "Where was Tarquin Oskaley born?",
    "What is the capital of Dravenia?",
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Both engines over one tiny model taught to search (so stop strings fire), sharing its weights."""
    root = tmp_path_factory.mktemp("prefix_cache")
    path = teach_to_emit(
        build_tiny_causal_lm(root / "base"),
        root / "taught",
        QUESTIONS,
        "<think> look </think>\n<search> lead singer </search> and more",
    )
    model, tokenizer = load_causal_lm(str(path))
    return HFEngine(model, tokenizer), PrefixCachingHFEngine(model, tokenizer), tokenizer


def chat(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_same_segments_as_hf_engine_over_three_turns(engines, temperature):
    plain, cached, tokenizer = engines
    cached.reset_cache()
    prefixes = [chat(tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(temperature=temperature, max_new_tokens=48, stop=STOPS, seed=3)
    observations = [
        "\n\n<information>Doc 1(Title: A) short</information>\n\n",
        "\nMy action is not correct.\n",
        "\n\n<information>Doc 1(Title: B) a much longer passage about many things</information>\n\n",
    ]
    stopped = 0
    for turn in range(3):
        limits = [48, 7, 13] if turn == 1 else None
        if temperature == 0.0:
            expected = plain.generate(prefixes, params, limits)
        got = cached.generate(prefixes, params, limits)
        for row, segment in enumerate(got):
            assert len(segment.token_ids) == len(segment.logprobs) > 0
            if temperature == 0.0:  # greedy: exactly HFEngine's output
                assert segment.token_ids == expected[row].token_ids
                assert segment.finish_reason == expected[row].finish_reason
                torch.testing.assert_close(
                    torch.tensor(segment.logprobs), torch.tensor(expected[row].logprobs), atol=1e-4, rtol=1e-4
                )
            stopped += segment.finish_reason == "stop"
        prefixes = [
            p + s.token_ids + tokenizer.encode(observations[(row + turn) % 3])
            for row, (p, s) in enumerate(zip(prefixes, got))
        ]
        if turn > 0:
            assert cached.cached_tokens > 0
    assert stopped > 0


def test_only_uncached_tokens_are_fed_and_new_weights_drop_the_caches(engines):
    _, cached, tokenizer = engines
    cached.reset_cache()
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    prefix = chat(tokenizer, QUESTIONS[0])
    first = cached.generate([prefix], params)[0]
    fed_before, cached_before = cached.fed_tokens, cached.cached_tokens
    observation = tokenizer.encode(" and then some observation")
    cached.generate([prefix + first.token_ids + observation], params)
    # Reused: the prefix and all generated tokens but the last; fed: the last token and the observation.
    assert cached.cached_tokens - cached_before == len(prefix) + len(first.token_ids) - 1
    assert cached.fed_tokens - fed_before <= 1 + len(observation) + params.max_new_tokens
    cached.load_weights({})  # nothing changed, but any weight load drops the caches
    cached_before = cached.cached_tokens
    cached.generate([prefix + first.token_ids + observation], params)
    assert cached.cached_tokens == cached_before


def test_append_in_place_layer_matches_concatenation_through_reallocation_and_compaction():
    """Appending in place (with spare room too small, so the buffers grow twice) gives the same keys and
    values as transformers' concatenating layer, before and after dropping rows from the batch."""
    from transformers.cache_utils import DynamicLayer

    from rllib_search.llm.engines.hf_prefix_cache import _AppendInPlaceLayer

    generator = torch.Generator().manual_seed(0)
    concatenating, in_place = DynamicLayer(), _AppendInPlaceLayer(spare=2)
    batch = 4
    for step, length in enumerate([5, 1, 1, 1, 3, 1]):
        keys = torch.randn(batch, 2, length, 8, generator=generator)
        values = torch.randn(batch, 2, length, 8, generator=generator)
        want = concatenating.update(keys, values)
        got = in_place.update(keys, values)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        if step == 2:
            kept = torch.tensor([0, 2, 3])
            concatenating.batch_select_indices(kept)
            in_place.batch_select_indices(kept)
            batch = len(kept)
        assert in_place.get_seq_length() == concatenating.get_seq_length()


def test_stop_check_skips_only_tokens_that_cannot_end_a_stop_string(engines):
    _, cached, tokenizer = engines
    may_end = cached._stop_enders_for(STOPS)
    assert may_end.shape == (len(tokenizer),)
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert bool(may_end[token_id]) == (">" in text or "\ufffd" in text)
    assert may_end.any() and not may_end.all()


def forward_logprobs(model, prefix: list[int], tokens: list[int], temperature: float) -> list[float]:
    """Log-probabilities of ``tokens`` after ``prefix`` from one forward pass of the unpadded sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix + tokens])).logits[0, len(prefix) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_grouped_samples_uneven_rows_and_split_prefills_decode_each_row_as_alone(engines, temperature):
    """Eight rows, G=4 samples of two prompts, with uneven limits and observations from 1 to ~40 tokens:
    the shared prompts are prefilled once, new tokens go through several prefill passes (a small token
    budget splits them further), finished rows wait in the batch and leave it in groups with the leading
    padding. Every row's tokens and log-probs are those of its own sequence: HFEngine's under greedy
    decoding, a forward pass's of the unpadded sequence under sampling."""
    plain, cached, tokenizer = engines
    cached.reset_cache()
    cached.prefill_tokens = 96
    prefixes = [chat(tokenizer, QUESTIONS[0])] * 4 + [chat(tokenizer, QUESTIONS[2])] * 4
    params = SamplingParams(temperature=temperature, max_new_tokens=40, stop=STOPS, seed=5)
    observations = [
        "",
        " no",
        "\n\n<information>Doc 1(Title: B) a much longer passage about things</information>",
    ]
    try:
        for turn in range(3):
            limits = [(3 * row + 5 * turn) % 17 + 2 for row in range(len(prefixes))]
            got = cached.generate(prefixes, params, limits)
            if temperature == 0.0:
                expected = plain.generate(prefixes, params, limits)
                assert [s.token_ids for s in got] == [s.token_ids for s in expected]
                assert [s.finish_reason for s in got] == [s.finish_reason for s in expected]
            for prefix, segment in zip(prefixes, got):
                assert 0 < len(segment.token_ids) == len(segment.logprobs)
                torch.testing.assert_close(
                    segment.logprobs,
                    forward_logprobs(cached.model, prefix, segment.token_ids, temperature),
                    atol=1e-4,
                    rtol=0,
                )
            prefixes = [
                p + s.token_ids + tokenizer.encode(observations[(row + turn) % 3])
                if (row + turn) % 3
                else p + s.token_ids
                for row, (p, s) in enumerate(zip(prefixes, got))
            ]
    finally:
        cached.prefill_tokens = PrefixCachingHFEngine(cached.model, tokenizer).prefill_tokens


def test_a_prompt_shared_by_its_samples_is_fed_once(engines):
    _, cached, tokenizer = engines
    cached.reset_cache()
    prompt = chat(tokenizer, QUESTIONS[1])
    fed_before = cached.fed_tokens
    segments = cached.generate([prompt] * 4, SamplingParams(temperature=1.0, max_new_tokens=1, seed=0))
    assert all(len(s.token_ids) == 1 for s in segments)
    assert cached.fed_tokens - fed_before == len(prompt)  # one prefill; the token came from its logits


def test_a_call_s_seconds_split_into_prefill_decode_and_the_rest(engines):
    _, cached, tokenizer = engines
    cached.reset_cache()
    before = dict(cached.seconds)
    cached.generate(
        [chat(tokenizer, QUESTIONS[0])] * 2, SamplingParams(temperature=1.0, max_new_tokens=3, seed=0)
    )
    spent = {phase: cached.seconds[phase] - before[phase] for phase in before}
    # One prefill pass, then two decode steps (the first token comes from the prefill's logits).
    assert spent["prefill"] > 0 and spent["decode"] > 0
    assert spent["call"] >= spent["prefill"] + spent["decode"]


def test_prefill_passes_group_similar_new_token_counts(engines):
    _, cached, _ = engines
    budget = cached.prefill_tokens
    try:
        # Longest first; a new pass when a prefix has less than half the pass's width to feed.
        assert cached._prefill_passes([1, 200, 31, 199, 1, 1]) == [[1, 3], [2], [0, 4, 5]]
        cached.prefill_tokens = 400  # at most two 200-token rows a pass
        assert cached._prefill_passes([200, 200, 200, 150]) == [[0, 1], [2, 3]]
    finally:
        cached.prefill_tokens = budget


@pytest.mark.parametrize("window", [64, 16], ids=["calls-fit", "calls-overflow"])
def test_sliding_window_models_give_hf_engines_outputs(tmp_path, window):
    """A Gemma-3 with a sliding-window layer runs on this engine (kept caches, prefill passes, decode) and
    gives HFEngine's greedy output, also once prefixes outgrow the window (16 tokens) and prefill passes
    mix rows with different numbers of new tokens."""
    from rllib_search.llm.tiny import build_tiny_tokenizer
    from tests.helpers import build_tiny_sliding_window_lm

    path = build_tiny_sliding_window_lm(tmp_path / "gemma", build_tiny_tokenizer(tmp_path / "tok"), window)
    model, tokenizer = load_causal_lm(str(path))
    assert PrefixCachingHFEngine.supports(model)
    plain, cached = HFEngine(model, tokenizer), PrefixCachingHFEngine(model, tokenizer, min_shared_tokens=4)
    start = tokenizer.encode("Answer the question below in a few words.")
    prefixes = [start + tokenizer.encode(q) for q in QUESTIONS]  # a shared start, then 10 to 20 tokens
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop=STOPS)
    limits = [12, 5, 9]
    observations = [" then", " and after that the answer is", " so"]  # new-token counts that differ
    for _turn in range(3):
        expected = plain.generate(prefixes, params, limits)
        fed = cached.fed_tokens
        got = cached.generate(prefixes, params, limits)
        assert [s.token_ids for s in got] == [s.token_ids for s in expected]
        for segment, reference in zip(got, expected):
            torch.testing.assert_close(segment.logprobs, reference.logprobs, atol=1e-4, rtol=1e-4)
        assert cached.fed_tokens > fed
        prefixes = [p + s.token_ids + tokenizer.encode(o) for p, s, o in zip(prefixes, got, observations)]
    assert max(map(len, prefixes)) > 2 * window or window == 64
    assert cached.cached_tokens > 0  # later turns reused the earlier turns' caches


def test_a_prefill_pass_feeds_kept_tokens_again_instead_of_padding(engines):
    """Rows with fewer new tokens than their pass's widest feed their last kept tokens again, so no padding
    sits between a row's cache and its new tokens (a sliding-window mask counts columns)."""
    _, cached, _ = engines
    layers = [(torch.zeros(1, 2, 6, 4), torch.ones(1, 2, 6, 4))]
    key = tuple(range(6))
    assert cached._without_last((key, layers), 0) == (key, layers)
    shorter, shorter_layers = cached._without_last((key, layers), 2)
    assert shorter == key[:4] and shorter_layers[0][0].shape == (1, 2, 4, 4)
    assert cached._without_last((key, layers), 6) == ((), [])
    assert cached._without_last((key, layers), 9) == ((), [])


def test_kept_caches_find_the_longest_proper_prefix():
    from rllib_search.llm.engines.hf_prefix_cache import _KeptCaches

    kept = _KeptCaches()
    kept.replace({(1, 2, 3): ["a"], (1, 2, 3, 4, 5): ["b"], (1, 2, 9, 4, 5, 6): ["c"], (7,): ["d"]})
    assert kept.longest_prefix_of([1, 2, 3, 4, 5, 6, 7]) == ((1, 2, 3, 4, 5), ["b"])
    assert kept.longest_prefix_of([1, 2, 3, 4]) == ((1, 2, 3), ["a"])
    assert kept.longest_prefix_of([1, 2, 3, 4, 5]) == ((1, 2, 3), ["a"])  # proper prefixes only
    assert kept.longest_prefix_of([1, 2, 9, 4, 5, 7]) == ((), [])  # same length as "c", not its tokens
    assert kept.longest_prefix_of([7]) == ((), [])
    assert kept.longest_prefix_of([8, 1, 2, 3, 4]) == ((), [])
    kept.replace({})
    assert kept.longest_prefix_of([1, 2, 3, 4, 5, 6]) == ((), [])


def test_kept_caches_never_return_a_colliding_sequence():
    """With every weight 0, every prefix hashes alike: a hit must still be checked token by token."""
    from rllib_search.llm.engines.hf_prefix_cache import _KeptCaches

    kept = _KeptCaches()
    kept.prefix_hashes(list(range(64)))  # grow the weights, then zero them
    kept._weights[:] = 0
    kept.replace({(5, 6, 7): ["x"]})
    assert kept.longest_prefix_of([5, 6, 8, 9]) == ((), [])
    assert kept.longest_prefix_of([1, 2]) == ((), [])
    assert kept.longest_prefix_of([5, 6, 7, 9]) == ((5, 6, 7), ["x"])


def test_batch_cache_pads_with_zeros_even_over_dirty_memory(engines, monkeypatch):
    """The batch cache's buffers are allocated uninitialised: the left padding must still read 0 (attention
    masks it but multiplies it by 0, and 0 x NaN is NaN); each row's keys and values sit right-aligned."""
    _, cached, _ = engines
    generator = torch.Generator().manual_seed(0)
    rows = [
        [(torch.randn(1, 2, n, 32, generator=generator), torch.randn(1, 2, n, 32, generator=generator))] * 2
        for n in (5, 2)
    ]
    monkeypatch.setattr(torch, "empty", lambda *a, **k: torch.full(a[0], float("nan"), **k))
    monkeypatch.setattr(torch, "empty_like", lambda t: torch.full_like(t, float("nan")))
    cache = cached._batch_cache(rows, [5, 2], past_len=5, room=3)
    for index, layer in enumerate(cache.layers):
        assert layer.keys.shape == (2, 2, 5, 32) and not layer.keys.isnan().any()
        assert not layer.values.isnan().any()
        torch.testing.assert_close(layer.keys[0:1], rows[0][index][0], rtol=0, atol=0)
        torch.testing.assert_close(layer.values[1:2, :, 3:], rows[1][index][1], rtol=0, atol=0)
        assert (layer.keys[1, :, :3] == 0).all() and (layer.values[1, :, :3] == 0).all()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_template_start_shared_by_different_prompts_is_fed_once(engines, temperature):
    """Different questions after one long instruction: the instruction is prefilled once for all rows, and
    each row still decodes as alone (HFEngine's greedy output, a forward pass's log-probs)."""
    plain, cached, tokenizer = engines
    cached.reset_cache()
    instruction = "Answer the given question. Reason inside <think> and </think> first, then search. " * 2
    prefixes = [chat(tokenizer, instruction + q) for q in QUESTIONS]
    shared = next(n for n in range(len(prefixes[0])) if len({tuple(p[: n + 1]) for p in prefixes}) > 1)
    assert shared >= cached.min_shared_tokens
    params = SamplingParams(temperature=temperature, max_new_tokens=12, stop=STOPS, seed=2)
    fed_before, cached_before = cached.fed_tokens, cached.cached_tokens
    got = cached.generate(prefixes, params, [1, 1, 1])
    # The start once, then one pass as wide as the longest rest: shorter rows feed shared tokens again
    # where they would have padding.
    width = max(len(p) - shared for p in prefixes)
    assert cached.fed_tokens - fed_before == shared + len(prefixes) * width
    # Reused: what each row kept of the start, but for the row that kept most (it was computed for it).
    kept = [len(p) - width for p in prefixes]
    assert cached.cached_tokens - cached_before == sum(kept) - max(kept)
    got = cached.generate(prefixes, params)
    if temperature == 0.0:
        assert [s.token_ids for s in got] == [s.token_ids for s in plain.generate(prefixes, params)]
    for prefix, segment in zip(prefixes, got):
        torch.testing.assert_close(
            segment.logprobs,
            forward_logprobs(cached.model, prefix, segment.token_ids, temperature),
            atol=1e-4,
            rtol=0,
        )


def test_a_consumed_batch_cache_releases_each_rows_layers_and_holds_the_same_values(engines):
    """Decoding builds its batch cache from the prefill's rows, releasing each layer of them once copied:
    the rows and the batch are never both held whole; rows with one prefix share a list."""
    _, cached, _ = engines
    generator = torch.Generator().manual_seed(0)
    shapes = [(1, 2, n, 32) for n in (5, 2)]
    layers = [
        [(torch.randn(s, generator=generator), torch.randn(s, generator=generator)) for _ in range(2)]
        for s in shapes
    ]
    first, second = list(layers[0]), list(layers[1])
    rows = [first, first, second]  # the first two rows share their list, as a prompt's samples do
    kept = cached._batch_cache([list(r) for r in rows], [5, 5, 2], past_len=5, room=3)
    consumed = cached._batch_cache(rows, [5, 5, 2], past_len=5, room=3, consume=True)
    assert all(entry is None for row in rows for entry in row)
    for a, b in zip(kept.layers, consumed.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
