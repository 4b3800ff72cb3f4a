"""What an index directory holds, and reading its manifest and corpus (shared by building and loading).

An index directory holds

* ``manifest.json``: what was built (kind, encoder spec, width, passage count, the source corpus's
  checksum, index parameters). It is written last, so a directory with a manifest is complete;
* ``corpus.arrow``: the passages (``id``, ``title``, ``text``, ``contents``) as an uncompressed Arrow IPC
  file. Memory-mapped, it costs page cache instead of process memory, and the pages are shared by every
  process on the node; search results are looked up by row number. (A parquet file cannot do this: it is
  decoded into process memory when read, 1.5 GB at peak for a 0.4 GB corpus.)
* ``index.faiss`` for the dense kinds, ``bm25/`` for BM25.

Kinds: ``flat`` (exact inner product), ``hnsw`` (approximate, graph), ``ivfpq`` (approximate,
compressed), ``bm25`` (lexical) and ``random`` (uniformly random passages, a study's floor).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

MANIFEST_FILE = "manifest.json"
CORPUS_FILE = "corpus.arrow"
FAISS_FILE = "index.faiss"
BM25_DIR = "bm25"
MANIFEST_VERSION = 1
CORPUS_COLUMNS = ("id", "title", "text", "contents")
MANIFEST_KEYS = ("kind", "encoder", "dim", "count", "corpus_file", "options", "version")

DENSE_KINDS = ("flat", "hnsw", "ivfpq")
KINDS = (*DENSE_KINDS, "bm25", "random")
# Each kind's options with their defaults; None: chosen from the corpus size and the embedding width.
KIND_OPTIONS: dict[str, dict[str, Any]] = {
    "flat": {},
    "hnsw": {"m": 32, "ef_construction": 200, "ef_search": 128},
    "ivfpq": {"nlist": None, "pq_m": None, "nbits": 8, "nprobe": 16, "train_size": None},
    "bm25": {"k1": 1.5, "b": 0.75},
    "random": {"seed": 0},
}
BM25_STOPWORDS = "en"
# The manifest's ``encoder`` object (``EncoderSpec.to_dict``): field -> accepted types.
ENCODER_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name_or_path": (str,),
    "pooling": (str,),
    "query_prefix": (str,),
    "passage_prefix": (str,),
    "max_length": (int,),
    "normalize": (bool,),
}
ENCODER_REQUIRED_FIELDS = ("name_or_path", "pooling", "query_prefix", "passage_prefix")


class IndexMismatchError(ValueError):
    """The encoder asked for is not the one the index was built with."""


class IndexFileError(ValueError):
    """A file of an index directory is unreadable or disagrees with the manifest."""


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    """An index directory's manifest, checked for the keys and version this code reads."""
    path = Path(index_dir) / MANIFEST_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no index manifest (build one with `rllib-search index build`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise IndexFileError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(manifest, dict):
        raise IndexFileError(f"{path}: expected a JSON object")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise IndexFileError(f"{path}: missing key(s) {', '.join(missing)}")
    if manifest["version"] != MANIFEST_VERSION:
        raise IndexFileError(f"{path}: manifest version {manifest['version']!r}, expected {MANIFEST_VERSION}")
    if manifest["kind"] not in KINDS:
        raise IndexFileError(f"{path}: unknown index kind {manifest['kind']!r}")
    problem = _type_problem(manifest)
    if problem is not None:
        raise IndexFileError(f"{path}: {problem}")
    return manifest


def index_identity(index_dir: str | Path) -> dict[str, Any]:
    """What search results over an index depend on, from its manifest: kind, encoder, options and the
    corpus's checksum (for cache keys of results computed with the index's passages)."""
    manifest = read_manifest(index_dir)
    return {key: manifest.get(key) for key in ("kind", "encoder", "options", "count", "corpus_sha256")}


def _type_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the types of a manifest's values (a hand-edited or foreign file), or None."""

    def count_like(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    kind, encoder, dim = manifest["kind"], manifest["encoder"], manifest["dim"]
    if not count_like(manifest["count"]):
        return f"key 'count': expected a non-negative integer, got {manifest['count']!r}"
    corpus_file = manifest["corpus_file"]
    if (
        not isinstance(corpus_file, str)
        or not corpus_file
        or Path(corpus_file).is_absolute()
        or (".." in Path(corpus_file).parts)
    ):
        return f"key 'corpus_file': expected a file name inside the index directory, got {corpus_file!r}"
    if not isinstance(manifest["options"], dict):
        return f"key 'options': expected an object, got {type(manifest['options']).__name__}"
    missing = sorted(KIND_OPTIONS[kind].keys() - manifest["options"].keys())
    if missing:
        return f"key 'options': a {kind} index needs option(s) {', '.join(missing)}"
    if kind in DENSE_KINDS:
        if not count_like(dim) or dim == 0:
            return f"key 'dim': a {kind} index needs a positive integer, got {dim!r}"
        if not isinstance(encoder, dict):
            return f"key 'encoder': a {kind} index needs an encoder object, got {encoder!r}"
        for field, types in ENCODER_FIELD_TYPES.items():
            if field in ENCODER_REQUIRED_FIELDS and field not in encoder:
                return f"key 'encoder': missing field {field!r}"
            if field in encoder and not isinstance(encoder[field], types):
                return f"key 'encoder.{field}': expected {types[0].__name__}, got {encoder[field]!r}"
        unknown = sorted(encoder.keys() - ENCODER_FIELD_TYPES.keys())
        if unknown:
            return f"key 'encoder': unknown field(s) {', '.join(unknown)}"
    elif encoder is not None:
        return f"key 'encoder': a {kind} index uses no encoder, got {encoder!r}"
    return None


def write_manifest(path: Path, data: dict[str, Any]) -> None:
    """Write a manifest (or any JSON) atomically: beside its final path, then renamed."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def open_corpus(path: Path) -> pa.Table:
    """The staged corpus, memory-mapped: reading it copies nothing into process memory."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: the index's corpus file is missing")
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise IndexFileError(f"{path}: not a readable Arrow IPC corpus ({err})") from err
    for name in CORPUS_COLUMNS:
        if name not in table.column_names:
            raise IndexFileError(f"{path}: the corpus has no {name!r} column")
        if not pa.types.is_string(table.schema.field(name).type):
            raise IndexFileError(f"{path}: column {name!r} is {table.schema.field(name).type}, not string")
    return table
