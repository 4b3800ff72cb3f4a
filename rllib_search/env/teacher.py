"""A teacher that writes the turns a perfect search agent would, in any protocol.

Questions of the synthetic world carry their chain of hops (``extra["hops"]``: the query to issue at each
hop and the entity it finds), so the teacher searches once per hop and then answers, quoting the
retrieved lines that hold each hop's answer as evidence where the protocol has an evidence box. Its
segments serve as demonstrations (warm starts) and as a known-good policy in demos and tests.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllib_search.data.records import QARecord
from rllib_search.env.protocols import Protocol


class TeacherPolicy:
    """Writes one segment per turn for questions that carry ``extra["hops"]``."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol

    def segment(self, record: QARecord, turn: int, retrieved_blocks: Sequence[str]) -> str:
        """The text of turn ``turn`` (0-based) given the observation bodies seen so far."""
        hops = hops_of(record)
        if turn < len(hops):
            query = hops[turn]["query"]
            if turn == 0:
                thought = f"I need to search for {query}."
            else:
                thought = f"The results say {hops[turn - 1]['answer']}. Next I need {query}."
            return self.protocol.render_search(query, thought=thought)
        answer = record.golden_answers[0]
        last_found = hops[-1]["answer"] if hops else answer
        evidence = self._evidence(hops, retrieved_blocks) if hops else None
        return self.protocol.render_answer(
            answer, thought=f"The results say {last_found}.", evidence=evidence
        )

    def _evidence(self, hops: Sequence[dict[str, str]], retrieved_blocks: Sequence[str]) -> str:
        passages = [
            p for block in retrieved_blocks for p in block.split(self.protocol.passage_separator) if p
        ]
        quoted: list[str] = []
        for hop in hops:
            found = next((p for p in passages if hop["answer"].lower() in p.lower()), None)
            if found is not None and found not in quoted:
                quoted.append(found.strip())
        return " ".join(quoted) if quoted else "No relevant information was found."


def hops_of(record: QARecord) -> list[dict[str, str]]:
    """The record's hop chain (``[{"query", "answer"}, ...]``), empty when it has none."""
    hops = record.extra.get("hops") or []
    return [{"query": str(h["query"]), "answer": str(h["answer"])} for h in hops]
