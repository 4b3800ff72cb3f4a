"""A small hand-written world shared by the env tests: passages a BM25 index can answer from."""

from __future__ import annotations

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage

PASSAGES = [
    Passage("p1", "Tarquin Oskaley", "Tarquin Oskaley was born in Velmora, a river town."),
    Passage("p2", "Velmora", "Velmora is a city located in the country of Dravenia."),
    Passage("p3", "Dravenia", "Dravenia is a country whose capital is Ostrel."),
    Passage("p4", "Mirelle Dask", "Mirelle Dask was born in Carvossa and founded Quellon Works."),
    Passage("p5", "Quellon Works", "Quellon Works is a company founded by Mirelle Dask in 1987."),
    Passage("p6", "Carvossa", "Carvossa is a city located in the country of Lunethia."),
]

RECORDS = [
    QARecord("1", "Where was Tarquin Oskaley born?", ["Velmora"], "synthetic"),
    QARecord("2", "In which country is the city where Tarquin Oskaley was born?", ["Dravenia"], "synthetic"),
    QARecord("3", "Who founded Quellon Works?", ["Mirelle Dask"], "synthetic"),
]


def build_tiny_sliding_window_lm(out_dir, tokenizer_dir, sliding_window: int = 16):
    """A tiny Gemma-3 (one sliding-window layer, one full-attention layer) over the tokenizer in
    ``tokenizer_dir``, saved with it to ``out_dir``; returns ``out_dir``."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Gemma3ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
