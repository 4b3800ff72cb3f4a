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
    return manifest


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
        return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise IndexFileError(f"{path}: not a readable Arrow IPC corpus ({err})") from err
