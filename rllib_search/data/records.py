"""The one in-memory record of a question-answering example, whatever file it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class QARecord:
    """A question with its gold answers.

    ``id`` is unique within its ``data_source``; ``uid`` (``data_source/id``) is unique across datasets,
    which is what rollout group ids are built from (Search-R1's per-dataset row indices collided).
    ``extra`` carries anything else the source file had (for the synthetic world: ``num_hops`` and the
    ``hops`` chain of ``{"query", "answer"}`` that a teacher can follow).
    """

    id: str
    question: str
    golden_answers: list[str]
    data_source: str = "unknown"
    split: str = "train"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return f"{self.data_source}/{self.id}"
