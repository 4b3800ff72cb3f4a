"""``rllib-search index``: build a retrieval index directory, or show what one holds.

- ``rllib-search index build --corpus CORPUS --kind flat|hnsw|ivfpq|bm25|random --out DIR``
  (``--encoder`` for the dense kinds, default ``intfloat/e5-base-v2``; per-kind options below).
- ``rllib-search index import --faiss e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2
  --out DIR``: a faiss index built elsewhere (Search-R1's) as an index directory, nothing re-encoded.
- ``rllib-search index info DIR``: print the manifest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

# Command-line flags (argparse dests) of index options: dest -> (kind, option of KIND_OPTIONS[kind]).
KIND_FLAGS = {
    "hnsw_m": ("hnsw", "m"),
    "ef_construction": ("hnsw", "ef_construction"),
    "ef_search": ("hnsw", "ef_search"),
    "nlist": ("ivfpq", "nlist"),
    "pq_m": ("ivfpq", "pq_m"),
    "nbits": ("ivfpq", "nbits"),
    "nprobe": ("ivfpq", "nprobe"),
    "train_size": ("ivfpq", "train_size"),
    "bm25_k1": ("bm25", "k1"),
    "bm25_b": ("bm25", "b"),
    "seed": ("random", "seed"),
}
# Flags that override the encoder family's preset: argparse dests named as EncoderSpec fields.
ENCODER_FLAGS = ("pooling", "query_prefix", "passage_prefix", "max_length")


def add_encoder_overrides(parser: argparse.ArgumentParser) -> None:
    """The encoder-family overrides that `index build` and `index import` share."""
    parser.add_argument("--pooling", choices=("mean", "cls"), help="override the encoder family's pooling")
    parser.add_argument("--query-prefix", help="override the encoder family's query prefix")
    parser.add_argument("--passage-prefix", help="override the encoder family's passage prefix")
    parser.add_argument("--max-length", type=int, help="override the encoder's maximum tokens per text")


def add_index_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``index build`` and ``index info`` on a CLI's subcommands."""
    from rllib_search.serve.retrieval.manifest import KINDS

    index = subparsers.add_parser("index", help="build and inspect retrieval indexes")
    commands = index.add_subparsers(dest="index_command", required=True)

    build = commands.add_parser("build", help="build an index directory from a corpus")
    build.add_argument("--corpus", required=True, help="corpus .jsonl ({id, contents}) or .parquet")
    build.add_argument("--out", required=True, help="index directory to write")
    build.add_argument("--kind", choices=KINDS, default="flat", help="index kind (default: flat)")
    build.add_argument(
        "--encoder", help="dense kinds: hub name, local path or bundled alias (default: intfloat/e5-base-v2)"
    )
    add_encoder_overrides(build)
    build.add_argument("--batch-size", type=int, default=256, help="passages encoded per batch")
    build.add_argument("--hnsw-m", type=int, help="hnsw: graph neighbours per node (default 32)")
    build.add_argument("--ef-construction", type=int, help="hnsw: build-time beam width (default 200)")
    build.add_argument("--ef-search", type=int, help="hnsw: search-time beam width (default 128)")
    build.add_argument("--nlist", type=int, help="ivfpq: inverted lists (default ~4 sqrt(passages))")
    build.add_argument("--pq-m", type=int, help="ivfpq: sub-quantizers (default: width / 8)")
    build.add_argument("--nbits", type=int, help="ivfpq: bits per sub-quantizer code (default 8)")
    build.add_argument("--nprobe", type=int, help="ivfpq: lists searched per query (default 16)")
    build.add_argument("--train-size", type=int, help="ivfpq: passages to train the quantizers on")
    build.add_argument("--bm25-k1", type=float, help="bm25: term-frequency saturation (default 1.5)")
    build.add_argument("--bm25-b", type=float, help="bm25: length normalisation (default 0.75)")
    build.add_argument("--seed", type=int, help="random: generator seed (default 0)")
    build.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    build.set_defaults(func=cmd_index_build)

    imp = commands.add_parser(
        "import", help="import a faiss index built elsewhere (Search-R1's e5_Flat.index) without re-encoding"
    )
    imp.add_argument("--faiss", required=True, help="the faiss index file (IndexFlatIP, HNSW-Flat or IVF-PQ)")
    imp.add_argument(
        "--corpus", required=True, help="its corpus .jsonl ({id, contents}) or .parquet, in order"
    )
    imp.add_argument("--out", required=True, help="index directory to write")
    imp.add_argument(
        "--encoder", help="the model that embedded the passages (default: intfloat/e5-base-v2, Search-R1's)"
    )
    add_encoder_overrides(imp)
    imp.add_argument(
        "--copy", action="store_true", help="copy the faiss file even where a hard link would do"
    )
    imp.set_defaults(func=cmd_index_import)

    info = commands.add_parser("info", help="print an index directory's manifest")
    info.add_argument("dir", help="index directory")
    info.set_defaults(func=cmd_index_info)


