"""What the environment needs from a search engine: passages in, passages out.

Every retriever the project knows satisfies :class:`Retriever`: the in-process BM25 index used in tests
and demos, the Ray Serve client (in-cluster handle or HTTP) and an external Search-R1 retrieval server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. ``score`` is None when the engine does not return scores.

    ``raw_contents`` is the corpus's ``contents`` string exactly as stored, when the passage was read from
    one (``from_contents``, an index's corpus, a Search-R1 server's answer): Search-R1's rollout formats
    observations from that string, so keeping it lets the ``search_r1`` protocol write the same bytes.
    """

    id: str
    title: str
    text: str
    score: float | None = None
    raw_contents: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float | None = None) -> Passage:
        """Split Search-R1/FlashRAG ``contents`` (``"Title"\\ntext``) into title and text (the string itself
        is kept as ``raw_contents``)."""
        title, sep, text = contents.partition("\n")
        if not sep:
            title, text = "", contents
        return cls(
            id=str(id), title=title.strip().strip('"'), text=text.strip(), score=score, raw_contents=contents
        )

    @property
    def contents(self) -> str:
        """The passage in Search-R1's corpus convention, ``"Title"\\ntext``: ``raw_contents`` when known."""
        if self.raw_contents is not None:
            return self.raw_contents
        return f'"{self.title}"\n{self.text}'


@runtime_checkable
class Retriever(Protocol):
    """A search engine: for each query, the ``topk`` best passages, best first."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...
