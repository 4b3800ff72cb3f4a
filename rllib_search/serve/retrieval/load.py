"""Loading an index directory built by :func:`~rllib_search.serve.retrieval.build.build_index`: the corpus and
the faiss or BM25 arrays memory-mapped, the encoder checked against the manifest's (the directory's
layout: ``index_manifest.py``; the search itself: ``index_search.py``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bm25s

from rllib_search.serve.retrieval.manifest import (
    BM25_DIR,
    DENSE_KINDS,
    FAISS_FILE,
    MANIFEST_FILE,
    IndexFileError,
    IndexMismatchError,
    open_corpus,
    read_manifest,
)
from rllib_search.serve.retrieval.search import (
    BM25SearchIndex,
    DenseSearchIndex,
    RandomSearchIndex,
    SearchIndex,
)

if TYPE_CHECKING:  # torch and faiss load with a dense index only: a BM25 replica runs without them
    from rllib_search.serve.retrieval.encoders import EncoderSpec
    from rllib_search.serve.retrieval.faiss_module import faiss

logger = logging.getLogger(__name__)


def load_index(
    index_dir: str | Path,
    encoder: str | EncoderSpec | None = None,
    device: str | None = None,
    mmap: bool = True,
    dtype: str | None = None,
) -> SearchIndex:
    """Load an index built by :func:`build_index`.

    ``encoder`` (default: the manifest's) may name a local copy of the same model, or change its
    ``max_length``; a different model, pooling or prefix raises :class:`IndexMismatchError`. With ``mmap`` the
    faiss and BM25 arrays are memory-mapped; the corpus always is. On a machine whose faiss has GPU support,
    flat and IVF-PQ indexes are sharded in fp16 over all visible GPUs unless ``device`` is the CPU. ``dtype``
    is the query encoder's (:func:`~rllib_search.serve.retrieval.encoders.resolve_dtype`: None keeps fp32 on
    the CPU and fp16 on a GPU; ``"auto"`` also uses bf16 on CPUs where bf16 is native and pays).
    """
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    spec = _loading_spec(index_dir / MANIFEST_FILE, manifest, encoder)
    corpus_path = index_dir / manifest["corpus_file"]
    corpus = open_corpus(corpus_path)
    if corpus.num_rows != manifest["count"]:
        raise IndexFileError(
            f"{corpus_path}: {corpus.num_rows} passages, the manifest says {manifest['count']}"
        )
    kind, options = manifest["kind"], manifest["options"]
    if kind in DENSE_KINDS:
        from rllib_search.serve.retrieval.encoders import TextEncoder

        if spec is None:
            raise IndexFileError(f"{index_dir / MANIFEST_FILE}: a {kind} index without an encoder")
        faiss_index = _read_faiss(index_dir / FAISS_FILE, mmap, manifest["count"])
        if kind == "hnsw":
            faiss_index.hnsw.efSearch = options["ef_search"]
        elif kind == "ivfpq":
            faiss_index.nprobe = options["nprobe"]
        if faiss_index.d != manifest["dim"]:
            raise IndexFileError(
                f"{index_dir / FAISS_FILE}: {faiss_index.d}-dimensional vectors, the manifest says "
                f"{manifest['dim']}"
            )
        text_encoder = TextEncoder(spec, device=device, dtype=dtype)
        if text_encoder.dim != faiss_index.d:
            raise IndexMismatchError(
                f"{index_dir / FAISS_FILE}: {faiss_index.d}-dimensional vectors, but encoder "
                f"{spec.name_or_path!r} embeds in {text_encoder.dim}"
            )
        if device is None or str(device).startswith("cuda"):
            faiss_index = _on_gpus(faiss_index, kind)
        return DenseSearchIndex(manifest, corpus, text_encoder, faiss_index)
    if kind == "bm25":
        return BM25SearchIndex(manifest, corpus, _read_bm25(index_dir / BM25_DIR, mmap))
    return RandomSearchIndex(manifest, corpus, seed=options["seed"])


def _loading_spec(
    manifest_path: Path, manifest: dict[str, Any], encoder: str | EncoderSpec | None
) -> EncoderSpec | None:
    """The encoder to load: the manifest's, or the one asked for when it matches the manifest's."""
    if manifest["encoder"] is None and encoder is None:
        return None
    from rllib_search.serve.retrieval.encoders import EncoderSpec

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
    from rllib_search.serve.retrieval.encoders import resolve_model_path

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
    from rllib_search.serve.retrieval.faiss_module import faiss

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
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as err:
            reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise IndexFileError(f"{path}: not a readable faiss index ({reason})") from err
    if index.ntotal != count:
        raise IndexFileError(f"{path}: {index.ntotal} vectors, the manifest says {count}")
    return index


def _on_gpus(index: faiss.Index, kind: str) -> faiss.Index:
    """The index sharded in fp16 over all visible GPUs, when this faiss has GPU support and sees GPUs
    (HNSW stays on the CPU: faiss has no GPU HNSW)."""
    from rllib_search.serve.retrieval.faiss_module import faiss

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
    try:
        # allow_pickle=False (bm25s's default, stated): an index's arrays are plain .npy, never pickles.
        return bm25s.BM25.load(str(path), mmap=mmap, load_vocab=True, allow_pickle=False, show_progress=False)
    except (OSError, ValueError, KeyError, EOFError) as err:
        raise IndexFileError(f"{path}: not a readable BM25 index ({type(err).__name__}: {err})") from err
