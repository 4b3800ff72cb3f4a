"""A deterministic synthetic multi-hop world: an invented encyclopedia and questions that need it.

Entities (people, cities, countries, companies, universities, bands, albums, rivers) get names made of
invented syllables, and every fact about them is drawn at random, so no model can know an answer without
retrieving it. Each fact becomes one short passage titled with its subject; distractor passages are
added around it: facts about a confusable twin (an entity sharing a name part, "Velmora Systems" beside
"Velmora Dynamics") and other statements about the same subject that mention entities of the answer's kind.

Questions chain one to three relations ("In which country is the city where Tarquin Oskaley was born?").
Each records in ``extra["hops"]`` the searches a perfect agent would make, ``"<entity> <relation word>"``
("Tarquin Oskaley birthplace", then "Carvossa country"); every passage stating a fact contains its
relation word, so BM25 ranks the passage with each hop's answer near the top for that hop's query.

The same config gives byte-identical files: one seeded :class:`random.Random` drives everything. The
words and entity kinds are tables in ``synthetic_vocabulary.py``, the relations in ``synthetic_relations.py``.
"""

from __future__ import annotations

import json
import math
import os
import random
import string
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rllib_search.data.formats import (
    corpus_jsonl_to_parquet,
    write_corpus_jsonl,
    write_qa_jsonl,
    write_search_r1_parquet,
)
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage
from rllib_search.data.synthetic_relations import RELATIONS, RELATIONS_BY_SUBJECT, Relation
from rllib_search.data.synthetic_vocabulary import (
    ASIDES,
    FIRST_SYLLABLES,
    KINDS,
    LAST_SYLLABLES,
    MIDDLE_SYLLABLES,
    EntityKind,
)

DATA_SOURCE = "synthetic"
# Bumped whenever generation changes, so that ensure_world regenerates worlds written by older code.
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class SyntheticWorldConfig:
    """How big a world to invent. ``hop_mix`` holds the fractions of 1-, 2- and 3-hop questions."""

    seed: int = 0
    num_passages: int = 2000
    num_train: int = 1000
    num_test: int = 200
    hop_mix: tuple[float, float, float] = (0.4, 0.4, 0.2)
    distractors_per_fact: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "hop_mix", tuple(float(f) for f in self.hop_mix))
        if len(self.hop_mix) != 3 or min(self.hop_mix) < 0 or not math.isclose(sum(self.hop_mix), 1.0):
            raise ValueError(f"hop_mix must be three non-negative fractions summing to 1, got {self.hop_mix}")
        if self.num_passages < 50 or self.num_train < 0 or self.num_test < 0 or self.distractors_per_fact < 0:
            raise ValueError(f"invalid sizes in {self}")


@dataclass
class SyntheticWorld:
    """An invented corpus with its train and test questions."""

    passages: list[Passage]
    train: list[QARecord]
    test: list[QARecord]
    config: SyntheticWorldConfig
    data_source: str = DATA_SOURCE


def generate_world(config: SyntheticWorldConfig | None = None) -> SyntheticWorld:
    """Invent a world: entities, facts, passages and questions, all from ``config.seed``."""
    config = config or SyntheticWorldConfig()
    builder = _WorldBuilder(config)
    passages = builder.passages()
    train, test = builder.questions()
    return SyntheticWorld(passages=passages, train=train, test=test, config=config)


WORLD_FILES = {
    "corpus_jsonl": "corpus.jsonl",
    "corpus_parquet": "corpus.parquet",
    "train_parquet": "train.parquet",
    "test_parquet": "test.parquet",
    "train_jsonl": "train.jsonl",
    "test_jsonl": "test.jsonl",
    "world_json": "world.json",  # last: written once everything else is in place
}