def cmd_index_build(args: argparse.Namespace) -> int:
    """``index build``: options for another kind than ``--kind`` are an error (exit status 2)."""
    from rllib_search.serve.memory import resident_memory_mb
    from rllib_search.serve.retrieval.build import build_index
    from rllib_search.serve.retrieval.manifest import DENSE_KINDS

    options: dict[str, Any] = {}
    for dest, (kind, option) in KIND_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if kind != args.kind:
            return _usage_error(f"--{dest.replace('_', '-')} applies to --kind {kind} only")
        options[option] = value
    overrides = {field: getattr(args, field) for field in ENCODER_FLAGS if getattr(args, field) is not None}
    encoder = None
    if args.kind in DENSE_KINDS:
        from rllib_search.serve.retrieval.encoders import DEFAULT_ENCODER, EncoderSpec

        encoder = EncoderSpec.for_model(args.encoder or DEFAULT_ENCODER, **overrides)
    elif args.encoder is not None or overrides:
        return _usage_error(f"a {args.kind} index uses no encoder: drop --encoder and its overrides")

    start = time.perf_counter()
    manifest = build_index(
        args.corpus,
        args.out,
        args.kind,
        encoder=encoder,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        **options,
    )
    seconds = time.perf_counter() - start
    dim = f", dim {manifest['dim']}" if manifest["dim"] is not None else ""
    print(
        f"[index] {manifest['kind']} index of {manifest['count']} passages{dim} in {args.out} "
        f"({seconds:.1f} s, resident memory {resident_memory_mb():.0f} MB)"
    )
    return 0


def cmd_index_import(args: argparse.Namespace) -> int:
    """``index import``: a foreign faiss index and its corpus as an index directory."""
    from rllib_search.serve.retrieval.encoders import DEFAULT_ENCODER, EncoderSpec
    from rllib_search.serve.retrieval.import_faiss import import_faiss_index

    overrides = {field: getattr(args, field) for field in ENCODER_FLAGS if getattr(args, field) is not None}
    encoder = EncoderSpec.for_model(args.encoder or DEFAULT_ENCODER, **overrides)
    start = time.perf_counter()
    manifest = import_faiss_index(args.faiss, args.corpus, args.out, encoder=encoder, copy=args.copy)
    seconds = time.perf_counter() - start
    print(
        f"[index] imported {manifest['faiss']['type']} ({manifest['kind']}) of {manifest['count']} passages, "
        f"dim {manifest['dim']}, encoder {manifest['encoder']['name_or_path']} into {args.out} "
        f"(faiss file: {manifest['imported_from']['how']}; {seconds:.1f} s)"
    )
    return 0


def cmd_index_info(args: argparse.Namespace) -> int:
    """``index info DIR``: print the manifest as JSON."""
    from rllib_search.serve.retrieval.manifest import read_manifest

    print(json.dumps(read_manifest(args.dir), indent=2))
    return 0


def _usage_error(message: str) -> int:
    print(f"rllib-search index build: error: {message}", file=sys.stderr)
    return 2
