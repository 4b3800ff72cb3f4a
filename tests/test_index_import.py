"""Importing a faiss index built the way Search-R1 builds ``e5_Flat.index``: loaded through our
``load_index`` it finds what the original index finds, with nothing re-encoded; mismatches are named."""

from __future__ import annotations

import json
import os

import faiss
import numpy as np
import pytest
import torch

from rllib_search.cli import main as cli_main
from rllib_search.data.formats import write_corpus_jsonl
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.serve.retrieval.encoders import EncoderSpec, resolve_model_path
from rllib_search.serve.retrieval.import_faiss import import_faiss_index
from rllib_search.serve.retrieval.load import load_index
from rllib_search.serve.retrieval.manifest import IndexFileError, IndexMismatchError, read_manifest

MINILM = "all-minilm-l6-v2"
# Search-R1 embeds with E5's prefixes; the bundled MiniLM stands in for E5 with the same prefixes.
E5_STYLE = {"query_prefix": "query: ", "passage_prefix": "passage: "}


class SearchR1StyleEncoder:
    """Search-R1's ``index_builder.py`` encoder, written out here so the test does not check our encoder
    against itself: prefix, tokenize (256 tokens), mean pooling over the mask, L2 normalisation."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    @torch.inference_mode()
    def __call__(self, texts: list[str], prefix: str) -> np.ndarray:
        inputs = self.tokenizer(
            [prefix + t for t in texts], padding=True, truncation=True, max_length=256, return_tensors="pt"
        )
        hidden = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32)


@pytest.fixture(scope="module")
def world():
    return generate_world(SyntheticWorldConfig(seed=5, num_passages=120, num_train=10, num_test=10))


@pytest.fixture(scope="module")
def search_r1_encoder():
    return SearchR1StyleEncoder(resolve_model_path(MINILM))


@pytest.fixture(scope="module")
def search_r1_files(world, search_r1_encoder, tmp_path_factory):
    """``wiki-18.jsonl`` and ``e5_Flat.index`` in miniature: corpus rows {id, contents}, IndexFlatIP."""
    root = tmp_path_factory.mktemp("search_r1")
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    contents = [p.contents for p in world.passages]
    vectors = np.concatenate(
        [search_r1_encoder(contents[i : i + 32], "passage: ") for i in range(0, len(contents), 32)]
    )
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(root / "e5_Flat.index"))
    return root / "e5_Flat.index", root / "corpus.jsonl"


def test_cli_import_searches_like_the_original_index(
    tmp_path, world, search_r1_files, search_r1_encoder, capsys
):
    faiss_path, corpus = search_r1_files
    out = tmp_path / "imported"
    argv = ["index", "import", "--faiss", str(faiss_path), "--corpus", str(corpus), "--out", str(out)]
    prefixes = ["--query-prefix", "query: ", "--passage-prefix", "passage: "]
    assert cli_main([*argv, "--encoder", MINILM, *prefixes]) == 0
    assert f"IndexFlatIP (flat) of {len(world.passages)} passages, dim 384" in capsys.readouterr().out

    manifest = read_manifest(out)
    assert manifest["kind"] == "flat" and manifest["count"] == len(world.passages) and manifest["dim"] == 384
    assert manifest["encoder"] == EncoderSpec.for_model(MINILM, **E5_STYLE).to_dict()
    assert manifest["imported_from"]["how"] == "hard link"  # same file system: no bytes copied
    assert os.path.samefile(out / "index.faiss", faiss_path)

    index = load_index(out, device="cpu")
    queries = [hop["query"] for record in world.test for hop in record.extra["hops"]]
    ours = index.search(queries, 5)
    scores, rows = faiss.read_index(str(faiss_path)).search(search_r1_encoder(queries, "query: "), 5)
    ids = [p.id for p in world.passages]
    assert [[p.id for p in ps] for ps in ours] == [[ids[r] for r in row] for row in rows]
    np.testing.assert_allclose([[p.score for p in ps] for ps in ours], scores, atol=1e-4)
    assert ours[0][0].contents == world.passages[rows[0][0]].contents


def test_a_hub_encoder_name_is_recorded_without_a_download(tmp_path, search_r1_files):
    """Importing with ``intfloat/e5-base-v2`` only records it: E5's prefixes and pooling, no model loaded
    (the tests run with HF_HUB_OFFLINE=1: a download would fail)."""
    _, corpus = search_r1_files
    rows = len(corpus.read_text(encoding="utf-8").splitlines())
    index = faiss.IndexFlatIP(768)
    index.add(np.random.default_rng(0).standard_normal((rows, 768)).astype(np.float32))
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    manifest = import_faiss_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "out", copy=True)
    encoder = manifest["encoder"]
    assert encoder["name_or_path"] == "intfloat/e5-base-v2" and encoder["pooling"] == "mean"
    assert (encoder["query_prefix"], encoder["passage_prefix"]) == ("query: ", "passage: ")
    assert manifest["imported_from"]["how"] == "copy" and not os.path.samefile(
        tmp_path / "out" / "index.faiss", tmp_path / "e5_Flat.index"
    )


def _write(index: faiss.Index, vectors: np.ndarray, path) -> str:
    index.add(vectors)
    faiss.write_index(index, str(path))
    return str(path)


def test_mismatches_are_named(tmp_path, world, search_r1_files):
    faiss_path, corpus = search_r1_files
    spec = EncoderSpec.for_model(MINILM, **E5_STYLE)
    rng = np.random.default_rng(0)
    n = len(world.passages)

    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]))
    with pytest.raises(IndexFileError, match=rf"short\.jsonl: {n - 1} passages, .*holds {n} vectors"):
        import_faiss_index(faiss_path, short, tmp_path / "a", encoder=spec)
    assert not (tmp_path / "a" / "manifest.json").exists()

    narrow = _write(faiss.IndexFlatIP(16), rng.random((n, 16), dtype=np.float32), tmp_path / "d16.index")
    with pytest.raises(IndexMismatchError, match=r"d16\.index: 16-dimensional vectors, .* embeds in 384"):
        import_faiss_index(narrow, corpus, tmp_path / "b", encoder=spec)

    l2 = _write(faiss.IndexFlatL2(384), rng.random((n, 384), dtype=np.float32), tmp_path / "l2.index")
    with pytest.raises(IndexFileError, match=r"l2\.index: metric 1 is not inner product"):
        import_faiss_index(l2, corpus, tmp_path / "c", encoder=spec)

    garbage = tmp_path / "garbage.index"
    garbage.write_bytes(b"not a faiss index" * 10)
    with pytest.raises(IndexFileError, match=r"garbage\.index: not a readable faiss index"):
        import_faiss_index(garbage, corpus, tmp_path / "d", encoder=spec)
    with pytest.raises(FileNotFoundError, match=r"missing\.index"):
        import_faiss_index(tmp_path / "missing.index", corpus, tmp_path / "e", encoder=spec)

    # An index imported with the width unchecked (a hub name not on this machine) and then loaded with an
    # encoder of another width fails at load time, naming the file.
    out = tmp_path / "late"
    import_faiss_index(narrow, corpus, out, encoder="example-org/e5-base-not-on-this-machine")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["encoder"] = spec.to_dict()
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match=r"index\.faiss: 16-dimensional vectors, .* embeds in 384"):
        load_index(out, device="cpu")
