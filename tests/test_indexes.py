"""Index directories over a small synthetic world: build, load memory-mapped, search, and fail clearly."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_search.data.formats import corpus_jsonl_to_parquet, write_corpus_jsonl
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.serve.memory import resident_memory_mb
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from rllib_search.serve.retrieval.build import build_index, ensure_index
from rllib_search.serve.retrieval.cli import add_index_commands
from rllib_search.serve.retrieval.encoders import EncoderSpec, resolve_model_path
from rllib_search.serve.retrieval.load import load_index
from rllib_search.serve.retrieval.manifest import (
    IndexFileError,
    IndexMismatchError,
    index_identity,
    read_manifest,
)
from rllib_search.serve.retrieval.search import SearchIndex

MINILM = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def world():
    return generate_world(SyntheticWorldConfig(num_passages=300, num_train=20, num_test=20))


@pytest.fixture(scope="module")
def hops(world) -> list[dict[str, str]]:
    return [hop for record in world.train + world.test for hop in record.extra["hops"]]


@pytest.fixture(scope="module")
def corpus_jsonl(world, tmp_path_factory):
    path = tmp_path_factory.mktemp("world") / "corpus.jsonl"
    write_corpus_jsonl(world.passages, path)
    return path


def _built(tmp_path_factory, corpus, kind, **kwargs):
    out = tmp_path_factory.mktemp(kind)
    build_index(corpus, out, kind, progress=False, **kwargs)
    return out


@pytest.fixture(scope="module")
def flat_dir(corpus_jsonl, tmp_path_factory):
    return _built(tmp_path_factory, corpus_jsonl, "flat", encoder=MINILM)


@pytest.fixture(scope="module")
def hnsw_dir(corpus_jsonl, tmp_path_factory):
    return _built(tmp_path_factory, corpus_jsonl, "hnsw", encoder=MINILM, m=16)


@pytest.fixture(scope="module")
def bm25_dir(corpus_jsonl, tmp_path_factory):
    return _built(tmp_path_factory, corpus_jsonl, "bm25")


@pytest.fixture(scope="module")
def random_dir(corpus_jsonl, tmp_path_factory):
    return _built(tmp_path_factory, corpus_jsonl, "random", seed=7)


@pytest.fixture(scope="module")
def flat(flat_dir):
    return load_index(flat_dir)


@pytest.fixture(scope="module")
def indexes(flat, hnsw_dir, bm25_dir, random_dir) -> dict[str, SearchIndex]:
    return {
        "flat": flat,
        "hnsw": load_index(hnsw_dir),
        "bm25": load_index(bm25_dir),
        "random": load_index(random_dir),
    }


def _hit_rate(hops, results) -> float:
    return float(np.mean([any(h["answer"] in p.contents for p in ps) for h, ps in zip(hops, results)]))


def test_manifest_describes_the_build(flat_dir, corpus_jsonl, world):
    manifest = read_manifest(flat_dir)
    assert manifest == json.loads((flat_dir / "manifest.json").read_text())
    assert manifest["kind"] == "flat" and manifest["version"] == 1
    assert manifest["encoder"] == EncoderSpec.for_model(MINILM).to_dict()
    assert manifest["dim"] == 384 and manifest["count"] == len(world.passages)
    assert manifest["corpus_sha256"] == hashlib.sha256(corpus_jsonl.read_bytes()).hexdigest()
    assert manifest["faiss"] == {"type": "IndexFlatIP", "metric": "inner_product"}
    assert (flat_dir / manifest["corpus_file"]).exists() and (flat_dir / "index.faiss").exists()
    datetime.fromisoformat(manifest["created"])


def test_flat_minilm_finds_most_hop_answers_with_descending_scores(flat, hops):
    results = flat.search([h["query"] for h in hops], topk=3)
    assert len(results) == len(hops) and all(len(ps) == 3 for ps in results)
    assert _hit_rate(hops, results) >= 0.9  # measured 1.0 on this world (72 hops)
    for ps in results:
        scores = [p.score for p in ps]
        assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0 + 1e-5


def test_batched_flat_search_equals_one_query_at_a_time(flat, hops):
    """Batches from ``blas_min_queries`` on take faiss's BLAS path; the ranking must not change."""
    queries = [hop["query"] for hop in hops[:20]]
    assert len(queries) >= flat.blas_min_queries
    batched = flat.search(queries, 3)
    one_by_one = [flat.search([query], 3)[0] for query in queries]
    assert [[p.id for p in ps] for ps in batched] == [[p.id for p in ps] for ps in one_by_one]
    for got, want in zip(batched, one_by_one):
        np.testing.assert_allclose([p.score for p in got], [p.score for p in want], atol=1e-5)


