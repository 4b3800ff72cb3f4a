"""Search-R1 parquet, FlashRAG QA jsonl and corpus files: round trips, foreign files and malformed input."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_search.data.errors import DataFormatError
from rllib_search.data.formats import (
    corpus_jsonl_to_parquet,
    iter_passages,
    read_corpus,
    read_qa_file,
    read_qa_jsonl,
    read_search_r1_parquet,
    write_corpus_jsonl,
    write_qa_jsonl,
    write_search_r1_parquet,
)
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage

RECORDS = [
    QARecord(
        id="train_0",
        question="In which country is the city where Tarquin Oskaley was born?",
        golden_answers=["Dravenia"],
        data_source="synthetic",
        split="train",
        extra={
            "num_hops": 2,
            "hops": [
                {"query": "Tarquin Oskaley birthplace", "answer": "Velmora"},
                {"query": "Velmora country", "answer": "Dravenia"},
            ],
        },
    ),
    QARecord(
        id="train_1",
        question="Which band released the album Ostrel Nights?",
        golden_answers=["The Quellon Tides", "Quellon Tides"],
        data_source="synthetic",
        split="train",
        extra={"num_hops": 1, "hops": [{"query": "Ostrel Nights band", "answer": "The Quellon Tides"}]},
    ),
    QARecord(id="q7", question="who wrote hamlet?", golden_answers=["Shakespeare"], data_source="nq"),
]

# The instruction Search-R1's data scripts put before every question.
SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search>. You can search as many times as you want. If you find no further "
    "external knowledge needed, you can directly provide the answer inside <answer> and </answer> without "
    "detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)


# --- Search-R1 parquet --------------------------------------------------------------------------------------


def test_search_r1_parquet_round_trip_keeps_typed_extra_info(tmp_path):
    path = tmp_path / "train.parquet"
    write_search_r1_parquet(RECORDS, path)

    assert read_search_r1_parquet(path) == RECORDS
    schema = pq.read_schema(path)
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    extra_info = schema.field("extra_info").type
    assert extra_info.field("index").type == pa.int64()
    assert extra_info.field("num_hops").type == pa.int64()
    assert extra_info.field("hops").type == pa.list_(
        pa.struct([("query", pa.string()), ("answer", pa.string())])
    )
    first = pq.read_table(path).slice(0, 1).to_pylist()[0]
    assert first["prompt"] == [{"role": "user", "content": RECORDS[0].question}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": {"target": ["Dravenia"]}}
    assert first["ability"] == "fact-reasoning"


def test_search_r1_parquet_uses_the_prompt_builder(tmp_path):
    path = tmp_path / "test.parquet"
    write_search_r1_parquet(
        RECORDS,
        path,
        prompt_builder=lambda q: [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=q)}],
    )
    prompts = pq.read_table(path).column("prompt").to_pylist()
    assert prompts[2] == [
        {"role": "user", "content": SEARCH_R1_TEMPLATE.format(question="who wrote hamlet?")}
    ]
    assert [r.question for r in read_search_r1_parquet(path)] == [r.question for r in RECORDS]


def test_reads_a_parquet_written_in_search_r1_style(tmp_path):
    """Search-R1's own files: the question only inside the templated prompt, ids only as indices."""
    questions = ["who got the first nobel prize in physics?", "when did the eagles win last super bowl?"]
    table = pa.table(
        {
            "data_source": ["nq", "nq"],
            "prompt": [
                [{"content": SEARCH_R1_TEMPLATE.format(question=q), "role": "user"}] for q in questions
            ],
            "ability": ["fact-reasoning", "fact-reasoning"],
            "reward_model": [
                {"ground_truth": {"target": ["Wilhelm Conrad Röntgen"]}, "style": "rule"},
                {"ground_truth": {"target": ["2017", "Super Bowl LII"]}, "style": "rule"},
            ],
            "extra_info": [{"index": 0, "split": "test"}, {"index": 1, "split": "test"}],
        }
    )
    path = tmp_path / "test.parquet"
    pq.write_table(table, path)

    assert read_search_r1_parquet(path) == [
        QARecord("0", questions[0], ["Wilhelm Conrad Röntgen"], "nq", "test"),
        QARecord("1", questions[1], ["2017", "Super Bowl LII"], "nq", "test"),
    ]


