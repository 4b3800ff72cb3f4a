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

The same config gives byte-identical files: one seeded :class:`random.Random` drives everything.
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
# Vocabulary: invented words, entity kinds and their attributes
# ---------------------------------------------------------------------------------------------------------

# A word is FIRST + MIDDLE + LAST ("Velmora", "Ostrivane"): pronounceable, at least two syllables, and
# never an English word, because every LAST starts with a consonant and no FIRST + LAST pair is English
# (the tests check the answers against the vocabulary of Python's documentation).
_FIRST = (
    "vel", "tar", "mir", "kor", "zan", "bel", "dra", "ist", "ul", "qua", "fen", "hal", "jor", "nim",
    "pell", "rho", "sar", "thal", "vor", "wyn", "xan", "yss", "zel", "cas", "gal", "lun", "nev", "ost",
    "ka", "ve", "ta", "ri", "do", "se", "lu", "zo", "fi", "ne", "bra", "tor",
)  # fmt: skip
_MIDDLE = (
    "", "", "", "", "a", "e", "i", "o", "la", "ri", "va", "no", "me", "si", "ke", "lo", "da", "ti",
    "ra", "ve",
)  # fmt: skip
_LAST = (
    "mora", "quin", "vessa", "drith", "kaley", "bryn", "thar", "zane", "lisk", "vane", "dor", "mir",
    "wen", "ros", "nath", "vik", "lune", "rath", "sova", "tine", "xel", "dask", "skor", "thova",
    "ndel", "vaux", "mbrel", "zhen", "quor", "brisk",
)  # fmt: skip


@dataclass(frozen=True)
class _Kind:
    """A kind of entity. Names fill ``formats`` with invented words ``{a}`` (and ``{b}``); a confusable
    twin fills one of ``twin_formats``, keeping ``{a}`` or ``{b}`` and taking a fresh word as ``{new}``."""

    name: str
    weight: int  # entities of this kind per unit of world size
    formats: tuple[str, ...]
    twin_formats: tuple[str, ...]
    attributes: dict[str, tuple[Any, ...] | range]
    fillers: tuple[str, ...]  # neutral sentences about the entity, stating no relation and not naming it


def _choices(words: str) -> tuple[str, ...]:
    """A comma-separated list of attribute values as a tuple."""
    return tuple(words.split(", "))


_COMPANY_FORMATS = tuple(
    f"{{a}} {suffix}" for suffix in ("Dynamics", "Systems", "Industries", "Labs", "Holdings", "Works")
)
_UNIVERSITY_FORMATS = tuple(f"{{a}} {suffix}" for suffix in ("University", "College", "Institute"))
_BAND_FORMATS = tuple(
    f"The {{a}} {noun}" for noun in ("Lanterns", "Comets", "Ravens", "Tides", "Engines", "Foxes")
)
_ALBUM_FORMATS = tuple(
    f"{{a}} {noun}" for noun in ("Nights", "Sessions", "Horizons", "Letters", "Gardens", "Signals")
)

KINDS = (
    _Kind(
        "person",
        10,
        ("{a} {b}",),
        ("{a} {new}", "{new} {b}"),
        {
            "year": range(1931, 1996),
            "occupation": _choices(
                "architect, botanist, cartographer, novelist, engineer, chemist, painter, economist, "
                "sculptor, historian, violinist, surveyor, astronomer, playwright"
            ),
            "field": _choices(
                "mathematics, linguistics, geology, economics, architecture, marine biology, "
                "philosophy, chemistry, law, medicine"
            ),
            "hobby": ("sailor", "chess player", "beekeeper", "climber", "gardener", "birdwatcher"),
        },
        (
            "The {occupation} has worked in the trade for most of a long career.",
            "Outside work, the {occupation} is a keen {hobby}.",
        ),
    ),
    _Kind(
        "city",
        5,
        ("{a}",),
        ("Port {a}", "New {a}", "{a} Falls", "Upper {a}"),
        {
            "population": range(8, 950),
            "size": ("small", "mid-sized", "large", "coastal", "hillside", "riverside"),
            "landmark": _choices(
                "old harbour, clock tower, glass market, terraced gardens, stone bridge, salt museum"
            ),
        },
        ("The city has about {population},000 inhabitants.", "The city is known for its {landmark}."),
    ),
    _Kind(
        "country",
        1,
        ("{a}",),
        ("North {a}", "East {a}", "West {a}"),
        {
            "year": range(1820, 1991),
            "export": ("copper", "wool", "olive oil", "timber", "glassware", "tea"),
        },
        ("The nation declared independence in {year}.", "The nation is known for its exports of {export}."),
    ),
    _Kind(
        "company",
        3,
        _COMPANY_FORMATS,
        _COMPANY_FORMATS,
        {
            "year": range(1950, 2016),
            "industry": _choices(
                "logistics, software, textile, shipbuilding, biotechnology, aerospace, "
                "agricultural machinery, insurance"
            ),
        },
        ("The firm was founded in {year}.", "The firm is active in {industry}."),
    ),
    _Kind(
        "university",
        2,
        _UNIVERSITY_FORMATS,
        _UNIVERSITY_FORMATS,
        {
            "year": range(1790, 1991),
            "field": ("mathematics", "linguistics", "geology", "economics", "law", "medicine"),
        },
        ("It was established in {year}.", "The university is best known for its {field} faculty."),
    ),
    _Kind(
        "band",
        3,
        _BAND_FORMATS,
        _BAND_FORMATS,
        {
            "year": range(1965, 2013),
            "genre": ("folk", "synth-pop", "jazz", "post-rock", "blues", "indie rock", "metal"),
        },
        ("The group released their first record in {year}.", "The group play {genre} music."),
    ),
    _Kind(
        "album",
        5,
        _ALBUM_FORMATS,
        _ALBUM_FORMATS,
        {
            "year": range(1968, 2021),
            "tracks": range(8, 17),
            "ordinal": ("debut", "second", "third", "fourth", "fifth"),
        },
        ("The record has {tracks} tracks.", "The record came out in {year}."),
    ),
    _Kind(
        "river",
        2,
        ("{a} River",),
        ("{a} Creek",),
        {"length": range(40, 900)},
        ("It is {length} kilometres long.", "Its waters are known for their trout."),
    ),
)

