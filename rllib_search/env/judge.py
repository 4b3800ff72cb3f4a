"""What the environment needs from an evidence judge: questions and evidence in, answers out, in batches.

R-Search's evidence reward (eq. 4) is the F1 of a second model's answer when that model sees only the evidence
the policy wrote. The judge is a frozen model of another family; the env never calls a model itself, it asks
an :class:`EvidenceJudge` for the answers of every episode that needs one in ONE call (``score_episodes`` in
``search_env.py``). The served judge (``serve/judge/deployment.py`` and its client) satisfies the protocol,
and so does any callable ``(question, evidence) -> answer`` wrapped by :func:`as_judge`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

EVIDENCE_JUDGE_TEMPLATE = (
    # R-Search, Table 5 (Appendix B.2): the cross-family model answers from the evidence alone.
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages: {evidence}\n\nQuestion: {question}\n\nAnswer:"
)


def evidence_prompt(question: str, evidence: str) -> str:
    """R-Search's evidence template filled with one question and the evidence the policy wrote."""
    return EVIDENCE_JUDGE_TEMPLATE.format(evidence=evidence, question=question)


@runtime_checkable
class EvidenceJudge(Protocol):
    """A reader of another model family: for each (question, evidence) pair, its short answer.

    One call answers a whole batch; a failure raises (the env then scores every episode of that call with
    an evidence term of 0 and counts a judge error for each).
    """

    def answer_evidence(self, questions: Sequence[str], evidences: Sequence[str]) -> list[str]: ...


class CallableJudge:
    """An :class:`EvidenceJudge` over a plain function ``(question, evidence) -> answer`` (tests, or a
    user's own reader); answers the pairs of a batch one by one."""

    def __init__(self, fn: Callable[[str, str], str]) -> None:
        self.fn = fn

    def answer_evidence(self, questions: Sequence[str], evidences: Sequence[str]) -> list[str]:
        return [self.fn(question, evidence) for question, evidence in zip(questions, evidences)]


def as_judge(judge: Any) -> EvidenceJudge | None:
    """``judge`` as an :class:`EvidenceJudge`: None stays None, a judge is returned as is, a callable is
    wrapped in :class:`CallableJudge`."""
    if judge is None or isinstance(judge, EvidenceJudge):
        return judge
    if callable(judge):
        return CallableJudge(judge)
    raise TypeError(
        "a judge must have answer_evidence(questions, evidences) or be a callable, "
        f"got {type(judge).__name__}"
    )
