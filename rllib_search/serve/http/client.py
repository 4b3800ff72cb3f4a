"""What the service clients share (the retriever's and the evidence judge's): a Serve DeploymentHandle or
an HTTP URL, a timeout per attempt, and bounded retries with exponential backoff.

A replica restarting or a proxy hiccup is retried; a request the service rejected (4xx, or its own bound
check) is not. When every attempt failed the client raises its service's "unavailable" error, which the
env turns into a counted error for the affected episodes. Calls, retries and errors are also Ray metrics
(latency histogram and counters, tag ``service``), a no-op outside Ray.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from rllib_search.metrics import record

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class ServiceClient:
    """``handle`` (in-cluster) or ``url`` (HTTP); ``timeout_s`` bounds each attempt; ``max_retries`` extra
    attempts follow a failure, waiting ``backoff_s * 2**attempt`` (capped at ``max_backoff_s``)."""

    handle: Any = None
    url: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0

    default_app: ClassVar[str] = ""
    default_deployment: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if (self.handle is None) == (self.url is None):
            raise ValueError("give exactly one of handle (in-cluster) or url (HTTP)")
        self._session = None

    @classmethod
    def from_app(cls, app_name: str | None = None, deployment: str | None = None, **kwargs: Any) -> Any:
        """A client for a running Serve application (call inside the Ray cluster)."""
        from ray import serve

        handle = serve.get_deployment_handle(
            deployment or cls.default_deployment, app_name=app_name or cls.default_app
        )
        return cls(handle=handle, **kwargs)

    def _with_retries(
        self,
        attempt: Callable[[], T],
        *,
        stats: Any,
        final_errors: tuple[type[BaseException], ...],
        unavailable: type[Exception],
        service: str,
        items: int = 0,
    ) -> T:
        """``attempt()`` until it succeeds; ``final_errors`` are raised at once; ``stats`` counts retries and
        failures; after the last retry, ``unavailable`` is raised with the last error.

        The call's seconds, its ``items`` (queries, prompts), retries and errors are also Ray metrics
        (``rllib_search/metrics.py``, tag ``service``; nothing is recorded outside Ray)."""
        tags = {"service": service}
        record("service_items", items, tags)
        started, outcome = time.perf_counter(), "error"
        last_error: Exception | None = None
        try:
            for number in range(self.max_retries + 1):
                if number:
                    stats.retries += 1
                    record("service_retries", 1, tags)
                    time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (number - 1)))
                try:
                    result = attempt()
                    outcome = "ok"
                    return result
                except final_errors:
                    stats.failures += 1
                    record("service_errors", 1, {**tags, "kind": "rejected"})
                    raise
                except Exception as error:  # any transport or replica failure is retried
                    last_error = error
                    logger.warning(
                        "%s attempt %d/%d failed: %s", service, number + 1, self.max_retries + 1, error
                    )
            stats.failures += 1
            record("service_errors", 1, {**tags, "kind": "unavailable"})
            raise unavailable(f"{service} failed after {self.max_retries + 1} attempts: {last_error}")
        finally:
            record("service_call_seconds", time.perf_counter() - started, {**tags, "outcome": outcome})

    def _http(self) -> Any:
        """This client's HTTP session (made on first use, in the process that uses it)."""
        import requests

        if self._session is None:
            self._session = requests.Session()
        return self._session

    def __getstate__(self) -> dict[str, Any]:
        # A requests.Session does not travel between processes; a handle does.
        state = dict(self.__dict__)
        state["_session"] = None
        return state
