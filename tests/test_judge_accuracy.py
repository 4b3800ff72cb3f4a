"""The judge's prompt (worked examples before R-Search's verbatim template), the short-answer extraction,
and how a judge's accuracy is measured: three kinds of evidence built from the synthetic world and scored
as the evidence reward scores answers."""

from __future__ import annotations

import pytest

from benchmarks.judge_bench import Variant, choose, evidence_cases
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.env.judge import (
    EVIDENCE_JUDGE_TEMPLATE,
    JUDGE_EXAMPLES,
    ExtractingJudge,
    JudgeCase,
    JudgePrompt,
    evidence_prompt,
    extract_short_answer,
    few_shot_prefix,
    judge_accuracy,
)
from rllib_search.serve.judge.client import JudgeClient, build_judge
from rllib_search.serve.retrieval.bm25 import BM25Retriever

# R-Search, Table 5 (Appendix B.2), word for word.
PAPER_TEMPLATE = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages: {evidence}\n\nQuestion: {question}\n\nAnswer:"
)


def test_the_template_is_r_searchs_and_the_bare_prompt_is_it_alone():
    assert EVIDENCE_JUDGE_TEMPLATE == PAPER_TEMPLATE
    bare = PAPER_TEMPLATE.format(evidence="E.", question="Q?")
    assert JudgePrompt().fill("Q?", "E.") == evidence_prompt("Q?", "E.") == bare


def test_examples_and_a_prefix_come_before_the_verbatim_template():
    question, evidence = "Who founded Quellon Works?", "Quellon Works: founded by Mirelle Dask."
    prompt = JudgePrompt(examples=2, prefix="Read carefully.\n\n").fill(question, evidence)
    bare = PAPER_TEMPLATE.format(evidence=evidence, question=question)
    assert prompt.endswith(bare)
    assert prompt == "Read carefully.\n\n" + few_shot_prefix(2) + bare
    # Each worked example is the same template, filled and answered in a few words, then a blank line.
    shown = few_shot_prefix(2).split("\n\nAnswer the question")
    assert len(shown) == 2
    for (q, e, answer), block in zip(JUDGE_EXAMPLES, few_shot_prefix(2).split("\n\n\n\n")):
        assert PAPER_TEMPLATE.format(evidence=e, question=q) + f" {answer}" in block
    assert few_shot_prefix(0) == ""
    with pytest.raises(ValueError, match="examples"):
        JudgePrompt(examples=len(JUDGE_EXAMPLES) + 1)


@pytest.mark.parametrize(
    ("answer", "question", "short"),
    [
        ("In the country of Vorvaux.", "In which country is the city where X was born?", "Vorvaux"),
        (
            "The Zantibrisk Tides was formed in 2011 in Luebrisk, their hometown.",
            "In which city was The Zantibrisk Tides formed?",
            "Luebrisk",
        ),
        (
            "Mara Ellison founded Hollow Pine Records in 1987.",
            "Who founded Hollow Pine Records?",
            "Mara Ellison",
        ),
        ("He studied at the University of Korad for years.", "Which university?", "University of Korad"),
        ("Nelune University", "Which university did X attend?", "Nelune University"),
        ("it is not given in the passages", "Who founded X?", "it is not given in the passages"),
    ],
)
def test_extract_short_answer(answer, question, short):
    assert extract_short_answer(answer, question) == short


