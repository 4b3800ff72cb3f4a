"""Bad input at every edge, table-driven: each corruption of an index directory, a manifest, a checkpoint or a
parquet file raises an error whose message names the file and what is wrong (row and field where they
apply), and none of them is a bare traceback from faiss, Arrow or pickle; each bad HTTP request body (too
large, by Content-Length or chunked, not JSON, not an object, a list past its bound, not of the schema)
gets a 4xx with a message from the services' body reading (``serve/http/validation.py``), before it is
parsed where its size is the problem."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel

from rllib_search.algos.checkpoints.check import CheckpointError, check_checkpoint
from rllib_search.algos.evaluation.evaluate import load_policy
from rllib_search.cli import main as cli_main
from rllib_search.data.errors import DataFormatError
from rllib_search.data.formats import (
    read_corpus,
    read_search_r1_parquet,
    write_corpus_jsonl,
    write_search_r1_parquet,
)
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.serve.http.validation import (
    RequestRefused,
    check_length,
    default_body_bytes,
    parse_json_object,
    read_body,
    validate,
)
from rllib_search.serve.judge.deployment import JudgeLimits
from rllib_search.serve.retrieval.build import build_index
from rllib_search.serve.retrieval.deployment import RequestLimits
from rllib_search.serve.retrieval.load import load_index
from rllib_search.serve.retrieval.manifest import IndexFileError, IndexMismatchError

MINILM = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def world():
    return generate_world(SyntheticWorldConfig(seed=9, num_passages=50, num_train=6, num_test=2))


@pytest.fixture(scope="module")
def built(world, tmp_path_factory) -> dict[str, Path]:
    """A flat MiniLM index and a BM25 index of a 40-passage corpus, built once; cases edit copies."""
    root = tmp_path_factory.mktemp("bad_inputs")
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    build_index(root / "corpus.jsonl", root / "flat", "flat", encoder=MINILM, progress=False)
    build_index(root / "corpus.jsonl", root / "bm25", "bm25", progress=False)
    return {"flat": root / "flat", "bm25": root / "bm25"}


def _edit_manifest(**changes: object) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        manifest = json.loads((directory / "manifest.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                del manifest[key]
            else:
                manifest[key] = value
        (directory / "manifest.json").write_text(json.dumps(manifest))

    return edit


_DROP = object()


def _truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[: int(len(data) * keep)])

    return edit


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda directory: (directory / name).write_bytes(data)


def _remove(name: str) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        target = directory / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return edit


def _narrow_corpus(directory: Path) -> None:
    table = pa.ipc.open_file(str(directory / "corpus.arrow")).read_all().select(["id", "contents"])
    with pa.OSFile(str(directory / "corpus.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)


def _one_more_passage(directory: Path) -> None:
    count = json.loads((directory / "manifest.json").read_text())["count"]
    _edit_manifest(count=count + 1)(directory)


def _faiss_of_width(width: int) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        count = json.loads((directory / "manifest.json").read_text())["count"]
        index = faiss.IndexFlatIP(width)
        index.add(np.random.default_rng(0).random((count, width), dtype=np.float32))
        faiss.write_index(index, str(directory / "index.faiss"))
        _edit_manifest(dim=width)(directory)

    return edit


# (case, index kind, corruption, error type, message pattern: the file, then what is wrong)
MANIFEST_CASES = [
    ("missing", "flat", _remove("manifest.json"), FileNotFoundError, r"manifest\.json: no index manifest"),
    (
        "not JSON",
        "flat",
        _write("manifest.json", b"{kind: flat"),
        IndexFileError,
        r"manifest\.json: not valid JSON",
    ),
    (
        "not an object",
        "flat",
        _write("manifest.json", b"[1, 2]"),
        IndexFileError,
        r"manifest\.json: expected a JSON object",
    ),
    (
        "missing key",
        "flat",
        _edit_manifest(count=_DROP),
        IndexFileError,
        r"manifest\.json: missing key\(s\) count",
    ),
    ("count a string", "flat", _edit_manifest(count="50"), IndexFileError, r"manifest\.json: key 'count'"),
    ("count negative", "bm25", _edit_manifest(count=-1), IndexFileError, r"manifest\.json: key 'count'"),
    ("dim a string", "flat", _edit_manifest(dim="384"), IndexFileError, r"manifest\.json: key 'dim'"),
    ("no encoder", "flat", _edit_manifest(encoder=None), IndexFileError, r"manifest\.json: key 'encoder'"),
    (
        "encoder field type",
        "flat",
        _edit_manifest(
            encoder={"name_or_path": MINILM, "pooling": 1, "query_prefix": "", "passage_prefix": ""}
        ),
        IndexFileError,
        r"manifest\.json: key 'encoder\.pooling'",
    ),
    (
        "encoder on bm25",
        "bm25",
        _edit_manifest(encoder={"name_or_path": MINILM}),
        IndexFileError,
        r"manifest\.json: key 'encoder': a bm25 index uses no encoder",
    ),
    (
        "options a list",
        "bm25",
        _edit_manifest(options=[1.5]),
        IndexFileError,
        r"manifest\.json: key 'options'",
    ),
    (
        "option missing",
        "bm25",
        _edit_manifest(options={"k1": 1.5}),
        IndexFileError,
        r"manifest\.json: key 'options': a bm25 index needs option\(s\) b",
    ),
    (
        "corpus outside",
        "bm25",
        _edit_manifest(corpus_file="../corpus.jsonl"),
        IndexFileError,
        r"manifest\.json: key 'corpus_file'",
    ),
    ("version", "flat", _edit_manifest(version=2), IndexFileError, r"manifest\.json: manifest version 2"),
    (
        "kind",
        "flat",
        _edit_manifest(kind="annoy"),
        IndexFileError,
        r"manifest\.json: unknown index kind 'annoy'",
    ),
]

INDEX_FILE_CASES = [
    (
        "corpus missing",
        "bm25",
        _remove("corpus.arrow"),
        FileNotFoundError,
        r"corpus\.arrow: the index's corpus file is missing",
    ),
    (
        "corpus truncated",
        "bm25",
        _truncate("corpus.arrow"),
        IndexFileError,
        r"corpus\.arrow: not a readable Arrow IPC corpus",
    ),
    (
        "corpus garbled",
        "flat",
        _write("corpus.arrow", b"ARROW1" + b"\x00" * 64),
        IndexFileError,
        r"corpus\.arrow: not a readable Arrow IPC corpus",
    ),
    (
        "corpus columns",
        "bm25",
        _narrow_corpus,
        IndexFileError,
        r"corpus\.arrow: the corpus has no 'title' column",
    ),
    (
        "corpus rows vs manifest",
        "bm25",
        _one_more_passage,
        IndexFileError,
        r"corpus\.arrow: (\d+) passages, the manifest says (?!\1)\d+",
    ),
    (
        "faiss missing",
        "flat",
        _remove("index.faiss"),
        FileNotFoundError,
        r"index\.faiss: the index's faiss file is missing",
    ),
    (
        "faiss truncated",
        "flat",
        _truncate("index.faiss"),
        IndexFileError,
        r"index\.faiss: not a readable faiss index",
    ),
    (
        "faiss garbled",
        "flat",
        _write("index.faiss", b"not faiss" * 20),
        IndexFileError,
        r"index\.faiss: not a readable faiss index",
    ),
    (
        "faiss width vs manifest",
        "flat",
        lambda d: (_faiss_of_width(16)(d), _edit_manifest(dim=384)(d)),
        IndexFileError,
        r"index\.faiss: 16-dimensional vectors, the manifest says 384",
    ),
    (
        "faiss width vs encoder",
        "flat",
        _faiss_of_width(16),
        IndexMismatchError,
        r"index\.faiss: 16-dimensional vectors, but encoder .* embeds in 384",
    ),
    (
        "bm25 missing",
        "bm25",
        _remove("bm25"),
        FileNotFoundError,
        r"bm25: the index's BM25 directory is missing",
    ),
    (
        "bm25 garbled",
        "bm25",
        lambda d: (d / "bm25" / "params.index.json").write_text("{oops"),
        IndexFileError,
        r"bm25: not a readable BM25 index",
    ),
]


@pytest.mark.parametrize(
    ("kind", "corrupt", "error", "pattern"),
    [case[1:] for case in MANIFEST_CASES + INDEX_FILE_CASES],
    ids=[case[0] for case in MANIFEST_CASES + INDEX_FILE_CASES],
)
def test_a_corrupt_index_directory_names_the_file_and_the_problem(
    tmp_path, built, kind, corrupt, error, pattern
):
    directory = tmp_path / kind
    shutil.copytree(built[kind], directory)
    corrupt(directory)
    with pytest.raises(error, match=re.escape(str(directory)) + r".*" + pattern):
        load_index(directory, device="cpu")


def test_the_cli_reports_a_corrupt_index_without_a_traceback(tmp_path, built, capsys):
    directory = tmp_path / "flat"
    shutil.copytree(built["flat"], directory)
    _edit_manifest(count="many")(directory)
    assert cli_main(["index", "info", str(directory)]) == 1
    assert f"rllib-search: error: {directory / 'manifest.json'}: key 'count'" in capsys.readouterr().err


# --- checkpoints -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def module_checkpoint(tmp_path_factory) -> Path:
    """A real RLModule checkpoint (RLlib's ``save_to_path``) of a tiny policy."""
    from gymnasium import spaces

    from rllib_search.algos.model.rl_module import LLMRLModule
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("checkpoint")
    model = str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))
    space = spaces.Sequence(spaces.Discrete(440), stack=True)
    module = LLMRLModule(observation_space=space, action_space=space, model_config={"model": model})
    return Path(module.save_to_path(str(root / "module")))


