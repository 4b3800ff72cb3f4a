"""What the environment needs from a search engine: passages in, passages out.

Every retriever the project knows satisfies :class:`Retriever`: the in-process BM25 index used in tests
and demos, the Ray Serve client (in-cluster handle or HTTP) and an external Search-R1 retrieval server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. ``score`` is None when the engine does not return scores."""

    id: str
    title: str
    text: str
    score: float | None = None

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float | None = None) -> Passage:
        """Split Search-R1/FlashRAG ``contents`` (``"Title"\\ntext``) into title and text."""
        title, sep, text = contents.partition("\n")
        if not sep:
            title, text = "", contents
        return cls(id=str(id), title=title.strip().strip('"'), text=text.strip(), score=score)

    @property
    def contents(self) -> str:
        """The passage in Search-R1's corpus convention: ``"Title"\\ntext``."""
        return f'"{self.title}"\n{self.text}'


@runtime_checkable
class Retriever(Protocol):
    """A search engine: for each query, the ``topk`` best passages, best first."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...