def test_hnsw_recall_at_3_against_flat(indexes, hops, world):
    queries = [h["query"] for h in hops] + [r.question for r in world.train + world.test]
    exact, approximate = indexes["flat"].search(queries, 3), indexes["hnsw"].search(queries, 3)
    recall = np.mean([len({p.id for p in a} & {p.id for p in e}) / 3 for a, e in zip(approximate, exact)])
    assert recall >= 0.9
    assert (
        indexes["hnsw"].manifest["faiss"]["m"] == 16 and indexes["hnsw"].manifest["faiss"]["ef_search"] == 128
    )


def test_bm25_index_scores_like_the_in_process_bm25(indexes, hops, world):
    queries = [h["query"] for h in hops]
    results = indexes["bm25"].search(queries, 3)
    assert _hit_rate(hops, results) >= 0.9
    reference = BM25Retriever(world.passages).search(queries, 3)
    for ours, theirs in zip(results, reference):
        np.testing.assert_allclose([p.score for p in ours], [p.score for p in theirs], rtol=1e-5)


def _entries(directory):
    """A directory's entries, ``ensure_index``'s lock file left out (filelock may keep it)."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_ensure_index_builds_once_under_concurrent_callers_and_replaces_a_half_built_one(
    corpus_jsonl, tmp_path, hops, bm25_dir, monkeypatch
):
    """Four callers at once (threads: the lock is a file lock, which threads and processes share alike)
    build the index once (the others wait for it) and leave no staging directory; a directory without a
    manifest (a build that stopped in place) is rebuilt, and a dead builder's staging directory removed."""
    from concurrent.futures import ThreadPoolExecutor

    from rllib_search.serve.retrieval import build as index_build

    builds = []

    def counted_build(*args, **kwargs):
        builds.append(args[1])
        return build_index(*args, **kwargs)

    monkeypatch.setattr(index_build, "build_index", counted_build)  # the real build, counted
    out = tmp_path / "shared" / "bm25_index"
    with ThreadPoolExecutor(4) as pool:
        returned = list(pool.map(lambda _: ensure_index(corpus_jsonl, out, "bm25", progress=False), range(4)))
    assert returned == [out] * 4 and len(builds) == 1 and _entries(out.parent) == ["bm25_index"]
    queries = [h["query"] for h in hops]
    expected = [[p.id for p in ps] for ps in load_index(bm25_dir).search(queries, 3)]
    assert [[p.id for p in ps] for ps in load_index(out).search(queries, 3)] == expected

    written = {f.name: f.stat().st_mtime_ns for f in out.rglob("*")}
    assert ensure_index(corpus_jsonl, out, "bm25", progress=False, k1=1.5) == out  # complete: left alone
    assert {f.name: f.stat().st_mtime_ns for f in out.rglob("*")} == written

    half_built = tmp_path / "half" / "bm25_index"
    half_built.mkdir(parents=True)
    (half_built / "corpus.arrow").write_bytes(b"cut short")
    (half_built.parent / ".bm25_index.staging-dead1234").mkdir()  # a killed builder's staging directory
    (half_built.parent / ".bm25_index-small.staging-ab12").mkdir()  # another index's build: not ours
    ensure_index(corpus_jsonl, half_built, "bm25", progress=False)
    assert [[p.id for p in ps] for ps in load_index(half_built).search(queries, 3)] == expected
    assert _entries(half_built.parent) == [".bm25_index-small.staging-ab12", "bm25_index"]


