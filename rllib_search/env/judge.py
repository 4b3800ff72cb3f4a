"""What the environment needs from an evidence judge: questions and evidence in, answers out, in batches.

R-Search's evidence reward (eq. 4) is the F1 of a second model's answer when that model sees only the evidence
the policy wrote. The judge is a frozen model of another family; the env never calls a model itself, it asks
an :class:`EvidenceJudge` for the answers of every episode that needs one in ONE call (``score_episodes`` in
``search_env.py``). The served judge (``serve/judge/deployment.py`` and its client) satisfies the protocol,
and so does any callable ``(question, evidence) -> answer`` wrapped by :func:`as_judge`.

A judge prompt is R-Search's Table 5 template, verbatim, after whatever a :class:`JudgePrompt` puts before
it: worked examples (a small base model answers in sentences without them) and/or a user's text.
:func:`judge_accuracy` measures a judge as the reward uses it: the F1 of its answers against the gold
answers for each kind of evidence shown (``benchmarks/judge_bench.py``: gold, none, misleading).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

EVIDENCE_JUDGE_TEMPLATE = (
    # R-Search, Table 5 (Appendix B.2): the cross-family model answers from the evidence alone.
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages: {evidence}\n\nQuestion: {question}\n\nAnswer:"
)


# Worked examples a judge prompt may carry before R-Search's template (``JudgePrompt.examples``): a small base
# model given the bare template answers in sentences ("In the country of Vorvaux."); shown a few filled
# templates, each answered in a few words, it answers in a few words too. Hand-written and generic (their
# names are of no world the benchmarks draw), one to three passages each, as a policy's evidence reads.
JUDGE_EXAMPLES: tuple[tuple[str, str, str], ...] = (  # (question, evidence, answer)
    (
        "Who founded Hollow Pine Records?",
        "Hollow Pine Records: Hollow Pine Records was founded in 1987 by Mara Ellison in the town of "
        "Westfield. The label is known for its folk catalogue.",
        "Mara Ellison",
    ),
    (
        "In which country is the town where Dorian Vale was born?",
        "Dorian Vale: Dorian Vale was born in Kestrel Bay in 1961; the painter later opened a studio there. "
        "Kestrel Bay: Kestrel Bay is a port town in the country of Almaria. The town is known for its "
        "lighthouse.",
        "Almaria",
    ),
    (
        "Which university did the lead singer of The Lantern Coast attend?",
        "The Lantern Coast: The Lantern Coast is a rock band formed in Port Ellery; its lead singer is Ivy "
        "Marsh. Ivy Marsh: Ivy Marsh studied at Northgate University before she joined the band.",
        "Northgate University",
    ),
    (
        "In which city is the company that built the ship Grey Heron headquartered?",
        "Grey Heron: The Grey Heron was built in 1932 by Selwyn Industries. Selwyn Industries: Selwyn "
        "Industries, a shipbuilder, has its headquarters in Carrowmore.",
        "Carrowmore",
    ),
)


def few_shot_prefix(examples: int) -> str:
    """The first ``examples`` worked examples, each R-Search's template filled and answered, then a blank
    line: what :class:`JudgePrompt` puts before the template (``""`` for 0)."""
    if not 0 <= examples <= len(JUDGE_EXAMPLES):
        raise ValueError(f"examples must lie in [0, {len(JUDGE_EXAMPLES)}], got {examples}")
    return "".join(
        f"{EVIDENCE_JUDGE_TEMPLATE.format(evidence=evidence, question=question)} {answer}\n\n"
        for question, evidence, answer in JUDGE_EXAMPLES[:examples]
    )


@dataclass(frozen=True)
class JudgePrompt:
    """What a judge prompt holds before R-Search's verbatim template: ``examples`` worked examples
    (:data:`JUDGE_EXAMPLES`) and/or a user's own ``prefix`` text (placed before the examples). The default is
    the bare template, as R-Search."""

    examples: int = 0
    prefix: str = ""

    def __post_init__(self) -> None:
        few_shot_prefix(self.examples)  # checks the count

    @property
    def text_before(self) -> str:
        """Everything placed before the template."""
        return self.prefix + few_shot_prefix(self.examples)

    def fill(self, question: str, evidence: str) -> str:
        """The whole prompt for one (question, evidence) pair."""
        return evidence_prompt(question, evidence, prefix=self.text_before)


def evidence_prompt(question: str, evidence: str, prefix: str = "") -> str:
    """R-Search's evidence template filled with one question and the evidence the policy wrote, after
    ``prefix`` (worked examples or other text: :class:`JudgePrompt`)."""
    return prefix + EVIDENCE_JUDGE_TEMPLATE.format(evidence=evidence, question=question)


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


_CONNECTORS = frozenset({"of", "the", "de", "la", "von", "van"})
_SENTENCE_STARTS = frozenset({"a", "an", "the", "in", "it", "its", "he", "his", "she", "her", "they"})


def extract_short_answer(answer: str, question: str) -> str:
    """A short answer from a sentence: the last run of capitalised words (joined by "of", "the"...) that the
    question does not name, e.g. "Luebrisk" from "The Zantibrisk Tides was formed in 2011 in Luebrisk,
    their hometown."; an answer of at most three words, or with no such run, is returned as is (stripped).

    Not in R-Search (its judge answers in a few words): a rule for a judge that answers in sentences, offered
    by :class:`ExtractingJudge`.
    """
    answer = answer.strip()
    words = answer.split()
    if len(words) <= 3:
        return answer
    runs: list[list[str]] = []
    current: list[str] = []
    for position, raw in enumerate(words):
        word = raw.strip(".,;:!?\"'()")
        capitalised = word[:1].isupper() and (position > 0 or word.lower() not in _SENTENCE_STARTS)
        if capitalised or (current and word.lower() in _CONNECTORS):
            current.append(word)
            continue
        if current:
            runs.append(current)
        current = []
    if current:
        runs.append(current)
    named = question.lower()
    for run in reversed(runs):
        while run and run[-1].lower() in _CONNECTORS:
            run = run[:-1]
        phrase = " ".join(run)
        if phrase and phrase.lower() not in named:
            return phrase
    return answer


class ExtractingJudge:
    """An :class:`EvidenceJudge` whose answers pass through :func:`extract_short_answer` (a deviation from
    R-Search, for judges that answer in sentences)."""

    def __init__(self, judge: Any) -> None:
        self.judge = as_judge(judge)

    def answer_evidence(self, questions: Sequence[str], evidences: Sequence[str]) -> list[str]:
        answers = self.judge.answer_evidence(questions, evidences)
        return [extract_short_answer(answer, question) for answer, question in zip(answers, questions)]


# --- measuring a judge --------------------------------------------------------------------------------
EVIDENCE_KINDS = ("gold", "none", "misleading")


@dataclass(frozen=True)
class JudgeCase:
    """One question for a judge: the evidence shown (``kind``: ``gold`` the passages that answer it,
    ``none`` empty, ``misleading`` a twin entity's passage in place of the last hop's) and the gold answers
    the judge's answer is scored against."""

    question: str
    evidence: str
    golds: tuple[str, ...]
    kind: str


