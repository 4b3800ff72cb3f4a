"""Protocols: templates, parsing of generated segments, observation layout, format checks."""

from __future__ import annotations

import pytest

from rllib_search.data.retrieval import Passage
from rllib_search.env.protocols import (
    R1_SEARCHER,
    R_SEARCH,
    SEARCH_R1,
    Protocol,
    Turn,
    get_protocol,
    protocol_names,
    register_protocol,
)

PASSAGES = [Passage("1", "Velmora", "Velmora is a city."), Passage("2", "Dravenia", "Dravenia is a country.")]


def test_builtin_protocols_by_name():
    assert {"search_r1", "search_r1_compact", "r1_searcher", "r_search"} <= set(protocol_names())
    assert get_protocol("search_r1") is SEARCH_R1
    with pytest.raises(ValueError, match="unknown protocol"):
        get_protocol("nope")


def test_templates_match_the_papers():
    # Search-R1 Table 1: the question goes inside the instruction, sent as one user message.
    # The paper's text written out here, not read back from the protocol.
    table_1 = (
        "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
        "time you get new information. After reasoning, if you find you lack some knowledge, you can call a "
        "search engine by <search> query </search>, and it will return the top searched results between "
        "<information> and </information>. You can search as many times as you want. If you find no "
        "further external knowledge needed, you can directly provide the answer inside <answer> and "
        "</answer> without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
        "Who wrote it?\n"
    )
    assert SEARCH_R1.prompt_messages("Who wrote it?") == [{"role": "user", "content": table_1}]
    # R-Search Table 1 and R1-Searcher: a system template, then the question as the user message.
    for protocol in (R_SEARCH, R1_SEARCHER):
        system, user = protocol.prompt_messages("  Who wrote it? ")
        assert system == {"role": "system", "content": protocol.instruction}
        assert user == {"role": "user", "content": "Who wrote it?"}
    assert "<original_evidence> and </original_evidence>" in R_SEARCH.instruction
    assert "<|begin_of_query|>" in R1_SEARCHER.instruction


def test_stop_strings():
    assert SEARCH_R1.stop_strings == ("</search>", "</answer>")
    assert R1_SEARCHER.stop_strings == ("<|end_of_query|>", "</answer>")
    assert R_SEARCH.stop_strings == ("</search>", "</answer>")


@pytest.mark.parametrize(
    ("segment", "kind", "value"),
    [
        ("<think> need it </think>\n<search> Velmora country </search>", "search", "Velmora country"),
        ("<think>ok</think><answer> Dravenia </answer>", "answer", "Dravenia"),
        ("<search>first</search> then <search>second</search>", "search", "first"),
        ("<answer>a</answer><search>b</search>", "answer", "a"),
        ("<search>q</search><answer>a</answer>", "search", "q"),
        ("<search>  multi\n  line\tquery </search>", "search", "multi line query"),
        ("<search>odd\x00bytes\x07here</search>", "search", "odd bytes here"),
    ],
)
def test_parse_valid_actions(segment, kind, value):
    action = SEARCH_R1.parse_action(segment)
    assert action.kind == kind
    assert (action.query if kind == "search" else action.answer) == value


@pytest.mark.parametrize(
    ("segment", "reason"),
    [
        ("just thinking out loud", "no search or answer"),
        ("<search> unclosed query", "unclosed query"),
        ("<answer> unclosed answer", "unclosed answer"),
        ("</search> misordered <search>", "unclosed query"),
        ("</answer>", "closing tag without opening tag"),
        ("<search>   </search>", "empty query"),
        ("<answer></answer>", "empty answer"),
        ("<search> a <search> b </search>", "nested tag inside search"),
        ("<answer> x <information> y </answer>", "nested tag inside answer"),
        ("<search>" + "x" * 10_000 + "</search>", "query longer than 1000 characters"),
        ("", "no search or answer"),
    ],
)
def test_parse_invalid_actions(segment, reason):
    action = SEARCH_R1.parse_action(segment)
    assert action.kind == "invalid"
    assert action.reason == reason


def test_r1_searcher_parses_its_own_tags():
    action = R1_SEARCHER.parse_action("<think>x</think><|begin_of_query|> Velmora country <|end_of_query|>")
    assert (action.kind, action.query) == ("search", "Velmora country")
    assert R1_SEARCHER.parse_action("<search> not this protocol </search>").kind == "invalid"


def test_r_search_answer_carries_the_evidence():
    segment = (
        "So.\n<original_evidence> Velmora is in Dravenia. </original_evidence>\n<answer> Dravenia </answer>"
    )
    action = R_SEARCH.parse_action(segment)
    assert (action.kind, action.answer, action.evidence) == ("answer", "Dravenia", "Velmora is in Dravenia.")
    assert R_SEARCH.parse_action("<answer> Dravenia </answer>").evidence is None


