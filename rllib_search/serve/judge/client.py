"""The evidence judge client the env uses: the Serve deployment in-cluster, or any OpenAI-compatible URL.

:class:`JudgeClient` satisfies :class:`rllib_search.env.judge.EvidenceJudge`: ``answer_evidence`` fills
R-Search's evidence template for every (question, evidence) pair of a sample and sends them in ONE call:

- in-cluster, one ``generate`` call on a DeploymentHandle of ``serve/judge/deployment.py``'s deployment;
- over HTTP with ``api="completions"``, one ``POST {url}/completions`` carrying the list of prompts (our
  server, vLLM's OpenAI server and Ray Serve LLM all take a list);
- over HTTP with ``api="chat"``, one ``POST {url}/chat/completions`` per prompt (OpenAI's chat API holds
  one conversation per request), sent concurrently so the server batches them.

Each attempt has a timeout; failures are retried with exponential backoff (a 4xx never is;
``service_client.py``); when every attempt fails the client raises :class:`JudgeUnavailable`, and the env
scores the sample's evidence terms 0 and counts the errors (``score_episodes``). ``stats`` counts calls,
prompts, retries and failures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rllib_search.env.judge import EvidenceJudge, JudgePrompt, as_judge
from rllib_search.serve.http.client import ServiceClient
from rllib_search.serve.judge.deployment import APP_NAME, DEPLOYMENT_NAME

logger = logging.getLogger(__name__)


class JudgeUnavailable(RuntimeError):
    """Every attempt to reach the judge failed."""


class JudgeClientRequestError(ValueError):
    """The judge rejected the request (4xx): retrying would not help."""


@dataclass
class JudgeClientStats:
    calls: int = 0
    prompts: int = 0
    retries: int = 0
    failures: int = 0
    seconds: float = 0.0


@dataclass
class JudgeClient(ServiceClient):
    """Ask a judge model through a Serve deployment (``handle``) or an OpenAI-compatible base URL (``url``,
    e.g. ``http://127.0.0.1:8000/judge/v1``).

    - ``api``: ``completions`` (the evidence template as a plain prompt: right for base models such as the
      CPU judge Gemma-3-270M) or ``chat`` (the template as the user message: instruct models such as
      R-Search's Llama-3.2-3B-Instruct);
    - ``model``: the name sent as ``model`` (required by vLLM's and Ray Serve LLM's servers);
    - ``max_tokens``, ``temperature`` (0 greedy; R-Search used 0.1), ``stop`` (a short answer ends at the
      line's end);
    - ``examples`` worked examples (``env/judge.py``'s ``JUDGE_EXAMPLES``) and ``prompt_prefix`` text placed
      before R-Search's verbatim template (a small base model answers in sentences without them; an
      instruct model such as Llama-3.2-3B-Instruct needs none): part of the judge's spec, so a run's config
      records them;
    - ``max_evidence_chars``: longer evidence is cut to this many characters (noted in the log), so a
      runaway evidence box cannot break the server's prompt bound;
    - ``timeout_s`` per attempt, ``max_retries`` extra attempts with ``backoff_s * 2**attempt`` between
      (capped at ``max_backoff_s``); ``max_prompts_per_request`` and ``concurrency`` (chat over HTTP).
    """

    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    api: str = "completions"
    model: str | None = None
    max_tokens: int = 32
    temperature: float = 0.0
    stop: tuple[str, ...] = ("\n",)
    examples: int = 0
    prompt_prefix: str = ""
    max_evidence_chars: int = 6000
    max_prompts_per_request: int = 256
    concurrency: int = 16
    stats: JudgeClientStats = field(default_factory=JudgeClientStats)

    default_app: ClassVar[str] = APP_NAME
    default_deployment: ClassVar[str] = DEPLOYMENT_NAME

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {self.api!r}")
        if self.url is not None:
            self.url = self.url.rstrip("/")
        self.stop = tuple(self.stop)
        self.prompt = JudgePrompt(examples=self.examples, prefix=self.prompt_prefix)

    # --- the env's interface -----------------------------------------------------------------------------
    def answer_evidence(self, questions: Sequence[str], evidences: Sequence[str]) -> list[str]:
        """The judge's answer for each (question, evidence) pair, from the evidence alone (R-Search eq. 4)."""
        prompts = []
        for question, evidence in zip(questions, evidences):
            if len(evidence) > self.max_evidence_chars:
                logger.info("evidence of %d characters cut to %d", len(evidence), self.max_evidence_chars)
                evidence = evidence[: self.max_evidence_chars]
            prompts.append(self.prompt.fill(question, evidence))
        return [answer.strip() for answer in self.complete(prompts)]

    def complete(self, prompts: Sequence[str]) -> list[str]:
        """The judge's text for each prompt (as the user message when ``api="chat"``), in ONE call where
        the API allows it; raises :class:`JudgeUnavailable` after the last retry."""
        prompts = list(prompts)
        if not prompts:
            return []
        self.stats.calls += 1
        self.stats.prompts += len(prompts)

        def attempt() -> list[str]:
            answers: list[str] = []
            for start in range(0, len(prompts), self.max_prompts_per_request):
                answers.extend(self._send(prompts[start : start + self.max_prompts_per_request]))
            return answers

        started = time.perf_counter()
        try:
            return self._with_retries(
                attempt,
                stats=self.stats,
                final_errors=(JudgeClientRequestError,),
                unavailable=JudgeUnavailable,
                service="judge",
                items=len(prompts),
            )
        finally:
            self.stats.seconds += time.perf_counter() - started

    def describe(self) -> dict[str, Any]:
        """What the judge says of its model: ``model`` (and, from our deployment, ``model_type`` and
        ``vocab_size``), for the cross-family check."""
        if self.handle is not None:
            return self.handle.describe.remote().result(timeout_s=self.timeout_s)
        if self.model is not None:
            return {"model": self.model}
        response = self._http().get(f"{self.url}/models", timeout=self.timeout_s)
        response.raise_for_status()
        return {"model": response.json()["data"][0]["id"]}

    # --- transport -------------------------------------------------------------------------------------
    def _send(self, prompts: list[str]) -> list[str]:
        if self.handle is not None:
            chats: list[Any] = prompts
            if self.api == "chat":
                chats = [[{"role": "user", "content": prompt}] for prompt in prompts]
            try:
                answers = self.handle.generate.remote(
                    chats, max_tokens=self.max_tokens, temperature=self.temperature, stop=list(self.stop)
                ).result(timeout_s=self.timeout_s)
            except ValueError as error:  # the deployment's own bounds (JudgeRequestError)
                raise JudgeClientRequestError(str(error)) from error
            return [answer["text"] for answer in answers]
        if self.api == "completions":
            body = self._sampling_body()
            choices = self._post("completions", {**body, "prompt": prompts})["choices"]
            ordered = sorted(choices, key=lambda choice: choice.get("index", 0))
            if len(ordered) != len(prompts):
                raise RuntimeError(f"the judge returned {len(ordered)} choices for {len(prompts)} prompts")
            return [choice["text"] for choice in ordered]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self._chat_one, prompts))

    def _chat_one(self, prompt: str) -> str:
        body = {**self._sampling_body(), "messages": [{"role": "user", "content": prompt}]}
        return self._post("chat/completions", body)["choices"][0]["message"]["content"]

    def _sampling_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "n": 1,
            "stop": list(self.stop),
        }
        if self.model is not None:
            body["model"] = self.model
        return body

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._http().post(f"{self.url}/{path}", json=body, timeout=self.timeout_s)
        if 400 <= response.status_code < 500:
            raise JudgeClientRequestError(f"HTTP {response.status_code}: {response.text[:500]}")
        response.raise_for_status()
        return response.json()


