"""Generated HTTP requests for fuzzing the retriever's ``/retrieve`` and the judge's OpenAI subset (shared by
``tests/test_http_fuzz.py`` and ``benchmarks/fuzz_http.py``).

Hypothesis strategies draw a request: a method, a path (mostly the endpoint, sometimes a neighbour or
garbage), a content type and a body that is one of: a well-formed body with extreme values (huge, empty,
unicode and lone-surrogate strings, huge or negative numbers, NaN and infinities), a well-formed body with
fields of the wrong JSON type, any JSON document, deeply nested JSON, or raw bytes (invalid JSON or UTF-8).
``draw_requests`` collects ``count`` of them from seeded runs of hypothesis; ``draw_requests_isolated`` does
it in a fresh interpreter, because Hypothesis also draws constants it finds in the source of every local
module loaded (``hypothesis/internal/conjecture/providers.py``), so in a pytest session the draws depend on
which test modules were collected; in a fresh interpreter the same seed always gives the same requests.
``send`` posts them concurrently and counts the answers by status.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote

import requests
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/octet-stream",
    None,
)


@dataclass(frozen=True)
class FuzzRequest:
    """One generated request (``path`` is appended to the service's base URL)."""

    method: str
    path: str
    content_type: str | None
    body: bytes


# --- JSON values ---------------------------------------------------------------------------------------
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=200),  # any code point UTF-8 can carry
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(["", " ", "\x00", "\u202e", "👩‍👩‍👧", "query: ", "<search>", "\n" * 50]),
    st.integers(1, 5000).map(lambda n: "x" * n),
    st.integers(1, 3000).map(lambda n: "word " * n),
)
short_texts = st.text(max_size=10)
numbers = st.one_of(
    st.integers(-3, 300),
    st.integers(),  # arbitrary size
    st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=25,
)


def _long_list(element: st.SearchStrategy) -> st.SearchStrategy:
    """A list well beyond a bound: the same element repeated (cheap to draw, large to send)."""
    return st.tuples(element, st.sampled_from([65, 257, 1025, 3000])).map(lambda pair: [pair[0]] * pair[1])


def fields(**strategies: st.SearchStrategy) -> st.SearchStrategy:
    """A JSON object with any subset of the given fields, sometimes an extra unknown one."""
    return st.fixed_dictionaries({}, optional={**strategies, "unknown_field": json_values})


# --- request bodies per endpoint -------------------------------------------------------------------------
plain_texts = st.text(st.characters(codec="utf-8"), max_size=60)
retrieve_bodies = st.one_of(
    st.fixed_dictionaries(  # within the bounds but for the odd value: exercises the search itself
        {"queries": st.lists(plain_texts, max_size=8), "topk": st.integers(0, 12)},
        optional={"return_scores": st.booleans()},
    ),
    fields(
        queries=st.one_of(st.lists(texts, max_size=8), _long_list(short_texts)),
        topk=numbers,
        return_scores=st.booleans(),
    ),
    fields(queries=json_values, topk=json_values, return_scores=json_values),
)
chat_messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": texts}),
        fields(role=json_values, content=json_values),
    ),
    max_size=4,
)
sampling = {
    "model": st.one_of(st.none(), st.sampled_from(["tiny-judge", "gpt-4"]), texts),
    "max_tokens": st.one_of(st.integers(-2, 20), numbers),
    "temperature": st.one_of(st.floats(0, 2), numbers),
    "top_p": st.one_of(st.floats(0, 1), numbers),
    "n": st.one_of(st.just(1), numbers),
    "stop": st.one_of(st.none(), texts, st.lists(texts, max_size=10)),
    "stream": st.booleans(),
    "seed": st.one_of(st.none(), numbers),
}
completion_bodies = st.one_of(
    st.fixed_dictionaries(
        {"prompt": st.one_of(plain_texts, st.lists(plain_texts, max_size=9))},
        optional={
            "max_tokens": st.integers(0, 17),
            "temperature": st.floats(0, 2.5),
            "top_p": st.floats(0, 1),
            "seed": st.integers(-1, 2**64),
            "stop": st.lists(plain_texts, max_size=3),
            "model": st.sampled_from(["tiny-judge", "other"]),
        },
    ),
    fields(prompt=st.one_of(texts, st.lists(texts, max_size=10), _long_list(short_texts)), **sampling),
    fields(prompt=json_values, max_tokens=json_values, temperature=json_values, stop=json_values),
)
chat_bodies = st.one_of(
    st.fixed_dictionaries(
        {
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": plain_texts}
                ),
                max_size=4,
            )
        },
        optional={"max_completion_tokens": st.integers(0, 17), "temperature": st.floats(0, 2.5)},
    ),
    fields(messages=chat_messages, max_completion_tokens=st.one_of(st.integers(-2, 20), numbers), **sampling),
    fields(messages=json_values, max_completion_tokens=json_values, seed=json_values),
)


