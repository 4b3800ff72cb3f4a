"""Reading and writing the data files the project meets: QA sets and retrieval corpora.

* Search-R1 parquet: ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model``
  (``{style, ground_truth: {target: [gold, ...]}}``) and ``extra_info`` (``{split, index, ...}``).
* FlashRAG QA jsonl: one ``{"id", "question", "golden_answers", ...}`` object per line.
* Corpora: jsonl lines ``{"id", "contents": "\\"Title\\"\\ntext"}``, converted once to a parquet with
  ``id``, ``title``, ``text`` and ``contents`` columns that is memory-mapped when read.

Anything malformed raises :class:`DataFormatError` naming the file, the row (0-based) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rllib_search.data.errors import DataFormatError
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage

PromptBuilder = Callable[[str], list[dict[str, str]]]

# Files named after a split (FlashRAG's ``<dataset>/<split>.jsonl``, Search-R1's ``train.parquet``).
SPLIT_NAMES = ("train", "dev", "validation", "test")


def _default_source_and_split(path: Path) -> tuple[str, str]:
    """The data source and split a file's name implies: ``nq/test.jsonl`` is ("nq", "test")."""
    if path.stem in SPLIT_NAMES:
        return path.parent.name or path.stem, path.stem
    return path.stem, "train"


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------------------------------------------------
# Search-R1 parquet
# ---------------------------------------------------------------------------------------------------------

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
HOP_TYPE = pa.struct([("query", pa.string()), ("answer", pa.string())])
REWARD_MODEL_TYPE = pa.struct(
    [("style", pa.string()), ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))]
)
# ``extra_info`` fields that hold QARecord attributes rather than entries of ``QARecord.extra``.
RECORD_EXTRA_INFO_FIELDS = ("split", "index", "id", "question")
# Entries of ``QARecord.extra`` with a fixed type (the synthetic world's); other entries get pyarrow's
# inferred type.
TYPED_EXTRA_FIELDS: dict[str, pa.DataType] = {"num_hops": pa.int64(), "hops": pa.list_(HOP_TYPE)}
ABILITY = "fact-reasoning"


def user_message_prompt(question: str) -> list[dict[str, str]]:
    """The default prompt column: one user message holding the plain question."""
    return [{"role": "user", "content": question}]


def write_search_r1_parquet(
    records: list[QARecord], path: str | Path, prompt_builder: PromptBuilder | None = None
) -> None:
    """Write records in Search-R1's parquet schema; ``prompt_builder`` renders each question as messages."""
    build = prompt_builder or user_message_prompt
    table = pa.table(
        {
            "data_source": pa.array([r.data_source for r in records], pa.string()),
            "prompt": pa.array([build(r.question) for r in records], pa.list_(MESSAGE_TYPE)),
            "ability": pa.array([ABILITY] * len(records), pa.string()),
            "reward_model": pa.array(
                [{"style": "rule", "ground_truth": {"target": list(r.golden_answers)}} for r in records],
                REWARD_MODEL_TYPE,
            ),
            "extra_info": _extra_info_array(records),
        }
    )
    pq.write_table(table, path)


def _extra_info_array(records: list[QARecord]) -> pa.StructArray:
    columns = {
        "split": pa.array([r.split for r in records], pa.string()),
        "index": pa.array(list(range(len(records))), pa.int64()),
        "id": pa.array([r.id for r in records], pa.string()),
        "question": pa.array([r.question for r in records], pa.string()),
    }
    for key, type_ in TYPED_EXTRA_FIELDS.items():
        columns[key] = pa.array([r.extra.get(key) for r in records], type_)
    for key in sorted({key for r in records for key in r.extra} - columns.keys()):
        try:
            columns[key] = pa.array([r.extra.get(key) for r in records])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ValueError(f"extra[{key!r}] cannot be stored as one parquet column: {err}") from err
    return pa.StructArray.from_arrays(list(columns.values()), names=list(columns))


