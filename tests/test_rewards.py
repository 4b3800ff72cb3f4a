"""Rewards: metrics and the papers' formulas on hand-computed cases."""

from __future__ import annotations

import pytest

from rllib_search.env.judge import EVIDENCE_JUDGE_TEMPLATE, evidence_prompt
from rllib_search.env.rewards import (
    R1SearcherRewardConfig,
    ResponseSummary,
    RSearchRewardConfig,
    SearchR1RewardConfig,
    cover_exact_match,
    exact_match,
    make_reward,
    normalize_answer,
    r1_searcher_stage1_reward,
    r1_searcher_stage2_reward,
    r_search_reward,
    retrieval_hit,
    search_r1_reward,
    token_f1,
)


def summary(answer=None, evidence=None, searches=0, blocks=(), valid=True, question="Q?"):
    return ResponseSummary(question, answer, evidence, searches, tuple(blocks), valid)


def test_normalisation_and_metrics():
    assert normalize_answer("  The  Eiffel-Tower!! ") == "eiffeltower"
    assert normalize_answer("A cat, an owl and THE dog.") == "cat owl and dog"
    assert exact_match("the Velmora.", ["velmora"]) == 1.0
    assert exact_match("Velmora City", ["Velmora"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0
    assert cover_exact_match("it is Velmora City", ["velmora"]) == 1.0
    assert cover_exact_match("Velm", ["Velmora"]) == 0.0
    assert cover_exact_match("anything", [""]) == 0.0
    # F1 = 2·|overlap| / (|pred| + |gold|): pred "new velmora city" vs gold "velmora city" -> 2·2/(3+2)
    assert token_f1("New Velmora City", ["Velmora City"]) == pytest.approx(0.8)
    # max over golds
    assert token_f1("Velmora", ["Dravenia", "Velmora"]) == 1.0
    assert token_f1("a b c", ["d"]) == 0.0
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 * 2 / 6)
    assert retrieval_hit(["Doc 1(Title: V) The city of Velmora."], ["velmora"]) is True
    assert retrieval_hit(["nothing here"], ["velmora"]) is False


@pytest.mark.parametrize(
    ("answer", "valid", "hit", "expected"),
    [
        ("Velmora", True, True, 1.0),  # correct, formatted
        ("Velmora", False, True, 1.0 - 0.2),  # correct, not formatted: 1 - λ_f
        ("Wrong", True, True, 0.2 + 0.1),  # wrong, formatted, gold retrieved: λ_f + λ_r
        ("Wrong", True, False, 0.2),  # wrong, formatted, not retrieved: λ_f
        ("Wrong", False, True, 0.0),  # wrong, not formatted
        (None, False, False, 0.0),
    ],
)
def test_search_r1_reward_equation_4(answer, valid, hit, expected):
    blocks = ["Velmora is a city."] if hit else ["Nothing."]
    config = SearchR1RewardConfig(lambda_format=0.2, lambda_retrieval=0.1)
    result = search_r1_reward(summary(answer, blocks=blocks, valid=valid, searches=1), ["Velmora"], config)
    assert result.total == pytest.approx(expected)
    assert result.components["em"] == float(answer == "Velmora")
    assert result.components["format"] == float(valid)
    assert result.components["retrieval_hit"] == float(hit)


def test_search_r1_reward_equation_3_and_plain_em():
    eq3 = SearchR1RewardConfig(lambda_format=0.4)
    assert search_r1_reward(summary("x", blocks=["Velmora"]), ["Velmora"], eq3).total == pytest.approx(0.4)
    # λ_f = λ_r = 0: Search-R1's EM, whatever the format or retrieval.
    for answer, valid in [("Velmora", True), ("Velmora", False), ("x", True), ("x", False)]:
        total = search_r1_reward(summary(answer, blocks=["Velmora"], valid=valid), ["Velmora"]).total
        assert total == exact_match(answer, ["Velmora"])
    with pytest.raises(ValueError):
        SearchR1RewardConfig(lambda_format=1.5)


def test_r1_searcher_stage1():
    config = R1SearcherRewardConfig()
    # eq. 1 + eq. 2: 0.5 for at least one retrieval, 0.5 for a valid format; the answer does not count.
    assert r1_searcher_stage1_reward(summary("wrong", searches=2, valid=True), ["x"], config).total == 1.0
    assert r1_searcher_stage1_reward(summary("x", searches=0, valid=True), ["x"], config).total == 0.5
    assert r1_searcher_stage1_reward(summary("x", searches=1, valid=False), ["x"], config).total == 0.5
    assert r1_searcher_stage1_reward(summary(None, searches=0, valid=False), ["x"], config).total == 0.0


def test_r1_searcher_stage2():
    # eq. 4 + eq. 3: F1 plus -2 when the format is invalid.
    gold = ["Mirelle Dask"]
    assert r1_searcher_stage2_reward(summary("Mirelle Dask", valid=True), gold).total == 1.0
    assert r1_searcher_stage2_reward(summary("Dask", valid=True), gold).total == pytest.approx(2 * 1 / 3)
    assert r1_searcher_stage2_reward(summary("Mirelle Dask", valid=False), gold).total == pytest.approx(-1.0)
    assert r1_searcher_stage2_reward(summary(None, valid=False), gold).total == pytest.approx(-2.0)


def test_r_search_reward_scores_the_judges_answer():
    response = ResponseSummary(
        "Where?", "Dravenia", "Velmora is in Dravenia.", 1, (), True, evidence_answer="Dravenia country"
    )
    result = r_search_reward(
        response, ["Dravenia"], RSearchRewardConfig(gamma_evidence=0.2, gamma_answer=0.2)
    )
    # r_α = 1; r_e = F1("dravenia country", "dravenia") = 2/3; r_f = I_S(γ_e·1 + γ_a·1) = 0.4
    assert result.components == {
        "answer_f1": 1.0,
        "evidence_f1": pytest.approx(2 / 3),
        "format": pytest.approx(0.4),
        "searched": 1.0,
        "judge_error": 0.0,
    }
    assert result.total == pytest.approx(1 + 2 / 3 + 0.4)


def test_the_evidence_template_is_r_searchs_table_5():
    prompt = evidence_prompt("Who founded Quellon Works?", "Quellon Works was founded by Mirelle Dask.")
    assert prompt == (
        "Answer the question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nThe following are given passages: Quellon Works was founded by Mirelle Dask.\n\n"
        "Question: Who founded Quellon Works?\n\nAnswer:"
    )
    assert (
        EVIDENCE_JUDGE_TEMPLATE.count("{evidence}") == 1 and EVIDENCE_JUDGE_TEMPLATE.count("{question}") == 1
    )


def test_r_search_format_term_equation_5():
    gold = ["x"]
    # searched, no evidence, answer: γ_a only
    assert r_search_reward(summary("y", searches=1), gold).components["format"] == pytest.approx(0.2)
    # searched, evidence, no answer: γ_e only
    assert r_search_reward(summary(None, evidence="e", searches=1), gold).components[
        "format"
    ] == pytest.approx(0.2)
    # no search: γ_e is given, plus γ_a for an answer
    assert r_search_reward(summary("y", searches=0), gold).components["format"] == pytest.approx(0.4)
    assert r_search_reward(summary(None, searches=0), gold).components["format"] == pytest.approx(0.2)


def test_r_search_without_a_judge_or_with_a_failing_one():
    result = r_search_reward(summary("x", evidence="e", searches=1), ["x"])
    assert result.components["evidence_f1"] == 0.0 and result.components["judge_error"] == 0.0
    assert result.notes["evidence"] == "no judge configured: evidence term is 0"

    failed = ResponseSummary("Q?", "x", "e", 1, (), True, evidence_answer=None, judge_error="timed out")
    result = r_search_reward(failed, ["x"])
    assert result.components["judge_error"] == 1.0 and result.components["evidence_f1"] == 0.0
    assert "timed out" in result.notes["evidence"]
    assert result.total == pytest.approx(1.0 + 0.4)
    # A judge's answer next to an error is never scored: the error wins.
    both = ResponseSummary("Q?", "x", "e", 1, (), True, evidence_answer="x", judge_error="late")
    assert r_search_reward(both, ["x"]).components["evidence_f1"] == 0.0


def test_make_reward_by_name():
    reward = make_reward("search_r1", {"lambda_format": 0.2})
    assert reward(summary("no", blocks=[], valid=True), ["yes"]).total == pytest.approx(0.2)
    assert make_reward("r1_searcher_stage1")(summary(None, searches=1, valid=False), ["x"]).total == 0.5
    with pytest.raises(ValueError, match="unknown reward"):
        make_reward("nope")