def write_world(world: SyntheticWorld, out_dir: str | Path) -> dict[str, Path]:
    """Write the corpus (jsonl and parquet), the questions (Search-R1 parquet and FlashRAG jsonl) and
    ``world.json`` (config and counts) to ``out_dir``; returns the paths by :data:`WORLD_FILES` key.

    Files are staged in a temporary directory and moved into place one by one, ``world.json`` last, so
    a reader that finds ``world.json`` finds a complete world even while another process writes one.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".world-") as tmp:
        staged = {key: Path(tmp) / name for key, name in WORLD_FILES.items()}
        write_corpus_jsonl(world.passages, staged["corpus_jsonl"])
        corpus_jsonl_to_parquet(staged["corpus_jsonl"], staged["corpus_parquet"])
        for split, records in (("train", world.train), ("test", world.test)):
            write_search_r1_parquet(records, staged[f"{split}_parquet"])
            write_qa_jsonl(records, staged[f"{split}_jsonl"])
        manifest = json.dumps(_manifest(world), indent=2, sort_keys=True)
        staged["world_json"].write_text(manifest + "\n", encoding="utf-8")
        for key, name in WORLD_FILES.items():
            os.replace(staged[key], out / name)
    return _world_paths(out)


def ensure_world(out_dir: str | Path, config: SyntheticWorldConfig | None = None) -> dict[str, Path]:
    """The world's files in ``out_dir``, generated only if missing or written for another config."""
    config = config or SyntheticWorldConfig()
    paths = _world_paths(Path(out_dir))
    if all(path.exists() for path in paths.values()) and _written_for(paths["world_json"], config):
        return paths
    return write_world(generate_world(config), out_dir)


def _written_for(manifest_path: Path, config: SyntheticWorldConfig) -> bool:
    """Whether ``world.json`` records this config and the current generator."""
    try:
        stored = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return stored.get("generator_version") == GENERATOR_VERSION and stored.get("config") == _config_json(
        config
    )


def _world_paths(out: Path) -> dict[str, Path]:
    return {key: out / name for key, name in WORLD_FILES.items()}


def _config_json(config: SyntheticWorldConfig) -> dict[str, Any]:
    """The config as it reads back from ``world.json`` (tuples become lists)."""
    return json.loads(json.dumps(asdict(config)))


def _manifest(world: SyntheticWorld) -> dict[str, Any]:
    def hop_counts(records: list[QARecord]) -> dict[str, int]:
        return {str(h): sum(r.extra["num_hops"] == h for r in records) for h in (1, 2, 3)}

    return {
        "generator_version": GENERATOR_VERSION,
        "data_source": world.data_source,
        "config": _config_json(world.config),
        "counts": {
            "passages": len(world.passages),
            "train": len(world.train),
            "test": len(world.test),
            "train_hops": hop_counts(world.train),
            "test_hops": hop_counts(world.test),
        },
    }


# ---------------------------------------------------------------------------------------------------------
# Building a world
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Entity:
    kind: EntityKind
    name: str
    words: dict[str, str]  # the invented words in the name, by format placeholder ({} for twins)
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fact:
    subject: _Entity
    relation: Relation
    object: _Entity


@dataclass(frozen=True)
class _Question:
    text: str
    hops: list[dict[str, str]]  # the chain a perfect agent follows: {"query", "answer"} per hop
    golden_answers: list[str]


