"""Retrieval indexes over a corpus: built once into a directory, loaded memory-mapped.

An index directory holds

* ``manifest.json``: what was built (kind, encoder spec, width, passage count, the source corpus's
  checksum, index parameters). It is written last, so a directory with a manifest is complete;
* ``corpus.arrow``: the passages (``id``, ``title``, ``text``, ``contents``) as an uncompressed Arrow IPC
  file. Memory-mapped, it costs page cache instead of process memory, and the pages are shared by every
  process on the node; search results are looked up by row number. (A parquet file cannot do this: it is
  decoded into process memory when read, 1.5 GB at peak for a 0.4 GB corpus.)
* ``index.faiss`` for the dense kinds, ``bm25/`` for BM25.

Kinds: ``flat`` (exact inner product), ``hnsw`` (approximate, graph), ``ivfpq`` (approximate,
compressed), ``bm25`` (lexical) and ``random`` (uniformly random passages, a study's floor). Dense kinds
embed each passage's ``contents`` (``"Title"\\ntext``) with the passage prefix, as Search-R1 does.
Every loaded index satisfies :class:`rllib_search.data.retrieval.Retriever`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import resource
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from rllib_search.data.errors import DataFormatError
from rllib_search.data.formats import CORPUS_SCHEMA, corpus_jsonl_to_parquet
from rllib_search.data.retrieval import Passage
from rllib_search.serve.encoders import DEFAULT_ENCODER, EncoderSpec, TextEncoder, resolve_model_path

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
# Rows read from the source corpus at a time while staging it.
STAGING_BATCH_ROWS = 50_000

logger = logging.getLogger(__name__)


class IndexMismatchError(ValueError):
    """The encoder asked for is not the one the index was built with."""


class IndexFileError(ValueError):
    """A file of an index directory is unreadable or disagrees with the manifest."""


def resident_memory_mb() -> float:
    """This process's resident memory in MB (``VmRSS``; without /proc, the peak from ``getrusage``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


# ---------------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------------


def build_index(
    corpus: str | Path,
    out_dir: str | Path,
    kind: str,
    encoder: str | EncoderSpec | None = None,
    batch_size: int = 256,
    progress: bool = True,
    **kind_options: Any,
) -> dict[str, Any]:
    """Build a ``kind`` index of a corpus (jsonl or parquet) into ``out_dir``; returns the manifest.

    Dense kinds use ``encoder`` (default :data:`DEFAULT_ENCODER`) and encode ``batch_size`` passages at a
    time straight into the faiss index; ``kind_options`` are those of :data:`KIND_OPTIONS`.
    """
    options = _kind_options(kind, kind_options)
    spec = _build_spec(kind, encoder)
    corpus, out = Path(corpus), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # a rebuild that fails must not look complete
    checksum = _sha256(corpus)
    count = _stage_corpus(corpus, out / CORPUS_FILE)
    if count == 0:
        raise DataFormatError(corpus, None, None, "the corpus has no passages")
    table = _open_corpus(out / CORPUS_FILE)
    dim, faiss_params = None, None
    if spec is not None:
        text_encoder = TextEncoder(spec)
        dim = text_encoder.dim
        if kind == "ivfpq":
            options = _ivfpq_options(options, count, dim)
        faiss_params = _build_faiss(
            table, text_encoder, kind, options, batch_size, progress, out / FAISS_FILE
        )
    elif kind == "bm25":
        _build_bm25(table, options, batch_size, progress, out / BM25_DIR)
    manifest = {
        "kind": kind,
        "encoder": spec.to_dict() if spec is not None else None,
        "dim": dim,
        "count": count,
        "corpus_file": CORPUS_FILE,
        "corpus_sha256": checksum,
        "faiss": faiss_params,
        "options": options,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": MANIFEST_VERSION,
    }
    _write_json_atomically(out / MANIFEST_FILE, manifest)
    return manifest


def _kind_options(kind: str, given: dict[str, Any]) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r} (expected one of {', '.join(KINDS)})")
    defaults = KIND_OPTIONS[kind]
    unknown = sorted(given.keys() - defaults.keys())
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for a {kind} index (allowed: {allowed})")
    return {**defaults, **given}