def test_search_r1_parquet_tolerates_a_string_gold_and_no_extra_info(tmp_path):
    table = pa.table(
        {
            "data_source": ["hotpotqa"],
            "prompt": [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]],
            "reward_model": [{"style": "rule", "ground_truth": {"target": "Because"}}],
        }
    )
    path = tmp_path / "hotpotqa" / "dev.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)

    assert read_search_r1_parquet(path) == [QARecord("0", "Why?", ["Because"], "hotpotqa", "dev")]


# --- FlashRAG QA jsonl --------------------------------------------------------------------------------------


def test_qa_jsonl_round_trip(tmp_path):
    path = tmp_path / "train.jsonl"
    write_qa_jsonl(RECORDS, path)

    assert read_qa_jsonl(path) == RECORDS
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[0])["hops"] == RECORDS[0].extra["hops"]


def test_reads_flashrag_jsonl_with_defaults_from_the_file_name(tmp_path):
    lines = [
        {"id": "test_0", "question": "who sings i'm a believer?", "golden_answers": ["The Monkees"]},
        {"id": 17, "question": "capital of peru?", "golden_answers": ["Lima"], "metadata": {"type": "geo"}},
    ]
    nq = tmp_path / "nq"
    nq.mkdir()
    (nq / "test.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    (tmp_path / "popqa.jsonl").write_text(json.dumps(lines[0]) + "\n", encoding="utf-8")

    assert read_qa_jsonl(nq / "test.jsonl") == [
        QARecord("test_0", "who sings i'm a believer?", ["The Monkees"], "nq", "test"),
        QARecord("17", "capital of peru?", ["Lima"], "nq", "test", {"metadata": {"type": "geo"}}),
    ]
    (popqa,) = read_qa_jsonl(tmp_path / "popqa.jsonl")
    assert (popqa.data_source, popqa.split) == ("popqa", "train")
    (overridden,) = read_qa_jsonl(tmp_path / "popqa.jsonl", data_source="pop", split="dev")
    assert (overridden.data_source, overridden.split) == ("pop", "dev")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    question=st.text(min_size=1),
    golds=st.lists(st.text(), min_size=1, max_size=3),
    record_id=st.text(min_size=1, max_size=20),
)
def test_any_text_survives_both_qa_formats(tmp_path, question, golds, record_id):
    record = QARecord(record_id, question, golds, "any", "test", {"num_hops": 1, "note": question})
    write_qa_jsonl([record], tmp_path / "any.jsonl")
    write_search_r1_parquet([record], tmp_path / "any.parquet")

    assert read_qa_jsonl(tmp_path / "any.jsonl") == [record]
    assert read_search_r1_parquet(tmp_path / "any.parquet") == [record]


def test_read_qa_file_dispatches_on_the_suffix(tmp_path):
    write_qa_jsonl(RECORDS, tmp_path / "a.jsonl")
    write_search_r1_parquet(RECORDS, tmp_path / "a.parquet")

    assert read_qa_file(tmp_path / "a.jsonl") == RECORDS
    assert read_qa_file(tmp_path / "a.parquet") == RECORDS
    assert {r.split for r in read_qa_file(tmp_path / "a.parquet", split="test")} == {"test"}
    with pytest.raises(DataFormatError, match=r"a\.csv"):
        read_qa_file(tmp_path / "a.csv")


# --- Corpora ------------------------------------------------------------------------------------------------

PASSAGES = [
    Passage(str(i), f"Entity {i}", f'Entity {i} is passage number {i}; it says "{i}"\nover two lines.')
    for i in range(23)
]


def test_corpus_jsonl_to_parquet_streams_in_batches(tmp_path):
    jsonl, parquet = tmp_path / "corpus.jsonl", tmp_path / "corpus.parquet"
    write_corpus_jsonl(PASSAGES, jsonl)

    assert corpus_jsonl_to_parquet(jsonl, parquet, batch_size=5) == len(PASSAGES)
    assert pq.ParquetFile(parquet).metadata.num_row_groups == 5
    table = read_corpus(parquet)
    assert table.schema.names == ["id", "title", "text", "contents"]
    assert table.equals(read_corpus(jsonl))
    assert table.column("contents").to_pylist() == [p.contents for p in PASSAGES]
    assert list(iter_passages(parquet)) == PASSAGES
    assert list(iter_passages(table)) == PASSAGES


