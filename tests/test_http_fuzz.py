"""Fuzzed HTTP against the retriever's ``/retrieve`` and the judge's ``/v1/completions`` and
``/v1/chat/completions`` at the shipped request bounds, through Serve's proxy actor (apps added to the
session's Serve) and through HAProxy (Ray's high-throughput mode, on a Ray of its own in a subprocess): a few
hundred generated requests per endpoint and ingress (``tests/http_fuzz.py``; ``benchmarks/fuzz_http.py``
sends 5,000 per endpoint and ingress), most of them parsed by the endpoint, none answered with a 5xx, and
each service still answering afterwards. Then the body size limit, end to end: refused from Content-Length
before the body is read, and a chunked body refused before its end; and the causes of 5xx and of
minute-long answers that fuzzing found, each a 4xx now."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from tests.http_fuzz import (
    ENDPOINTS,
    SERVICE,
    Services,
    app_args,
    build_assets,
    describe,
    generate,
    send,
    shipped_limits,
    start_services,
    still_answering,
)

pytestmark = pytest.mark.slow

REQUESTS = 200  # per endpoint and ingress
SEED = 14


@pytest.fixture(scope="module")
def limits():
    return shipped_limits()


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets(tmp_path_factory.mktemp("fuzz_assets"))


@pytest.fixture(scope="module")
def proxy_services(service, assets, limits):
    """The retriever and the judge at the shipped bounds, as apps of the session's Serve (its proxy actor),
    under ``/fuzzr`` and ``/fuzzj``."""
    from ray import serve

    from rllib_search.serve.judge.deployment import build_judge_app
    from rllib_search.serve.retrieval.deployment import build_retriever_app

    args = app_args(assets, limits)
    for app in args.values():
        app["ray_actor_options"] = {"num_cpus": 0.5}  # beside the session's apps in its 4 CPUs
    serve.run(build_retriever_app(args["retriever"]), name="fuzz_retriever", route_prefix="/fuzzr")
    serve.run(build_judge_app(args["judge"]), name="fuzz_judge", route_prefix="/fuzzj")
    base = service.rsplit("/", 1)[0]
    yield Services(None, f"{base}/fuzzr", f"{base}/fuzzj", None)
    serve.delete("fuzz_retriever")
    serve.delete("fuzz_judge")


@pytest.fixture(scope="module")
def haproxy_services(assets, limits, tmp_path_factory):
    """Both services on a Ray of their own started in HAProxy mode (``--high-throughput``'s settings)."""
    services = start_services(assets, limits, "haproxy", tmp_path_factory.mktemp("haproxy") / "serve.log")
    yield services
    services.stop()


@pytest.fixture(params=["proxy", "haproxy"])
def services(request) -> Services:
    return request.getfixturevalue(f"{request.param}_services")


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_fuzzed_requests_never_get_a_5xx(services, endpoint, limits):
    base = services.retriever if SERVICE[endpoint] == "retriever" else services.judge
    result = send(base, generate(endpoint, REQUESTS, SEED, limits), workers=4)
    failures = "\n".join(f"{status} {describe(r)} -> {text}" for r, status, text in result.failures)
    assert result.server_errors == 0, f"{result.server_errors} 5xx or transport errors:\n{failures}"
    assert result.requests == REQUESTS
    assert result.statuses[200] > 0 and any(400 <= s < 500 for s in result.statuses), result.statuses
    # Most requests reach the endpoint with a JSON object it parses; every answer comes from a known stage.
    assert result.share("schema", "bounds", "answered") > 0.6, result.summary()
    assert result.stages["other"] == 0, result.summary()["examples_other"]
    assert all(still_answering(services.retriever, services.judge).values())


def _raw_http(url: str, head: str, body_parts, timeout: float = 60.0) -> str:
    """Send ``head`` and the ``body_parts`` over one socket and return the first line of the answer; a
    body part the server refuses to take (the connection closed) ends the sending."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        try:
            for part in body_parts:
                sock.sendall(part)
        except OSError:
            pass
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def _head(url: str, path: str, length_header: str) -> str:
    host = url.split("//", 1)[1].split("/", 1)[0]
    prefix = "/" + url.split("//", 1)[1].split("/", 1)[1] if url.count("/") > 2 else ""
    return (
        f"POST {prefix}{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{length_header}\r\n\r\n"
    )


def test_a_body_past_the_limit_is_refused_before_it_is_read(services, limits):
    """Content-Length past ``max_body_bytes``: 413 with a message, answered with none of the body sent. A
    chunked body: 413 once it passes the limit, without waiting for its end. At the limit: answered."""
    limit = limits["retriever"]["max_body_bytes"]
    url = services.retriever
    declared = _raw_http(url, _head(url, "/retrieve", "Content-Length: 10000000000"), [])
    assert declared.split()[1] == "413", declared
    answer = requests.post(
        f"{url}/retrieve", data=b" " * (limit + 1), headers={"content-type": "application/json"}, timeout=60
    )
    assert answer.status_code == 413 and "at most" in answer.json()["detail"], answer.text

    chunk = b" " * 65536
    parts = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // len(chunk) + 2))  # no last chunk
    chunked = _raw_http(url, _head(url, "/retrieve", "Transfer-Encoding: chunked"), parts)
    assert chunked.split()[1] == "413", chunked

    small = b'{"queries": ["lead singer"], "topk": 2}'
    padded = small[:-1] + b" " * (limit - len(small)) + small[-1:]
    at_limit = requests.post(
        f"{url}/retrieve", data=iter([padded]), headers={"content-type": "application/json"}, timeout=120
    )
    assert at_limit.status_code == 200 and len(at_limit.json()["result"][0]) == 2

    judge_limit = limits["judge"]["max_body_bytes"]
    judge = _raw_http(
        services.judge, _head(services.judge, "/v1/completions", f"Content-Length: {judge_limit + 1}"), []
    )
    assert judge.split()[1] == "413", judge


def test_what_fuzzing_found_is_a_4xx(proxy_services, limits):
    """Lone surrogates (tokenizers refuse them; FastAPI's default 422 echoed them and failed to encode), an
    empty chat, a temperature or top_p that underflows fp32, seeds beyond 64 bits; a list of a million
    numbers where strings belong (pydantic lists a million errors and FastAPI copied the list twice:
    minutes), a list of stop strings or messages as long."""
    retrieve = f"{proxy_services.retriever}/retrieve"
    headers = {"content-type": "application/json"}
    answer = requests.post(retrieve, data=b'{"queries": ["\\ud897"], "topk": 2}', headers=headers, timeout=60)
    assert answer.status_code == 422 and "not valid Unicode" in answer.json()["detail"]
    answer = requests.post(
        retrieve, data=b'{"queries": "x", "topk": ["\\ud897"]}', headers=headers, timeout=60
    )
    assert answer.status_code == 422 and "malformed request" in answer.json()["detail"]

    def judge(path: str, body: bytes) -> requests.Response:
        return requests.post(f"{proxy_services.judge}/v1/{path}", data=body, headers=headers, timeout=60)

    answer = judge("completions", b'{"prompt": "\\ud897"}')
    assert answer.status_code == 400 and "not valid Unicode" in answer.json()["error"]["message"]
    answer = judge("chat/completions", b'{"messages": []}')
    assert answer.status_code == 400 and "no messages" in answer.json()["error"]["message"]
    answer = judge("completions", b'{"prompt": "p", "seed": 18446744073709551617}')
    assert answer.status_code == 400 and "seed" in answer.json()["error"]["message"]
    tiny = judge("completions", b'{"prompt": "p", "temperature": 1e-308, "max_tokens": 3, "seed": 1}')
    greedy = judge("completions", b'{"prompt": "p", "temperature": 0, "max_tokens": 3}')
    assert tiny.status_code == 200
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]

    numbers = b"[" + b", ".join([b"1"] * 1_000_000) + b"]"
    started = time.monotonic()
    answer = requests.post(retrieve, data=b'{"queries": ' + numbers + b"}", headers=headers, timeout=120)
    assert answer.status_code == 413 and "at most 1024 queries" in answer.json()["detail"]
    answer = judge("completions", b'{"prompt": "p", "stop": ' + numbers + b"}")
    assert answer.status_code == 400 and "stop must be at most 8" in answer.json()["error"]["message"]
    answer = judge("chat/completions", b'{"messages": ' + numbers + b"}")
    assert answer.status_code == 400 and "messages" in answer.json()["error"]["message"]
    answer = judge("completions", b'{"prompt": ' + numbers + b"}")
    assert answer.status_code == 413 and "at most 256 prompts" in answer.json()["error"]["message"]
    assert time.monotonic() - started < 60  # each took minutes when pydantic's errors were all listed