_CLIENT_FIELDS = set(JudgeClient.__dataclass_fields__) - {"handle", "url", "stats"}


def build_judge(spec: Any) -> EvidenceJudge | None:
    """An evidence judge from an object (an ``EvidenceJudge`` or a callable ``(question, evidence) ->
    answer``, returned usable as is) or a spec:

    - ``{"type": "serve", "app": "judge", **client_options}``: the Serve deployment, in-cluster;
    - ``{"type": "url", "url": "http://127.0.0.1:8000/judge/v1", "api": "completions" | "chat",
      "model": ..., **client_options}``: any OpenAI-compatible server (ours, vLLM's, Ray Serve LLM).

    ``allow_same_family`` in a spec is read by :func:`check_judge_family`, not here.
    """
    if spec is None or not isinstance(spec, Mapping):
        return as_judge(spec)
    options = {k: v for k, v in spec.items() if k != "allow_same_family"}
    kind = options.pop("type", None)
    unknown = set(options) - _CLIENT_FIELDS - {"app", "url"}
    if unknown:
        raise ValueError(f"unknown judge options {sorted(unknown)}; known: {sorted(_CLIENT_FIELDS)}")
    if "stop" in options:
        options["stop"] = tuple(options["stop"])
    if kind == "serve":
        return JudgeClient.from_app(options.pop("app", APP_NAME), **options)
    if kind == "url":
        return JudgeClient(**options)
    raise ValueError(f"unknown judge type {kind!r}; known: 'serve', 'url'")


def check_judge_family(judge: Any, policy_config: Any, policy_name: str, spec: Any = None) -> str | None:
    """Refuse a judge of the policy's own model family (R-Search's point is an independent reader) unless
    the spec says ``allow_same_family: True``. Returns a warning when the judge's family is unknown.

    ``policy_config`` is the policy's Hugging Face config. A judge that cannot describe itself (a plain
    callable) is not checked.
    """
    from rllib_search.llm.family import check_cross_family, family_from_config, family_from_description

    describe = getattr(judge, "describe", None)
    if describe is None:
        return None
    description = describe()
    allow = bool(spec.get("allow_same_family", False)) if isinstance(spec, Mapping) else False
    return check_cross_family(
        family_from_config(policy_config),
        family_from_description(description),
        policy_name=policy_name,
        judge_name=str(description.get("model", "?")),
        allow_same=allow,
    )
