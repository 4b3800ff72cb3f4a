"""The retriever client the env uses: in-cluster through a DeploymentHandle, or an HTTP URL.

Both paths satisfy :class:`rllib_search.data.retrieval.Retriever`. Each call has a timeout and bounded
retries with exponential backoff (``service_client.py``); when every attempt fails the client raises
:class:`RetrieverUnavailable` and the env turns that into an error observation for the affected episodes,
so the run goes on. ``stats`` counts calls, retries and failures for metrics.

The URL path speaks Search-R1's schema, so it also works against an existing Search-R1 retrieval server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rllib_search.data.retrieval import Passage, Retriever
from rllib_search.serve.http.client import ServiceClient
from rllib_search.serve.retrieval.deployment import APP_NAME, DEPLOYMENT_NAME


class RetrieverUnavailable(RuntimeError):
    """Every attempt to reach the retriever failed."""


class RetrieverRequestError(ValueError):
    """The retriever rejected the request (4xx): retrying would not help."""


@dataclass
class ClientStats:
    calls: int = 0
    queries: int = 0
    retries: int = 0
    failures: int = 0


@dataclass
class RetrieverClient(ServiceClient):
    """Search through a Serve deployment (``handle``) or an HTTP endpoint (``url``, e.g.
    ``http://127.0.0.1:8000/retrieve``), with the timeout and retries of :class:`ServiceClient`."""

    stats: ClientStats = field(default_factory=ClientStats)

    default_app: ClassVar[str] = APP_NAME
    default_deployment: ClassVar[str] = DEPLOYMENT_NAME

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` passages for each query; raises RetrieverUnavailable after the last retry."""
        queries = list(queries)
        if not queries:
            return []
        self.stats.calls += 1
        self.stats.queries += len(queries)

        def attempt() -> list[list[Passage]]:
            if self.handle is not None:
                return self._search_handle(queries, topk)
            return self._search_http(queries, topk)

        return self._with_retries(
            attempt,
            stats=self.stats,
            final_errors=(RetrieverRequestError,),
            unavailable=RetrieverUnavailable,
            service="retriever",
            items=len(queries),
        )

    def _search_handle(self, queries: list[str], topk: int) -> list[list[Passage]]:
        try:
            return self.handle.search.remote(queries, topk).result(timeout_s=self.timeout_s)
        except ValueError as error:  # the deployment's own limit check
            raise RetrieverRequestError(str(error)) from error

    def _search_http(self, queries: list[str], topk: int) -> list[list[Passage]]:
        body = {"queries": queries, "topk": int(topk), "return_scores": True}
        response = self._http().post(self.url, json=body, timeout=self.timeout_s)
        if 400 <= response.status_code < 500:
            raise RetrieverRequestError(f"HTTP {response.status_code}: {response.text[:500]}")
        response.raise_for_status()
        return [
            [
                Passage.from_contents(item["document"]["id"], item["document"]["contents"], item.get("score"))
                for item in results
            ]
            for results in response.json()["result"]
        ]


def build_retriever(spec: Retriever | Mapping[str, Any] | None) -> Retriever | None:
    """A retriever from an object (returned as is) or a spec:

    - ``{"type": "serve", "app": "retriever", **client_options}``: the Serve deployment, in-cluster;
    - ``{"type": "url", "url": "http://127.0.0.1:8000/retrieve", **client_options}``: any Search-R1-style
      HTTP retrieval server;
    - ``{"type": "index", "dir": INDEX_DIR}``: an index built by ``rllib-search index build``, in-process;
    - ``{"type": "bm25", "corpus": PATH}``: BM25 over a corpus file, in-process (small corpora).
    """
    if spec is None or isinstance(spec, Retriever):
        return spec
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"retriever must have search(queries, topk) or be a spec dict, got {type(spec).__name__}"
        )
    options = dict(spec)
    kind = options.pop("type", None)
    if kind == "serve":
        return RetrieverClient.from_app(options.pop("app", "retriever"), **options)
    if kind == "url":
        return RetrieverClient(**options)
    if kind == "index":
        from rllib_search.serve.retrieval.load import load_index

        return load_index(options.pop("dir"), **options)
    if kind == "bm25":
        from rllib_search.data.formats import iter_passages, read_corpus
        from rllib_search.serve.retrieval.bm25 import BM25Retriever

        return BM25Retriever(list(iter_passages(read_corpus(options["corpus"]))))
    raise ValueError(f"unknown retriever type {kind!r}; known: 'serve', 'url', 'index', 'bm25'")
