"""The evaluation cache: keyed on the weights' bytes and the settings, reused only when both match, and a
damaged file is recomputed, never trusted. Real tiny models saved and loaded by path, real greedy decoding."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.recipes.tiny_cpu.answer_cache import EvaluationCache, weights_digest

SETTINGS = {"questions": [["q1", "Where was Tarquin Oskaley born?"]], "max_turn_tokens": 8}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cached_eval_model")
    return build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok"))


def greedy_ids(model_dir) -> dict[str, list[int]]:
    """What the cache stands in for: greedy tokens of the saved weights on a fixed prompt."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer(SETTINGS["questions"][0][1], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return {"ids": out[0].tolist()}


def test_a_stored_evaluation_is_what_evaluating_again_gives(model_dir, tmp_path):
    cache = EvaluationCache(tmp_path / "evaluations")
    key = cache.key(model_dir, SETTINGS)
    calls = []

    def compute():
        calls.append(1)
        return greedy_ids(model_dir)

    first, cached_first = cache.get_or_compute(key, compute)
    second, cached_second = cache.get_or_compute(key, compute)
    assert (cached_first, cached_second, len(calls)) == (False, True, 1)
    assert second == first == greedy_ids(model_dir)


def test_the_key_changes_with_the_weights_and_the_settings(model_dir, tmp_path):
    key = EvaluationCache.key(model_dir, SETTINGS)
    assert EvaluationCache.key(model_dir, dict(SETTINGS)) == key
    assert EvaluationCache.key(model_dir, {**SETTINGS, "max_turn_tokens": 9}) != key

    changed = tmp_path / "changed"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    model.save_pretrained(changed)
    assert weights_digest(changed) != weights_digest(model_dir)
    assert EvaluationCache.key(changed, SETTINGS) != key


def test_a_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no weight files"):
        weights_digest(tmp_path)


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"key": "another", "result": {"ids": [1]}}), json.dumps({"key": None})],
    ids=["unreadable", "another key", "no result"],
)
def test_a_damaged_file_is_reported_and_recomputed(model_dir, tmp_path, caplog, content):
    cache = EvaluationCache(tmp_path)
    key = cache.key(model_dir, SETTINGS)
    cache.path(key).write_text(content)
    with caplog.at_level(logging.WARNING, logger="rllib_search.recipes.tiny_cpu.answer_cache"):
        result, cached = cache.get_or_compute(key, lambda: {"ids": [7]})
    assert (result, cached) == ({"ids": [7]}, False)
    assert str(cache.path(key)) in caplog.text
    assert json.loads(cache.path(key).read_text()) == {"key": key, "result": {"ids": [7]}}
