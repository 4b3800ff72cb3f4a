"""``benchmarks/exact_products_bench.py`` on a tiny model: both engines generate, the comparison it reports
is the one it claims, and it times decoding steps only (times are not checked: they belong to the
benchmark)."""

from __future__ import annotations

from benchmarks.exact_products_bench import measure, measure_evaluation, prompts
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm


def test_both_engines_decode_the_same_tokens_and_only_decoding_steps_are_timed(tmp_path):
    model, tokenizer = load_causal_lm(str(build_tiny_causal_lm(tmp_path / "tiny")))
    assert len(prompts(tokenizer, 5)) == 5
    result = measure(model, tokenizer, rows=5, tokens=6, repeats=2)
    assert result["rows"] == 5 and result["same_tokens_and_logprobs"]
    assert result["plain_step_ms"] > 0 and result["exact_step_ms"] > 0
    # Every product of the exact engine went through it: a first product per shape key, the rest served.
    assert result["formulations"]["checked"] == result["shape_keys"] > 0
    assert sum(result["formulations"].values()) > result["shape_keys"]


def test_the_main_jobs_evaluation_gives_the_same_answers_with_and_without(tmp_path):
    model = build_tiny_causal_lm(tmp_path / "tiny")
    result = measure_evaluation(str(model), questions_per_hop=2, repeats=2)
    assert result["questions"] == 4 and result["same_answers_and_tokens"]
    assert result["plain_s"] > 0 and result["exact_s"] > 0
