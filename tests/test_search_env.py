"""MultiTurnSearchEnv: token exactness, budgets, failures, batching, registration."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rllib_search import ENV_ID, MultiTurnSearchEnv, SearchEnvConfig, register_envs, step_batch
from rllib_search.env.protocols import get_protocol
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from tests.helpers import PASSAGES, RECORDS


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run_episode(env, tokenizer, segments: list[str], record_index: int = 0):
    """Step through ``segments``; return everything the env emitted, in order."""
    prompt, _ = env.reset(seed=0, options={"index": record_index})
    emitted = [("prompt", list(prompt))]
    result = None
    for text in segments:
        ids = encode(tokenizer, text)
        result = env.step(ids)
        emitted.append(("generated", ids))
        emitted.append(("observation", list(result[0])))
        if result[2] or result[3]:
            break
    return emitted, result


def assert_token_exact(env, emitted):
    ids = [i for _, chunk in emitted for i in chunk]
    mask = [int(kind == "generated") for kind, chunk in emitted for _ in chunk]
    assert env.trajectory.token_ids == ids
    assert env.trajectory.loss_mask == mask


@pytest.mark.parametrize("protocol", ["search_r1", "r1_searcher", "r_search"])
def test_episode_is_token_exact(tiny_tokenizer, retriever, protocol):
    p = get_protocol(protocol)
    env = MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS, {"protocol": protocol})
    segments = [
        p.render_search("Tarquin Oskaley born", thought="Find the birthplace."),
        "garbage without tags",
        p.render_search("Velmora country", thought="Now the country."),
        p.render_answer("Dravenia", thought="Done.", evidence="Velmora is located in Dravenia."),
    ]
    emitted, (obs, reward, terminated, truncated, info) = run_episode(env, tiny_tokenizer, segments, 1)
    assert terminated and not truncated
    assert len(obs) == 0
    assert_token_exact(env, emitted)
    # Observations are exactly what the protocol formats, tokenised once.
    search_obs = emitted[2][1]
    assert tiny_tokenizer.decode(search_obs) == p.format_observation(
        retriever.search(["Tarquin Oskaley born"], 3)[0]
    )
    assert tiny_tokenizer.decode(emitted[4][1]) == p.rethink_text
    assert info["answer"] == "Dravenia"
    assert info["searches"] == 2 and info["invalid_actions"] == 1
    assert reward > 0
    assert env.trajectory.turn_spans == [
        (s.start, s.end) for s in env.trajectory.spans if s.kind == "generated"
    ]


def test_search_r1_reward_and_format_on_a_clean_episode(tiny_tokenizer, retriever):
    env = MultiTurnSearchEnv(
        tiny_tokenizer, retriever, RECORDS, {"reward_config": {"lambda_format": 0.2, "lambda_retrieval": 0.1}}
    )
    protocol = get_protocol("search_r1")
    segments = [
        protocol.render_search("Tarquin Oskaley", thought="t"),
        protocol.render_answer("Velmora", thought="t"),
    ]
    _, (_, reward, terminated, _, info) = run_episode(env, tiny_tokenizer, segments, 0)
    assert terminated and reward == 1.0
    assert info["format_valid"] and info["reward_components"] == {
        "em": 1.0,
        "format": 1.0,
        "retrieval_hit": 1.0,
    }
    # Wrong answer, valid format, gold retrieved: λ_f + λ_r.
    segments[1] = protocol.render_answer("Ostrel", thought="t")
    _, (_, reward, *_rest) = run_episode(env, tiny_tokenizer, segments, 0)
    assert reward == pytest.approx(0.3)


def test_chat_template_prompt(smollm2_tokenizer, retriever):
    env = MultiTurnSearchEnv(smollm2_tokenizer, retriever, RECORDS, {"protocol": "r_search"})
    prompt, info = env.reset(options={"index": 0})
    text = smollm2_tokenizer.decode(prompt)
    assert text.startswith(
        "<|im_start|>system\nYou are a helpful assistant that can solve the given question"
    )
    assert text.endswith(
        "<|im_start|>user\nWhere was Tarquin Oskaley born?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert info["prompt_length"] == len(prompt)


def test_compact_search_r1_has_search_r1s_episode_with_a_shorter_prompt(smollm2_tokenizer, retriever):
    """search_r1_compact: the same generated and observed ids as search_r1, its instruction as the system
    message (replacing SmolLM2's default one) and under half the prompt tokens."""
    segments = [
        "<think> look </think>\n<search> Tarquin Oskaley </search>",
        "<think> found </think>\n<answer> Velmora </answer>",
    ]
    episodes = {}
    for name in ("search_r1", "search_r1_compact"):
        env = MultiTurnSearchEnv(smollm2_tokenizer, retriever, RECORDS, {"protocol": name})
        emitted, result = run_episode(env, smollm2_tokenizer, segments)
        assert_token_exact(env, emitted)
        episodes[name] = (emitted, result[1], result[4]["format_valid"])
    (full, full_reward, full_format), (compact, compact_reward, compact_format) = episodes.values()
    assert compact[1:] == full[1:]  # everything after the prompt
    assert (compact_reward, compact_format) == (full_reward, full_format) == (1.0, True)
    text = smollm2_tokenizer.decode(compact[0][1])
    assert text.startswith("<|im_start|>system\nAnswer the question. Think inside <think> </think>")
    assert "SmolLM" not in text and "Question:" not in text
    assert text.endswith(
        "<|im_start|>user\nWhere was Tarquin Oskaley born?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(compact[0][1]) < len(full[0][1]) / 2


def test_smollm2_episode_token_exact_with_eos(smollm2_tokenizer, retriever):
    env = MultiTurnSearchEnv(smollm2_tokenizer, retriever, RECORDS)
    prompt, _ = env.reset(options={"index": 0})
    seg1 = encode(smollm2_tokenizer, "<think> look </think>\n<search> Tarquin Oskaley </search>")
    obs1, *_ = env.step(seg1)
    eos = smollm2_tokenizer.eos_token_id
    seg2 = [*encode(smollm2_tokenizer, "<think> ok </think>\n<answer> Velmora </answer>"), eos]
    _, reward, terminated, _, info = env.step(seg2)
    assert terminated and reward == 1.0 and info["format_valid"]  # EOS is not protocol text
    assert env.trajectory.token_ids == [*prompt, *seg1, *obs1, *seg2]
    assert env.trajectory.response_mask == [1] * len(seg1) + [0] * len(obs1) + [1] * len(seg2)


def test_observation_is_cut_in_tokens_and_stays_closed(tiny_tokenizer):
    long_passages = [type(PASSAGES[0])("x", "Long", "word " * 400)]
    env = MultiTurnSearchEnv(tiny_tokenizer, BM25Retriever(long_passages), RECORDS, {"max_obs_tokens": 40})
    env.reset(options={"index": 0})
    obs, _, _, _, info = env.step(encode(tiny_tokenizer, "<think>a</think><search> word </search>"))
    assert len(obs) == 40
    closing = encode(tiny_tokenizer, "</information>\n\n")
    assert list(obs[-len(closing) :]) == closing
    assert info["observation_truncations"] == 1
    assert env.retrieved_blocks[0].startswith('Doc 1(Title: "Long") word')


def test_max_turns_truncates_and_skips_the_last_search(tiny_tokenizer, retriever):
    calls = []

    class CountingRetriever(BM25Retriever):
        def search(self, queries, topk):
            calls.append(list(queries))
            return super().search(queries, topk)

    env = MultiTurnSearchEnv(tiny_tokenizer, CountingRetriever(PASSAGES), RECORDS, {"max_turns": 2})
    env.reset(options={"index": 0})
    search = encode(tiny_tokenizer, "<think>a</think><search> Velmora </search>")
    assert env.step(search)[2:4] == (False, False)
    obs, _, terminated, truncated, info = env.step(search)
    assert (terminated, truncated, len(obs)) == (False, True, 0)
    assert len(calls) == 1  # the search on the last turn is not executed
    assert info["turn"] == 2 and "reward_components" in info
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(search)


def test_whole_trajectory_budget(tiny_tokenizer, retriever):
    budget = 400
    env = MultiTurnSearchEnv(
        tiny_tokenizer, retriever, RECORDS, {"max_total_tokens": budget, "max_turns": 50}
    )
    env.reset(options={"index": 0})
    search = encode(tiny_tokenizer, "<think>a</think><search> Velmora </search>")
    for _ in range(50):
        _, _, terminated, truncated, info = env.step(search)
        assert not terminated
        assert len(env.trajectory) <= budget
        if truncated:
            break
    # The last observation was cut to the tokens left: the trajectory fills the budget exactly.
    assert truncated and len(env.trajectory) == budget and env.remaining_tokens == 0
    assert info["observation_truncations"] == 1 and "reward_components" in info


def test_retriever_failure_becomes_an_error_observation(tiny_tokenizer):
    class DownRetriever:
        def search(self, queries, topk):
            raise ConnectionError("retriever unreachable")

    env = MultiTurnSearchEnv(tiny_tokenizer, DownRetriever(), RECORDS)
    env.reset(options={"index": 0})
    obs, _, terminated, truncated, info = env.step(
        encode(tiny_tokenizer, "<think>a</think><search> q </search>")
    )
    text = tiny_tokenizer.decode(obs)
    assert text.startswith("\n\n<information>Search failed: ConnectionError: retriever unreachable")
    assert text.endswith("</information>\n\n")
    assert info["retriever_errors"] == 1 and info["searches"] == 0
    assert not (terminated or truncated)


def test_step_batch_sends_one_retriever_call_per_turn(tiny_tokenizer):
    calls = []

    class CountingRetriever(BM25Retriever):
        def search(self, queries, topk):
            calls.append(list(queries))
            return super().search(queries, topk)

    retriever = CountingRetriever(PASSAGES)
    envs = [MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS) for _ in range(4)]
    for i, env in enumerate(envs):
        env.reset(options={"index": i})
    segments = [
        "<think>a</think><search> Tarquin Oskaley </search>",
        "no action here",
        "<think>a</think><search> Quellon Works </search>",
        "<think>a</think><answer> Mirelle Dask </answer>",
    ]
    results = step_batch(envs, [encode(tiny_tokenizer, s) for s in segments])
    assert calls == [["Tarquin Oskaley", "Quellon Works"]]
    assert [r.terminated for r in results] == [False, False, False, True]
    assert results[1].info["invalid_reason"] == "no search or answer"
    # Same observations as stepping one env at a time.
    solo = MultiTurnSearchEnv(tiny_tokenizer, BM25Retriever(PASSAGES), RECORDS)
    solo.reset(options={"index": 0})
    assert list(solo.step(encode(tiny_tokenizer, segments[0]))[0]) == list(results[0].observation)


class RecordingJudge:
    """A reader that answers with the evidence's last word and remembers every call it got."""

    def __init__(self, fail: bool = False):
        self.calls: list[list[tuple[str, str]]] = []
        self.fail = fail

    def answer_evidence(self, questions, evidences):
        self.calls.append(list(zip(questions, evidences)))
        if self.fail:
            raise ConnectionError("judge replica died")
        return [evidence.rstrip(".").split()[-1] for evidence in evidences]


R_SEARCH_TURNS = {
    "answer_now": [
        "<original_evidence>Mirelle Dask founded Quellon Works.</original_evidence><answer> x </answer>"
    ],
    "search_then_answer": [
        "<search> Tarquin Oskaley </search>",
        "<original_evidence>Tarquin Oskaley was born in Velmora.</original_evidence>\n"
        "<answer> Velmora </answer>",
    ],
    "no_evidence": ["<answer> Velmora </answer>"],
}


def run_r_search_batch(tokenizer, judge, *, score_each_turn: bool):
    """Three R-Search episodes ending at different turns; returns (envs, results, judge reports)."""
    envs = [
        MultiTurnSearchEnv(tokenizer, BM25Retriever(PASSAGES), RECORDS, {"protocol": "r_search"}, judge=judge)
        for _ in R_SEARCH_TURNS
    ]
    for env, record in zip(envs, [RECORDS[2], RECORDS[0], RECORDS[0]]):
        env.reset(options={"record": record})
    scripts = list(R_SEARCH_TURNS.values())
    active, turn = [0, 1, 2], 0
    while active:
        actions = [encode(tokenizer, scripts[i][turn]) for i in active]
        step_batch([envs[i] for i in active], actions, score=score_each_turn)
        active = [i for i in active if not envs[i].done]
        turn += 1
    return envs


def test_one_judge_call_scores_every_episode_of_a_batch(tiny_tokenizer):
    from rllib_search.env.search_env import score_episodes

    judge = RecordingJudge()
    envs = run_r_search_batch(tiny_tokenizer, judge, score_each_turn=False)
    assert judge.calls == [] and all(env.awaits_score for env in envs)
    report = score_episodes(envs)
    # One call for both evidence boxes (the episodes ended at turns 1 and 2); none for the episode without.
    assert judge.calls == [
        [
            ("Who founded Quellon Works?", "Mirelle Dask founded Quellon Works."),
            ("Where was Tarquin Oskaley born?", "Tarquin Oskaley was born in Velmora."),
        ]
    ]
    assert (report.calls, report.prompts, report.errors) == (1, 2, 0)
    first, second, third = (env.reward_breakdown for env in envs)
    assert first.components["evidence_f1"] == 0.0 and envs[0].evidence_answer == "Works"
    assert second.components["evidence_f1"] == 1.0 and envs[1].evidence_answer == "Velmora"
    assert third.notes["evidence"] == "no evidence box: evidence term is 0"
    assert envs[1].last_step_result().reward == pytest.approx(second.total)
    assert envs[1].last_step_result().info["evidence_answer"] == "Velmora"
    assert score_episodes(envs).calls == 0  # scored episodes are never judged twice


def test_step_batch_judges_the_episodes_that_end_in_each_turn(tiny_tokenizer):
    judge = RecordingJudge()
    envs = run_r_search_batch(tiny_tokenizer, judge, score_each_turn=True)
    assert [len(call) for call in judge.calls] == [1, 1]
    assert all(not env.awaits_score for env in envs)


def test_a_failing_judge_costs_the_evidence_term_and_is_counted(tiny_tokenizer):
    from rllib_search.env.search_env import score_episodes

    envs = run_r_search_batch(tiny_tokenizer, RecordingJudge(fail=True), score_each_turn=False)
    report = score_episodes(envs)
    assert (report.calls, report.prompts, report.errors) == (1, 2, 2)
    judged = [env.reward_breakdown for env in envs[:2]]
    assert all(r.components["judge_error"] == 1.0 and r.components["evidence_f1"] == 0.0 for r in judged)
    assert all("ConnectionError: judge replica died" in r.notes["evidence"] for r in judged)
    assert envs[2].reward_breakdown.components["judge_error"] == 0.0

    class ShortJudge(RecordingJudge):
        def answer_evidence(self, questions, evidences):
            return ["one answer"]

    envs = run_r_search_batch(tiny_tokenizer, ShortJudge(), score_each_turn=False)
    assert score_episodes(envs).errors == 2
    assert "1 answers for 2 questions" in envs[0].reward_breakdown.notes["evidence"]


def test_gym_step_asks_the_judge_for_its_own_episode(tiny_tokenizer):
    judge = RecordingJudge()
    env = MultiTurnSearchEnv(
        tiny_tokenizer, BM25Retriever(PASSAGES), RECORDS, {"protocol": "r_search"}, judge=judge
    )
    env.reset(options={"record": RECORDS[0]})
    _, reward, terminated, _, info = env.step(encode(tiny_tokenizer, R_SEARCH_TURNS["search_then_answer"][1]))
    assert terminated and len(judge.calls) == 1
    assert info["reward_components"]["evidence_f1"] == 1.0
    # A plain function is a judge too.
    env = MultiTurnSearchEnv(
        tiny_tokenizer, None, RECORDS, {"protocol": "r_search"}, judge=lambda q, e: "Velmora"
    )
    env.reset(options={"record": RECORDS[0]})
    assert env.step(encode(tiny_tokenizer, R_SEARCH_TURNS["search_then_answer"][1]))[1] == pytest.approx(
        reward
    )


def test_logprobs_are_kept_for_generated_tokens(tiny_tokenizer, retriever):
    env = MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS)
    prompt, _ = env.reset(options={"index": 0})
    ids = encode(tiny_tokenizer, "<think>a</think><answer> Velmora </answer>")
    logprobs = [-0.5] * len(ids)
    env.step({"token_ids": ids, "logprobs": logprobs})
    assert env.trajectory.logprobs[len(prompt) :] == logprobs
    assert all(np.isnan(env.trajectory.logprobs[: len(prompt)]))


