"""Building a retrieval index: the corpus staged as a memory-mapped Arrow IPC file, the faiss or BM25
index over its ``contents``, then the manifest, written last (the directory's layout: ``index_manifest.py``).

Dense kinds embed each passage's ``contents`` (``"Title"\\ntext``) with the passage prefix, as Search-R1 does.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bm25s
import numpy as np
import pyarrow as pa
from filelock import FileLock
from tqdm.auto import tqdm

from rllib_search.data.errors import DataFormatError
from rllib_search.data.formats import CORPUS_SCHEMA, corpus_batches, write_batches_atomically
from rllib_search.serve.retrieval.manifest import (
    BM25_DIR,
    BM25_STOPWORDS,
    CORPUS_FILE,
    DENSE_KINDS,
    FAISS_FILE,
    KIND_OPTIONS,
    KINDS,
    MANIFEST_FILE,
    MANIFEST_VERSION,
    IndexFileError,
    open_corpus,
    read_manifest,
    write_manifest,
)

if TYPE_CHECKING:  # torch and faiss load for dense indexes only: BM25 builds and loads run without them
    from rllib_search.serve.retrieval.encoders import EncoderSpec, TextEncoder
    from rllib_search.serve.retrieval.faiss_module import faiss

# Rows read from the source corpus at a time while staging it.
STAGING_BATCH_ROWS = 50_000


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

    Dense kinds use ``encoder`` (default ``encoders.DEFAULT_ENCODER``) and encode ``batch_size`` passages at a
    time straight into the faiss index; ``kind_options`` are those of :data:`KIND_OPTIONS`.
    """
    options = _kind_options(kind, kind_options)
    spec = _build_spec(kind, encoder)
    corpus, out = Path(corpus), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # a rebuild that fails must not look complete
    checksum = file_sha256(corpus)
    count = stage_corpus(corpus, out / CORPUS_FILE)
    if count == 0:
        raise DataFormatError(corpus, None, None, "the corpus has no passages")
    table = open_corpus(out / CORPUS_FILE)
    dim, faiss_params = None, None
    if spec is not None:
        from rllib_search.serve.retrieval.encoders import TextEncoder

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
    write_manifest(out / MANIFEST_FILE, manifest)
    return manifest


def ensure_index(
    corpus: str | Path,
    out_dir: str | Path,
    kind: str,
    encoder: str | EncoderSpec | None = None,
    **build_options: Any,
) -> Path:
    """``out_dir``, with a ``kind`` index of ``corpus`` built there unless a complete one of the same
    corpus (the manifest's ``corpus_sha256``), kind, encoder and given options already is; returns
    ``out_dir``. An index of another corpus (a regenerated world) or a half-built one is replaced.

    One builder at a time per index (a lock file beside it), so processes that start at once (a Tune
    sweep's trials, parallel tests, jobs on one node) build it once and the others wait for it. The new
    index is built in a staging directory and renamed into place, so a reader never finds a half-written
    one; the old directory is renamed aside first and removed last.
    """
    corpus, out = Path(corpus), Path(out_dir)
    wanted = _wanted_manifest(corpus, kind, encoder, build_options)
    if _is_current(out, wanted):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # filelock (a dependency of torch and the HF hub) holds an OS lock the kernel drops with its process,
    # so a builder that dies leaves no stale lock, only a staging directory, removed by the next builder.
    with FileLock(out.parent / f".{out.name}.lock"):
        if _is_current(out, wanted):  # built by the process this one waited for
            return out
        for leftover in out.parent.glob(f".{out.name}.staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # builders that died: the lock is ours now
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
        replaced = staging.with_name(staging.name + "-replaced")
        try:
            build_index(corpus, staging, kind, encoder=encoder, **build_options)
            if out.exists():
                out.replace(replaced)
            staging.replace(out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after the rename; a failed build's otherwise
            shutil.rmtree(replaced, ignore_errors=True)
    return out


def _wanted_manifest(
    corpus: Path, kind: str, encoder: str | EncoderSpec | None, build_options: dict[str, Any]
) -> dict[str, Any]:
    """The manifest entries an index of ``corpus`` built with these arguments must have: the kind's
    options as given or by default (an option left out means its default, not whatever an earlier build
    used), except ``None`` ones, which the build chooses; not ``batch_size`` or ``progress``."""
    given = {k: v for k, v in build_options.items() if k not in ("batch_size", "progress")}
    options = _kind_options(kind, given)  # unknown options fail here, before any hashing or locking
    spec = _build_spec(kind, encoder)
    return {
        "kind": kind,
        "corpus_sha256": file_sha256(corpus),
        "encoder": spec.to_dict() if spec is not None else None,
        "options": {k: v for k, v in options.items() if v is not None},
    }


def _is_current(out: Path, wanted: dict[str, Any]) -> bool:
    """Whether ``out`` holds a complete index with the ``wanted`` entries (build-chosen options aside)."""
    try:
        manifest = read_manifest(out)
    except (OSError, IndexFileError):
        return False
    options = manifest.get("options") or {}
    return (
        manifest["kind"] == wanted["kind"]
        and manifest.get("corpus_sha256") == wanted["corpus_sha256"]
        and manifest["encoder"] == wanted["encoder"]
        and all(options.get(k) == v for k, v in wanted["options"].items())
    )


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
    from rllib_search.serve.retrieval.encoders import DEFAULT_ENCODER, EncoderSpec

    if isinstance(encoder, EncoderSpec):
        return encoder
    return EncoderSpec.for_model(encoder or DEFAULT_ENCODER)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stage_corpus(source: Path, target: Path) -> int:
    """Write a corpus jsonl or parquet to ``target`` as an Arrow IPC file, batch by batch; returns rows."""
    return write_batches_atomically(corpus_batches(source, STAGING_BATCH_ROWS), target, _arrow_ipc_writer)


@contextlib.contextmanager
def _arrow_ipc_writer(path: Path) -> Iterator[pa.ipc.RecordBatchFileWriter]:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, CORPUS_SCHEMA) as writer:
        yield writer


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
    from rllib_search.serve.retrieval.faiss_module import faiss

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
    from rllib_search.serve.retrieval.faiss_module import faiss

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