def _as_algorithm_without_module(directory: Path) -> None:
    """An Algorithm checkpoint's top level whose learner state is gone."""
    (directory / "algorithm_state.pkl").write_bytes(pickle.dumps({"training_iteration": 3}))
    for name in ("module_state.pkl", "class_and_ctor_args.pkl"):
        (directory / name).unlink()


CHECKPOINT_CASES = [
    ("module state missing", _remove("module_state.pkl"), CheckpointError, r"module_state\.pkl: missing"),
    (
        "ctor args missing",
        _remove("class_and_ctor_args.pkl"),
        CheckpointError,
        r"class_and_ctor_args\.pkl: missing",
    ),
    (
        "module state truncated",
        _truncate("module_state.pkl"),
        CheckpointError,
        r"module_state\.pkl: truncated",
    ),
    (
        "module state empty",
        _write("module_state.pkl", b""),
        CheckpointError,
        r"module_state\.pkl: empty file",
    ),
    (
        "module state garbage",
        _write("module_state.pkl", b"\x80\x05garbage" * 9),
        CheckpointError,
        r"module_state\.pkl: truncated or not a pickle",
    ),
    (
        "ctor args trailing bytes",
        lambda d: (d / "class_and_ctor_args.pkl").write_bytes(
            (d / "class_and_ctor_args.pkl").read_bytes() + b"xx"
        ),
        CheckpointError,
        r"class_and_ctor_args\.pkl: unexpected bytes",
    ),
    (
        "metadata garbled",
        _write("metadata.json", b'{"checkpoint_version": '),
        CheckpointError,
        r"metadata\.json: not valid JSON",
    ),
    (
        "algorithm without its module",
        _as_algorithm_without_module,
        CheckpointError,
        r"default_policy: missing",
    ),
]