def _build_spec(kind: str, encoder: str | EncoderSpec | None) -> EncoderSpec | None:
    if kind not in DENSE_KINDS:
        if encoder is not None:
            raise ValueError(f"a {kind} index uses no encoder, but encoder {encoder!r} was given")
        return None
    if isinstance(encoder, EncoderSpec):
        return encoder
    return EncoderSpec.for_model(encoder or DEFAULT_ENCODER)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stage_corpus(source: Path, target: Path) -> int:
    """Write a corpus jsonl or parquet to ``target`` as an Arrow IPC file, batch by batch; returns rows."""
    if source.suffix not in (".jsonl", ".parquet"):
        raise DataFormatError(source, None, None, "unknown corpus file type (expected .jsonl or .parquet)")
    partial = target.with_name(target.name + ".partial")
    rows = 0
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".staging-") as tmp:
            parquet = source
            if source.suffix == ".jsonl":
                parquet = Path(tmp) / "corpus.parquet"
                corpus_jsonl_to_parquet(source, parquet, batch_size=STAGING_BATCH_ROWS)
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, CORPUS_SCHEMA) as writer:
                for batch in _corpus_batches(parquet):
                    writer.write_batch(batch)
                    rows += batch.num_rows
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return rows


def _corpus_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """A corpus parquet's rows in :data:`CORPUS_SCHEMA`: string ids, nulls as "", and ``contents``
    (``"Title"\\ntext``) made from the title and text where the file has none."""
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DataFormatError(path, None, None, f"not a readable parquet file ({err})") from err
    names = parquet.schema_arrow.names
    for column in ("id", "title", "text"):
        if column not in names:
            raise DataFormatError(path, None, column, "missing column")
    columns = [name for name in CORPUS_SCHEMA.names if name in names]
    for batch in parquet.iter_batches(batch_size=STAGING_BATCH_ROWS, columns=columns):
        title, text = (pc.fill_null(pc.cast(batch.column(n), pa.string()), "") for n in ("title", "text"))
        if "contents" in names:
            contents = pc.fill_null(pc.cast(batch.column("contents"), pa.string()), "")
        else:
            contents = pc.binary_join_element_wise('"', title, '"\n', text, "")
        ids = pc.cast(batch.column("id"), pa.string())
        yield pa.RecordBatch.from_arrays([ids, title, text, contents], schema=CORPUS_SCHEMA)


