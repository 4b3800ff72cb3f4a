"""The synthetic world's relations: what a question can ask about an entity, how a passage states it and
the keyword a searcher appends to the subject's name (``synthetic.py`` chains them into questions)."""

from __future__ import annotations

from dataclasses import dataclass

from rllib_search.data.synthetic_vocabulary import KINDS


@dataclass(frozen=True)
class Relation:
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
    Relation(
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