def test_accuracy_per_evidence_kind_is_scored_as_the_reward_scores():
    cases = [
        JudgeCase("Q1?", "Ann Lee founded it.", ("Ann Lee",), "gold"),
        JudgeCase("Q2?", "Born in Karos.", ("Karos",), "gold"),
        JudgeCase("Q1?", "", ("Ann Lee",), "none"),
        JudgeCase("Q2?", "Born in Sarquor.", ("Karos",), "misleading"),
    ]
    answers = {"Ann Lee founded it.": "Ann Lee", "Born in Karos.": "In the city of Karos.", "": "Bo Tan"}
    figures, said = judge_accuracy(lambda q, e: answers.get(e, "Sarquor"), cases)
    assert said == ["Ann Lee", "In the city of Karos.", "Bo Tan", "Sarquor"]
    # "in the city of karos" -> "in city of karos" (articles dropped): F1 = 2 * 1 / (4 + 1).
    assert figures["gold"] == {"f1": (1.0 + 0.4) / 2, "em": 0.5, "gold_contained": 1.0, "count": 2}
    assert figures["none"] == {"f1": 0.0, "em": 0.0, "gold_contained": 0.0, "count": 1}
    assert figures["misleading"] == {"f1": 0.0, "em": 0.0, "gold_contained": 0.0, "count": 1}
    # The extraction step turns the sentence into the gold.
    extracted, _ = judge_accuracy(ExtractingJudge(lambda q, e: answers.get(e, "Sarquor")), cases)
    assert extracted["gold"]["f1"] == extracted["gold"]["em"] == 1.0


@pytest.fixture(scope="module")
def world_cases():
    world = generate_world(SyntheticWorldConfig(seed=3, num_passages=600, num_train=0, num_test=60))
    return evidence_cases(world.test, BM25Retriever(world.passages))


def test_evidence_cases_from_the_synthetic_world(world_cases):
    assert len(world_cases) >= 10
    for gold, none, misleading in world_cases:
        assert (gold.kind, none.kind, misleading.kind) == ("gold", "none", "misleading")
        assert gold.question == none.question == misleading.question and none.evidence == ""
        assert any(answer in gold.evidence for answer in gold.golds)
        assert not any(answer in misleading.evidence for answer in misleading.golds)
        # As many passages ("Title: text"), the last one the twin's instead of the gold's.
        assert gold.evidence != misleading.evidence
        assert gold.evidence.count(": ") == misleading.evidence.count(": ")


def test_a_reader_scores_high_on_gold_and_low_on_misleading_evidence(world_cases):
    """A judge that echoes the gold when the evidence states it, else the twin's passage's subject, against
    one that always echoes the gold (it ignores the evidence, and so scores as well on misleading)."""
    golds = {group[0].question: group[0].golds[0] for group in world_cases}

    def reader(question: str, evidence: str) -> str:
        return golds[question] if golds[question] in evidence else evidence.rsplit(": ", 1)[0][-20:]

    flat = [case for group in world_cases for case in group]
    reading, _ = judge_accuracy(reader, flat)
    assert reading["gold"]["f1"] == reading["gold"]["em"] == 1.0
    assert reading["misleading"]["f1"] < 0.2 and reading["none"]["f1"] == 0.0
    guessing, _ = judge_accuracy(lambda question, evidence: golds[question], flat)
    assert {kind: row["f1"] for kind, row in guessing.items()} == {
        "gold": 1.0,
        "none": 1.0,
        "misleading": 1.0,
    }
    rows = [
        {"name": "guessing", "by_evidence": guessing},
        {"name": "reading", "by_evidence": reading},
        {"name": "reading again", "by_evidence": reading},
    ]
    assert choose(rows)["name"] == "reading"  # the largest gold - misleading margin, first on a tie


def test_the_prompt_options_round_trip_through_a_judge_spec():
    spec = {"type": "url", "url": "http://127.0.0.1:9/judge/v1", "examples": 2, "prompt_prefix": "Hi.\n"}
    client = build_judge(spec)
    assert isinstance(client, JudgeClient)
    assert client.prompt == JudgePrompt(examples=2, prefix="Hi.\n")
    assert JudgeClient(url="http://127.0.0.1:9/v1").prompt == JudgePrompt()
    with pytest.raises(ValueError, match="examples"):
        build_judge({**spec, "examples": 99})
    assert Variant("4 examples", examples=4).describe() == {
        "name": "4 examples",
        "examples": 4,
        "extract_short_answer": False,
    }
