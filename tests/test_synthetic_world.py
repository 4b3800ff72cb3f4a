"""The synthetic multi-hop world: deterministic, sized as asked, and answerable by searching it."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import bm25s
import pytest

from rllib_search.data.formats import iter_passages, read_qa_jsonl, read_search_r1_parquet
from rllib_search.data.synthetic import (
    WORLD_FILES,
    SyntheticWorldConfig,
    ensure_world,
    generate_world,
    write_world,
)

CONFIG = SyntheticWorldConfig()


@pytest.fixture(scope="module")
def world():
    return generate_world(CONFIG)


@pytest.fixture(scope="module")
def world_dir(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    write_world(world, out)
    return out


def test_default_world_has_the_configured_size():
    # Its generation time is not asserted here (timing belongs in benchmarks/, not in tests).
    config = SyntheticWorldConfig(seed=11)
    world = generate_world(config)
    assert len(world.train) == config.num_train and len(world.test) == config.num_test
    assert abs(len(world.passages) - config.num_passages) <= 0.1 * config.num_passages  # "about" that many


def test_same_seed_gives_identical_files_and_another_seed_does_not(world_dir, tmp_path):
    again = write_world(generate_world(CONFIG), tmp_path / "again")
    other = write_world(generate_world(SyntheticWorldConfig(seed=1)), tmp_path / "other")

    for key, name in WORLD_FILES.items():
        assert again[key].read_bytes() == (world_dir / name).read_bytes(), name
    assert other["corpus_jsonl"].read_bytes() != again["corpus_jsonl"].read_bytes()
    assert other["train_jsonl"].read_bytes() != again["train_jsonl"].read_bytes()


def test_sizes_follow_the_config(world, world_dir):
    assert abs(len(world.passages) - CONFIG.num_passages) <= 0.1 * CONFIG.num_passages
    assert (len(world.train), len(world.test)) == (CONFIG.num_train, CONFIG.num_test)
    assert Counter(r.extra["num_hops"] for r in world.train) == {1: 400, 2: 400, 3: 200}
    assert Counter(r.extra["num_hops"] for r in world.test) == {1: 80, 2: 80, 3: 40}
    manifest = json.loads((world_dir / "world.json").read_text(encoding="utf-8"))
    assert manifest["counts"]["passages"] == len(world.passages)
    assert manifest["config"]["hop_mix"] == list(CONFIG.hop_mix)


def test_ids_and_questions_are_unique_and_splits_disjoint(world):
    records = world.train + world.test
    assert len({r.id for r in records}) == len(records)
    assert len({p.id for p in world.passages}) == len(world.passages)
    assert all(isinstance(p.id, str) for p in world.passages)
    assert len({r.question for r in records}) == len(records)
    assert not {r.question for r in world.train} & {r.question for r in world.test}
    assert {(r.data_source, r.split) for r in world.train} == {("synthetic", "train")}
    assert {(r.data_source, r.split) for r in world.test} == {("synthetic", "test")}


def test_hops_chain_from_the_question_to_the_answer(world):
    for record in world.train + world.test:
        hops = record.extra["hops"]
        assert record.extra["num_hops"] == len(hops) in (1, 2, 3)
        assert hops[-1]["answer"] == record.golden_answers[0]
        for previous, hop in itertools.pairwise(hops):
            assert hop["query"].startswith(previous["answer"] + " ")
        assert record.golden_answers[0] not in record.question
        if record.golden_answers[0].startswith("The "):
            assert record.golden_answers[1] == record.golden_answers[0].removeprefix("The ")


def test_each_hop_is_stated_by_a_passage_titled_with_its_subject(world):
    texts_by_title: dict[str, list[str]] = {}
    for p in world.passages:
        texts_by_title.setdefault(p.title, []).append(p.text)
    for record in world.train + world.test:
        for hop in record.extra["hops"]:
            # The query is "<subject> <relation word(s)>"; relation words are one or two words long.
            subjects = [hop["query"].rsplit(" ", n)[0] for n in (1, 2)]
            texts = [text for subject in subjects for text in texts_by_title.get(subject, [])]
            assert any(hop["answer"] in text for text in texts), hop


def test_every_hop_answer_is_in_the_bm25_top3_for_its_query(world):
    texts = [f"{p.title} {p.text}" for p in world.passages]
    index = bm25s.BM25()
    index.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    hops = [hop for record in world.train + world.test for hop in record.extra["hops"]]
    queries = bm25s.tokenize([hop["query"] for hop in hops], stopwords="en", show_progress=False)
    top3, _ = index.retrieve(queries, k=3, show_progress=False)

    missed = [
        hop for hop, ids in zip(hops, top3, strict=True) if not any(hop["answer"] in texts[i] for i in ids)
    ]
    assert not missed, missed[:5]


def test_answers_are_invented_not_english(world):
    """Every answer holds a word that English prose (Python's own documentation) never uses."""
    from pydoc_data.topics import topics

    english = {word for text in topics.values() for word in re.findall(r"[a-z]+", text.lower())}
    english |= set(bm25s.stopwords.STOPWORDS_EN)
    for record in world.train + world.test:
        for answer in record.golden_answers:
            assert any(word.lower() not in english for word in answer.split()), answer


def test_written_files_read_back_as_the_world(world, world_dir):
    assert read_search_r1_parquet(world_dir / "train.parquet") == world.train
    assert read_search_r1_parquet(world_dir / "test.parquet") == world.test
    assert read_qa_jsonl(world_dir / "train.jsonl") == world.train
    assert read_qa_jsonl(world_dir / "test.jsonl") == world.test
    assert list(iter_passages(world_dir / "corpus.parquet")) == world.passages
    assert list(iter_passages(world_dir / "corpus.jsonl")) == world.passages


def test_ensure_world_generates_only_when_needed(tmp_path):
    small = SyntheticWorldConfig(num_passages=400, num_train=100, num_test=20)
    paths = ensure_world(tmp_path, small)
    written = {key: path.stat().st_mtime_ns for key, path in paths.items()}

    assert ensure_world(tmp_path, small) == paths
    assert {key: path.stat().st_mtime_ns for key, path in paths.items()} == written

    paths["test_jsonl"].unlink()
    ensure_world(tmp_path, small)
    assert len(read_qa_jsonl(paths["test_jsonl"])) == 20

    ensure_world(tmp_path, SyntheticWorldConfig(num_passages=400, num_train=100, num_test=30))
    assert len(read_qa_jsonl(paths["test_jsonl"])) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(WORLD_FILES.values())


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="hop_mix"):
        SyntheticWorldConfig(hop_mix=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="hop questions"):
        generate_world(SyntheticWorldConfig(num_passages=100, num_train=1000, num_test=0))