@pytest.mark.parametrize(
    ("corrupt", "error", "pattern"),
    [case[1:] for case in CHECKPOINT_CASES],
    ids=[case[0] for case in CHECKPOINT_CASES],
)
def test_a_corrupt_checkpoint_names_the_file_before_anything_is_unpickled(
    tmp_path, module_checkpoint, corrupt, error, pattern
):
    directory = tmp_path / "checkpoint"
    shutil.copytree(module_checkpoint, directory)
    corrupt(directory)
    with pytest.raises(error, match=re.escape(str(directory)) + r".*" + pattern):
        load_policy(checkpoint=directory)  # the eval path (rllib-search eval --checkpoint)


def test_an_intact_checkpoint_passes_and_missing_ones_are_named(tmp_path, module_checkpoint):
    assert check_checkpoint(module_checkpoint) == module_checkpoint
    assert load_policy(checkpoint=module_checkpoint).module_dir == module_checkpoint.resolve()
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        check_checkpoint(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="a checkpoint is a directory"):
        check_checkpoint(tmp_path / "file")


# --- parquet ----------------------------------------------------------------------------------------------
def _corpus_table(rows: int = 30, **columns: pa.Array) -> pa.Table:
    base = {
        "id": pa.array([str(i) for i in range(rows)]),
        "title": pa.array([f"Title {i}" for i in range(rows)]),
        "text": pa.array([f"text of passage {i} " * 8 for i in range(rows)]),
    }
    base.update(columns)
    return pa.table({name: array for name, array in base.items() if array is not None})


def _damaged_page(path: Path) -> None:
    pq.write_table(_corpus_table(400), path, row_group_size=100, compression="snappy")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 300] = b"\x00" * 300
    path.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    pq.write_table(_corpus_table(), path)
    path.write_bytes(path.read_bytes()[:-20])


