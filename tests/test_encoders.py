"""Text encoders: family presets, the bundled MiniLM (real, offline) and a tiny random BERT saved to disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rllib_search.llm.models import cpu_precision
from rllib_search.serve.retrieval.encoders import (
    BGE_INSTRUCTION,
    DEFAULT_ENCODER,
    EncoderSpec,
    TextEncoder,
    resolve_dtype,
    resolve_model_path,
)

MINILM = "all-minilm-l6-v2"
E5 = {"pooling": "mean", "query_prefix": "query: ", "passage_prefix": "passage: "}
BGE = {"pooling": "cls", "query_prefix": BGE_INSTRUCTION, "passage_prefix": ""}
PLAIN = {"pooling": "mean", "query_prefix": "", "passage_prefix": ""}

TINY_WORDS = [
    *("the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "rug", "query", "passage"),
    *(":", ".", ",", "who", "where", "is", "was", "born", "city"),
]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (DEFAULT_ENCODER, E5),
        ("intfloat/e5-small-v2", E5),
        ("intfloat/multilingual-e5-large", E5),
        ("BAAI/bge-base-en-v1.5", BGE),
        ("BAAI/bge-large-en", BGE),
        ("BAAI/bge-m3", {"pooling": "cls", "query_prefix": "", "passage_prefix": ""}),
        ("sentence-transformers/all-MiniLM-L6-v2", PLAIN),
        ("sentence-transformers/all-mpnet-base-v2", PLAIN),
        ("intfloat/e5-mistral-7b-instruct", PLAIN),  # instruction format: not the E5 preset
    ],
)
def test_presets_follow_the_family_name(name, expected):
    spec = EncoderSpec.for_model(name)
    assert spec.name_or_path == name
    assert {key: getattr(spec, key) for key in expected} == expected
    assert spec.max_length == 256 and spec.normalize


def test_overrides_win_over_the_preset():
    spec = EncoderSpec.for_model(DEFAULT_ENCODER, pooling="cls", query_prefix="", max_length=512)
    assert (spec.pooling, spec.query_prefix, spec.passage_prefix, spec.max_length) == (
        "cls",
        "",
        "passage: ",
        512,
    )


def test_local_folders_are_recognised_by_name_config_and_pooling_files(tmp_path):
    e5_copy = tmp_path / "e5-base-v2"
    e5_copy.mkdir()
    (e5_copy / "config.json").write_text("{}")
    assert EncoderSpec.for_model(str(e5_copy)).query_prefix == "query: "

    bge_copy = tmp_path / "retriever"
    bge_copy.mkdir()
    (bge_copy / "config.json").write_text(json.dumps({"_name_or_path": "BAAI/bge-small-en-v1.5"}))
    assert EncoderSpec.for_model(str(bge_copy)).query_prefix == BGE_INSTRUCTION

    st_model = tmp_path / "my-sentence-model"
    (st_model / "1_Pooling").mkdir(parents=True)
    (st_model / "config.json").write_text("{}")
    (st_model / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (st_model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    spec = EncoderSpec.for_model(str(st_model))
    assert (spec.pooling, spec.max_length, spec.query_prefix) == ("cls", 128, "")


def test_spec_round_trips_through_a_dict_and_rejects_unknown_pooling():
    spec = EncoderSpec.for_model("BAAI/bge-small-en-v1.5", max_length=128)
    assert EncoderSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match="pooling"):
        EncoderSpec.for_model(MINILM, pooling="max")


def test_bundled_alias_resolves_to_the_packaged_model_folder():
    folder = Path(resolve_model_path(MINILM))
    assert (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists()
    assert resolve_model_path("intfloat/e5-base-v2") == "intfloat/e5-base-v2"
    spec = EncoderSpec.for_model(MINILM)
    assert (spec.name_or_path, spec.pooling, spec.query_prefix, spec.max_length) == (MINILM, "mean", "", 256)


# ---------------------------------------------------------------------------------------------------------
# The bundled all-MiniLM-L6-v2
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    return TextEncoder(MINILM)


def test_minilm_loads_offline_and_gives_normalised_384d_vectors(minilm):
    assert minilm.device.type == "cpu" and minilm.dtype == torch.float32
    vectors = minilm.encode_passages(["Paris is the capital of France.", "Cats sleep a lot."])
    assert vectors.shape == (2, 384) and minilm.dim == 384 and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_minilm_puts_a_paraphrase_nearer_than_an_unrelated_sentence(minilm):
    query = minilm.encode_queries(["How old is the president of France?"])[0]
    paraphrase, unrelated = minilm.encode_passages(
        ["What is the age of the French president?", "The recipe needs two cups of flour."]
    )
    assert query @ paraphrase > query @ unrelated + 0.3


def test_minilm_truncates_a_long_text_at_max_length(minilm):
    long_text = "retrieval " * 1000  # 10,000 characters, ~1,000 tokens: over BERT's 512 positions
    vectors = minilm.encode_passages([long_text, long_text + " and a different ending"])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)


def test_bf16_autocast_keeps_fp32_weights_and_nearly_the_same_vectors(minilm):
    """bf16 on the CPU runs the matrix products in bf16 under autocast, over the same fp32 weights."""
    reduced = TextEncoder(MINILM, dtype="bfloat16")
    assert reduced.dtype == torch.bfloat16
    assert next(reduced.model.parameters()).dtype == torch.float32
    texts = ["who wrote the song", "Paris is the capital of France.", "a longer query about the city"]
    exact, approx = minilm.encode_queries(texts), reduced.encode_queries(texts)
    assert approx.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(approx, axis=1), 1.0, atol=1e-5)
    cosines = (exact * approx).sum(axis=1)
    assert cosines.min() > 0.999 and not np.array_equal(exact, approx)  # close, yet computed in bf16


def test_dtype_names_resolve_per_device():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype(None, cpu) == torch.float32 and resolve_dtype(None, gpu) == torch.float16
    assert resolve_dtype("auto", gpu) == torch.float16
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if cpu_precision().bf16 else torch.float32)
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype(torch.float16, cpu) == torch.float16
    with pytest.raises(ValueError, match="encoder dtype"):
        resolve_dtype("int8", cpu)


def test_empty_input_gives_an_empty_array(minilm):
    assert minilm.encode_queries([]).shape == (0, 384)
    assert minilm.encode_passages([], progress=True).shape == (0, 384)


# ---------------------------------------------------------------------------------------------------------
# A tiny random BERT saved to a folder and loaded back by path
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path_factory.mktemp("tiny-bert")
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(special + TINY_WORDS) + "\n", encoding="utf-8")
    BertTokenizer.from_pretrained(folder).save_pretrained(folder)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=len(special) + len(TINY_WORDS),
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return str(folder)


def _hidden_states(encoder: TextEncoder, text: str) -> torch.Tensor:
    inputs = encoder.tokenizer([text], return_tensors="pt")
    with torch.inference_mode():
        return encoder.model(**inputs).last_hidden_state[0]


def test_tiny_bert_mean_pooling_ignores_padding(tiny_bert):
    encoder = TextEncoder(EncoderSpec.for_model(tiny_bert, normalize=False))
    assert encoder.spec.pooling == "mean" and encoder.dim == 32
    short, long = "the cat sat", "the dog ran under the rug where the cat was born"
    alone = encoder.encode_passages([short])[0]
    padded = encoder.encode_passages([short, long])[0]  # batched with a longer text: padded
    np.testing.assert_allclose(alone, padded, atol=1e-5)
    np.testing.assert_allclose(alone, _hidden_states(encoder, short).mean(dim=0).numpy(), atol=1e-5)


def test_tiny_bert_cls_pooling_keeps_the_first_token(tiny_bert):
    encoder = TextEncoder(EncoderSpec.for_model(tiny_bert, pooling="cls"))
    vector = encoder.encode_passages(["who is the cat"])[0]
    cls = _hidden_states(encoder, "who is the cat")[0]
    np.testing.assert_allclose(vector, (cls / cls.norm()).numpy(), atol=1e-5)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-5


def test_tiny_bert_prefixes_and_truncation(tiny_bert):
    plain = TextEncoder(EncoderSpec.for_model(tiny_bert, max_length=8))
    text = "the cat sat on the mat"
    np.testing.assert_allclose(plain.encode_queries([text]), plain.encode_passages([text]), atol=1e-6)
    # [CLS] + 6 words + [SEP] is 8 tokens: words past the limit are cut.
    np.testing.assert_allclose(
        plain.encode_passages([text]), plain.encode_passages([text + " under the rug"]), atol=1e-6
    )
    e5_like = TextEncoder(
        EncoderSpec.for_model(tiny_bert, query_prefix="query: ", passage_prefix="passage: ", max_length=8)
    )
    query, passage = e5_like.encode_queries([text])[0], e5_like.encode_passages([text])[0]
    assert not np.allclose(query, passage, atol=1e-3)
    long_text = "the cat sat on the mat. " * 420  # over 10,000 characters, 64 positions in the model
    assert e5_like.encode_passages([long_text]).shape == (1, 32)
