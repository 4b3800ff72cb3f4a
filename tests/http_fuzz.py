"""Generated HTTP requests against the retriever's ``/retrieve`` and the judge's ``/v1/completions`` and
``/v1/chat/completions`` at the shipped request bounds, and the servers that answer them (shared by
``tests/test_http_fuzz.py`` and ``benchmarks/fuzz_http.py``).

Most requests are well-formed: a POST to the endpoint with a JSON content type and a JSON object of the
endpoint's schema, valid but for one to three mutated fields. A mutation changes a field's type (null,
number, string, object, list, deep nesting), its size at and just past its bound (queries or prompts per
request, characters per string, tokens per prompt, topk, max_tokens, stop strings, messages), its text
(CJK, emoji outside the Basic Multilingual Plane, combining and zero-width marks, right-to-left and control
characters, noncharacters, lone surrogates), its number (0, -1, 2**63, 10**40, floats, NaN, infinities),
drops it or adds an unknown one. With no mutation, or one that stays in bounds, the endpoint answers 200.
A minority of requests is not well-formed: bodies at and past ``max_body_bytes`` (by Content-Length and
chunked), bodies that are not a JSON object (truncated, invalid UTF-8, nested past Python's recursion limit,
integers past its conversion limit, another top-level type), content types that are not JSON, other
methods and paths.

One field at a time is pushed to its bound, the others stay small: a valid request therefore stays cheap
enough for thousands a minute on two cores (every bound at once is a load test, not a fuzz case). The
bounds are the shipped Serve configs' (``tuned_examples/serve_*.yaml``, the deployments' defaults where a
config leaves one out), read by :func:`shipped_limits`.

Request ``i`` of an endpoint and seed is drawn from its own ``random.Random`` (seeded with the endpoint,
the seed and ``i``), so the same seed gives the same requests in any process, and one request can be
drawn again alone (:func:`draw`). :func:`send` answers by status code and by the stage that answered
(:func:`stage`): the route, the body's size, its media type, its JSON, the schema, the endpoint's bounds,
or a 200.

:func:`build_assets` writes what the services serve (a BM25 index of a small synthetic corpus, as the
CPU config serves, and a tiny Gemma-3 judge); :func:`start_services` runs both on their own local Ray in
a subprocess, through Serve's proxy actor or through HAProxy (Ray's high-throughput mode, as
``rllib-search serve --high-throughput`` starts it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = {"retrieve": "/retrieve", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
SERVICE = {"retrieve": "retriever", "completions": "judge", "chat": "judge"}
SERVED_MODEL_NAME = "tiny-judge"
DEFAULT_MAX_TOKENS = 8  # the judge's answer length when a request leaves max_tokens out
INGRESSES = ("proxy", "haproxy")  # Serve's proxy actor; HAProxy straight to the replicas


# --- the bounds -------------------------------------------------------------------------------------------
def shipped_limits(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """The request bounds of the retriever and the judge as the shipped Serve configs set them (the widest
    where configs differ), completed with the deployments' defaults, ``max_body_bytes`` included."""
    import yaml

    from rllib_search.serve.judge.deployment import JudgeLimits
    from rllib_search.serve.retrieval.deployment import RequestLimits

    found: dict[str, dict[str, int]] = {"retriever": {}, "judge": {}}
    for path in sorted((root / "tuned_examples").glob("serve*.yaml")):
        for app in (yaml.safe_load(path.read_text()) or {}).get("applications", []):
            service = {"build_retriever_app": "retriever", "build_judge_app": "judge"}.get(
                str(app.get("import_path", "")).rsplit(":", 1)[-1]
            )
            for key, value in ((app.get("args") or {}).get("limits") or {}).items():
                if service is not None:
                    found[service][key] = max(value, found[service].get(key, value))
    from dataclasses import asdict

    return {
        "retriever": asdict(RequestLimits(**found["retriever"])),
        "judge": asdict(JudgeLimits(**found["judge"])),
    }


# --- requests --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FuzzRequest:
    """One generated request: ``path`` is appended to the service's base URL; a ``chunked`` body is sent
    without Content-Length. ``case`` names what was generated (``kind:detail``; kinds: ``fields`` for a
    well-formed body with mutated fields, ``size``, ``raw``, ``media``, ``route``)."""

    method: str
    path: str
    content_type: str | None
    body: bytes
    case: str
    chunked: bool = False

    @property
    def kind(self) -> str:
        return self.case.split(":", 1)[0]


