"""Model families for the evidence judge's cross-family guard."""

from __future__ import annotations

import pytest

from rllib_search.llm.family import (
    ModelFamily,
    SameFamilyJudgeError,
    check_cross_family,
    family_from_config,
    family_from_description,
    family_from_name,
)


def config(model_type: str, vocab_size: int = 1000):
    return type("Config", (), {"model_type": model_type, "vocab_size": vocab_size})


def test_families_from_configs():
    qwen2, qwen3 = family_from_config(config("qwen2", 151936)), family_from_config(config("qwen3", 151669))
    assert qwen2.name == qwen3.name == "qwen"
    assert family_from_config(config("gemma3_text", 262144)).name == "gemma"
    # The llama architecture is shared by independent lines: the vocabulary tells them apart.
    smollm2, llama3 = family_from_config(config("llama", 49152)), family_from_config(config("llama", 128256))
    assert smollm2 != llama3
    assert family_from_config(config("some_new_arch")).name == "some_new_arch"
    with pytest.raises(ValueError, match="model_type"):
        family_from_config(config(""))


def test_families_from_names_and_descriptions():
    assert family_from_name("meta-llama/Llama-3.2-3B-Instruct").name == "llama/vocab128256"
    assert family_from_name("HuggingFaceTB/SmolLM2-135M-Instruct").name == "llama/vocab49152"
    assert family_from_name("Qwen/Qwen2.5-3B").name == "qwen"
    assert family_from_name("google/gemma-3-270m").name == "gemma"
    assert family_from_name("my-judge") is None
    assert family_from_description({"model": "x", "model_type": "qwen2", "vocab_size": 5}).name == "qwen"
    assert family_from_description({"model": "Qwen/Qwen2.5-7B-Instruct"}).source == "name"
    assert family_from_description({}) is None


def test_the_guard_refuses_the_same_family_unless_allowed():
    qwen, llama = ModelFamily("qwen", "config"), ModelFamily("llama/vocab128256", "name")
    assert check_cross_family(qwen, llama, policy_name="q", judge_name="l", allow_same=False) is None
    with pytest.raises(SameFamilyJudgeError, match="allow_same_family=True"):
        check_cross_family(qwen, qwen, policy_name="Qwen2.5-3B", judge_name="Qwen2.5-7B", allow_same=False)
    assert check_cross_family(qwen, qwen, policy_name="q", judge_name="q", allow_same=True) is None
    warning = check_cross_family(qwen, None, policy_name="q", judge_name="mystery", allow_same=False)
    assert "mystery" in warning and "skipped" in warning
