"""``benchmarks/cpu_gemm_bench.py`` on a small config: every backend multiplies the same step, and the
comparisons it reports are the ones it claims (times are not checked: they belong to the benchmark)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from benchmarks.cpu_gemm_bench import Step, compare, describe, layer_shapes, measure


def small_config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=500,
    )


def test_layer_shapes_follow_the_config():
    # q, k, v, o, gate, up, down of a grouped-query layer: k and v have the key-value heads' width
    assert layer_shapes(small_config()) == [
        (64, 64),
        (32, 64),
        (32, 64),
        (64, 64),
        (96, 64),
        (96, 64),
        (64, 96),
    ]


def test_every_backend_computes_the_step_torch_computes():
    step = Step(small_config(), layers=2, vocab_chunk=128)
    row = measure(step, rows=3, hidden=64, repeats=2)
    assert set(row["backends"]) >= {"torch", "openblas"}
    assert row["backends"]["torch"]["bitwise_equal"]
    for name, result in row["backends"].items():
        # other BLAS libraries sum in another order: the same products up to float rounding
        assert result["max_abs_diff"] < 1e-4, name
        assert result["ms_per_step"] > 0 and result["speedup_vs_torch"] > 0
    vocabulary = row["vocabulary_projection"]
    assert vocabulary["max_abs_diff"] < 1e-5 and vocabulary["share_of_step"] > 0
    assert describe(row).startswith("rows   3: torch ")


def test_compare_tells_bitwise_equality_from_rounding():
    a = torch.tensor([1.0, 2.0])
    assert compare([a], [a.clone()]) == {"bitwise_equal": True, "max_abs_diff": 0.0}
    different = compare([a], [a + 1e-6])
    assert not different["bitwise_equal"] and 0 < different["max_abs_diff"] < 1e-5