def test_ensure_index_rebuilds_an_index_of_another_corpus_kind_or_options(world, tmp_path, hops):
    """A regenerated corpus (another checksum), another kind or other options replace the index in place;
    the old one is gone afterwards and nothing is left beside it."""
    old_corpus, new_corpus = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    write_corpus_jsonl(world.passages, old_corpus)
    write_corpus_jsonl(world.passages[:150], new_corpus)  # the world regenerated: another corpus
    out = tmp_path / "world" / "bm25_index"
    ensure_index(old_corpus, out, "bm25", progress=False)
    assert read_manifest(out)["count"] == len(world.passages)
    old_identity = index_identity(out)  # part of the main job's evaluation-cache key

    ensure_index(new_corpus, out, "bm25", progress=False)
    manifest = read_manifest(out)
    assert index_identity(out) != old_identity
    assert index_identity(out) == {
        "kind": "bm25",
        "encoder": None,
        "options": {"k1": 1.5, "b": 0.75},
        "count": 150,
        "corpus_sha256": manifest["corpus_sha256"],
    }
    assert manifest["count"] == 150
    assert manifest["corpus_sha256"] == hashlib.sha256(new_corpus.read_bytes()).hexdigest()
    kept = {p.id for p in world.passages[:150]}
    found = load_index(out).search([h["query"] for h in hops], 3)
    assert all(p.id in kept for ps in found for p in ps)
    assert _entries(out.parent) == ["bm25_index"]

    ensure_index(new_corpus, out, "bm25", progress=False, k1=0.9)
    assert read_manifest(out)["options"]["k1"] == 0.9
    ensure_index(new_corpus, out, "bm25", progress=False)  # k1 left out: the default, not 0.9
    assert read_manifest(out)["options"] == {"k1": 1.5, "b": 0.75}
    ensure_index(new_corpus, out, "random", progress=False)
    assert read_manifest(out)["kind"] == "random" and _entries(out.parent) == ["bm25_index"]
    with pytest.raises(ValueError, match="unknown option"):
        ensure_index(new_corpus, out, "bm25", progress=False, nprobe=4)


def test_random_index_is_seeded_and_deterministic(random_dir, corpus_jsonl, tmp_path, hops):
    queries = [h["query"] for h in hops]
    first, again = load_index(random_dir).search(queries, 3), load_index(random_dir).search(queries, 3)
    assert [[p.id for p in ps] for ps in first] == [[p.id for p in ps] for ps in again]
    assert all(len({p.id for p in ps}) == 3 and all(p.score is None for p in ps) for ps in first)
    assert _hit_rate(hops, first) < 0.5
    build_index(corpus_jsonl, tmp_path, "random", progress=False, seed=8)
    other = load_index(tmp_path).search(queries, 3)
    assert [[p.id for p in ps] for ps in other] != [[p.id for p in ps] for ps in first]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "bm25", "random"])
def test_topk_beyond_the_corpus_returns_every_passage(indexes, kind, world):
    (results,) = indexes[kind].search(["Tarquin Oskaley birthplace"], topk=10_000)
    assert indexes[kind].count == len(world.passages)
    if kind == "hnsw":  # a graph search need not reach every node: faiss pads with -1, dropped
        assert 0.9 * len(world.passages) <= len(results) <= len(world.passages)
    else:
        assert len(results) == len(world.passages)
    assert len({p.id for p in results}) == len(results)
    if kind != "random":
        scores = [p.score for p in results]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "bm25", "random"])
def test_empty_query_list_and_bad_topk(indexes, kind):
    assert indexes[kind].search([], topk=3) == []
    with pytest.raises(ValueError, match="topk"):
        indexes[kind].search(["a query"], topk=0)


def test_mmap_and_plain_loads_agree_and_rows_match_the_corpus(flat, flat_dir, world, hops):
    plain = load_index(flat_dir, mmap=False)
    queries = [h["query"] for h in hops[:10]]
    assert flat.search(queries, 3) == plain.search(queries, 3)
    rows = flat.corpus.select(["id", "title", "text"]).to_pylist()
    assert rows == [{"id": p.id, "title": p.title, "text": p.text} for p in world.passages]


def test_opening_the_corpus_copies_nothing_into_memory(random_dir):
    before = pa.total_allocated_bytes()
    index = load_index(random_dir)
    assert pa.total_allocated_bytes() - before < 1024  # the Arrow IPC file is memory-mapped
    assert index.corpus.nbytes > 10_000
    assert resident_memory_mb() > 10