def read_search_r1_parquet(
    path: str | Path, data_source: str | None = None, split: str | None = None
) -> list[QARecord]:
    """Read a Search-R1 parquet, ours or Search-R1's own (whose prompt embeds the template).

    ``data_source`` and ``split`` arguments override the rows' own; a row without ``extra_info.split``
    takes its split from the file name when that is a split name (``test.parquet``), else "train".
    """
    path = Path(path)
    table = _read_parquet(path)
    for column in ("data_source", "reward_model"):
        if column not in table.column_names:
            raise DataFormatError(path, None, column, "missing column")
    _, default_split = _default_source_and_split(path)
    records = []
    for i, row in enumerate(table.to_pylist()):
        extra_info = row.get("extra_info") or {}
        if not isinstance(extra_info, dict):
            raise DataFormatError(path, i, "extra_info", f"expected a struct, got {_type_name(extra_info)}")
        index, row_split = extra_info.get("index"), extra_info.get("split") or default_split
        records.append(
            QARecord(
                id=str(extra_info.get("id") or (index if index is not None else i)),
                question=_row_question(path, i, row.get("prompt"), extra_info.get("question")),
                golden_answers=_row_golds(path, i, row["reward_model"]),
                data_source=data_source or _require_str(path, i, "data_source", row["data_source"]),
                split=split or _require_str(path, i, "extra_info.split", row_split),
                extra={
                    key: value
                    for key, value in extra_info.items()
                    if key not in RECORD_EXTRA_INFO_FIELDS and value is not None
                },
            )
        )
    return records


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        if not path.exists():
            raise
        raise DataFormatError(path, None, None, f"not a readable parquet file ({err})") from err


def _row_question(path: Path, row: int, prompt: Any, question: Any) -> str:
    """``extra_info.question`` if there, else the last user message after its last ``Question: ``."""
    if isinstance(question, str):
        return question
    if not isinstance(prompt, list):
        raise DataFormatError(path, row, "prompt", f"expected a list of messages, got {_type_name(prompt)}")
    user_contents = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    if not user_contents:
        raise DataFormatError(path, row, "prompt", "no user message holds the question")
    content = _require_str(path, row, "prompt.content", user_contents[-1])
    return content.rpartition("Question: ")[2].strip()


def _row_golds(path: Path, row: int, reward_model: Any) -> list[str]:
    """``reward_model.ground_truth.target``: a list of strings, or one string."""
    field = "reward_model"
    value = reward_model
    for key in ("ground_truth", "target"):
        if not isinstance(value, dict):
            raise DataFormatError(path, row, field, f"expected a struct, got {_type_name(value)}")
        field, value = f"{field}.{key}", value.get(key)
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise DataFormatError(path, row, field, f"expected a list of strings, got {value!r}")
    return value