def test_out_of_vocabulary_ids_are_rejected(tiny_tokenizer, retriever):
    env = MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS)
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        env.step([len(tiny_tokenizer) + 10])


def test_spaces_describe_ragged_token_sequences(tiny_tokenizer, retriever):
    env = MultiTurnSearchEnv(tiny_tokenizer, retriever, RECORDS)
    prompt, _ = env.reset(seed=3)
    assert env.observation_space.contains(prompt)
    assert env.action_space.contains(
        np.asarray(encode(tiny_tokenizer, "<answer> x </answer>"), dtype=np.int64)
    )
    assert env.action_space.feature_space.n == len(tiny_tokenizer)


def test_config_validation():
    with pytest.raises(ValueError, match="max_turns"):
        SearchEnvConfig(max_turns=0)
    with pytest.raises(ValueError, match="unknown env config keys"):
        SearchEnvConfig.from_dict({"max_turn": 3})


def test_registered_with_rllib_and_gymnasium(tiny_tokenizer, tmp_path):
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from rllib_search.data.formats import write_corpus_jsonl, write_qa_jsonl

    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "test.jsonl"
    write_corpus_jsonl(PASSAGES, corpus)
    write_qa_jsonl(RECORDS, questions)
    tokenizer_dir = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tokenizer_dir)
    env_config = {
        "tokenizer": str(tokenizer_dir),
        "retriever": {"type": "bm25", "corpus": str(corpus)},
        "dataset": str(questions),
        "protocol": "r1_searcher",
        "max_turns": 3,
    }
    register_envs()  # an earlier test's Ray session took the import-time registration with it
    creator = _global_registry.get(ENV_CREATOR, ENV_ID)
    env = creator(env_config)
    assert isinstance(env, MultiTurnSearchEnv) and env.protocol.name == "r1_searcher"
    prompt, info = env.reset(seed=0)
    assert len(prompt) == info["prompt_length"]
    obs, *_ = env.step(encode(tiny_tokenizer, "<think>a</think><|begin_of_query|> Velmora <|end_of_query|>"))
    assert "Velmora is a city" in tiny_tokenizer.decode(obs)

    gym_env = gym.make(ENV_ID, **env_config)
    assert isinstance(gym_env.unwrapped, MultiTurnSearchEnv)
    with pytest.raises(ValueError, match="unknown env_config keys"):
        creator({**env_config, "max_turn": 2})
