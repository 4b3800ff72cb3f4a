"""An in-process BM25 retriever (bm25s): the search engine of tests, demos and small corpora.

The Ray Serve deployment wraps retrievers like this one; anything here satisfies
:class:`rllib_search.data.retrieval.Retriever`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import bm25s
import numpy as np

from rllib_search.data.retrieval import Passage


class BM25Retriever:
    """BM25 over passages' ``title + text`` with English stop words removed."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = list(passages)
        corpus_tokens = bm25s.tokenize(
            [f"{p.title} {p.text}" for p in self.passages], stopwords="en", show_progress=False
        )
        self._index = bm25s.BM25()
        self._index.index(corpus_tokens, show_progress=False)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` best passages for each query (all queries scored in one call)."""
        if not queries:
            return []
        k = max(1, min(int(topk), len(self.passages)))
        # A query made only of stop words tokenises to nothing; bm25s then scores every passage 0.
        query_tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        doc_ids, scores = self._index.retrieve(query_tokens, k=k, show_progress=False, n_threads=1)
        return [
            [self._with_score(int(i), float(s)) for i, s in zip(row_ids, row_scores)]
            for row_ids, row_scores in zip(np.asarray(doc_ids), np.asarray(scores))
        ]

    def _with_score(self, index: int, score: float) -> Passage:
        return replace(self.passages[index], score=score)