def test_corpus_ids_may_be_integers(tmp_path):
    jsonl = tmp_path / "wiki.jsonl"
    jsonl.write_text(
        '{"id": 0, "contents": "\\"Velmora\\"\\nVelmora is a city."}\n{"id": "1", "contents": "untitled"}\n',
        encoding="utf-8",
    )
    assert list(iter_passages(jsonl)) == [
        Passage("0", "Velmora", "Velmora is a city."),
        Passage("1", "", "untitled"),
    ]


# --- Malformed input ----------------------------------------------------------------------------------------


def _qa_line(**fields: object) -> str:
    return json.dumps({"id": "x", "question": "q?", "golden_answers": ["a"]} | fields)


MALFORMED_JSONL = {
    "invalid JSON": (read_qa_jsonl, [_qa_line(), '{"id": "y", "question": '], 1, None),
    "missing question": (
        read_qa_jsonl,
        [_qa_line(), "", json.dumps({"id": "y", "golden_answers": []})],
        2,
        "question",
    ),
    "golds not a list": (read_qa_jsonl, [_qa_line(golden_answers="a")], 0, "golden_answers"),
    "corpus line without contents": (
        read_corpus,
        ['{"id": "1", "contents": "x"}', '{"id": "2"}'],
        1,
        "contents",
    ),
}


@pytest.mark.parametrize("case", MALFORMED_JSONL)
def test_malformed_jsonl_names_file_row_and_field(tmp_path, case):
    reader, lines, row, field = MALFORMED_JSONL[case]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    with pytest.raises(DataFormatError) as caught:
        reader(path)
    err = caught.value
    assert (err.path, err.row, err.field) == (path, row, field)
    assert str(path) in str(err) and f"row {row}" in str(err)
    if field is not None:
        assert f"field '{field}'" in str(err)


def test_corpus_conversion_leaves_no_parquet_behind_on_a_bad_line(tmp_path):
    jsonl, parquet = tmp_path / "corpus.jsonl", tmp_path / "corpus.parquet"
    jsonl.write_text(
        '{"id": "1", "contents": "x"}\n' * 10 + '{"id": [2], "contents": "y"}\n', encoding="utf-8"
    )

    with pytest.raises(DataFormatError, match=r"corpus\.jsonl: row 10, field 'id'"):
        corpus_jsonl_to_parquet(jsonl, parquet, batch_size=3)
    assert list(tmp_path.iterdir()) == [jsonl]


def test_parquet_without_reward_model_names_file_and_column(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"data_source": ["nq"], "prompt": [[{"role": "user", "content": "q?"}]]}), path)

    with pytest.raises(DataFormatError) as caught:
        read_search_r1_parquet(path)
    assert (caught.value.path, caught.value.row, caught.value.field) == (path, None, "reward_model")
    assert str(caught.value) == f"{path}: field 'reward_model': missing column"


def test_parquet_with_a_mistyped_gold_names_file_row_and_field(tmp_path):
    path = tmp_path / "train.parquet"
    write_search_r1_parquet(RECORDS, path)
    table = pq.read_table(path)
    reward_models = table.column("reward_model").to_pylist()
    reward_models[1] = {"style": "rule", "ground_truth": {"target": None}}
    pq.write_table(table.set_column(3, "reward_model", pa.array(reward_models)), path)

    with pytest.raises(
        DataFormatError, match=r"train\.parquet: row 1, field 'reward_model\.ground_truth\.target'"
    ):
        read_search_r1_parquet(path)


def test_a_file_that_is_not_parquet_is_a_data_format_error(tmp_path):
    path = tmp_path / "corpus.parquet"
    path.write_text("not parquet", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"corpus\.parquet"):
        read_corpus(path)


def test_data_format_error_survives_pickling():
    """Ray re-raises a worker's exception in the driver by pickling it."""
    err = DataFormatError(Path("train.jsonl"), 7, "golden_answers", "expected a list of strings, got int")
    copy = pickle.loads(pickle.dumps(err))

    assert (
        str(copy)
        == str(err)
        == "train.jsonl: row 7, field 'golden_answers': expected a list of strings, got int"
    )
    assert (copy.path, copy.row, copy.field, copy.reason) == (err.path, err.row, err.field, err.reason)
    assert isinstance(copy, ValueError)