PARQUET_CORPUS_CASES = [
    ("truncated", _truncated, DataFormatError, r": not a readable parquet file"),
    (
        "not parquet",
        lambda p: p.write_text("id,title,text\n1,a,b\n"),
        DataFormatError,
        r": not a readable parquet file",
    ),
    (
        "missing column",
        lambda p: pq.write_table(_corpus_table(text=None), p),
        DataFormatError,
        r": field 'text': missing column",
    ),
    (
        "struct title",
        lambda p: pq.write_table(_corpus_table(title=pa.array([{"a": 1}] * 30)), p),
        DataFormatError,
        r": field 'title': expected strings",
    ),
    (
        "float ids",
        lambda p: pq.write_table(_corpus_table(id=pa.array([0.5] * 30)), p),
        DataFormatError,
        r": field 'id': expected strings",
    ),
    (
        "null id",
        lambda p: pq.write_table(_corpus_table(id=pa.array(["a", "b", "c", None] + ["x"] * 26)), p),
        DataFormatError,
        r": row 3, field 'id': expected a string or an integer, got null",
    ),
    ("damaged data page", _damaged_page, DataFormatError, r": row \d+: unreadable rows from here on"),
]


@pytest.mark.parametrize(
    ("write", "error", "pattern"),
    [case[1:] for case in PARQUET_CORPUS_CASES],
    ids=[case[0] for case in PARQUET_CORPUS_CASES],
)
def test_a_bad_corpus_parquet_names_file_row_and_field(tmp_path, write, error, pattern):
    path = tmp_path / "corpus.parquet"
    write(path)
    with pytest.raises(error, match=re.escape(str(path)) + pattern):
        read_corpus(path)
    with pytest.raises(error, match=re.escape(str(path)) + pattern):  # and building an index of it
        build_index(path, tmp_path / "index", "random", progress=False)
    assert not (tmp_path / "index" / "manifest.json").exists()


def _search_r1(world, path: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    write_search_r1_parquet(world.train, path)
    pq.write_table(edit(pq.read_table(path)), path)


def _set_row(
    table: pa.Table, column: str, row: int, value: object, type_: pa.DataType | None = None
) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values, type_))


SEARCH_R1_CASES = [
    (
        "no reward_model",
        lambda t: t.drop_columns(["reward_model"]),
        r": field 'reward_model': missing column",
    ),
    (
        "int data_source",
        lambda t: t.set_column(0, "data_source", pa.array(range(t.num_rows))),
        r": row 0, field 'data_source': expected a string",
    ),
    (
        "golds not strings",
        lambda t: _set_row(t, "reward_model", 2, {"style": "rule", "ground_truth": {"target": None}}),
        r": row 2, field 'reward_model\.ground_truth\.target': expected a list of strings",
    ),
    (
        "no user message",
        lambda t: _set_row(t.drop_columns(["extra_info"]), "prompt", 4, [{"role": "system", "content": "x"}]),
        r": row 4, field 'prompt': no user message",
    ),
]


@pytest.mark.parametrize(
    ("edit", "pattern"), [case[1:] for case in SEARCH_R1_CASES], ids=[case[0] for case in SEARCH_R1_CASES]
)
def test_a_bad_search_r1_parquet_names_file_row_and_field(tmp_path, world, edit, pattern):
    path = tmp_path / "train.parquet"
    _search_r1(world, path, edit)
    with pytest.raises(DataFormatError, match=re.escape(str(path)) + pattern):
        read_search_r1_parquet(path)


def test_a_truncated_search_r1_parquet_is_named(tmp_path, world):
    path = tmp_path / "train.parquet"
    write_search_r1_parquet(world.train, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataFormatError, match=re.escape(str(path)) + ": not a readable parquet file"):
        read_search_r1_parquet(path)


# --- HTTP request bodies (serve/http/validation.py, on a small app without Ray) -----------------------
BODY_LIMIT = 100


class _Item(BaseModel):
    items: list[str]
    k: int = 1