def test_a_bm25_index_builds_loads_and_searches_without_torch_or_faiss(corpus_jsonl, tmp_path):
    """A BM25 replica imports neither (about 130 MB of a replica's memory)."""
    code = (
        "import sys\n"
        "from rllib_search.serve.retrieval.build import build_index\n"
        "from rllib_search.serve.retrieval.deployment import set_search_threads\n"
        "from rllib_search.serve.retrieval.load import load_index\n"
        f"build_index({str(corpus_jsonl)!r}, {str(tmp_path / 'bm25')!r}, kind='bm25', progress=False)\n"
        f"index = load_index({str(tmp_path / 'bm25')!r})\n"
        "set_search_threads(2, index.manifest['kind'])\n"
        "assert index.search(['a question'], 2)[0]\n"
        "print(sorted({'torch', 'faiss', 'transformers'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_loading_with_another_encoder_raises(flat_dir, bm25_dir):
    with pytest.raises(IndexMismatchError, match=r"all-minilm-l6-v2.*intfloat/e5-base-v2"):
        load_index(flat_dir, encoder="intfloat/e5-base-v2")
    with pytest.raises(IndexMismatchError, match="pooling 'mean' != 'cls'"):
        load_index(flat_dir, encoder=EncoderSpec.for_model(MINILM, pooling="cls"))
    with pytest.raises(IndexMismatchError, match="uses no encoder"):
        load_index(bm25_dir, encoder=MINILM)
    local_copy = load_index(flat_dir, encoder=resolve_model_path(MINILM))  # the same model, by path
    assert local_copy.encoder.spec.name_or_path == resolve_model_path(MINILM)


def test_missing_or_corrupt_files_are_named(tmp_path, flat_dir):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "manifest.json"))):
        load_index(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFileError, match=r"manifest\.json: not valid JSON"):
        load_index(tmp_path)

    broken = tmp_path / "broken"
    shutil.copytree(flat_dir, broken)
    (broken / "index.faiss").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(broken / "index.faiss"))):
        load_index(broken)
    (broken / "corpus.arrow").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(broken / "corpus.arrow"))):
        load_index(broken)


def test_parquet_corpora_are_staged_like_jsonl(tmp_path, corpus_jsonl, random_dir):
    parquet = tmp_path / "corpus.parquet"
    corpus_jsonl_to_parquet(corpus_jsonl, parquet)
    manifest = build_index(parquet, tmp_path / "from_parquet", "random", progress=False)
    assert load_index(tmp_path / "from_parquet").corpus.equals(load_index(random_dir).corpus)
    assert manifest["corpus_sha256"] == hashlib.sha256(parquet.read_bytes()).hexdigest()

    bare = tmp_path / "bare.parquet"  # integer ids, no contents column
    pq.write_table(pa.table({"id": [1, 2], "title": ["Alpha", None], "text": ["first", "second"]}), bare)
    build_index(bare, tmp_path / "bare", "random", progress=False)
    corpus = load_index(tmp_path / "bare").corpus
    assert corpus.column("id").to_pylist() == ["1", "2"]
    assert corpus.column("contents").to_pylist() == ['"Alpha"\nfirst', '""\nsecond']


def test_build_rejects_bad_arguments(tmp_path, corpus_jsonl):
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(corpus_jsonl, tmp_path, "annoy")
    with pytest.raises(ValueError, match=r"unknown option\(s\) nlist for a hnsw index"):
        build_index(corpus_jsonl, tmp_path, "hnsw", encoder=MINILM, nlist=8)
    with pytest.raises(ValueError, match="uses no encoder"):
        build_index(corpus_jsonl, tmp_path, "bm25", encoder=MINILM)


def test_cli_builds_an_ivfpq_index_and_describes_it(tmp_path, capsys):
    small = generate_world(SyntheticWorldConfig(num_passages=60, num_train=10, num_test=5))
    corpus = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(small.passages, corpus)
    hops = [hop for record in small.train + small.test for hop in record.extra["hops"]]
    parser = argparse.ArgumentParser(prog="rllib-search")
    add_index_commands(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        return args.func(args)

    out = tmp_path / "ivfpq"
    build = ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-progress"]
    options = ["--nlist", "2", "--nbits", "4", "--nprobe", "2", "--batch-size", "32"]
    assert run(*build, "--kind", "ivfpq", "--encoder", MINILM, *options) == 0
    assert f"ivfpq index of {len(small.passages)} passages, dim 384" in capsys.readouterr().out
    assert run("index", "info", str(out)) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["faiss"]["type"] == "IndexIVFPQ"
    # Unset options are chosen from the corpus: one sub-quantizer per 8 dimensions, all passages to train.
    expected = {"nlist": 2, "pq_m": 48, "nbits": 4, "nprobe": 2, "train_size": len(small.passages)}
    assert shown["options"] == expected
    results = load_index(out).search([h["query"] for h in hops], 3)
    assert _hit_rate(hops, results) >= 0.8  # compressed vectors: measured 1.0 here
    assert all(p.score is not None for ps in results for p in ps)

    assert run(*build, "--kind", "bm25", "--hnsw-m", "8") == 2
    assert "--hnsw-m applies to --kind hnsw only" in capsys.readouterr().err
    assert run(*build, "--kind", "random", "--encoder", MINILM) == 2
    assert "uses no encoder" in capsys.readouterr().err