def _encode(value: object) -> bytes:
    """JSON as Python writes it: NaN and Infinity literals pass (as many clients send them), lone
    surrogates become ``\\udXXX`` escapes."""
    return json.dumps(value).encode("ascii")


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def bodies(objects: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Request bodies: mostly the endpoint's objects, then any JSON, deep nesting and raw bytes."""
    return st.one_of(
        objects.map(_encode),
        objects.map(_encode),
        objects.map(_encode),
        json_values.map(_encode),
        st.sampled_from([10, 1000, 10_000, 100_000]).map(_nested),
        st.binary(max_size=200),
        st.sampled_from([b"", b"{", b'{"queries": ["a"', b"\xff\xfe\x00", b"null", b"[]", b'"x"']),
    )


def requests_for(path: str, objects: st.SearchStrategy, neighbours: tuple[str, ...]) -> st.SearchStrategy:
    """Requests aimed at ``path``: mostly POST with a JSON content type, sometimes another method, content
    type or path."""
    garbage = st.text(st.characters(codec="utf-8"), max_size=20).map(lambda t: "/" + quote(t, safe="/?=&%"))
    paths = st.one_of(st.just(path), st.just(path), st.just(path), st.sampled_from(neighbours), garbage)
    methods = st.one_of(st.just("POST"), st.just("POST"), st.sampled_from(METHODS))
    content_types = st.one_of(st.just("application/json"), st.sampled_from(CONTENT_TYPES))
    return st.builds(FuzzRequest, methods, paths, content_types, bodies(objects))


def retrieve_requests() -> st.SearchStrategy[FuzzRequest]:
    return requests_for("/retrieve", retrieve_bodies, ("/", "/health", "/retrieve/", "/docs", "/x"))


def judge_requests() -> st.SearchStrategy[FuzzRequest]:
    neighbours = ("/v1/models", "/health", "/v1/completions/", "/v1/embeddings", "/v2/completions")
    return st.one_of(
        requests_for("/v1/completions", completion_bodies, neighbours),
        requests_for("/v1/chat/completions", chat_bodies, neighbours),
    )


def draw_requests(
    strategy: st.SearchStrategy[FuzzRequest], count: int, seed_value: int = 0
) -> list[FuzzRequest]:
    """``count`` requests from ``strategy``, the same ones for the same seed (hypothesis drives the
    drawing, seeded per chunk of 1000 with ``seed_value``, ``seed_value + 1``, ...; see
    :func:`draw_requests_isolated` for why the same seed can still draw differently in a pytest session)."""
    drawn: list[FuzzRequest] = []
    chunk = 0
    while len(drawn) < count:
        wanted = min(1000, count - len(drawn))

        @seed(seed_value + chunk)
        @settings(
            max_examples=wanted,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def collect(request: FuzzRequest) -> None:
            drawn.append(request)

        before = len(drawn)
        collect()
        if len(drawn) == before:
            raise RuntimeError("hypothesis drew no requests")
        chunk += 1
    return drawn[:count]


STRATEGIES = {"retrieve": "retrieve_requests", "judge": "judge_requests"}


def draw_requests_isolated(kind: str, count: int, seed_value: int = 0) -> list[FuzzRequest]:
    """:func:`draw_requests` of ``retrieve_requests()`` or ``judge_requests()`` (``kind``) in a fresh Python
    that imports only this module: the same requests for the same seed, whatever this process loaded."""
    import base64
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "tests.http_fuzz", kind, str(count), str(seed_value)]
    out = subprocess.run(command, cwd=root, check=True, capture_output=True, text=True, timeout=900).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [
        FuzzRequest(row["method"], row["path"], row["content_type"], base64.b64decode(row["body"]))
        for row in rows
    ]


def _print_drawn(kind: str, count: int, seed_value: int) -> None:
    import base64

    for request in draw_requests(globals()[STRATEGIES[kind]](), count, seed_value):
        row = {
            "method": request.method,
            "path": request.path,
            "content_type": request.content_type,
            "body": base64.b64encode(request.body).decode("ascii"),
        }
        print(json.dumps(row))


@dataclass
class FuzzResult:
    """Answers by status code; ``failures`` holds up to 20 (request, status, answer) for each 5xx or
    transport error (status 0)."""

    statuses: Counter
    failures: list[tuple[FuzzRequest, int, str]]

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500 or status == 0)


def send(base_url: str, batch: list[FuzzRequest], workers: int = 8, timeout: float = 120.0) -> FuzzResult:
    """Send every request (``workers`` at a time, one session per worker thread) and count the answers."""
    import threading

    local = threading.local()

    def one(request: FuzzRequest) -> tuple[FuzzRequest, int, str]:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        headers = {"content-type": request.content_type} if request.content_type else {}
        try:
            response = local.session.request(
                request.method, base_url + request.path, data=request.body, headers=headers, timeout=timeout
            )
        except requests.RequestException as error:
            return request, 0, f"{type(error).__name__}: {error}"
        return request, response.status_code, response.text[:300]

    statuses: Counter = Counter()
    failures: list[tuple[FuzzRequest, int, str]] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for request, status, text in pool.map(one, batch):
            statuses[status] += 1
            if (status >= 500 or status == 0) and len(failures) < 20:
                failures.append((request, status, text))
    return FuzzResult(statuses, failures)


def describe(request: FuzzRequest) -> str:
    """A short printable form of a request (for failure reports)."""
    body = request.body if len(request.body) <= 200 else request.body[:200] + b"..."
    return f"{request.method} {request.path!r} [{request.content_type}] {body!r}"


if __name__ == "__main__":
    import sys

    _print_drawn(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