class _WorldBuilder:
    """Entities and facts first (in ``__init__``), then passages, then questions, from one random stream."""

    def __init__(self, config: SyntheticWorldConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.used_words: set[str] = set()
        self.used_names: set[str] = set()
        self.twins: dict[str, _Entity] = {}
        counts = self._entity_counts()
        self.entities = {kind.name: [self._entity(kind) for _ in range(counts[kind.name])] for kind in KINDS}
        self.facts: list[_Fact] = []
        self.objects: dict[tuple[str, str], _Entity] = {}  # (subject name, relation name) -> object
        for relation in RELATIONS:
            for i, subject in enumerate(self.entities[relation.subject]):
                obj = self._pick_object(i, subject, relation)
                self.facts.append(_Fact(subject, relation, obj))
                self.objects[subject.name, relation.name] = obj

    def _entity_counts(self) -> dict[str, int]:
        """Entities per kind so that facts plus their distractors come to about ``num_passages``."""
        facts_per_unit = sum(kind.weight * len(RELATIONS_BY_SUBJECT[kind.name]) for kind in KINDS)
        units = self.config.num_passages / (1 + self.config.distractors_per_fact) / facts_per_unit
        counts = {kind.name: max(1, round(kind.weight * units)) for kind in KINDS}
        counts["city"] = max(counts["city"], counts["country"])  # each country needs a city as its capital
        return counts

    def _word(self) -> str:
        """A fresh invented word."""
        for _ in range(10_000):
            word = (
                self.rng.choice(FIRST_SYLLABLES)
                + self.rng.choice(MIDDLE_SYLLABLES)
                + self.rng.choice(LAST_SYLLABLES)
            ).capitalize()
            if len(word) >= 5 and word not in self.used_words:
                self.used_words.add(word)
                return word
        raise ValueError("the world is too large for the invented vocabulary; lower num_passages")

    def _entity(self, kind: EntityKind) -> _Entity:
        while True:
            fmt = self.rng.choice(kind.formats)
            words = {"a": self._word(), "b": self._word()} if "{b}" in fmt else {"a": self._word()}
            name = fmt.format(**words)
            if name not in self.used_names:
                self.used_names.add(name)
                return _Entity(kind, name, words, self._attributes(kind))

    def _attributes(self, kind: EntityKind) -> dict[str, Any]:
        """Random attribute values; each text value ``{key}`` also as ``{a_key}``, with its article."""
        values = {key: self.rng.choice(choices) for key, choices in kind.attributes.items()}
        articled = {
            f"a_{key}": ("an " if value[0] in "aeiou" else "a ") + value
            for key, value in values.items()
            if isinstance(value, str)
        }
        return values | articled

    def _twin(self, entity: _Entity) -> _Entity:
        """An entity of the same kind whose name shares an invented word with ``entity``'s."""
        if entity.name not in self.twins:
            while True:
                fmt = self.rng.choice(entity.kind.twin_formats)
                name = fmt.format(**entity.words, new=self._word() if "{new}" in fmt else "")
                if name not in self.used_names:
                    break
            self.used_names.add(name)
            self.twins[entity.name] = _Entity(entity.kind, name, {}, self._attributes(entity.kind))
        return self.twins[entity.name]

    def _pick_object(self, i: int, subject: _Entity, relation: Relation) -> _Entity:
        if relation.name == "located_in":  # the first cities go one to each country, the rest anywhere
            countries = self.entities["country"]
            return countries[i] if i < len(countries) else self.rng.choice(countries)
        if relation.name == "capital":
            return self.rng.choice(
                [city for city in self.entities["city"] if self.objects[city.name, "located_in"] is subject]
            )
        return self.rng.choice(self.entities[relation.object])

    def _other(self, kind: str, *excluded: _Entity) -> _Entity:
        """A random entity of ``kind``, avoiding ``excluded`` unless nothing else is left."""
        candidates = self.entities[kind]
        while len(candidates) > len(excluded):
            entity = self.rng.choice(candidates)
            if all(entity is not x for x in excluded):
                return entity
        return self.rng.choice(candidates)

    # --- passages ---

    def passages(self) -> list[Passage]:
        """One passage per fact plus ``distractors_per_fact`` distractors on average, shuffled."""
        drafts: list[tuple[str, str]] = []  # (title, text)
        for fact in self.facts:
            subject, relation = fact.subject, fact.relation
            drafts.append((subject.name, self._statement(subject, relation, fact.object)))
            for j in range(self._distractor_count()):
                if j == 0 and self.rng.random() < 0.5:
                    twin = self._twin(subject)
                    twin_object = self._other(relation.object, fact.object)
                    drafts.append((twin.name, self._statement(twin, relation, twin_object)))
                else:
                    drafts.append((subject.name, self._aside(subject)))
        drafts = list(dict.fromkeys(drafts))
        self.rng.shuffle(drafts)
        return [Passage(id=str(i), title=title, text=text) for i, (title, text) in enumerate(drafts)]

    def _distractor_count(self) -> int:
        whole, fraction = divmod(self.config.distractors_per_fact, 1)
        return int(whole) + (self.rng.random() < fraction)

    def _statement(self, subject: _Entity, relation: Relation, obj: _Entity) -> str:
        """The sentence stating a fact, sometimes followed by a filler that adds to it."""
        template = self.rng.choice(relation.statements)
        text = template.format(s=subject.name, o=obj.name, **subject.attributes)
        if self.rng.random() < 0.5:
            text += self._filler(subject, avoid=template)
        return text

    def _aside(self, subject: _Entity) -> str:
        """A statement about ``subject`` naming another entity, with no relation a question asks about."""
        kind, template = self.rng.choice(ASIDES[subject.kind.name])
        text = template.format(s=subject.name, x=self._other(kind, subject).name, **subject.attributes)
        return text + self._filler(subject, avoid=template)

    def _filler(self, subject: _Entity, avoid: str) -> str:
        """A space and a filler sentence sharing no attribute with ``avoid``; "" if every filler does."""
        used = _placeholders(avoid)
        fillers = [f for f in subject.kind.fillers if not _placeholders(f) & used]
        return " " + self.rng.choice(fillers).format(**subject.attributes) if fillers else ""

    # --- questions ---

    def questions(self) -> tuple[list[QARecord], list[QARecord]]:
        """Train and test questions in the configured hop mix; distinct questions, so disjoint splits."""
        pools: dict[int, list[_Question]] = {1: [], 2: [], 3: []}
        for kind in KINDS:
            for start in self.entities[kind.name]:
                for walk in self._walks(start, {start.name}, 3):
                    question = self._question(start, walk)
                    if not any(answer in question.text for answer in question.golden_answers):
                        pools[len(walk)].append(question)
        train: list[_Question] = []
        test: list[_Question] = []
        train_counts = _split_counts(self.config.num_train, self.config.hop_mix)
        test_counts = _split_counts(self.config.num_test, self.config.hop_mix)
        for hops, pool, n_train, n_test in zip(
            (1, 2, 3), pools.values(), train_counts, test_counts, strict=True
        ):
            if len(pool) < n_train + n_test:
                raise ValueError(
                    f"the world has {len(pool)} {hops}-hop questions, fewer than the {n_train + n_test} "
                    "asked for; raise num_passages or lower num_train/num_test"
                )
            chosen = self.rng.sample(pool, n_train + n_test)
            test += chosen[:n_test]
            train += chosen[n_test:]
        self.rng.shuffle(train)
        self.rng.shuffle(test)
        return _records(train, "train"), _records(test, "test")

    def _walks(self, entity: _Entity, visited: set[str], max_hops: int) -> Iterator[list[_Fact]]:
        """Every chain of up to ``max_hops`` facts from ``entity`` that visits no entity twice."""
        if max_hops == 0:
            return
        for relation in RELATIONS_BY_SUBJECT[entity.kind.name]:
            target = self.objects[entity.name, relation.name]
            if target.name in visited:
                continue
            fact = _Fact(entity, relation, target)
            yield [fact]
            for rest in self._walks(target, visited | {target.name}, max_hops - 1):
                yield [fact, *rest]

    @staticmethod
    def _question(start: _Entity, walk: list[_Fact]) -> _Question:
        description = start.name
        for fact in walk[:-1]:
            description = fact.relation.phrase.format(s=description)
        answer = walk[-1].object.name
        golds = [answer, answer.removeprefix("The ")] if answer.startswith("The ") else [answer]
        return _Question(
            text=walk[-1].relation.question.format(s=description),
            hops=[
                {"query": f"{fact.subject.name} {fact.relation.keyword}", "answer": fact.object.name}
                for fact in walk
            ],
            golden_answers=golds,
        )


def _placeholders(template: str) -> set[str]:
    """The attributes a template uses (``{a_genre}`` uses ``genre``)."""
    return {name.removeprefix("a_") for _, name, _, _ in string.Formatter().parse(template) if name}


def _split_counts(total: int, fractions: tuple[float, ...]) -> list[int]:
    """``total`` split in proportion to ``fractions`` (largest remainders round up), summing to ``total``."""
    exact = [total * f for f in fractions]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _records(questions: list[_Question], split: str) -> list[QARecord]:
    return [
        QARecord(
            id=f"{split}_{i}",
            question=q.text,
            golden_answers=q.golden_answers,
            data_source=DATA_SOURCE,
            split=split,
            extra={"num_hops": len(q.hops), "hops": q.hops},
        )
        for i, q in enumerate(questions)
    ]