def _body_client() -> TestClient:
    """An app that reads its body as the services do: size, media type, JSON, a list's length, schema."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        try:
            body = await read_body(request, BODY_LIMIT)
            fields = parse_json_object(body, request.headers.get("content-type"), 422)
            check_length(fields, "items", 3, "at most {bound} items, got {length}", 413)
            item = validate(_Item, fields, 422)
        except RequestRefused as refused:
            return JSONResponse({"detail": refused.message}, status_code=refused.status)
        return JSONResponse({"items": item.items, "bytes": len(body)})

    return TestClient(app)


def _chunks(data: bytes, size: int = 7):
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _padded(size: int) -> bytes:
    core = b'{"items": ["a"]}'
    return core[:-1] + b" " * (size - len(core)) + core[-1:]


# (case, body, headers, status, message pattern)
BODY_CASES = [
    ("at the limit", _padded(BODY_LIMIT), {}, 200, None),
    ("past the limit", _padded(BODY_LIMIT + 1), {}, 413, r"has 101 bytes, at most 100 allowed"),
    ("chunked at the limit", _chunks(_padded(BODY_LIMIT)), {}, 200, None),
    ("chunked past the limit", _chunks(_padded(10 * BODY_LIMIT)), {}, 413, r"passes 100 bytes"),
    ("no content type", b'{"items": ["a"]}', {"content-type": ""}, 200, None),
    ("a +json type", b'{"items": ["a"]}', {"content-type": "application/vnd.api+json"}, 200, None),
    ("text/plain", b'{"items": ["a"]}', {"content-type": "text/plain"}, 415, r"must be JSON"),
    ("form", b"items=a", {"content-type": "application/x-www-form-urlencoded"}, 415, r"must be JSON"),
    ("empty", b"", {}, 422, r"not valid JSON"),
    ("truncated", b'{"items": [', {}, 422, r"not valid JSON"),
    ("not UTF-8", b'{"items": ["\xff"]}', {}, 422, r"not valid JSON"),
    ("nested arrays", b"[" * 40 + b"]" * 40, {}, 422, r"must be a JSON object, got an array"),
    ("an array", b"[1]", {}, 422, r"must be a JSON object, got an array"),
    ("null", b"null", {}, 422, r"got null"),
    ("a list past its bound", b'{"items": [1, 2, 3, 4]}', {}, 413, r"at most 3 items, got 4"),
    ("schema", b'{"items": [1, 2]}', {}, 422, r"malformed request: items\.0: .*; items\.1"),
]


@pytest.mark.parametrize(
    ("body", "headers", "status", "pattern"),
    [case[1:] for case in BODY_CASES],
    ids=[case[0] for case in BODY_CASES],
)
def test_a_bad_request_body_gets_a_4xx_with_a_message(body, headers, status, pattern):
    headers = {"content-type": "application/json", **headers}
    headers = {k: v for k, v in headers.items() if v}
    answer = _body_client().post("/echo", content=body, headers=headers)
    assert answer.status_code == status, answer.text
    if pattern is not None:
        assert re.search(pattern, answer.json()["detail"]), answer.text


def test_json_python_cannot_convert_gets_a_4xx():
    """Nesting past Python's recursion limit, an integer past its 4300-digit conversion limit: both are
    parse errors (FastAPI answered the first with a generic 400), neither a 5xx."""
    with pytest.raises(RequestRefused, match="nested too deeply") as deep:
        parse_json_object(b"[" * 100_000 + b"]" * 100_000, "application/json", 422)
    with pytest.raises(RequestRefused, match="not valid JSON") as long_int:
        parse_json_object(b'{"k": ' + b"1" * 5000 + b"}", None, 400)
    assert (deep.value.status, long_int.value.status) == (422, 400)


def test_a_bad_content_length_gets_a_400():
    client = _body_client()
    answer = client.post(
        "/echo", content=b"{}", headers={"content-type": "application/json", "content-length": "x"}
    )
    assert answer.status_code == 400 and "Content-Length" in answer.json()["detail"]


def test_a_refusal_never_echoes_the_input_and_lists_at_most_20_problems():
    with pytest.raises(RequestRefused) as refused:
        validate(_Item, {"items": [None] * 1000, "k": "\ud800secret"}, 422)
    message = refused.value.message
    assert "secret" not in message and "(and 981 more)" in message
    message.encode("utf-8")  # printable


def test_the_default_body_limit_admits_the_largest_valid_request():
    """``max_body_bytes`` defaults to what the other bounds admit: every query (prompt) at its character
    bound, every character escaped as ``\\uXXXX`` (what ``requests.post(json=...)`` sends), fits; it can
    be set, and must be a positive integer."""
    retriever = RequestLimits()
    body = json.dumps(
        {"queries": ["\u4e2d" * retriever.max_query_chars] * retriever.max_queries, "topk": 100}
    )
    assert len(body) <= retriever.max_body_bytes == default_body_bytes(1024, 2000) < 13_000_000
    judge = JudgeLimits()
    body = json.dumps({"prompt": ["\u4e2d" * judge.max_prompt_chars] * judge.max_prompts, "max_tokens": 256})
    assert len(body) <= judge.max_body_bytes < 50_000_000
    assert RequestLimits(max_queries=8, max_query_chars=10).max_body_bytes == 8 * 63 + 65536
    assert JudgeLimits(max_body_bytes=1000).max_body_bytes == 1000
    for bad in (0, -1, True, 1.5, "1000"):
        with pytest.raises(ValueError, match="max_body_bytes must be a positive integer"):
            RequestLimits(max_body_bytes=bad)