class Raw:
    """JSON text written as it is (numbers Python's json cannot write, duplicate keys, deep nesting)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dump(value: Any, ascii_only: bool = True) -> str:
    """``value`` as JSON text; ``Raw`` as is; NaN and infinities as Python writes them; with
    ``ascii_only`` every other character as ``\\uXXXX`` (as ``requests.post(json=...)`` sends)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        items = (
            f"{json.dumps(str(k), ensure_ascii=ascii_only)}: {dump(v, ascii_only)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        if value and all(item is value[0] for item in value) and isinstance(value[0], str):
            one = json.dumps(value[0], ensure_ascii=ascii_only)  # a repeated string: written once
            return "[" + ", ".join([one] * len(value)) + "]"
        return "[" + ", ".join(dump(item, ascii_only) for item in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def encode(value: Any, rng: random.Random) -> bytes:
    """``value`` as a body: mostly ASCII-only JSON, sometimes raw UTF-8 (lone surrogates then become bytes
    that are not UTF-8), sometimes with a byte order mark or surrounding whitespace."""
    roll = rng.random()
    if roll < 0.75:
        return dump(value).encode("ascii")
    text = dump(value, ascii_only=False)
    if roll < 0.92:
        return text.encode("utf-8", "surrogatepass")
    if roll < 0.96:
        return b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")
    return b" \n\t" + text.encode("utf-8", "surrogatepass") + b"\r\n "


# Characters by kind: what a string is made of.
ALPHABETS: dict[str, str] = {
    "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?!'-",
    "cjk": "".join(chr(c) for c in range(0x4E00, 0x4E00 + 400)),
    "emoji": "".join(chr(c) for c in range(0x1F600, 0x1F650)) + "\U0001f469\u200d\U0001f469\u200d\U0001f467",
    "combining": "e\u0301a\u0308o\u0303\u0336\u0489\u20dd",
    "bidi": "abc \u202e\u202d\u200f\u200e\u2066\u2069 \u05d0\u05d1 \u0627\u0644",
    "invisible": "\u200b\u200c\u200d\u2060\ufeff\u00ad x",
    "control": "".join(chr(c) for c in range(0, 32)) + "\x7f\x85",
    "nonchar": "\ufffe\uffff\ufdd0\U0001fffe\U0010ffff",
    "whitespace": " \t\n\r\u00a0\u2028\u2029\u3000",
    "markup": "<search></search><answer>\"'\\{}[]",
}
WORDS = ["lead", "singer", "capital", "river", "who", "what", "founded", "band", "city", "year", "the", "of"]


def text(rng: random.Random, length: int, alphabet: str | None = None) -> str:
    """A string of exactly ``length`` characters (code points) from ``alphabet`` (a random one if None; a
    long string repeats a random stretch of up to 64)."""
    if length <= 0:
        return ""
    if alphabet is None:
        alphabet = rng.choice([*ALPHABETS, "words", "words", "any"])
    if alphabet == "words":
        stretch = " ".join(rng.choice(WORDS) for _ in range(12)) + " "
    elif alphabet == "any":  # any code point UTF-8 can carry
        points = (rng.randrange(0x110000) for _ in range(min(length, 64)))
        stretch = "".join(chr(p) if not 0xD800 <= p <= 0xDFFF else "x" for p in points)
    else:
        stretch = "".join(rng.choice(ALPHABETS[alphabet]) for _ in range(min(length, 64)))
    return (stretch * (length // len(stretch) + 1))[:length]


def with_surrogate(rng: random.Random, value: str) -> str:
    """``value`` with a lone surrogate somewhere (Python decodes ``"\\ud800"`` from JSON; UTF-8 cannot)."""
    at = rng.randrange(len(value) + 1)
    return value[:at] + chr(rng.randrange(0xD800, 0xE000)) + value[at:]


def short_text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def odd_text(rng: random.Random) -> str:
    """A short string of any kind of characters (sometimes empty, sometimes a lone surrogate)."""
    value = text(rng, rng.randint(0, 12))
    return with_surrogate(rng, value) if rng.random() < 0.02 else value


def around(rng: random.Random, bound: int, *, past: float = 0.5) -> int:
    """A size at or just past ``bound``: bound - 1 or bound (within), bound + 1 or more (past) with
    probability ``past``."""
    if rng.random() < past:
        return rng.choice([bound + 1, bound + 1, bound + 2, 2 * bound, 10 * bound])
    return rng.choice([bound, bound, bound - 1, max(bound // 2, 1)])


INTEGERS = [0, -1, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 + 1, -(2**63) - 1, 10**40]
FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, 3.0, 1e-308, 5e-324, 1e308, float("nan"), float("inf"), float("-inf")]
# Past Python's int conversion limit (4300 digits), past a double's range, below its smallest value:
RAW_NUMBERS = [Raw("1" * 5000), Raw("-1e999"), Raw("1E400"), Raw("0.1e-9999")]
NUMBERS: list[Any] = [*INTEGERS, *FLOATS, *RAW_NUMBERS]


def deep(depth: int, rng: random.Random) -> Raw:
    """Arrays or objects nested ``depth`` deep (past Python's recursion limit from about 1000)."""
    if rng.random() < 0.5:
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a": ' * depth + "1" + "}" * depth)


def other_type(rng: random.Random, like: str) -> Any:
    """A value of another JSON type than ``like`` (``string``, ``number``, ``list``, ``bool``, ``object``)."""
    choices: list[Callable[[], Any]] = [
        lambda: None,
        lambda: rng.choice([True, False]),
        lambda: rng.choice(NUMBERS),
        lambda: short_text(rng),
        lambda: [short_text(rng), rng.choice(NUMBERS)],
        lambda: {"text": short_text(rng), "n": [1, {"x": None}]},
        lambda: [[short_text(rng)]],
        lambda: deep(rng.choice([5, 64, 2000, 100_000]), rng),
        lambda: [],
        lambda: {},
    ]
    skip = {"string": 3, "number": 2, "list": 4, "bool": 1, "object": 5}.get(like)
    options = [make for i, make in enumerate(choices) if i != skip]
    return rng.choice(options)()


def string_value(rng: random.Random, max_chars: int) -> str:
    """A string at or past ``max_chars`` characters, or one of odd text, sometimes with a lone surrogate."""
    roll = rng.random()
    if roll < 0.45:
        value = text(rng, around(rng, max_chars))
    elif roll < 0.85:
        value = text(rng, rng.randint(0, 40))
    else:
        value = rng.choice(["", " ", "\x00", "\u202e", "query: ", "<search>", "\n" * 50, "\ud800", "\udfff"])
    if rng.random() < 0.08:
        value = with_surrogate(rng, value)
    return value


def mutate_list(
    rng: random.Random, items: list[Any], bound: int, element: Callable[[], Any], short: Callable[[], Any]
) -> list[Any]:
    """``items`` with its length at or past ``bound`` (of ``short`` elements, cheap to send and to answer),
    or one element replaced by an ``element()`` or a value of another type."""
    roll = rng.random()
    if roll < 0.35:
        length = around(rng, bound, past=0.75)
        if rng.random() < 0.5:  # one repeated short string
            return [rng.choice(["a", "lead singer", "\u4e2d", "\U0001f600"])] * length
        return [short() for _ in range(min(length, 3 * bound))]
    items = (list(items) if isinstance(items, list) else []) or [element()]
    at = rng.randrange(len(items))
    items[at] = element() if roll < 0.75 else other_type(rng, "string")
    return items


def mutate_fields(
    rng: random.Random, fields: dict[str, Any], mutators: dict[str, Callable[[Any], Any]]
) -> tuple[dict[str, Any], list[str]]:
    """``fields`` with one to three of them mutated (or none: a valid request), each by its mutator, or
    dropped, or given another type; sometimes an unknown field added. Returns the fields and the names."""
    names: list[str] = []
    count = rng.choices([0, 1, 2, 3], weights=[12, 55, 23, 10])[0]
    for _ in range(count):
        name = rng.choice([*mutators, "unknown"])
        roll = rng.random()
        if name == "unknown":
            key = rng.choice(["extra", "", "\u00e9\u00e8", "queries ", "x" * 300, "\ud800"])
            fields[key] = other_type(rng, "none")
        elif roll < 0.1:
            fields.pop(name, None)
            name += "-dropped"
        elif roll < 0.3:
            fields[name] = other_type(rng, "")
            name += "-type"
        else:
            fields[name] = mutators[name](fields.get(name))
        names.append(name)
    return fields, names


# Endpoint bodies: a small valid one, and a mutator per field.
def retrieve_fields(rng: random.Random, limits: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    fields: dict[str, Any] = {
        "queries": [short_text(rng) for _ in range(rng.randint(1, 4))],
        "topk": rng.randint(1, 5),
    }
    if rng.random() < 0.5:
        fields["return_scores"] = rng.choice([True, False])
    chars = limits["max_query_chars"]
    mutators: dict[str, Callable[[Any], Any]] = {
        "queries": lambda items: mutate_list(
            rng, items or [], limits["max_queries"], lambda: string_value(rng, chars), lambda: odd_text(rng)
        ),
        "topk": lambda _: rng.choice(
            [around(rng, limits["max_topk"]), 0, -1, "3", True, None, rng.choice(NUMBERS)]
        ),
        "return_scores": lambda _: rng.choice([True, False, "true", 1, 0, None, [], {}]),
    }
    return mutate_fields(rng, fields, mutators)


def _sampling_mutators(rng: random.Random, limits: dict[str, int]) -> dict[str, Callable[[Any], Any]]:
    return {
        "max_tokens": lambda _: rng.choice(
            [around(rng, limits["max_tokens"]), 0, -1, 1, None, "8", rng.choice(NUMBERS)]
        ),
        "temperature": lambda _: rng.choice([0, 0.7, 2, 2.0000001, -0.1, 1e-308, None, "0.5", *NUMBERS]),
        "top_p": lambda _: rng.choice([1, 0.9, 1e-308, 0, -0.1, 1.0000001, None, *NUMBERS]),
        "n": lambda _: rng.choice([1, 1.0, 2, 0, -1, None, "1", 2**64]),
        "stream": lambda _: rng.choice([False, True, None, "false", 0]),
        "seed": lambda _: rng.choice([None, 0, 7, 2**63 - 1, 2**63, -1, 1.5, "7", *NUMBERS]),
        "stop": lambda value: rng.choice(
            [
                None,
                string_value(rng, 64),
                mutate_list(
                    rng,
                    value if isinstance(value, list) else [],
                    8,
                    lambda: string_value(rng, 64),
                    lambda: ".",
                ),
            ]
        ),
        "model": lambda _: rng.choice([None, SERVED_MODEL_NAME, "gpt-4", "", string_value(rng, 300)]),
    }


def _sampling_fields(rng: random.Random) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if rng.random() < 0.5:
        fields["max_tokens"] = rng.randint(1, DEFAULT_MAX_TOKENS)
    if rng.random() < 0.3:
        fields["temperature"] = rng.choice([0, 0.1, 0.7, 1.0])
    if rng.random() < 0.2:
        fields["seed"] = rng.randint(0, 1000)
    if rng.random() < 0.2:
        fields["stop"] = [rng.choice(["\n", ".", "</answer>"])]
    if rng.random() < 0.2:
        fields["model"] = SERVED_MODEL_NAME
    return fields


def token_heavy(rng: random.Random, limits: dict[str, int]) -> str:
    """Text near the prompt token bound (words are about a token each for the tiny judge's tokenizer)."""
    return text(rng, 5 * around(rng, limits["max_prompt_tokens"]), "words")


def completion_fields(rng: random.Random, limits: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    prompts = [short_text(rng) for _ in range(rng.randint(1, 3))]
    fields = {"prompt": prompts if rng.random() < 0.6 else prompts[0], **_sampling_fields(rng)}
    chars = limits["max_prompt_chars"]

    def prompt(value: Any) -> Any:
        roll = rng.random()
        if roll < 0.3:
            return string_value(rng, chars)
        if roll < 0.45:
            return token_heavy(rng, limits)
        items = value if isinstance(value, list) else []
        return mutate_list(
            rng, items, limits["max_prompts"], lambda: string_value(rng, chars), lambda: odd_text(rng)
        )

    return mutate_fields(rng, fields, {"prompt": prompt, **_sampling_mutators(rng, limits)})


def chat_fields(rng: random.Random, limits: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    messages: list[Any] = [{"role": "user", "content": short_text(rng)}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Answer briefly."})
    fields: dict[str, Any] = {"messages": messages, **_sampling_fields(rng)}
    if rng.random() < 0.3:
        fields["max_completion_tokens"] = fields.pop("max_tokens", rng.randint(1, DEFAULT_MAX_TOKENS))
    chars = limits["max_prompt_chars"]

    def message() -> Any:
        roll = rng.random()
        role = rng.choice(["user", "assistant", "system", "tool", "developer", "", "\u202e", "x" * 100])
        if roll < 0.6:
            return {"role": role, "content": string_value(rng, chars)}
        if roll < 0.7:
            return {"role": "user", "content": token_heavy(rng, limits)}
        if roll < 0.8:
            return {"role": "user", "content": [{"type": "text", "text": "hi"}]}  # OpenAI's parts form
        one = {"role": role, "content": short_text(rng)}
        one[rng.choice(["role", "content"])] = other_type(rng, "string")
        if rng.random() < 0.3:
            one.pop(rng.choice(["role", "content"]))
        return one

    def mutate_messages(value: Any) -> Any:
        items = value if isinstance(value, list) else []
        if rng.random() < 0.1:
            return []
        short = lambda: {"role": rng.choice(["user", "assistant"]), "content": odd_text(rng)}  # noqa: E731
        return mutate_list(rng, items, limits["max_prompt_tokens"], message, short)

    mutators = {
        "messages": mutate_messages,
        "max_completion_tokens": lambda _: rng.choice([around(rng, limits["max_tokens"]), 0, None, "4"]),
        **_sampling_mutators(rng, limits),
    }
    return mutate_fields(rng, fields, mutators)


FIELDS = {"retrieve": retrieve_fields, "completions": completion_fields, "chat": chat_fields}
NEIGHBOURS = {
    "retrieve": ["/", "/health", "/retrieve/", "/docs", "/openapi.json", "/x", "/retrieve/x", "/Retrieve"],
    "completions": ["/v1/models", "/health", "/v1/completions/", "/v1/embeddings", "/v2/completions", "/v1"],
    "chat": ["/v1/chat", "/v1/chat/completions/x", "/v1/models", "/v1/chat/completion", "/health"],
}
OTHER_METHODS = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
OTHER_MEDIA = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/octet-stream",
    "application/xml",
    "text/json",
    "json",
    ";",
    "application/json\x7f",
]
JSON_MEDIA = [
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "application/x+json",
    None,
]
RAW_BODIES = [
    b"",
    b"{",
    b"}",
    b'{"queries": ["a"',
    b'{"prompt": "a"',
    b"\xff\xfe\x00\x00",
    b"\xc3\x28",
    b"null",
    b"[]",
    b'"x"',
    b"1e999",
    b"NaN",
    b"{'a': 1}",
    b'{"a": 1,}',
    b'{"a": 1} {"a": 2}',
    b"\x00" * 64,
    '{"prompt": "é"}'.encode("utf-16"),
    '{"queries": ["é"], "topk": 1}'.encode("utf-32"),
]


def draw(endpoint: str, index: int, seed: int, limits: dict[str, dict[str, int]]) -> FuzzRequest:
    """Request ``index`` of ``endpoint`` for ``seed`` (the same in every process)."""
    rng = random.Random(f"{endpoint}:{seed}:{index}")
    path = ENDPOINTS[endpoint]
    service_limits = limits[SERVICE[endpoint]]
    roll = rng.random()
    if roll < 0.04:  # another method
        body = encode(FIELDS[endpoint](rng, service_limits)[0], rng) if rng.random() < 0.5 else b""
        method = rng.choice(OTHER_METHODS)
        return FuzzRequest(method, path, "application/json", body, f"route:method {method}")
    if roll < 0.07:  # another path
        if rng.random() < 0.6:
            other = rng.choice(NEIGHBOURS[endpoint])
        else:
            other = "/" + quote(text(rng, rng.choice([3, 20, 3000])), safe="/?=&%")
        body = encode(FIELDS[endpoint](rng, service_limits)[0], rng)
        return FuzzRequest("POST", other, "application/json", body, "route:path")
    if roll < 0.10:  # a content type that is not JSON, or none
        media = rng.choice(OTHER_MEDIA)
        return FuzzRequest(
            "POST", path, media, encode(FIELDS[endpoint](rng, service_limits)[0], rng), "media"
        )
    if roll < 0.15:  # bytes that are not a JSON object
        body = rng.choice(
            [
                *RAW_BODIES,
                bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))),
                dump(deep(rng.choice([10, 1000, 100_000]), rng)).encode(),
                encode(FIELDS[endpoint](rng, service_limits)[0], rng)[: rng.randint(1, 40)],
                dump(other_type(rng, "object")).encode(),
            ]
        )
        return FuzzRequest("POST", path, "application/json", body, "raw", chunked=rng.random() < 0.2)
    if roll < 0.165:  # a body at or past max_body_bytes
        return size_case(rng, endpoint, path, service_limits)
    fields, names = FIELDS[endpoint](rng, service_limits)
    media = rng.choice(JSON_MEDIA) if rng.random() < 0.2 else "application/json"
    case = "fields:" + (",".join(names) or "valid")
    return FuzzRequest("POST", path, media, encode(fields, rng), case, chunked=rng.random() < 0.03)


def size_case(rng: random.Random, endpoint: str, path: str, limits: dict[str, int]) -> FuzzRequest:
    """A small valid body padded with whitespace to ``max_body_bytes`` (answered) or past it (413), sent
    with Content-Length or chunked; or a long string past it."""
    limit = limits["max_body_bytes"]
    small = {
        "retrieve": {"queries": ["lead singer"], "topk": 2},
        "completions": {"prompt": "hello", "max_tokens": 2},
        "chat": {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2},
    }[endpoint]
    core = dump(small).encode()
    size = rng.choice([limit, limit - 1, limit + 1, limit + 1, limit + 4096, limit + limit // 4])
    chunked = rng.random() < 0.5
    if rng.random() < 0.7:
        body = core[:-1] + b" " * max(size - len(core), 0) + core[-1:]
        detail = f"padded to max_body_bytes{size - limit:+d}"
    else:
        key = {"retrieve": "queries", "completions": "prompt", "chat": "messages"}[endpoint]
        body = b'{"' + key.encode() + b'": ["' + b"x" * max(size - len(key) - 10, 0) + b'"]}'
        detail = f"one string, body max_body_bytes{len(body) - limit:+d}"
    return FuzzRequest("POST", path, "application/json", body, f"size:{detail}", chunked=chunked)


def generate(
    endpoint: str, count: int, seed: int, limits: dict[str, dict[str, int]]
) -> Iterator[FuzzRequest]:
    """``count`` requests of ``endpoint``, drawn one at a time (a body is built only when it is sent)."""
    for index in range(count):
        yield draw(endpoint, index, seed, limits)


# --- answers ---------------------------------------------------------------------------------------------
STAGES = ("http", "route", "size", "media", "json", "schema", "bounds", "answered", "other")


def stage(status: int, text: str) -> str:
    """Which part of the server answered: the HTTP server or proxy itself (a 4xx that is not our JSON,
    e.g. uvicorn's for a header value it cannot parse), the router (404, 405), the body's size (413
    before reading it), its media type (415), its JSON, the schema, the endpoint's own bounds (after the
    schema, or a list length checked just before it), or the endpoint's work (200). ``other``: anything
    else."""
    if status == 200:
        return "answered"
    if status in (404, 405) and not text:  # HEAD: no body
        return "route"
    try:
        answer = json.loads(text)
    except ValueError:
        return "http" if 400 <= status < 500 else "other"
    if not isinstance(answer, dict):
        return "other"
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else answer.get("detail")
    if not isinstance(message, str):
        return "other"
    if status in (404, 405) and message in ("Not Found", "Method Not Allowed"):
        return "route"
    if message.startswith(("the request body", "malformed request: Content-Length", "the client went away")):
        return "size"
    if message.startswith("the body must be JSON"):
        return "media"
    if message.startswith("malformed request: the body"):
        return "json"
    if message.startswith("malformed request:"):
        return "schema"
    return "bounds"


@dataclass
class FuzzResult:
    """Answers by status code and by stage; ``failures`` holds up to 20 (request, status, answer) for each
    5xx or transport error (status 0), ``others`` up to 5 of those answered by no known stage,
    ``slowest`` the 10 slowest (seconds, case, status)."""

    statuses: Counter = field(default_factory=Counter)
    stages: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    failures: list[tuple[FuzzRequest, int, str]] = field(default_factory=list)
    others: list[tuple[FuzzRequest, int, str]] = field(default_factory=list)
    slowest: list[tuple[float, str, int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500 or status == 0)

    def share(self, *stages: str) -> float:
        return sum(self.stages[s] for s in stages) / max(self.requests, 1)

    def summary(self) -> dict[str, Any]:
        """The figures as JSON: counts, the share that reached the endpoint with a JSON object
        (``parsed``: schema, bounds or answered) and past its schema (``past_schema``), the 5xx."""
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 1),
            "status_counts": {str(k): v for k, v in sorted(self.statuses.items())},
            "stage_counts": {s: self.stages[s] for s in STAGES if self.stages[s]},
            "case_kinds": dict(sorted(self.kinds.items())),
            "share_parsed": round(self.share("schema", "bounds", "answered"), 4),
            "share_past_schema": round(self.share("bounds", "answered"), 4),
            "share_answered": round(self.share("answered"), 4),
            "5xx": self.server_errors,
            "examples_5xx": [f"{status} {describe(r)} -> {text}" for r, status, text in self.failures],
            "examples_other": [f"{status} {describe(r)} -> {text}" for r, status, text in self.others],
            "slowest": [[round(s, 2), case, status] for s, case, status in self.slowest],
        }


def _chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def send(base_url: str, batch: Iterable[FuzzRequest], workers: int = 8, timeout: float = 120.0) -> FuzzResult:
    """Send every request, ``workers`` at a time (one session per worker thread; at most twice that many
    drawn ahead), and count the answers."""
    import requests

    local = threading.local()
    result = FuzzResult()
    lock = threading.Lock()

    def one(request: FuzzRequest) -> None:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        headers = {"content-type": request.content_type} if request.content_type else {}
        data: Any = _chunks(request.body) if request.chunked else request.body
        started = time.perf_counter()
        try:
            response = local.session.request(
                request.method, base_url + request.path, data=data, headers=headers, timeout=timeout
            )
            status, answer = response.status_code, response.text[:300]
        except requests.RequestException as error:
            status, answer = 0, f"{type(error).__name__}: {error}"[:300]
            local.session = requests.Session()
        seconds = time.perf_counter() - started
        with lock:
            result.statuses[status] += 1
            answered_by = "other" if status == 0 else stage(status, answer)
            result.stages[answered_by] += 1
            if answered_by == "other" and status != 0 and len(result.others) < 5:
                result.others.append((request, status, answer))
            result.kinds[request.kind] += 1
            if (status >= 500 or status == 0) and len(result.failures) < 20:
                result.failures.append((request, status, answer))
            result.slowest = sorted([*result.slowest, (seconds, request.case, status)], reverse=True)[:10]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: set = set()
        for request in batch:
            if len(pending) >= 2 * workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
            pending.add(pool.submit(one, request))
        for future in pending:
            future.result()
    result.seconds = time.perf_counter() - started
    return result


def describe(request: FuzzRequest) -> str:
    """A short printable form of a request (for failure reports)."""
    body = request.body if len(request.body) <= 200 else request.body[:200] + b"..."
    how = "chunked" if request.chunked else f"{len(request.body)} bytes"
    return f"[{request.case}] {request.method} {request.path[:80]!r} [{request.content_type}] {how} {body!r}"


# --- the services ----------------------------------------------------------------------------------------
def build_assets(root: Path) -> dict[str, str]:
    """A BM25 index of a 300-passage synthetic corpus and a tiny Gemma-3 judge under ``root`` (once)."""
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
    from rllib_search.llm.tiny import build_tiny_tokenizer
    from rllib_search.serve.retrieval.build import build_index
    from tests.helpers import build_tiny_sliding_window_lm

    root.mkdir(parents=True, exist_ok=True)
    if not (root / "bm25" / "manifest.json").exists():
        world = generate_world(SyntheticWorldConfig(seed=3, num_passages=300, num_train=0, num_test=5))
        write_corpus_jsonl(world.passages, root / "corpus.jsonl")
        build_index(root / "corpus.jsonl", root / "bm25", "bm25", progress=False)
    if not (root / "judge" / "config.json").exists():
        build_tiny_sliding_window_lm(root / "judge", build_tiny_tokenizer(root / "tok"))
    return {"index_dir": str(root / "bm25"), "judge_dir": str(root / "judge")}


def app_args(assets: dict[str, str], limits: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """The builder arguments of the retriever and the judge at ``limits``, one replica of one CPU each."""
    return {
        "retriever": {
            "index_dir": assets["index_dir"],
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 1},
            "limits": limits["retriever"],
            "max_batch_queries": limits["retriever"]["max_queries"],
        },
        "judge": {
            "model": assets["judge_dir"],
            "served_model_name": SERVED_MODEL_NAME,
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 1},
            "limits": limits["judge"],
            "max_batch_prompts": limits["judge"]["max_prompts"],
            "default_max_tokens": DEFAULT_MAX_TOKENS,
        },
    }


@dataclass
class Services:
    """Both services on a local Ray in a subprocess: ``retriever`` and ``judge`` are base URLs."""

    process: subprocess.Popen
    retriever: str
    judge: str
    log: Path

    def stop(self, timeout: float = 120.0) -> None:
        """Shut Serve and Ray down (the child does on end of input), or kill the child."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=30)


def start_services(
    assets: dict[str, str], limits: dict[str, dict[str, int]], ingress: str, log: Path, timeout: float = 300
) -> Services:
    """The retriever at ``/`` and the judge at ``/judge`` on 127.0.0.1, on a local Ray of their own in a
    subprocess, through ``ingress`` (``proxy``: Serve's proxy actor; ``haproxy``: Ray's high-throughput
    mode, HAProxy forwarding to each replica's own HTTP server)."""
    from rllib_search.serve.http.ports import free_port

    if ingress not in INGRESSES:
        raise ValueError(f"ingress must be one of {INGRESSES}, got {ingress!r}")
    port = free_port()
    env = dict(os.environ)
    if ingress == "haproxy":
        from rllib_search.serve.cli import HIGH_THROUGHPUT_ENV

        env.update(HIGH_THROUGHPUT_ENV)
        # HAProxy's stats and metrics frontends bind fixed ports unless told otherwise (see
        # tests/test_retriever_service.py): free ones, so that a busy machine does not stop HAProxy.
        stats = free_port(exclude=[port])
        env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(stats)
        env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_port(exclude=[port, stats]))
    config = json.dumps({"port": port, "args": app_args(assets, limits)})
    command = [sys.executable, "-m", "tests.http_fuzz", "serve", config]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    services = Services(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/judge", log)
    deadline = time.monotonic() + timeout
    while "FUZZ SERVICES READY" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            services.stop(timeout=30)
            raise RuntimeError(f"the {ingress} services did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1.0)
    return services


def _serve(config_json: str) -> None:
    """The child of :func:`start_services`: Ray, Serve, both apps; serve until standard input ends."""
    import ray
    from ray import serve

    from rllib_search.serve.cluster import patient_serve_proxies
    from rllib_search.serve.judge.deployment import build_judge_app
    from rllib_search.serve.retrieval.deployment import build_retriever_app

    config = json.loads(config_json)
    patient_serve_proxies()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    quiet = {"enable_access_log": False, "log_level": "WARNING"}  # tens of thousands of requests
    serve.start(http_options={"host": "127.0.0.1", "port": config["port"]}, logging_config=quiet)
    serve.run(build_retriever_app(config["args"]["retriever"]), name="retriever", route_prefix="/")
    serve.run(build_judge_app(config["args"]["judge"]), name="judge", route_prefix="/judge")
    ready = ["FUZZ SERVICES READY", os.environ.get("RAY_SERVE_ENABLE_HA_PROXY", "0")]
    print(" ".join(ready), flush=True)
    sys.stdin.read()
    serve.shutdown()
    ray.shutdown()


def still_answering(retriever: str, judge: str) -> dict[str, bool]:
    """Whether each service answers a valid request with 200 and a well-formed body."""
    import requests

    retrieve = requests.post(
        f"{retriever}/retrieve", json={"queries": ["lead singer"], "topk": 2}, timeout=60
    )
    completion = requests.post(
        f"{judge}/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=60
    )
    chat = requests.post(
        f"{judge}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60
    )
    return {
        "retriever": retrieve.status_code == 200 and len(retrieve.json()["result"][0]) == 2,
        "judge": completion.status_code == 200 and len(completion.json()["choices"]) == 1,
        "judge chat": chat.status_code == 200 and len(chat.json()["choices"]) == 1,
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(sys.argv[2])
    else:
        raise SystemExit(f"usage: python -m tests.http_fuzz serve CONFIG_JSON, not {sys.argv[1:]}")