def _require_str(path: Path, row: int, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DataFormatError(path, row, field, f"expected a string, got {_type_name(value)}")
    return value


# ---------------------------------------------------------------------------------------------------------
# FlashRAG QA jsonl
# ---------------------------------------------------------------------------------------------------------

QA_JSONL_FIELDS = ("id", "question", "golden_answers", "data_source", "split")


def read_qa_jsonl(
    path: str | Path, data_source: str | None = None, split: str | None = None
) -> list[QARecord]:
    """Read FlashRAG-style QA jsonl; keys other than the record's own go to ``extra``.

    ``data_source`` and ``split`` arguments override the lines' own keys; without either, the file name
    decides: ``nq.jsonl`` is data source "nq", and ``nq/test.jsonl`` is data source "nq", split "test".
    """
    path = Path(path)
    default_source, default_split = _default_source_and_split(path)
    records = []
    for i, line in _json_lines(path):
        golds = line.get("golden_answers")
        if not isinstance(golds, list) or not all(isinstance(g, str) for g in golds):
            raise DataFormatError(
                path, i, "golden_answers", f"expected a list of strings, got {_type_name(golds)}"
            )
        records.append(
            QARecord(
                id=_line_id(path, i, line),
                question=_require_str(path, i, "question", line.get("question")),
                golden_answers=golds,
                data_source=data_source
                or _require_str(path, i, "data_source", line.get("data_source", default_source)),
                split=split or _require_str(path, i, "split", line.get("split", default_split)),
                extra={key: value for key, value in line.items() if key not in QA_JSONL_FIELDS},
            )
        )
    return records


def write_qa_jsonl(records: Iterable[QARecord], path: str | Path) -> None:
    """Write records as FlashRAG-style QA jsonl, ``extra`` entries as further keys."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            line = {
                "id": r.id,
                "question": r.question,
                "golden_answers": list(r.golden_answers),
                "data_source": r.data_source,
                "split": r.split,
            }
            line.update((key, value) for key, value in r.extra.items() if key not in line)
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The (0-based line index, object) of each non-blank line of a jsonl file."""
    with open(path, encoding="utf-8") as f:
        for i, text in enumerate(f):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataFormatError(path, i, None, f"invalid JSON ({err.msg})") from err
            if not isinstance(line, dict):
                raise DataFormatError(path, i, None, f"expected a JSON object, got {_type_name(line)}")
            yield i, line


def _line_id(path: Path, row: int, line: dict[str, Any]) -> str:
    """An ``id`` as found in the wild: a string or an integer, kept as a string."""
    value = line.get("id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(path, row, "id", f"expected a string or an integer, got {_type_name(value)}")
    return str(value)


def read_qa_file(path: str | Path, **kwargs: Any) -> list[QARecord]:
    """Read a QA file by its suffix: ``.parquet`` (Search-R1) or ``.jsonl``/``.json`` (FlashRAG).

    Keyword arguments (``data_source``, ``split``) go to the reader.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        return read_search_r1_parquet(path, **kwargs)
    if path.suffix in (".jsonl", ".json"):
        return read_qa_jsonl(path, **kwargs)
    raise DataFormatError(path, None, None, "unknown QA file type (expected .parquet, .jsonl or .json)")


# ---------------------------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------------------------

CORPUS_SCHEMA = pa.schema(
    [("id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("contents", pa.string())]
)


def write_corpus_jsonl(passages: Iterable[Passage], path: str | Path) -> None:
    """Write passages as Search-R1/FlashRAG corpus jsonl: ``{"id", "contents": "\\"Title\\"\\ntext"}``."""
    with open(path, "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")


CORPUS_BATCH_ROWS = 50_000


def corpus_jsonl_to_parquet(
    jsonl_path: str | Path, parquet_path: str | Path, batch_size: int = CORPUS_BATCH_ROWS
) -> int:
    """Convert a corpus jsonl to parquet ``batch_size`` lines at a time; returns the row count.

    The parquet appears only once complete: it is written beside its final path and renamed.
    """
    batches = corpus_batches(jsonl_path, batch_size)
    return write_batches_atomically(batches, parquet_path, lambda path: pq.ParquetWriter(path, CORPUS_SCHEMA))


def write_batches_atomically(
    batches: Iterable[pa.RecordBatch], target: str | Path, open_writer: Callable[[Path], Any]
) -> int:
    """Write ``batches`` through ``open_writer(path)`` (a context manager with ``write_batch``) to a file
    beside ``target``, renamed to ``target`` only once complete (removed on failure); returns the rows."""
    target = Path(target)
    partial = target.with_name(target.name + ".partial")
    rows = 0
    try:
        with open_writer(partial) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return rows


def corpus_batches(path: str | Path, batch_rows: int = CORPUS_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """A corpus file (``.jsonl`` or ``.parquet``) as record batches of :data:`CORPUS_SCHEMA`, read
    ``batch_rows`` rows at a time: THE normalisation of corpus rows, used by every reader of a corpus.

    jsonl lines ``{"id", "contents": "\"Title\"\ntext"}`` get their title and text split from
    ``contents``; parquet files need ``id``, ``title`` and ``text`` columns and get ``contents`` made
    from them where they have none. Ids become strings, nulls empty strings. The file's type and columns
    are checked before the first batch is asked for.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        return _jsonl_corpus_batches(path, batch_rows)
    if path.suffix == ".parquet":
        return _parquet_corpus_batches(path, _open_corpus_parquet(path), batch_rows)
    raise DataFormatError(path, None, None, "unknown corpus file type (expected .jsonl or .parquet)")


def _jsonl_corpus_batches(path: Path, batch_rows: int) -> Iterator[pa.RecordBatch]:
    columns: dict[str, list[str]] = {name: [] for name in CORPUS_SCHEMA.names}
    for i, line in _json_lines(path):
        contents = line.get("contents")
        if not isinstance(contents, str):
            raise DataFormatError(path, i, "contents", f"expected a string, got {_type_name(contents)}")
        passage = Passage.from_contents(_line_id(path, i, line), contents)
        values = (passage.id, passage.title, passage.text, contents)
        for name, value in zip(CORPUS_SCHEMA.names, values, strict=True):
            columns[name].append(value)
        if len(columns["id"]) >= batch_rows:
            yield pa.RecordBatch.from_pydict(columns, schema=CORPUS_SCHEMA)
            columns = {name: [] for name in CORPUS_SCHEMA.names}
    if columns["id"]:
        yield pa.RecordBatch.from_pydict(columns, schema=CORPUS_SCHEMA)


def _open_corpus_parquet(path: Path) -> pq.ParquetFile:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        if not path.exists():
            raise
        raise DataFormatError(path, None, None, f"not a readable parquet file ({err})") from err
    schema = parquet.schema_arrow
    for column in ("id", "title", "text"):
        if column not in schema.names:
            raise DataFormatError(path, None, column, "missing column")
    for column in CORPUS_SCHEMA.names:
        if column in schema.names and not _castable_to_string(schema.field(column).type):
            raise DataFormatError(
                path, None, column, f"expected strings (or integer ids), got {schema.field(column).type}"
            )
    return parquet


def _castable_to_string(type_: pa.DataType) -> bool:
    """Columns whose values are text as they are: strings, and integers (ids in the wild)."""
    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_integer(type_)


def _parquet_corpus_batches(path: Path, parquet: pq.ParquetFile, batch_rows: int) -> Iterator[pa.RecordBatch]:
    names = parquet.schema_arrow.names
    columns = [name for name in CORPUS_SCHEMA.names if name in names]
    start = 0
    batches = parquet.iter_batches(batch_size=batch_rows, columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as err:  # a damaged data page or a file cut short
            raise DataFormatError(path, start, None, f"unreadable rows from here on ({err})") from err
        ids = pc.cast(batch.column("id"), pa.string())
        if ids.null_count:
            row = start + int(pc.index(pc.is_null(ids), True).as_py())
            raise DataFormatError(path, row, "id", "expected a string or an integer, got null")
        title, text = (pc.fill_null(pc.cast(batch.column(n), pa.string()), "") for n in ("title", "text"))
        if "contents" in names:
            contents = pc.fill_null(pc.cast(batch.column("contents"), pa.string()), "")
        else:
            contents = pc.binary_join_element_wise('"', title, '"\n', text, "")
        yield pa.RecordBatch.from_arrays([ids, title, text, contents], schema=CORPUS_SCHEMA)
        start += batch.num_rows


def read_corpus(path: str | Path) -> pa.Table:
    """A corpus as a table of :data:`CORPUS_SCHEMA` (``id``, ``title``, ``text``, ``contents``).

    It is decoded into process memory (fine for demos and tests); a retrieval index keeps its corpus
    as a memory-mapped Arrow IPC file instead (``serve/retrieval/build.py``), which costs page cache, not RSS.
    """
    return pa.Table.from_batches(list(corpus_batches(path)), schema=CORPUS_SCHEMA)


def iter_passages(table_or_path: pa.Table | str | Path) -> Iterator[Passage]:
    """Each row of a corpus (a table from :func:`read_corpus`, or its file) as a :class:`Passage`."""
    table = table_or_path if isinstance(table_or_path, pa.Table) else read_corpus(table_or_path)
    names = ["id", "title", "text"] + (["contents"] if "contents" in table.column_names else [])
    for batch in table.select(names).to_batches():
        ids, titles, texts = (batch.column(name).to_pylist() for name in ("id", "title", "text"))
        contents = batch.column("contents").to_pylist() if "contents" in names else [None] * len(ids)
        for passage_id, title, text, raw in zip(ids, titles, texts, contents, strict=True):
            yield Passage(id=passage_id, title=title, text=text, raw_contents=raw)
