"""Answer metrics and the three papers' rewards, as pure functions that return their components.

Every reward takes a :class:`ResponseSummary` (what one episode's response said and saw), the gold answers
and a config, and returns a :class:`RewardBreakdown` whose ``components`` go to metrics as they are.

- ``search_r1``: EM with the empirical study's format (λ_f, eq. 3) and retrieval (λ_r, eq. 4) terms;
  λ_f = λ_r = 0 is Search-R1's plain EM (Search-R1 eq. 3).
- ``r1_searcher_stage1`` / ``r1_searcher_stage2``: R1-Searcher eq. 1-4.
- ``r_search``: R-Search eq. 3-8; the evidence term scores the answer an evidence judge (a model of another
  family, ``env/judge.py``) gave from the policy's evidence alone. The env asks the judge for a whole batch
  of episodes at once and puts each answer into the episode's :class:`ResponseSummary`.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


# --- answer normalisation and metrics (SQuAD conventions) ---------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golds))


def cover_exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when a normalised gold answer is contained in the normalised prediction (cover-EM/substring EM)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(gold) and normalize_answer(gold) in pred for gold in golds))


def token_f1(prediction: str | None, golds: Sequence[str]) -> float:
    """Word-level F1 = 2·|pred ∩ gold| / (|pred| + |gold|) on normalised words, the max over golds
    (R1-Searcher eq. 4, R-Search eq. 3)."""
    if prediction is None:
        return 0.0
    pred_words = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_words = normalize_answer(gold).split()
        overlap = sum((Counter(pred_words) & Counter(gold_words)).values())
        if overlap:
            best = max(best, 2 * overlap / (len(pred_words) + len(gold_words)))
    return best


def retrieval_hit(retrieved_blocks: Sequence[str], golds: Sequence[str]) -> bool:
    """f_ret: a normalised gold answer is a substring of a normalised retrieved block."""
    blocks = [normalize_answer(block) for block in retrieved_blocks]
    answers = [normalize_answer(gold) for gold in golds]
    return any(answer and answer in block for block in blocks for answer in answers)


# --- what a reward looks at ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ResponseSummary:
    """What one episode's response said and saw, extracted once by the env.

    ``retrieved_blocks`` are the bodies of the observation blocks the model actually saw (after token
    truncation); ``num_searches`` counts searches the retriever answered (failures excluded).
    ``evidence_answer`` is the evidence judge's answer from ``evidence`` alone (None when no judge was
    asked), ``judge_error`` why the judge could not answer.
    """

    question: str
    answer: str | None
    evidence: str | None
    num_searches: int
    retrieved_blocks: tuple[str, ...]
    format_valid: bool
    format_reason: str = ""
    evidence_answer: str | None = None
    judge_error: str | None = None


@dataclass(frozen=True)
class RewardBreakdown:
    """A reward and the parts it was made of. ``notes`` explain terms that could not be computed."""

    total: float
    components: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)


# --- Search-R1 with the empirical study's format and retrieval terms ----------------------------------
@dataclass(frozen=True)
class SearchR1RewardConfig:
    """λ_f (format) and λ_r (retrieval) of the empirical study; both 0 gives Search-R1's EM reward.

    The study used λ_f = 0.2 (3B/14B) or 0.4 (7B) and λ_r = 0.1.
    """

    lambda_format: float = 0.0
    lambda_retrieval: float = 0.0

    def __post_init__(self) -> None:
        for name in ("lambda_format", "lambda_retrieval"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")


def search_r1_reward(
    response: ResponseSummary, golds: Sequence[str], config: SearchR1RewardConfig = SearchR1RewardConfig()
) -> RewardBreakdown:
    """Empirical study eq. (4) (eq. (3) when λ_r = 0, Search-R1's EM when λ_f = λ_r = 0).

    correct & formatted: 1; correct & not formatted: 1 - λ_f; wrong & formatted: λ_f (+ λ_r when a
    retrieved block holds a gold answer); wrong & not formatted: 0.
    """
    em = exact_match(response.answer, golds)
    hit = retrieval_hit(response.retrieved_blocks, golds)
    lf, lr = config.lambda_format, config.lambda_retrieval
    if em:
        total = 1.0 if response.format_valid else 1.0 - lf
    elif response.format_valid:
        total = lf + (lr if hit else 0.0)
    else:
        total = 0.0
    components = {"em": em, "format": float(response.format_valid), "retrieval_hit": float(hit)}
    return RewardBreakdown(total, components)


# --- R1-Searcher's two stages ------------------------------------------------------------------------
@dataclass(frozen=True)
class R1SearcherRewardConfig:
    """R1-Searcher eq. 1-3 values: stage 1 gives ``retrieval_reward`` for searching at least once and
    ``format_reward`` for a valid format; stage 2 adds ``format_penalty`` to the answer F1 when the format is
    invalid."""

    retrieval_reward: float = 0.5
    format_reward: float = 0.5
    format_penalty: float = -2.0


def r1_searcher_stage1_reward(
    response: ResponseSummary, golds: Sequence[str], config: R1SearcherRewardConfig = R1SearcherRewardConfig()
) -> RewardBreakdown:
    """Stage 1 (eq. 1 + eq. 2): learn to call the retriever; the answer's correctness is not rewarded."""
    retrieval = config.retrieval_reward if response.num_searches >= 1 else 0.0
    fmt = config.format_reward if response.format_valid else 0.0
    components = {"retrieval": retrieval, "format": fmt, "f1": token_f1(response.answer, golds)}
    return RewardBreakdown(retrieval + fmt, components)


def r1_searcher_stage2_reward(
    response: ResponseSummary, golds: Sequence[str], config: R1SearcherRewardConfig = R1SearcherRewardConfig()
) -> RewardBreakdown:
    """Stage 2 (eq. 4 + eq. 3): answer F1 plus a penalty when the format is invalid."""
    f1 = token_f1(response.answer, golds)
    fmt = 0.0 if response.format_valid else config.format_penalty
    components = {"f1": f1, "format": fmt, "searched": float(response.num_searches >= 1)}
    return RewardBreakdown(f1 + fmt, components)


# --- R-Search: answer, evidence and format ----------------------------------------------------------
@dataclass(frozen=True)
class RSearchRewardConfig:
    """γ_e and γ_a of R-Search eq. 5 (the paper fixes both to 0.2)."""

    gamma_evidence: float = 0.2
    gamma_answer: float = 0.2


def r_search_reward(
    response: ResponseSummary, golds: Sequence[str], config: RSearchRewardConfig = RSearchRewardConfig()
) -> RewardBreakdown:
    """R-Search eq. 6: r = r_α + r_e + r_f with

    - r_α = F1(answer, gold) (eq. 3);
    - r_e = F1(judge's answer from the evidence alone, gold) (eq. 4): 0 when there is no evidence, when no
      judge answered (none configured) or when the judge failed (``judge_error`` 1, noted; never scored as
      correct);
    - r_f = (1 - I_S)(γ_e + γ_a·I_A) + I_S(γ_e·I_E + γ_a·I_A) (eq. 5), with I_S "searched", I_A "one
      non-empty answer box", I_E "one non-empty evidence box".
    """
    notes: dict[str, str] = {}
    answer_f1 = token_f1(response.answer, golds)
    searched = response.num_searches >= 1
    answer_ok = response.answer is not None and bool(response.answer.strip())
    evidence_ok = response.evidence is not None and bool(response.evidence.strip())
    ge, ga = config.gamma_evidence, config.gamma_answer
    fmt = (ge * evidence_ok + ga * answer_ok) if searched else (ge + ga * answer_ok)

    evidence_f1, judge_error = 0.0, 0.0
    if not evidence_ok:
        notes["evidence"] = "no evidence box: evidence term is 0"
    elif response.judge_error is not None:
        notes["evidence"] = f"judge failed: {response.judge_error}"
        judge_error = 1.0
    elif response.evidence_answer is None:
        notes["evidence"] = "no judge configured: evidence term is 0"
    else:
        evidence_f1 = token_f1(response.evidence_answer, golds)
    components = {
        "answer_f1": answer_f1,
        "evidence_f1": evidence_f1,
        "format": fmt,
        "searched": float(searched),
        "judge_error": judge_error,
    }
    return RewardBreakdown(answer_f1 + evidence_f1 + fmt, components, notes)


# --- selection by name ----------------------------------------------------------------------------
RewardFn = Callable[[ResponseSummary, Sequence[str], Any], RewardBreakdown]

REWARDS: dict[str, tuple[RewardFn, type]] = {
    "search_r1": (search_r1_reward, SearchR1RewardConfig),
    "r1_searcher_stage1": (r1_searcher_stage1_reward, R1SearcherRewardConfig),
    "r1_searcher_stage2": (r1_searcher_stage2_reward, R1SearcherRewardConfig),
    "r_search": (r_search_reward, RSearchRewardConfig),
}

DEFAULT_REWARD_FOR_PROTOCOL = {
    "search_r1": "search_r1",
    "r1_searcher": "r1_searcher_stage2",
    "r_search": "r_search",
}

REWARDS_USING_EVIDENCE_JUDGE = frozenset({"r_search"})
"""Rewards whose evidence term needs an evidence judge's answer (the env asks for it in batches)."""


def make_reward(
    name: str, config: Any = None, **overrides: Any
) -> Callable[[ResponseSummary, Sequence[str]], RewardBreakdown]:
    """The reward ``name`` bound to its config (a config object, a dict of fields, or keyword overrides)."""
    try:
        fn, config_cls = REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)}") from None
    if config is None or isinstance(config, dict):
        config = config_cls(**{**(config or {}), **overrides})
    elif overrides:
        raise ValueError("pass either a config object or keyword overrides, not both")

    def reward(response: ResponseSummary, golds: Sequence[str]) -> RewardBreakdown:
        return fn(response, golds, config)

    reward.__name__ = f"{name}_reward"
    return reward
