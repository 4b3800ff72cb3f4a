"""The evidence judge as an autoscaled Ray Serve deployment: a language model answering judge prompts.

R-Search scores the policy's evidence by asking a frozen model of another family to answer the question
from that evidence alone (its Table 5 template, ``env/judge.py``). R-Search's own code asks one sample at a
time; here every request that arrives while a batch runs joins the next one (``@serve.batch`` counting
prompts, not requests), so one engine call answers many prompts, and a rollout sends all of a sample's
evidences in one request.

- Engines are those of ``llm/``: the HF engine on CPU (default judge: the bundled Gemma-3-270M, a different
  family from the SmolLM2 policy), vLLM on GPU (``engine="vllm"``; R-Search's judge is
  Llama-3.2-3B-Instruct). Ray Serve LLM (``ray.serve.llm``, ``tuned_examples/serve_gpu_llm.yaml``) is
  the documented way to serve the 3B judge on a GPU cluster; the client speaks to either.
- In-cluster callers use a DeploymentHandle: ``generate(prompts, ...)`` (strings, or chat message lists)
  and ``describe()`` (the model's name, type and vocabulary, for the cross-family check).
- HTTP is a subset of the OpenAI API: ``POST /v1/completions`` (a prompt or a list of prompts) and
  ``POST /v1/chat/completions`` (one conversation), ``n=1``, ``max_tokens``, ``temperature``, ``top_p``,
  ``stop``, ``seed``; ``GET /v1/models``; ``GET /health``. Requests are bounded (body bytes, read before
  the body is; prompts per request, characters and tokens per prompt, new tokens); a request outside a
  bound, or malformed, gets a 4xx with an OpenAI-style error message, never a 5xx.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the request models' real types.
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from ray import serve

from rllib_search.llm.engines.base import SamplingParams
from rllib_search.metrics import record
from rllib_search.serve.http.validation import (
    RequestRefused,
    check_body_limit,
    check_length,
    default_body_bytes,
    invalid_unicode,
    parse_json_object,
    printable,
    read_body,
    validate,
    validation_message,
)
from rllib_search.serve.replicas import GRACEFUL_SHUTDOWN_CHECK_S

logger = logging.getLogger(__name__)

DEPLOYMENT_NAME = "EvidenceJudge"
APP_NAME = "judge"
METRIC_TAGS = {"service": "judge"}  # batch size and seconds as Ray metrics (rllib_search/metrics.py)
ROUTE_PREFIX = "/judge"
DEFAULT_CPU_JUDGE = "gemma3-270m"
DEFAULT_GPU_JUDGE = "meta-llama/Llama-3.2-3B-Instruct"
MAX_STOPS = 8  # stop strings per request


class JudgeRequestError(ValueError):
    """A request outside the judge's bounds, or malformed: answered with a 4xx, never retried."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class JudgeLimits:
    """Bounds on one request; a request outside them gets a 4xx with a message. ``max_body_bytes`` (the
    HTTP body, checked before it is read in full) defaults to what the other bounds admit: ``max_prompts``
    prompts of ``max_prompt_chars`` characters written as ``\\uXXXX`` escapes, plus 64 KiB (49 MB for the
    defaults; ``serve/http/validation.py``)."""

    max_prompts: int = 256
    max_prompt_chars: int = 32_000
    max_prompt_tokens: int = 2048
    max_tokens: int = 256
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes is None:
            object.__setattr__(
                self, "max_body_bytes", default_body_bytes(self.max_prompts, self.max_prompt_chars)
            )
        check_body_limit(self.max_body_bytes)

    def check_request(self, prompts: list[Any], max_tokens: int, temperature: float, top_p: float) -> None:
        """Raise :class:`JudgeRequestError` when the request's shape breaks a bound."""
        if not prompts:
            raise JudgeRequestError("at least one prompt is needed")
        if len(prompts) > self.max_prompts:
            raise JudgeRequestError(
                f"at most {self.max_prompts} prompts per request, got {len(prompts)}", 413
            )
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not max_tokens >= 1:
            raise JudgeRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if max_tokens > self.max_tokens:
            raise JudgeRequestError(f"max_tokens is at most {self.max_tokens}, got {max_tokens}")
        if not 0.0 <= temperature <= 2.0:
            raise JudgeRequestError(f"temperature must lie in [0, 2], got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise JudgeRequestError(f"top_p must lie in (0, 1], got {top_p}")


# --- OpenAI-compatible request bodies ------------------------------------------------------------------
class _SamplingFields(BaseModel):
    """What completions and chat completions share (the fields this server honours; others are ignored)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: a prompt or a list of prompts."""

    prompt: str | list[str]


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``: one conversation per request, as OpenAI's."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


def _error(message: str, status: int) -> JSONResponse:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    body = {"error": {"message": printable(message), "type": kind, "code": status}}
    return JSONResponse(body, status_code=status)


http_app = FastAPI(title="rllib-search evidence judge", description="A subset of the OpenAI API")


@http_app.exception_handler(RequestValidationError)
async def _malformed_request(request: Request, error: RequestValidationError) -> JSONResponse:
    """A request FastAPI's own validation refuses (a route's parameters; the completion endpoints read their
    bodies themselves): 400 with the validator's words, as vLLM answers."""
    return _error(validation_message(error), 400)


@dataclass
class _Job:
    """One request's prompts (token ids) and how to sample them."""

    prompt_ids: list[list[int]]
    params: SamplingParams


@dataclass
class _Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


# Defined before the deployment class: Serve pickles the ingress class (and the globals its methods use)
# when the decorator runs.
def _build_engine(model: str, engine: str, device: str | None, dtype: str, options: dict[str, Any]):
    """The engine, tokenizer and Hugging Face config of the judge model."""
    from transformers import AutoConfig

    from rllib_search.llm.models import default_device, load_causal_lm, resolve_model_path

    path = resolve_model_path(model)
    if engine == "vllm":
        from rllib_search.llm.engines.vllm import VLLMEngine

        options.setdefault("enable_sleep_mode", False)  # a judge never yields its GPU to a learner
        vllm_engine = VLLMEngine(path, dtype="bfloat16" if dtype == "auto" else dtype, **options)
        return vllm_engine, vllm_engine.tokenizer, AutoConfig.from_pretrained(path)
    if engine != "hf":
        raise ValueError(f"engine must be 'hf' or 'vllm', got {engine!r}")
    import torch

    from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine

    device = device or default_device()
    torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    hf_model, tokenizer = load_causal_lm(path, device=device, dtype=torch_dtype)
    hf_model.eval()
    # The prefix-caching engine prefills the template's shared start once, feeds prompts in passes of
    # similar length and drops finished answers from the decode batch (exact for Gemma-3's sliding window
    # too, when worked examples make a prompt longer than it).
    options.setdefault("min_shared_tokens", 16)
    return PrefixCachingHFEngine(hf_model, tokenizer, **options), tokenizer, hf_model.config


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# Requests above max_ongoing_requests wait in the caller's router; waiting in the batch queue is cheaper
# and makes bigger batches (as the retriever, see serve/retrieval/deployment.py).
@serve.deployment(
    name=DEPLOYMENT_NAME, max_ongoing_requests=256, graceful_shutdown_wait_loop_s=GRACEFUL_SHUTDOWN_CHECK_S
)
@serve.ingress(http_app)
class JudgeDeployment:
    """A replica: one frozen language model behind an engine of ``llm/engines``.

    ``model``: a bundled alias, hub name or local path; ``engine``: ``hf`` (any device) or ``vllm`` (GPU);
    ``served_model_name``: the name clients send as ``model`` (default: ``model``); ``dtype``: ``auto``
    (bf16 on GPU, fp32 on CPU), ``float32`` or ``bfloat16``; ``default_max_tokens`` and
    ``default_temperature`` apply when a request leaves them out (greedy by default, as a reward must be
    reproducible; R-Search used 0.1).
    """

    def __init__(
        self,
        model: str = DEFAULT_CPU_JUDGE,
        engine: str = "hf",
        served_model_name: str | None = None,
        device: str | None = None,
        dtype: str = "auto",
        max_batch_prompts: int = 256,
        batch_wait_timeout_s: float = 0.01,
        limits: dict[str, int] | None = None,
        default_max_tokens: int = 32,
        default_temperature: float = 0.0,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        self.limits = JudgeLimits(**(limits or {}))
        if max_batch_prompts < self.limits.max_prompts:
            raise ValueError(
                "max_batch_prompts must be at least limits.max_prompts (one request fits a batch)"
            )
        if not 1 <= default_max_tokens <= self.limits.max_tokens:
            raise ValueError(f"default_max_tokens must lie in [1, {self.limits.max_tokens}]")
        self.source = model
        self.served_model_name = served_model_name or model
        self.engine_name = engine
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        self.engine, self.tokenizer, self.model_config = _build_engine(
            model, engine, device, dtype, dict(engine_options or {})
        )
        self._generate_batched.set_max_batch_size(max_batch_prompts)
        self._generate_batched.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.requests = self.batches = self.batched_prompts = 0
        self.generate_seconds = 0.0
        logger.info("judge replica ready: %s on %s", model, engine)

    # --- in-cluster API (DeploymentHandle) ---------------------------------------------------------------
    async def generate(
        self,
        prompts: list[Any],
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> list[dict[str, Any]]:
        """Answer every prompt (a string, or a chat as a list of ``{"role", "content"}`` messages); returns
        ``{"text", "finish_reason", "prompt_tokens", "completion_tokens"}`` per prompt, in order. Raises
        :class:`JudgeRequestError` for a request outside the bounds."""
        job = self._job(list(prompts), max_tokens, temperature, top_p, stop, seed)
        self.requests += 1
        completions = await self._generate_batched(job)
        return [asdict(completion) for completion in completions]

    async def describe(self) -> dict[str, Any]:
        """The served model (name, source, ``model_type``, ``vocab_size``), engine, bounds and counters."""
        mean = self.batched_prompts / self.batches if self.batches else 0.0
        return {
            "model": self.served_model_name,
            "source": self.source,
            "model_type": getattr(self.model_config, "model_type", None),
            "vocab_size": getattr(self.model_config, "vocab_size", None),
            "engine": self.engine_name,
            "limits": asdict(self.limits),
            "requests": self.requests,
            "batches": self.batches,
            "mean_prompts_per_batch": mean,
            "generate_seconds": self.generate_seconds,
            "torch_threads": _torch_threads(),
        }

    def _job(
        self,
        prompts: list[Any],
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        stop: list[str] | None,
        seed: int | None,
    ) -> _Job:
        max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        temperature = self.default_temperature if temperature is None else float(temperature)
        top_p = 1.0 if top_p is None else float(top_p)
        self.limits.check_request(prompts, max_tokens, temperature, top_p)
        stops = tuple(s for s in (stop or ()) if isinstance(s, str) and s)
        if stop is not None and (len(stops) != len(stop) or len(stops) > MAX_STOPS):
            raise JudgeRequestError(f"stop must be at most {MAX_STOPS} non-empty strings")
        problem = invalid_unicode(stops, "stop")
        if problem is not None:
            raise JudgeRequestError(problem)
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63
        ):
            raise JudgeRequestError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        ids = [self._encode(i, prompt) for i, prompt in enumerate(prompts)]
        params = SamplingParams(temperature, top_p, max_tokens, stops, seed)
        return _Job(ids, params)

    def _encode(self, index: int, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            text, add_special = prompt, True
        elif isinstance(prompt, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt
        ):
            if not getattr(self.tokenizer, "chat_template", None):
                raise JudgeRequestError(
                    f"{self.served_model_name} has no chat template: send plain prompts (/v1/completions)"
                )
            if not prompt:
                raise JudgeRequestError(f"prompts[{index}] holds no messages")
            messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
            except Exception as err:  # the model's own Jinja template may refuse (roles, order): the caller's
                message = f"prompts[{index}]: the chat template refused the messages ({err})"
                raise JudgeRequestError(message) from err
            add_special = False
        else:
            raise JudgeRequestError(f"prompts[{index}] must be a string or a list of chat messages")
        problem = invalid_unicode([text], f"prompts[{index}]")
        if problem is not None:
            raise JudgeRequestError(problem.replace(f"prompts[{index}][0]", f"prompts[{index}]"))
        if len(text) > self.limits.max_prompt_chars:
            raise JudgeRequestError(
                f"prompts[{index}] has {len(text)} characters, at most {self.limits.max_prompt_chars} allowed"
            )
        ids = self.tokenizer(text, add_special_tokens=add_special)["input_ids"]
        if not ids:
            raise JudgeRequestError(f"prompts[{index}] is empty")
        if len(ids) > self.limits.max_prompt_tokens:
            raise JudgeRequestError(
                f"prompts[{index}] has {len(ids)} tokens, at most {self.limits.max_prompt_tokens} allowed"
            )
        return list(ids)

    @serve.batch(
        max_batch_size=256,
        batch_wait_timeout_s=0.01,
        batch_size_fn=lambda jobs: sum(len(job.prompt_ids) for job in jobs),
    )
    async def _generate_batched(self, jobs: list[_Job]) -> list[list[_Completion]]:
        """ONE engine call per distinct sampling setting for every prompt of every request in the batch."""
        # Generation runs on the replica's event loop, blocking it: requests arriving meanwhile wait in
        # Serve's queue and all join the next batch (the retriever measured why a worker thread is worse).
        started = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(tuple(asdict(job.params).values()), []).append(index)
        results: list[list[_Completion]] = [[] for _ in jobs]
        for indices in groups.values():
            params = jobs[indices[0]].params
            prefixes = [ids for i in indices for ids in jobs[i].prompt_ids]
            segments = self.engine.generate(prefixes, params)
            position = 0
            for i in indices:
                for ids in jobs[i].prompt_ids:
                    results[i].append(self._completion(ids, segments[position], params.stop))
                    position += 1
        seconds = time.perf_counter() - started
        self.generate_seconds += seconds
        self.batches += 1
        prompts = sum(len(job.prompt_ids) for job in jobs)
        self.batched_prompts += prompts
        record("serve_batch_items", prompts, METRIC_TAGS)
        record("serve_batch_seconds", seconds, METRIC_TAGS)
        return results

    def _completion(self, prompt_ids: list[int], segment: Any, stops: tuple[str, ...]) -> _Completion:
        text = self.tokenizer.decode(segment.token_ids, skip_special_tokens=True)
        cut = [text.find(stop) for stop in stops if stop in text]
        if cut:
            text = text[: min(cut)]  # OpenAI's convention: the stop string is not part of the text
        reason = "length" if segment.finish_reason == "length" else "stop"
        return _Completion(text, reason, len(prompt_ids), len(segment.token_ids))

    # --- HTTP API (OpenAI subset) --------------------------------------------------------------------
    @http_app.post("/v1/completions")
    async def completions(self, http_request: Request) -> JSONResponse:
        try:
            fields = await self._read_body(http_request)
            too_many = "at most {bound} prompts per request, got {length}"
            check_length(fields, "prompt", self.limits.max_prompts, too_many, 413)
            request = validate(CompletionRequest, fields, 400)
        except RequestRefused as refused:
            return _error(refused.message, refused.status)
        prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt)
        return await self._respond(request, prompts, request.max_tokens, chat=False)

    @http_app.post("/v1/chat/completions")
    async def chat_completions(self, http_request: Request) -> JSONResponse:
        try:
            fields = await self._read_body(http_request)
            # Every message adds tokens to the conversation's one prompt (its turn markers at least).
            too_many = "at most {bound} messages (the prompt's token bound), got {length}"
            check_length(fields, "messages", self.limits.max_prompt_tokens, too_many, 400)
            request = validate(ChatCompletionRequest, fields, 400)
        except RequestRefused as refused:
            return _error(refused.message, refused.status)
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        max_tokens = request.max_completion_tokens if request.max_tokens is None else request.max_tokens
        return await self._respond(request, [messages], max_tokens, chat=True)

    async def _read_body(self, http_request: Request) -> dict[str, Any]:
        """The body as a JSON object, read under ``limits.max_body_bytes``, its ``stop`` list's length
        checked before the schema is (``serve/http/validation.py``)."""
        body = await read_body(http_request, self.limits.max_body_bytes)
        fields = parse_json_object(body, http_request.headers.get("content-type"), 400)
        check_length(fields, "stop", MAX_STOPS, "stop must be at most {bound} non-empty strings", 400)
        return fields

    @http_app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.served_model_name, "object": "model", "owned_by": "rllib-search"}],
        }

    @http_app.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    async def _respond(
        self, request: Any, prompts: list[Any], max_tokens: Any, *, chat: bool
    ) -> JSONResponse:
        if request.stream:
            return _error("streaming is not supported by this judge server", 400)
        if request.n != 1:
            return _error(f"n must be 1, got {request.n}", 400)
        if request.model is not None and request.model not in (self.served_model_name, self.source):
            return _error(
                f"The model `{request.model}` does not exist; this server serves `{self.served_model_name}`",
                404,
            )
        stop = [request.stop] if isinstance(request.stop, str) else request.stop
        try:
            answers = await self.generate(
                prompts, max_tokens, request.temperature, request.top_p, stop, request.seed
            )
        except JudgeRequestError as error:
            return _error(str(error), error.status)
        usage = {
            "prompt_tokens": sum(a["prompt_tokens"] for a in answers),
            "completion_tokens": sum(a["completion_tokens"] for a in answers),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if chat:
            choices = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answers[0]["text"]},
                    "finish_reason": answers[0]["finish_reason"],
                }
            ]
        else:
            choices = [
                {"index": i, "text": a["text"], "finish_reason": a["finish_reason"], "logprobs": None}
                for i, a in enumerate(answers)
            ]
        body = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{time.time_ns():x}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": choices,
            "usage": usage,
        }
        return JSONResponse(body)


def build_judge_app(args: dict[str, Any]) -> serve.Application:
    """Application builder for ``serve build`` / ``serve deploy`` and ``rllib-search serve judge``.

    ``args``: the :class:`JudgeDeployment` arguments (``model``, ``engine``, ``served_model_name``,
    ``device``, ``dtype``, ``max_batch_prompts``, ``batch_wait_timeout_s``, ``limits``,
    ``default_max_tokens``, ``default_temperature``, ``engine_options``) and the deployment options
    ``autoscaling_config`` (min_replicas, max_replicas, target_ongoing_requests, ...), ``num_replicas``,
    ``ray_actor_options`` (num_cpus, num_gpus, ...) and ``max_ongoing_requests``.
    """
    args = dict(args)
    options: dict[str, Any] = {}
    for key in ("autoscaling_config", "num_replicas", "ray_actor_options", "max_ongoing_requests"):
        value = args.pop(key, None)
        if value is not None:
            options[key] = value
    if "autoscaling_config" in options:
        options.pop("num_replicas", None)
    deployment = JudgeDeployment.options(**options) if options else JudgeDeployment
    return deployment.bind(**args)