# Statements about a subject {s} that mention another entity {x} of the given kind without stating any
# relation a question asks about: same-subject distractors.
_ASIDES: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (
        ("city", "{s} spent several years living in {x}."),
        ("company", "{s} once worked as a consultant for {x}."),
        ("university", "{s} gave a public lecture at {x} in {year}."),
    ),
    "city": (("city", "{s} is twinned with {x}."), ("person", "{x} opened a small gallery in {s}.")),
    "country": (
        ("country", "{s} shares a long border with {x}."),
        ("person", "{x} once served as an envoy to {s}."),
    ),
    "company": (
        ("city", "{s} opened a regional office in {x} in {year}."),
        ("company", "{s} signed a supply agreement with {x}."),
    ),
    "university": (
        ("university", "{s} runs a student exchange with {x}."),
        ("person", "{x} taught {field} at {s} for a decade."),
    ),
    "band": (
        ("country", "{s} toured {x} in {year}."),
        ("band", "{s} shared a stage with {x} at a summer festival."),
    ),
    "album": (
        ("person", "{s} features a guest appearance by {x}."),
        ("city", "Part of {s} was recorded in {x}."),
    ),
    "river": (
        ("city", "The {s} rises in the hills above {x}."),
        ("river", "The {s} joins the {x} near its mouth."),
    ),
}


# ---------------------------------------------------------------------------------------------------------
# Relations
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Relation:
    """A functional relation: each ``subject`` entity has one ``object``.

    ``keyword`` is what a searcher appends to the subject's name, and every one of ``statements`` (the
    passage sentences stating the fact) contains it. ``question`` asks for the object of ``{s}``;
    ``phrase`` names it, so that chains nest: the phrase of one hop becomes ``{s}`` of the next.
    """

    name: str
    subject: str
    object: str
    keyword: str
    question: str
    phrase: str
    statements: tuple[str, ...]


