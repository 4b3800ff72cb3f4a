"""A loaded index: :class:`SearchIndex` ranks rows of a memory-mapped corpus and looks their passages up,
one subclass per ranking (dense faiss, BM25, random). Each satisfies
:class:`rllib_search.data.retrieval.Retriever`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import bm25s
import numpy as np
import pyarrow as pa

from rllib_search.data.retrieval import Passage
from rllib_search.serve.retrieval.manifest import BM25_STOPWORDS

if TYPE_CHECKING:  # a dense index brings torch and faiss; BM25 and random indexes run without them
    from rllib_search.serve.retrieval.encoders import TextEncoder
    from rllib_search.serve.retrieval.faiss_module import faiss


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
    # default (128000: 333 queries of 384 dimensions) keeps batched searches on the scan, as slow per query as
    # one query. Measured on 2 cores, 100k x 384 Flat, one thread, ms per query (scan / BLAS): 1 query
    # 5.6 / 28; 4: 4.9 / 7.1; 8: 5.0 / 3.6; 32: 5.4 / 1.7; 128: 5.6 / 0.9.
    blas_min_queries = 8

    def __init__(
        self, manifest: dict[str, Any], corpus: pa.Table, encoder: TextEncoder, faiss_index: faiss.Index
    ) -> None:
        from rllib_search.serve.retrieval.faiss_module import faiss

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