def test_observation_layouts():
    assert SEARCH_R1.format_observation(PASSAGES) == (
        '\n\n<information>Doc 1(Title: "Velmora") Velmora is a city.\n'
        'Doc 2(Title: "Dravenia") Dravenia is a country.</information>\n\n'
    )
    assert R1_SEARCHER.format_observation(PASSAGES) == (
        '\n<|begin_of_documents|>\n(1)"Velmora"\nVelmora is a city.\n'
        '(2)"Dravenia"\nDravenia is a country.\n<|end_of_documents|>\n'
    )
    assert R_SEARCH.format_observation(PASSAGES) == (
        '\n\n<observation>(Title: "Velmora") Velmora is a city.\n\n'
        '(Title: "Dravenia") Dravenia is a country.</observation>\n\n'
    )


def _turns(*parts: tuple[str, str]) -> list[Turn]:
    return [Turn(source, text) for source, text in parts]  # type: ignore[arg-type]


GOOD_SEARCH_R1 = _turns(
    ("generated", "<think> I need it </think>\n<search> Velmora </search>"),
    ("observation", SEARCH_R1.format_observation(PASSAGES)),
    ("generated", "<think> found </think>\n<answer> Dravenia </answer>"),
)


@pytest.mark.parametrize(
    ("turns", "valid", "reason_part"),
    [
        (GOOD_SEARCH_R1, True, "valid"),
        (_turns(("generated", "<think>direct</think><answer>x</answer>")), True, "valid"),
        (_turns(("generated", "<answer>x</answer>")), False, "unexpected tag <answer> in state start"),
        (_turns(("generated", "<think>a</think>stray<answer>x</answer>")), False, "unexpected text"),
        (_turns(("generated", "<think>a</think><search>q</search>")), False, "ended in state after_query"),
        (_turns(("generated", "<think>a<think>b</think>")), False, "unbalanced <think>"),
        (
            _turns(("generated", "<think>a</think><answer>x</answer><think>b</think>")),
            False,
            "unexpected tag",
        ),
        (
            [*GOOD_SEARCH_R1[:2], Turn("generated", "junk"), Turn("observation", SEARCH_R1.rethink_text)],
            False,
            "unexpected text",
        ),
    ],
)
def test_search_r1_state_machine(turns, valid, reason_part):
    check = SEARCH_R1.check_format(turns)
    assert check.valid is valid
    assert reason_part in check.reason


def test_r1_searcher_format_rules():
    obs = R1_SEARCHER.format_observation(PASSAGES)
    good = _turns(
        ("generated", "<think> look <|begin_of_query|> Velmora <|end_of_query|>"),
        ("observation", obs),
        ("generated", "it is Dravenia </think><answer> Dravenia </answer>"),
    )
    assert R1_SEARCHER.check_format(good).valid
    wrote_docs = _turns(
        ("generated", "<think>x</think><|begin_of_documents|>made up<|end_of_documents|><answer>a</answer>")
    )
    assert "documents block" in R1_SEARCHER.check_format(wrote_docs).reason
    long_answer = _turns(("generated", "<think>x</think><answer>" + "word " * 21 + "</answer>"))
    assert "longer than 20 words" in R1_SEARCHER.check_format(long_answer).reason
    garbled = _turns(("generated", "<think>x\ufffd</think><answer>a</answer>"))
    assert R1_SEARCHER.check_format(garbled).reason == "garbled content"
    no_think = _turns(("generated", "<answer>a</answer>"))
    assert not R1_SEARCHER.check_format(no_think).valid


def test_r_search_format_rules():
    obs = R_SEARCH.format_observation(PASSAGES)
    searched_with_evidence = _turns(
        ("generated", "Plan.\n<search> Velmora </search>"),
        ("observation", obs),
        (
            "generated",
            "<original_evidence> Velmora is a city. </original_evidence><answer> Dravenia </answer>",
        ),
    )
    assert R_SEARCH.check_format(searched_with_evidence).valid
    searched_without_evidence = [
        *searched_with_evidence[:2],
        Turn("generated", "<answer> Dravenia </answer>"),
    ]
    assert not R_SEARCH.check_format(searched_without_evidence).valid
    no_search = _turns(("generated", "I know it. <answer> Dravenia </answer>"))
    assert R_SEARCH.check_format(no_search).valid


def test_user_defined_protocol_without_editing_the_package():
    custom = Protocol(
        name="tool_call_test",
        instruction="Search with <tool>q</tool>, read <result></result>, answer <final></final>. {question}",
        query_open="<tool>",
        query_close="</tool>",
        observation_open="<result>",
        observation_close="</result>",
        answer_open="<final>",
        answer_close="</final>",
        passage_template="[{i}] {title}: {text}",
    )
    register_protocol(custom, overwrite=True)
    assert get_protocol("tool_call_test") is custom
    assert custom.stop_strings == ("</tool>", "</final>")
    assert custom.parse_action("<tool> x </tool>").query == "x"
    assert (
        custom.format_observation(PASSAGES[:1]) == "\n\n<result>[1] Velmora: Velmora is a city.</result>\n\n"
    )
    turns = _turns(
        ("generated", "<think>a</think><tool>x</tool>"),
        ("observation", custom.format_observation(PASSAGES)),
        ("generated", "<think>b</think><final>y</final>"),
    )
    assert custom.check_format(turns).valid
    with pytest.raises(ValueError, match="already registered"):
        register_protocol(custom)