RELATIONS = (
    _Relation(
        "born_in",
        "person",
        "city",
        "birthplace",
        "In which city was {s} born?",
        "the city where {s} was born",
        (
            "{s} is {a_occupation} whose birthplace is {o}.",
            "The birthplace of {s} is {o}, where the future {occupation} was born in {year}.",
            "{s} was born in {o} in {year}; the {occupation} still calls that birthplace home.",
        ),
    ),
    _Relation(
        "studied_at",
        "person",
        "university",
        "alma mater",
        "Which university did {s} attend?",
        "the university that {s} attended",
        (
            "{s} studied {field} at {o}, which remains the alma mater of the {occupation}.",
            "The alma mater of {s} is {o}, where the future {occupation} read {field}.",
            "{s} graduated in {field} from {o}; that alma mater later honoured the {occupation}.",
        ),
    ),
    _Relation(
        "located_in",
        "city",
        "country",
        "country",
        "In which country is {s}?",
        "the country where {s} is located",
        (
            "{s} is {a_size} city in the country of {o}.",
            "Located in the country of {o}, {s} has about {population},000 inhabitants.",
            "{s} is a city in the country of {o}, known for its {landmark}.",
        ),
    ),
    _Relation(
        "capital",
        "country",
        "city",
        "capital",
        "What is the capital of {s}?",
        "the capital of {s}",
        (
            "The capital of {s} is {o}.",
            "{s} is a country whose capital and largest city is {o}.",
            "{o} has been the capital of {s} since {year}.",
        ),
    ),
    _Relation(
        "founded_by",
        "company",
        "person",
        "founder",
        "Who founded {s}?",
        "the founder of {s}",
        (
            "{s} is {a_industry} company whose founder is {o}.",
            "{s} was started in {year} by its founder, {o}.",
            "The founder of {s}, {a_industry} firm, is {o}.",
        ),
    ),
    _Relation(
        "headquartered_in",
        "company",
        "city",
        "headquarters",
        "In which city is {s} headquartered?",
        "the city where {s} is headquartered",
        (
            "{s} has its headquarters in {o}.",
            "The {industry} company {s} keeps its headquarters in {o}.",
            "{s} moved its headquarters to {o} in {year}.",
        ),
    ),
    _Relation(
        "chief_executive",
        "company",
        "person",
        "chief executive",
        "Who is the chief executive of {s}?",
        "the chief executive of {s}",
        (
            "{o} serves as the chief executive of {s}.",
            "The chief executive of {s} is {o}.",
            "{s}, {a_industry} company, is run by its chief executive, {o}.",
        ),
    ),
    _Relation(
        "campus_in",
        "university",
        "city",
        "campus",
        "In which city is the main campus of {s}?",
        "the city where {s} has its main campus",
        (
            "{s} is a university with its main campus in {o}.",
            "The main campus of {s} lies in {o}; the university was established in {year}.",
            "Established in {year}, {s} has its campus in {o}.",
        ),
    ),
    _Relation(
        "formed_in",
        "band",
        "city",
        "hometown",
        "In which city was {s} formed?",
        "the city where {s} was formed",
        (
            "{s} are {a_genre} band formed in {year} in {o}, their hometown.",
            "{s} formed in {o}, the band's hometown, in {year}.",
            "The {genre} band {s} was formed in its hometown of {o}.",
        ),
    ),
    _Relation(
        "lead_singer",
        "band",
        "person",
        "lead singer",
        "Who is the lead singer of {s}?",
        "the lead singer of {s}",
        (
            "{o} is the lead singer of {s}.",
            "{s} feature {o} as their lead singer.",
            "The lead singer of the {genre} group {s} is {o}.",
        ),
    ),
    _Relation(
        "released_by",
        "album",
        "band",
        "band",
        "Which band released the album {s}?",
        "the band that released the album {s}",
        (
            "{s} is a {year} album released by the band {o}.",
            "The band {o} released the album {s} in {year}.",
            "{s} is the {ordinal} studio album by the band {o}.",
        ),
    ),
    _Relation(
        "produced_by",
        "album",
        "person",
        "producer",
        "Who produced the album {s}?",
        "the producer of the album {s}",
        (
            "{s} was recorded in {year} with {o} as producer.",
            "The producer of the album {s} is {o}.",
            "{o} worked as the producer of {s}, which has {tracks} tracks.",
        ),
    ),
    _Relation(
        "flows_through",
        "river",
        "city",
        "city",
        "Which city does the {s} flow through?",
        "the city that the {s} flows through",
        (
            "The {s} flows through the city of {o}.",
            "On its {length}-kilometre course, the {s} passes through the city of {o}.",
            "The city of {o} lies on the banks of the {s}.",
        ),
    ),
)
RELATIONS_BY_SUBJECT = {kind.name: [r for r in RELATIONS if r.subject == kind.name] for kind in KINDS}


# ---------------------------------------------------------------------------------------------------------
# Building a world
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Entity:
    kind: _Kind
    name: str
    words: dict[str, str]  # the invented words in the name, by format placeholder ({} for twins)
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fact:
    subject: _Entity
    relation: _Relation
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
            word = (self.rng.choice(_FIRST) + self.rng.choice(_MIDDLE) + self.rng.choice(_LAST)).capitalize()
            if len(word) >= 5 and word not in self.used_words:
                self.used_words.add(word)
                return word
        raise ValueError("the world is too large for the invented vocabulary; lower num_passages")

    def _entity(self, kind: _Kind) -> _Entity:
        while True:
            fmt = self.rng.choice(kind.formats)
            words = {"a": self._word(), "b": self._word()} if "{b}" in fmt else {"a": self._word()}
            name = fmt.format(**words)
            if name not in self.used_names:
                self.used_names.add(name)
                return _Entity(kind, name, words, self._attributes(kind))

    def _attributes(self, kind: _Kind) -> dict[str, Any]:
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

    def _pick_object(self, i: int, subject: _Entity, relation: _Relation) -> _Entity:
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

    def _statement(self, subject: _Entity, relation: _Relation, obj: _Entity) -> str:
        """The sentence stating a fact, sometimes followed by a filler that adds to it."""
        template = self.rng.choice(relation.statements)
        text = template.format(s=subject.name, o=obj.name, **subject.attributes)
        if self.rng.random() < 0.5:
            text += self._filler(subject, avoid=template)
        return text

    def _aside(self, subject: _Entity) -> str:
        """A statement about ``subject`` naming another entity, with no relation a question asks about."""
        kind, template = self.rng.choice(_ASIDES[subject.kind.name])
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
