"""Shared fixtures: real tokenizers (a tiny one built here, the bundled SmolLM2) and a small real corpus."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from rllib_search.serve.bm25 import BM25Retriever
from tests.helpers import PASSAGES, RECORDS


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer trained here, saved to a temp dir and loaded back by path."""
    from transformers import AutoTokenizer

    from rllib_search.llm.tiny import build_tiny_tokenizer

    path = build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The tokenizer of the bundled SmolLM2-135M-Instruct (GGUF converted once, then cached)."""
    from rllib_search.llm.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def retriever():
    return BM25Retriever(PASSAGES)


@pytest.fixture
def records():
    return list(RECORDS)
