"""Importing a faiss index built elsewhere, such as Search-R1's published ``e5_Flat.index`` over wiki-18,
into an index directory (layout: ``index_manifest.py``) without encoding a passage again.

Search-R1 builds its index with ``faiss.IndexFlatIP`` over normalised E5 embeddings of each corpus row's
``contents`` (``"Title"\\ntext``) with the ``passage: `` prefix, rows in corpus order; its corpus is jsonl
``{"id", "contents"}``. Row ``i`` of the faiss index is line ``i`` of the corpus, so importing is: check the
index (inner product, a kind we load), its width against the encoder's and its size against the corpus's,
stage the corpus as our memory-mapped Arrow file, put the faiss file beside it (a hard link when both are
on one file system, else a copy) and write the manifest naming the encoder, whose query side then encodes
with the same prefix, pooling and normalisation.
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rllib_search.serve.retrieval.build import file_sha256, stage_corpus
from rllib_search.serve.retrieval.encoders import DEFAULT_ENCODER, EncoderSpec, encoder_width
from rllib_search.serve.retrieval.faiss_module import faiss
from rllib_search.serve.retrieval.manifest import (
    CORPUS_FILE,
    FAISS_FILE,
    KIND_OPTIONS,
    MANIFEST_FILE,
    MANIFEST_VERSION,
    IndexFileError,
    IndexMismatchError,
    write_manifest,
)

logger = logging.getLogger(__name__)


def import_faiss_index(
    faiss_path: str | Path,
    corpus: str | Path,
    out_dir: str | Path,
    encoder: str | EncoderSpec = DEFAULT_ENCODER,
    copy: bool = False,
) -> dict[str, Any]:
    """Import a faiss index of ``corpus`` (jsonl or parquet, row ``i`` = vector ``i``) embedded with
    ``encoder`` into ``out_dir``; returns the manifest. Nothing is encoded and no model is loaded or
    downloaded: the encoder's width is read from its ``config.json`` where one is on this machine (else
    checked when the index is loaded). ``copy`` copies the faiss file even where a hard link would do."""
    faiss_path, corpus, out = Path(faiss_path), Path(corpus), Path(out_dir)
    spec = encoder if isinstance(encoder, EncoderSpec) else EncoderSpec.for_model(encoder)
    index = _read_header(faiss_path)
    kind, options = _kind_of(faiss_path, index)
    width = encoder_width(spec.name_or_path)
    if width is not None and width != index.d:
        raise IndexMismatchError(
            f"{faiss_path}: {index.d}-dimensional vectors, "
            f"but encoder {spec.name_or_path!r} embeds in {width}"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # an import that fails must not look complete
    count = stage_corpus(corpus, out / CORPUS_FILE)
    if count != index.ntotal:
        (out / CORPUS_FILE).unlink(missing_ok=True)
        raise IndexFileError(
            f"{corpus}: {count} passages, but the faiss index {faiss_path} holds {index.ntotal} vectors "
            "(row i of the corpus must be vector i of the index)"
        )
    how = _place(faiss_path, out / FAISS_FILE, copy)
    logger.info("%s -> %s (%s)", faiss_path, out / FAISS_FILE, how)
    manifest = {
        "kind": kind,
        "encoder": spec.to_dict(),
        "dim": int(index.d),
        "count": count,
        "corpus_file": CORPUS_FILE,
        "corpus_sha256": file_sha256(corpus),
        "faiss": {"type": type(index).__name__, "metric": "inner_product", **options},
        "options": options,
        "imported_from": {"faiss": str(faiss_path.resolve()), "corpus": str(corpus.resolve()), "how": how},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": MANIFEST_VERSION,
    }
    write_manifest(out / MANIFEST_FILE, manifest)
    return manifest


def _read_header(path: Path) -> faiss.Index:
    """The faiss index, memory-mapped where this faiss can (a 60 GB flat index costs no memory)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such faiss index file")
    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    try:
        return faiss.read_index(str(path), flag) if flag is not None else faiss.read_index(str(path))
    except RuntimeError as err:
        raise IndexFileError(f"{path}: not a readable faiss index ({str(err).strip()})") from err


def _kind_of(path: Path, index: faiss.Index) -> tuple[str, dict[str, Any]]:
    """Our kind and options for a faiss index: inner-product Flat, HNSW-Flat or IVF-PQ."""
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise IndexFileError(
            f"{path}: metric {index.metric_type} is not inner product (faiss.METRIC_INNER_PRODUCT); "
            "Search-R1 and this project search normalised embeddings by inner product"
        )
    if isinstance(index, faiss.IndexHNSWFlat):
        hnsw = index.hnsw
        m = int(hnsw.nb_neighbors(1))  # faiss keeps M per level; level 1 holds M, level 0 holds 2 M
        options = {"m": m, "ef_construction": int(hnsw.efConstruction), "ef_search": int(hnsw.efSearch)}
        return "hnsw", options
    if isinstance(index, faiss.IndexIVFPQ):
        ivfpq = {"nlist": int(index.nlist), "pq_m": int(index.pq.M), "nbits": int(index.pq.nbits)}
        return "ivfpq", {**KIND_OPTIONS["ivfpq"], **ivfpq, "nprobe": int(index.nprobe), "train_size": None}
    if isinstance(index, faiss.IndexFlat):
        return "flat", {}
    raise IndexFileError(
        f"{path}: a {type(index).__name__} index; importable are IndexFlatIP (Search-R1's), IndexHNSWFlat "
        "and IndexIVFPQ with the inner-product metric"
    )


def _place(source: Path, target: Path, copy: bool) -> str:
    """Put ``source`` at ``target``: a hard link (no bytes copied) unless ``copy`` or across file systems."""
    target.unlink(missing_ok=True)
    if not copy:
        try:
            os.link(source, target)
            return "hard link"
        except OSError:
            pass
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)
    return "copy"
