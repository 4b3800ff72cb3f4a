"""The evidence judge on real Ray Serve over 127.0.0.1: the OpenAI-compatible HTTP subset, bounds, the
in-cluster client (one call per batch of evidences), batching across requests, the cross-family guard,
and the bundled Gemma-3-270M answering an evidence prompt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from rllib_search.env.rewards import exact_match
from rllib_search.llm.family import SameFamilyJudgeError
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.serve.http.ports import free_port
from rllib_search.serve.judge.client import (
    JudgeClient,
    JudgeClientRequestError,
    JudgeUnavailable,
    build_judge,
    check_judge_family,
)
from rllib_search.serve.judge.deployment import build_judge_app

pytestmark = pytest.mark.slow


def test_completions_and_chat_speak_the_openai_schema(judge_url):
    completion = requests.post(
        f"{judge_url}/completions",
        json={"model": "tiny-judge", "prompt": ["first prompt", "second prompt"], "max_tokens": 4, "seed": 1},
        timeout=60,
    )
    assert completion.status_code == 200
    body = completion.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny-judge"
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert all(set(c) == {"index", "text", "finish_reason", "logprobs"} for c in body["choices"])
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"])
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < body["usage"]["completion_tokens"] <= 8

    chat = requests.post(
        f"{judge_url}/chat/completions",
        json={"messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 3},
        timeout=60,
    ).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 3
    assert requests.get(f"{judge_url}/models", timeout=30).json()["data"][0]["id"] == "tiny-judge"
    # Greedy by default: the same prompt gets the same text.
    same = [requests.post(f"{judge_url}/completions", json={"prompt": "same"}, timeout=60) for _ in range(2)]
    texts = [response.json()["choices"][0]["text"] for response in same]
    assert texts[0] == texts[1]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"not json at all", 400, "JSON"),
        (b"", 400, "malformed"),
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": 7}, 400, "prompt"),
        ({"prompt": [1, 2, 3]}, 400, "prompt"),
        ({"prompt": []}, 400, "at least one prompt"),
        ({"prompt": ["p"] * 9}, 413, "at most 8 prompts"),
        ({"prompt": "p", "n": 2}, 400, "n must be 1"),
        ({"prompt": "p", "max_tokens": 17}, 400, "max_tokens is at most 16"),
        ({"prompt": "p", "max_tokens": 0}, 400, "positive integer"),
        ({"prompt": "p", "temperature": 3}, 400, "temperature"),
        ({"prompt": "p", "top_p": 0}, 400, "top_p"),
        ({"prompt": "p", "stop": ["", "x"]}, 400, "stop"),
        ({"prompt": "p", "stream": True}, 400, "streaming"),
        ({"prompt": "x" * 4001}, 400, "characters"),
        ({"prompt": "word " * 400}, 400, "tokens, at most 300"),
        ({"prompt": "p", "model": "another-model"}, 404, "does not exist"),
    ],
)
def test_malformed_requests_get_4xx_with_a_message(judge_url, body, status, words):
    if isinstance(body, bytes):
        response = requests.post(
            f"{judge_url}/completions", data=body, headers={"content-type": "application/json"}, timeout=30
        )
    else:
        response = requests.post(f"{judge_url}/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    # The server still answers afterwards.
    assert requests.get(f"{judge_url}/models", timeout=30).status_code == 200


def test_chat_requests_are_checked_too(judge_url):
    bad = requests.post(f"{judge_url}/chat/completions", json={"messages": "hello"}, timeout=30)
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    many = requests.post(
        f"{judge_url}/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 99},
        timeout=30,
    )
    assert many.status_code == 400 and "max_tokens" in many.json()["error"]["message"]


def test_a_batch_of_evidences_is_one_judge_call(judge_url):
    client = JudgeClient.from_app("judge", max_tokens=4)
    before = client.describe()
    questions = [f"Question {i}?" for i in range(6)]
    answers = client.answer_evidence(questions, [f"Evidence number {i}." for i in range(6)])
    after = client.describe()
    assert len(answers) == 6 and all(isinstance(a, str) for a in answers)
    assert after["requests"] - before["requests"] == 1
    assert after["batches"] - before["batches"] == 1
    assert (client.stats.calls, client.stats.prompts, client.stats.failures) == (1, 6, 0)
    # The HTTP client sends the same prompts in one request too, and the server answers the same way.
    http = JudgeClient(url=judge_url, model="tiny-judge", max_tokens=4)
    assert http.answer_evidence(questions, [f"Evidence number {i}." for i in range(6)]) == answers
    assert client.describe()["requests"] - after["requests"] == 1
    # Chat over HTTP: one request per prompt (OpenAI's chat API), sent concurrently.
    chat = JudgeClient(url=judge_url, api="chat", max_tokens=4)
    assert len(chat.answer_evidence(questions[:3], ["a", "b", "c"])) == 3


def test_a_prompt_prefix_reaches_the_deployment_before_the_template(judge_url):
    """A spec's ``prompt_prefix`` (and ``examples``, too long for the tiny judge's bound: see
    test_judge_accuracy.py) is part of the run's config, and the client sends it before R-Search's
    template: the served answers are those of the whole prompt sent as is, in-cluster and over HTTP."""
    from rllib_search.env.judge import JudgePrompt

    prefix = "Answer in a few words, as the examples do.\n\n"
    questions, evidences = ["Who founded Quellon Works?", "Q2?"], ["Quellon Works: Mirelle Dask.", "E2."]
    prompts = [JudgePrompt(prefix=prefix).fill(q, e) for q, e in zip(questions, evidences)]
    body = {"max_tokens": 4, "temperature": 0.0, "stop": ["\n"]}
    raw = requests.post(f"{judge_url}/completions", json={**body, "prompt": prompts}, timeout=60).json()
    tokens = [
        requests.post(f"{judge_url}/completions", json={**body, "prompt": [p]}, timeout=60).json()["usage"]
        for p in (prompts[0], JudgePrompt().fill(questions[0], evidences[0]))
    ]
    assert tokens[0]["prompt_tokens"] > tokens[1]["prompt_tokens"] + 10  # the prefix's tokens were sent
    expected = [choice["text"].strip() for choice in sorted(raw["choices"], key=lambda c: c["index"])]
    options = {"prompt_prefix": prefix, "max_tokens": 4}
    in_cluster = build_judge({"type": "serve", "app": "judge", **options})
    over_http = build_judge({"type": "url", "url": judge_url, **options})
    assert in_cluster.answer_evidence(questions, evidences) == expected
    assert over_http.answer_evidence(questions, evidences) == expected


def test_concurrent_requests_share_batches(judge_url):
    client = JudgeClient.from_app("judge", max_tokens=16, stop=())
    before = client.describe()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: client.complete([f"prompt {i}"]), range(16)))
    after = client.describe()
    assert len(results) == 16
    requests_made = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    assert requests_made == 16
    assert batches < requests_made  # at least two concurrent requests shared an engine call


def test_bounds_and_unreachable_judges_raise_for_the_caller_to_count():
    client = JudgeClient.from_app("judge", max_tokens=99)
    with pytest.raises(JudgeClientRequestError, match="max_tokens"):
        client.complete(["p"])
    unreachable = JudgeClient(url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1, backoff_s=0.01)
    with pytest.raises(JudgeUnavailable, match="2 attempts"):
        unreachable.answer_evidence(["q"], ["e"])
    assert (unreachable.stats.retries, unreachable.stats.failures) == (1, 1)


def test_the_cross_family_guard(judge_url, judge_model_dir, tmp_path):
    policy_dir = build_tiny_causal_lm(tmp_path / "policy", build_tiny_tokenizer(tmp_path / "tok"))
    policy_config = load_causal_lm(str(policy_dir), device="cpu")[0].config  # tiny Llama
    judge_config = load_causal_lm(str(judge_model_dir), device="cpu")[0].config  # tiny Gemma-3
    served = build_judge({"type": "serve", "app": "judge"})
    assert check_judge_family(served, policy_config, "tiny-llama") is None
    # A Gemma policy with this Gemma judge is refused, unless the spec allows it.
    with pytest.raises(SameFamilyJudgeError, match="own family"):
        check_judge_family(served, judge_config, "tiny-gemma")
    spec = {"type": "serve", "app": "judge", "allow_same_family": True}
    assert check_judge_family(build_judge(spec), judge_config, "tiny-gemma", spec) is None
    # An external server is judged by its model's name.
    llama_server = JudgeClient(url=judge_url, model="meta-llama/Llama-3.2-3B-Instruct")
    smollm = type("Config", (), {"model_type": "llama", "vocab_size": 49152})
    assert check_judge_family(llama_server, smollm, "smollm2") is None
    llama3 = type("Config", (), {"model_type": "llama", "vocab_size": 128256})
    with pytest.raises(SameFamilyJudgeError):
        check_judge_family(llama_server, llama3, "Llama-3.1-8B")


def test_the_bundled_gemma_answers_an_evidence_prompt(service):
    """The CPU default judge: Gemma-3-270M (bundled), greedy, with the CPU recipe's worked examples before
    R-Search's template, reads the answer off the evidence in a few words."""
    from ray import serve

    from rllib_search.recipes.r_search import CPU_JUDGE_SPEC

    serve.run(
        build_judge_app({"model": "gemma3-270m", "num_replicas": 1, "ray_actor_options": {"num_cpus": 1}}),
        name="gemma_judge",
        route_prefix="/gemma_judge",
    )
    try:
        client = JudgeClient.from_app("gemma_judge", examples=CPU_JUDGE_SPEC["examples"])
        answers = client.answer_evidence(
            ["Who founded Quellon Works?", "Where was Tarquin Oskaley born?"],
            [
                "Quellon Works is a company founded by Mirelle Dask in 1987.",
                "Tarquin Oskaley was born in Velmora, a river town.",
            ],
        )
        assert exact_match(answers[0], ["Mirelle Dask"]) == 1.0, answers
        assert exact_match(answers[1], ["Velmora"]) == 1.0, answers
        description = client.describe()
        assert description["model_type"] == "gemma3_text" and description["engine"] == "hf"
    finally:
        serve.delete("gemma_judge")