def _open_corpus(path: Path) -> pa.Table:
    """The staged corpus, memory-mapped: reading it copies nothing into process memory."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: the index's corpus file is missing")
    try:
        return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise IndexFileError(f"{path}: not a readable Arrow IPC corpus ({err})") from err


def _ivfpq_options(options: dict[str, Any], count: int, dim: int) -> dict[str, Any]:
    """IVF-PQ options with the unset ones chosen: ~4 sqrt(n) lists, one sub-quantizer per 8 dimensions,
    and enough training vectors for both k-means (39 per centroid, faiss's minimum without warning)."""
    nbits = options["nbits"]
    nlist = options["nlist"] or max(1, min(int(4 * math.sqrt(count)), count // 39))
    pq_m = options["pq_m"] or max(d for d in range(1, max(1, dim // 8) + 1) if dim % d == 0)
    train_size = min(count, options["train_size"] or 39 * max(nlist, 2**nbits))
    if dim % pq_m:
        raise ValueError(f"ivfpq pq_m={pq_m} must divide the embedding width {dim}")
    if train_size < max(nlist, 2**nbits):
        raise ValueError(
            f"ivfpq with nlist={nlist}, nbits={nbits} needs at least {max(nlist, 2**nbits)} training "
            f"passages, got {train_size} (corpus of {count})"
        )
    return {**options, "nlist": nlist, "pq_m": pq_m, "train_size": train_size}


def _new_faiss_index(kind: str, dim: int, options: dict[str, Any]) -> faiss.Index:
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, options["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = options["ef_construction"]
        index.hnsw.efSearch = options["ef_search"]
        return index
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(
        quantizer, dim, options["nlist"], options["pq_m"], options["nbits"], faiss.METRIC_INNER_PRODUCT
    )
    index.nprobe = options["nprobe"]
    return index


def _build_faiss(
    table: pa.Table,
    encoder: TextEncoder,
    kind: str,
    options: dict[str, Any],
    batch_size: int,
    progress: bool,
    path: Path,
) -> dict[str, Any]:
    """Encode the corpus ``batch_size`` passages at a time into a new faiss index written to ``path``;
    returns the index's parameters for the manifest."""
    index = _new_faiss_index(kind, encoder.dim, options)
    if kind == "ivfpq":
        index.train(_encode_sample(table, encoder, options["train_size"], batch_size))
    contents = table.column("contents")
    with tqdm(total=table.num_rows, desc=f"{kind} index", unit="passage", disable=not progress) as bar:
        for start in range(0, table.num_rows, batch_size):
            texts = contents.slice(start, batch_size).to_pylist()
            index.add(encoder.encode_passages(texts, batch_size=batch_size))
            bar.update(len(texts))
    faiss.write_index(index, str(path))
    return {"type": type(index).__name__, "metric": "inner_product", **options}


def _encode_sample(table: pa.Table, encoder: TextEncoder, size: int, batch_size: int) -> np.ndarray:
    """Embeddings of ``size`` passages drawn at random (seeded), to train a quantizer on."""
    rows = np.sort(np.random.default_rng(0).choice(table.num_rows, size=size, replace=False))
    parts = [
        encoder.encode_passages(
            table.take(pa.array(rows[start : start + batch_size])).column("contents").to_pylist(),
            batch_size=batch_size,
        )
        for start in range(0, size, batch_size)
    ]
    return np.concatenate(parts)


def _build_bm25(
    table: pa.Table, options: dict[str, Any], batch_size: int, progress: bool, path: Path
) -> None:
    """Tokenise the corpus batch by batch (token ids, not strings, are kept) and save a bm25s index."""
    tokenizer = bm25s.tokenization.Tokenizer(stopwords=BM25_STOPWORDS)
    token_ids: list[list[int]] = []
    contents = table.column("contents")
    with tqdm(total=table.num_rows, desc="bm25 index", unit="passage", disable=not progress) as bar:
        for start in range(0, table.num_rows, batch_size):
            texts = contents.slice(start, batch_size).to_pylist()
            token_ids.extend(
                tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
            )
            bar.update(len(texts))
    model = bm25s.BM25(k1=options["k1"], b=options["b"])
    model.index((token_ids, tokenizer.get_vocab_dict()), show_progress=False)
    model.save(str(path), show_progress=False)


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


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


def load_index(
    index_dir: str | Path,
    encoder: str | EncoderSpec | None = None,
    device: str | None = None,
    mmap: bool = True,
    dtype: str | None = None,
) -> SearchIndex:
    """Load an index built by :func:`build_index`.

    ``encoder`` (default: the manifest's) may name a local copy of the same model, or change its
    ``max_length``; a different model, pooling or prefix raises :class:`IndexMismatchError`. With
    ``mmap`` the faiss and BM25 arrays are memory-mapped; the corpus always is. On a machine whose faiss
    has GPU support, flat and IVF-PQ indexes are sharded in fp16 over all visible GPUs unless ``device``
    is the CPU. ``dtype`` is the query encoder's (:func:`~rllib_search.serve.encoders.resolve_dtype`:
    None keeps fp32 on the CPU and fp16 on a GPU; ``"auto"`` also uses bf16 on CPUs with native bf16).
    """
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    spec = _loading_spec(index_dir / MANIFEST_FILE, manifest, encoder)
    corpus_path = index_dir / manifest["corpus_file"]
    corpus = _open_corpus(corpus_path)
    if corpus.num_rows != manifest["count"]:
        raise IndexFileError(
            f"{corpus_path}: {corpus.num_rows} passages, the manifest says {manifest['count']}"
        )
    kind, options = manifest["kind"], manifest["options"]
    if kind in DENSE_KINDS:
        if spec is None:
            raise IndexFileError(f"{index_dir / MANIFEST_FILE}: a {kind} index without an encoder")
        faiss_index = _read_faiss(index_dir / FAISS_FILE, mmap, manifest["count"])
        if kind == "hnsw":
            faiss_index.hnsw.efSearch = options["ef_search"]
        elif kind == "ivfpq":
            faiss_index.nprobe = options["nprobe"]
        if device is None or str(device).startswith("cuda"):
            faiss_index = _on_gpus(faiss_index, kind)
        return DenseSearchIndex(manifest, corpus, TextEncoder(spec, device=device, dtype=dtype), faiss_index)
    if kind == "bm25":
        return BM25SearchIndex(manifest, corpus, _read_bm25(index_dir / BM25_DIR, mmap))
    return RandomSearchIndex(manifest, corpus, seed=options["seed"])


def _loading_spec(
    manifest_path: Path, manifest: dict[str, Any], encoder: str | EncoderSpec | None
) -> EncoderSpec | None:
    """The encoder to load: the manifest's, or the one asked for when it matches the manifest's."""
    built = EncoderSpec.from_dict(manifest["encoder"]) if manifest["encoder"] is not None else None
    if encoder is None:
        return built
    given = encoder if isinstance(encoder, EncoderSpec) else EncoderSpec.for_model(encoder)
    if built is None:
        raise IndexMismatchError(
            f"{manifest_path}: a {manifest['kind']} index uses no encoder, "
            f"but encoder {given.name_or_path!r} was given"
        )
    differences = _spec_differences(built, given)
    if differences:
        raise IndexMismatchError(
            f"{manifest_path}: the index was built with encoder {built.name_or_path!r} but encoder "
            f"{given.name_or_path!r} was given ({'; '.join(differences)}); "
            "load with encoder=None to use the index's own"
        )
    return given


def _spec_differences(built: EncoderSpec, given: EncoderSpec) -> list[str]:
    """How two specs differ in ways that change the vectors (``max_length`` and the device do not count).

    Names match when equal, when they resolve to the same folder, or when their last path components
    agree (``/models/e5-base-v2`` is a local copy of ``intfloat/e5-base-v2``).
    """
    differences = []
    names = (built.name_or_path, given.name_or_path)
    same_name = (
        names[0] == names[1]
        or resolve_model_path(names[0]) == resolve_model_path(names[1])
        or Path(names[0]).name.lower() == Path(names[1]).name.lower()
    )
    if not same_name:
        differences.append(f"model {names[0]!r} != {names[1]!r}")
    for field in ("pooling", "query_prefix", "passage_prefix", "normalize"):
        if getattr(built, field) != getattr(given, field):
            differences.append(f"{field} {getattr(built, field)!r} != {getattr(given, field)!r}")
    return differences


def _read_faiss(path: Path, mmap: bool, count: int) -> faiss.Index:
    """Read a faiss index, memory-mapped where faiss can (``IO_FLAG_MMAP_IFC``, faiss >= 1.11)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: the index's faiss file is missing")
    index = None
    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    if mmap and flag is None:
        logger.warning("%s: this faiss cannot memory-map indexes; reading it into memory", path)
    elif mmap:
        try:
            index = faiss.read_index(str(path), flag)
        except RuntimeError as err:
            logger.warning("%s: cannot memory-map this faiss index (%s); reading it into memory", path, err)
    if index is None:
        index = faiss.read_index(str(path))
    if index.ntotal != count:
        raise IndexFileError(f"{path}: {index.ntotal} vectors, the manifest says {count}")
    return index


def _on_gpus(index: faiss.Index, kind: str) -> faiss.Index:
    """The index sharded in fp16 over all visible GPUs, when this faiss has GPU support and sees GPUs
    (HNSW stays on the CPU: faiss has no GPU HNSW)."""
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index
    if kind == "hnsw":
        logger.info("HNSW indexes search on the CPU (faiss has no GPU HNSW)")
        return index
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = True
    logger.info("sharding the %s index over %d GPUs in fp16", kind, faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index, co=options)


def _read_bm25(path: Path, mmap: bool) -> bm25s.BM25:
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: the index's BM25 directory is missing")
    return bm25s.BM25.load(str(path), mmap=mmap, load_vocab=True, show_progress=False)


# ---------------------------------------------------------------------------------------------------------
# Searching
# ---------------------------------------------------------------------------------------------------------


class SearchIndex(ABC):
    """A loaded index: :meth:`search` ranks the passages of ``corpus`` (a memory-mapped table)."""

    def __init__(self, manifest: dict[str, Any], corpus: pa.Table) -> None:
        self.manifest = manifest
        self.corpus = corpus

    @property
    def count(self) -> int:
        """The number of passages."""
        return self.corpus.num_rows

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``min(topk, count)`` best passages for each query, best first, with their scores."""
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if len(queries) == 0:
            return []
        rows, scores = self._rank(list(queries), min(int(topk), self.count))
        return self._lookup(rows, scores)

    @abstractmethod
    def _rank(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """The row numbers of each query's ``k`` best passages, best first, and their scores (or None)."""

    def _lookup(self, rows: list[np.ndarray], scores: list[np.ndarray] | None) -> list[list[Passage]]:
        """The passages at ``rows``, read from the corpus in one ``take``."""
        columns = ("id", "title", "text", "contents")
        taken = self.corpus.select(list(columns)).take(pa.array(np.concatenate(rows), pa.int64()))
        ids, titles, texts, contents = (taken.column(name).to_pylist() for name in columns)
        results, start = [], 0
        for q, query_rows in enumerate(rows):
            results.append(
                [
                    Passage(
                        id=ids[start + j],
                        title=titles[start + j],
                        text=texts[start + j],
                        score=None if scores is None else float(scores[q][j]),
                        raw_contents=contents[start + j],
                    )
                    for j in range(len(query_rows))
                ]
            )
            start += len(query_rows)
        return results


class DenseSearchIndex(SearchIndex):
    """Embedding search: one encoder call for all queries, then faiss (inner product).

    HNSW may return fewer than ``k`` passages when ``k`` nears the corpus size: its graph search need
    not reach every node.
    """

    # Queries are short: a batch of a few hundred fits any device.
    query_batch_size = 256
    # From this many queries on, exact search is one BLAS matrix product that reads the vectors once for the
    # whole batch, instead of a scan per query. faiss compares its threshold with queries x dimension, and its
    # default (128000: 333 queries of 384 dimensions) kept batched searches on the scan, as slow per query as
    # one query. Measured on 2 cores, 100k x 384 Flat, one thread, ms per query (scan / BLAS): 1 query
    # 5.6 / 28; 4: 4.9 / 7.1; 8: 5.0 / 3.6; 32: 5.4 / 1.7; 128: 5.6 / 0.9.
    blas_min_queries = 8

    def __init__(
        self, manifest: dict[str, Any], corpus: pa.Table, encoder: TextEncoder, faiss_index: faiss.Index
    ) -> None:
        super().__init__(manifest, corpus)
        self.encoder = encoder
        self.faiss_index = faiss_index
        # Process-wide in faiss; every dense index of a process sets the same rule.
        faiss.cvar.distance_compute_blas_threshold = self.blas_min_queries * faiss_index.d

    def _rank(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        vectors = self.encoder.encode_queries(queries, batch_size=self.query_batch_size)
        scores, rows = self.faiss_index.search(vectors, k)
        found = rows >= 0  # faiss pads with -1 when it finds fewer than k
        return [r[m] for r, m in zip(rows, found)], [s[m] for s, m in zip(scores, found)]


class BM25SearchIndex(SearchIndex):
    """BM25 (bm25s) over the passages' ``contents`` with English stop words removed."""

    def __init__(self, manifest: dict[str, Any], corpus: pa.Table, bm25: bm25s.BM25) -> None:
        super().__init__(manifest, corpus)
        self.bm25 = bm25

    def _rank(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        tokens = bm25s.tokenize(queries, stopwords=BM25_STOPWORDS, show_progress=False)
        rows, scores = self.bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return list(np.asarray(rows)), list(np.asarray(scores))


class RandomSearchIndex(SearchIndex):
    """Uniformly random distinct passages for every query, from a seeded generator; no scores."""

    def __init__(self, manifest: dict[str, Any], corpus: pa.Table, seed: int) -> None:
        super().__init__(manifest, corpus)
        self._rng = np.random.default_rng(seed)

    def _rank(self, queries: list[str], k: int) -> tuple[list[np.ndarray], None]:
        return [self._rng.choice(self.count, size=k, replace=False) for _ in queries], None
