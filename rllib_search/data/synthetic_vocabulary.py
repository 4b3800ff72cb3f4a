"""The synthetic world's vocabulary: invented syllables, the kinds of entity and their attributes, and
the asides that make same-subject distractor passages (``synthetic.py`` draws from these tables)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A word is FIRST + MIDDLE + LAST syllables ("Velmora", "Ostrivane"): pronounceable, at least two
# syllables, and never an English word, because every LAST starts with a consonant and no FIRST + LAST
# pair is English (the tests check the answers against the vocabulary of Python's documentation).
FIRST_SYLLABLES = (
    "vel", "tar", "mir", "kor", "zan", "bel", "dra", "ist", "ul", "qua", "fen", "hal", "jor", "nim",
    "pell", "rho", "sar", "thal", "vor", "wyn", "xan", "yss", "zel", "cas", "gal", "lun", "nev", "ost",
    "ka", "ve", "ta", "ri", "do", "se", "lu", "zo", "fi", "ne", "bra", "tor",
)  # fmt: skip
MIDDLE_SYLLABLES = (
    "", "", "", "", "a", "e", "i", "o", "la", "ri", "va", "no", "me", "si", "ke", "lo", "da", "ti",
    "ra", "ve",
)  # fmt: skip
LAST_SYLLABLES = (
    "mora", "quin", "vessa", "drith", "kaley", "bryn", "thar", "zane", "lisk", "vane", "dor", "mir",
    "wen", "ros", "nath", "vik", "lune", "rath", "sova", "tine", "xel", "dask", "skor", "thova",
    "ndel", "vaux", "mbrel", "zhen", "quor", "brisk",
)  # fmt: skip


@dataclass(frozen=True)
class EntityKind:
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
    EntityKind(
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
ASIDES: dict[str, tuple[tuple[str, str], ...]] = {
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
