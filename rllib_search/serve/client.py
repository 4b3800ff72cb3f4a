"""The retriever client the env uses: in-cluster through a DeploymentHandle, or an HTTP URL.

Both paths satisfy :class:`rllib_search.env.retrieval.Retriever`. Each call has a timeout and bounded
retries with exponential backoff (a replica restarting, a proxy hiccup); when every attempt fails the
client raises :class:`RetrieverUnavailable` and the env turns that into an error observation for the
affected episodes, so the run goes on. ``stats`` counts calls, retries and failures for metrics.

The URL path speaks Search-R1's schema, so it also works against an existing Search-R1 retrieval server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_search.env.retrieval import Passage
from rllib_search.serve.retriever import APP_NAME, DEPLOYMENT_NAME

logger = logging.getLogger(__name__)


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
class RetrieverClient:
    """Search through a Serve deployment (``handle``) or an HTTP endpoint (``url``, e.g.
    ``http://127.0.0.1:8000/retrieve``).

    ``timeout_s`` bounds each attempt; ``max_retries`` extra attempts follow a failure, waiting
    ``backoff_s * 2**attempt`` (capped at ``max_backoff_s``) in between.
    """

    handle: Any = None
    url: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    stats: ClientStats = field(default_factory=ClientStats)

    def __post_init__(self) -> None:
        if (self.handle is None) == (self.url is None):
            raise ValueError("give exactly one of handle (in-cluster) or url (HTTP)")
        self._session = None

    @classmethod
    def from_app(
        cls, app_name: str = APP_NAME, deployment: str = DEPLOYMENT_NAME, **kwargs: Any
    ) -> RetrieverClient:
        """A client for a running Serve application (call inside the Ray cluster)."""
        from ray import serve

        return cls(handle=serve.get_deployment_handle(deployment, app_name=app_name), **kwargs)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` passages for each query; raises RetrieverUnavailable after the last retry."""
        queries = list(queries)
        if not queries:
            return []
        self.stats.calls += 1
        self.stats.queries += len(queries)
        last_error: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            try:
                if self.handle is not None:
                    return self._search_handle(queries, topk)
                return self._search_http(queries, topk)
            except RetrieverRequestError:
                self.stats.failures += 1
                raise
            except Exception as error:  # any transport or replica failure is retried
                last_error = error
                logger.warning("retriever attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, error)
        self.stats.failures += 1
        raise RetrieverUnavailable(f"retriever failed after {self.max_retries + 1} attempts: {last_error}")

    def _search_handle(self, queries: list[str], topk: int) -> list[list[Passage]]:
        try:
            return self.handle.search.remote(queries, topk).result(timeout_s=self.timeout_s)
        except ValueError as error:  # the deployment's own limit check
            raise RetrieverRequestError(str(error)) from error

    def _search_http(self, queries: list[str], topk: int) -> list[list[Passage]]:
        import requests

        if self._session is None:
            self._session = requests.Session()
        body = {"queries": queries, "topk": int(topk), "return_scores": True}
        response = self._session.post(self.url, json=body, timeout=self.timeout_s)
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

    def __getstate__(self) -> dict[str, Any]:
        # A requests.Session does not travel between processes; a handle does.
        state = dict(self.__dict__)
        state["_session"] = None
        return state