def judge_accuracy(judge: Any, cases: Sequence[JudgeCase]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Ask ``judge`` (an :class:`EvidenceJudge` or a callable, :func:`as_judge`) every case in ONE call and
    score its answers as the evidence reward does (``env/rewards.py``): per evidence kind the mean token
    F1, exact match and gold-contained (a gold's normalised text inside the answer's), and the count.
    Returns those figures and the answers, in the cases' order."""
    from rllib_search.env.rewards import cover_exact_match, exact_match, token_f1

    reader = as_judge(judge)
    if reader is None:
        raise ValueError("judge_accuracy needs a judge")
    answers = reader.answer_evidence([c.question for c in cases], [c.evidence for c in cases])
    if len(answers) != len(cases):
        raise RuntimeError(f"the judge gave {len(answers)} answers for {len(cases)} cases")
    figures: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(c.kind for c in cases):
        scored = [(c, a) for c, a in zip(cases, answers) if c.kind == kind]
        figures[kind] = {
            "f1": sum(token_f1(a, c.golds) for c, a in scored) / len(scored),
            "em": sum(exact_match(a, c.golds) for c, a in scored) / len(scored),
            "gold_contained": sum(cover_exact_match(a, c.golds) for c, a in scored) / len(scored),
            "count": len(scored),
        }
    return figures, list(answers)
