"""The two equalities the main job's batching rests on (``benchmarks/main_job_parts_bench.py`` times them on
SmolLM2): greedy evaluation in one batch gives the answers of a batch per hop count, and a GRPO update in
micro-batches of 16 (the minibatch) gives the weights of micro-batches of 4."""

from __future__ import annotations

import pytest
import torch

from benchmarks.main_job_parts_bench import bench_evaluation, bench_learner, evaluation_runner
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("parts_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


def test_one_evaluation_batch_gives_the_answers_of_one_batch_per_hop_count(model_dir):
    torch.manual_seed(0)
    runner, by_hops = evaluation_runner(model_dir)
    result = bench_evaluation(runner, {h: by_hops[h][:6] for h in (1, 2)}, repeats=1)
    assert result["same_answers"] and result["questions_per_hop"] == 6
    assert result["one_batch_s"] > 0 and result["per_hop_count_s"] > 0


def test_micro_batches_of_the_minibatch_give_the_update_of_micro_batches_of_four(model_dir):
    torch.manual_seed(0)
    result = bench_learner(model_dir, prompt_tokens=24, repeats=1)
    assert result["first_update_max_weight_change"] > 1e-7  # the update moved the weights
    # Float rounding of the accumulation order only: an ulp of a weight against a step of about lr.
    assert result["first_update_max_difference_4_vs_16"] < 0.1 * result["first_update_max_weight_change"]