def test_serve_config_yamls_build_their_apps():
    """The combined configs' judge apps: ours builds from the GPU config; the Ray Serve LLM judge is valid
    for Ray's own schema."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from rllib_search.serve.judge.deployment import DEPLOYMENT_NAME

    examples = Path(__file__).parents[1] / "tuned_examples"
    ours = ServeDeploySchema.parse_obj(yaml.safe_load((examples / "serve_gpu.yaml").read_text()))
    (app_config,) = [app for app in ours.applications if app.name == "judge"]
    assert app_config.import_path == "rllib_search.serve.judge.deployment:build_judge_app"
    assert ours.http_options.host == "127.0.0.1"
    deployment = build_judge_app(app_config.args)._bound_deployment
    assert deployment.name == DEPLOYMENT_NAME

    llm = ServeDeploySchema.parse_obj(yaml.safe_load((examples / "serve_gpu_llm.yaml").read_text()))
    (judge,) = [app for app in llm.applications if app.import_path == "ray.serve.llm:build_openai_app"]
    # ray.serve.llm itself imports only where vLLM is installed; its LLMConfig is this class.
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    (config,) = [LLMConfig.model_validate(c) for c in judge.args["llm_configs"]]
    assert config.model_id == "llama-3.2-3b-judge"
    assert config.model_loading_config.model_source == "meta-llama/Llama-3.2-3B-Instruct"
