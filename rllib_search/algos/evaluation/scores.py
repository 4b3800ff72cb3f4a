"""Answer metrics over a question set: EM, F1 and cover-EM per group and overall, with bootstrap intervals.

The one scoring function of every evaluation in the project (``rllib-search eval``, held-out tables of the
training examples, the learning proof). Pure numpy over the per-question metrics of ``env/rewards.py``
(``exact_match``, ``token_f1``, ``cover_exact_match``: SQuAD normalisation, the best over gold answers).

- :func:`score_predictions`: predictions, gold-answer lists and one group key per question (a
  ``data_source``, a hop count) -> :class:`Scores`: each group's mean, the ``pooled`` mean over all
  questions and the ``average``, the unweighted mean of the group means (how Search-R1 reports "Avg." over
  its seven sources; it equals the pooled mean only when the groups are the same size).
- :func:`paired_gain`: two policies' predictions on the same questions (stage A, stage B) -> the same
  :class:`Scores` of the per-question difference B - A (``rl_gain_2hop``: ``paired_gain(sft, rl, golds,
  hops).groups["2"]["em"]``). Pairing removes the questions' own difficulty from the interval, which is
  therefore much narrower than the difference of two independent intervals.

Over several training seeds (or worlds), :func:`nested_bootstrap` gives the mean of per-seed means with a
two-level interval (seeds drawn with replacement, then each drawn seed's questions), so it holds the
seed-to-seed spread as well as the questions'; :func:`power` says what difference such a design can
detect and how many seeds a given one needs.

Intervals are percentile bootstrap intervals (default 95%, 1000 resamples, seeded): a group's interval
resamples that group's questions with replacement; the average's resamples every group on its own and
averages the groups' resampled means (the groups' sizes stay fixed, as in the data); the pooled interval
resamples all questions. Each group draws from its own generator, seeded from ``seed`` and the group's
key, so a group's interval does not depend on which other groups are in the set.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rllib_search.env.rewards import cover_exact_match, exact_match, token_f1

MetricFn = Callable[[str | None, Sequence[str]], float]

#: The metrics by name, in report order.
METRICS: dict[str, MetricFn] = {"em": exact_match, "f1": token_f1, "cover_em": cover_exact_match}
METRIC_LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover-EM"}

# Bootstrap index matrices are drawn at most this many entries at a time (memory stays ~10 MB per metric).
_DRAW_CHUNK = 1_000_000


@dataclass(frozen=True)
class Estimate:
    """A mean and its bootstrap confidence interval ``[low, high]``."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    def format(self, digits: int = 3) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass(frozen=True)
class Scores:
    """Per-group, averaged and pooled estimates of each metric (see the module docstring).

    ``groups`` maps a group key to ``{metric: Estimate}``, in report order (numeric keys sorted by value,
    others in order of first appearance); ``counts`` holds each group's number of questions.
    """

    metrics: tuple[str, ...]
    groups: dict[str, dict[str, Estimate]]
    counts: dict[str, int]
    average: dict[str, Estimate]
    pooled: dict[str, Estimate]
    confidence: float
    resamples: int
    seed: int

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        def block(estimates: Mapping[str, Estimate], n: int) -> dict[str, Any]:
            return {"n": n, **{metric: estimates[metric].to_dict() for metric in self.metrics}}

        return {
            "metrics": list(self.metrics),
            "groups": {key: block(self.groups[key], self.counts[key]) for key in self.groups},
            "average": {"groups": len(self.groups), **block(self.average, self.n)},
            "pooled": block(self.pooled, self.n),
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }

    def markdown(self, group_name: str = "group", digits: int = 3) -> str:
        """A markdown table: one row per group, then the average of the groups and the pooled mean."""
        level = f"{round(self.confidence * 100)}%"
        header = [group_name, "n", *(f"{METRIC_LABELS.get(m, m)} [{level} CI]" for m in self.metrics)]
        rows = [[key, str(self.counts[key]), *self._cells(self.groups[key], digits)] for key in self.groups]
        rows.append(["**average**", f"mean of {len(self.groups)}", *self._cells(self.average, digits)])
        rows.append(["all (pooled)", str(self.n), *self._cells(self.pooled, digits)])
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---", "---:"] + ["---"] * len(self.metrics)) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)

    def _cells(self, estimates: Mapping[str, Estimate], digits: int) -> list[str]:
        return [estimates[metric].format(digits) for metric in self.metrics]


def per_question_metrics(
    predictions: Sequence[str | None],
    golds: Sequence[Sequence[str]],
    metrics: Sequence[str] = tuple(METRICS),
) -> dict[str, np.ndarray]:
    """Each metric of each prediction against its gold answers (None: no answer, scored 0)."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} gold-answer lists")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; known: {list(METRICS)}")
    return {
        m: np.asarray([METRICS[m](p, list(g)) for p, g in zip(predictions, golds)], dtype=np.float64)
        for m in metrics
    }


def score_predictions(
    predictions: Sequence[str | None],
    golds: Sequence[Sequence[str]],
    groups: Sequence[Hashable] | None = None,
    *,
    metrics: Sequence[str] = tuple(METRICS),
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> Scores:
    """EM / F1 / cover-EM of ``predictions`` per group (``groups[i]`` is question i's key; None: one group
    ``"all"``), averaged over groups and pooled, each with its bootstrap interval."""
    values = per_question_metrics(predictions, golds, metrics)
    return aggregate(values, groups, confidence=confidence, resamples=resamples, seed=seed)


def paired_gain(
    before: Sequence[str | None],
    after: Sequence[str | None],
    golds: Sequence[Sequence[str]],
    groups: Sequence[Hashable] | None = None,
    *,
    metrics: Sequence[str] = tuple(METRICS),
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> Scores:
    """The gain of ``after`` over ``before`` on the same questions (question i in both lists): the
    metrics of the per-question differences, with paired bootstrap intervals (questions resampled)."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} predictions before but {len(after)} after: pair them by question")
    a = per_question_metrics(before, golds, metrics)
    b = per_question_metrics(after, golds, metrics)
    diffs = {m: b[m] - a[m] for m in metrics}
    return aggregate(diffs, groups, confidence=confidence, resamples=resamples, seed=seed)


def aggregate(
    values: Mapping[str, Sequence[float] | np.ndarray],
    groups: Sequence[Hashable] | None = None,
    *,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> Scores:
    """Means of per-question ``values`` (``{metric: one value per question}``) per group, averaged over
    groups and pooled, with percentile bootstrap intervals (see the module docstring)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    names = tuple(values)
    if not names:
        raise ValueError("no metrics to aggregate")
    matrix = np.stack([np.asarray(values[m], dtype=np.float64) for m in names])  # (metrics, questions)
    n = matrix.shape[1]
    if n == 0:
        raise ValueError("no questions to score")
    keys = ["all"] * n if groups is None else [str(g) for g in groups]
    if len(keys) != n:
        raise ValueError(f"{len(keys)} group keys for {n} questions")
    order = _group_order(keys)
    members = {key: np.asarray([i for i, k in enumerate(keys) if k == key]) for key in order}
    tails = (0.5 - confidence / 2, 0.5 + confidence / 2)

    def estimates(point: np.ndarray, replicates: np.ndarray) -> dict[str, Estimate]:
        low, high = np.quantile(replicates, tails, axis=1)
        return {m: Estimate(float(point[j]), float(low[j]), float(high[j])) for j, m in enumerate(names)}

    group_scores, group_replicates, group_points = {}, [], []
    for key in order:
        sub = matrix[:, members[key]]
        point = sub.mean(axis=1)
        replicates = _bootstrap_means(sub, resamples, _rng(seed, key))
        group_scores[key] = estimates(point, replicates)
        group_points.append(point)
        group_replicates.append(replicates)
    average = estimates(np.mean(group_points, axis=0), np.mean(group_replicates, axis=0))
    if len(order) == 1:
        pooled = group_scores[order[0]]
    else:
        pooled = estimates(matrix.mean(axis=1), _bootstrap_means(matrix, resamples, _rng(seed, "\0pooled")))
    return Scores(
        metrics=names,
        groups=group_scores,
        counts={key: len(members[key]) for key in order},
        average=average,
        pooled=pooled,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def _group_order(keys: Sequence[str]) -> list[str]:
    """Numeric keys (hop counts) by value; any other keys in order of first appearance (Search-R1's test
    file lists its sources in the paper's table order)."""
    unique = list(dict.fromkeys(keys))
    if all(_is_number(k) for k in unique):
        return sorted(unique, key=float)
    return unique


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(key.encode("utf-8"))])


def _bootstrap_means(matrix: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(metrics, resamples) means of ``matrix``'s columns resampled with replacement."""
    n = matrix.shape[1]
    out = np.empty((matrix.shape[0], resamples))
    step = max(1, _DRAW_CHUNK // n)
    for start in range(0, resamples, step):
        count = min(step, resamples - start)
        rows = rng.integers(0, n, size=(count, n))
        out[:, start : start + count] = matrix[:, rows].mean(axis=2)
    return out


def nested_bootstrap(
    values: Sequence[Sequence[float]], resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Estimate:
    """The mean of per-seed means of ``values`` (one sequence of per-question values per seed, or per
    (world, seed) pair) with a percentile interval from a two-level bootstrap: seeds drawn with
    replacement, then each drawn seed's questions drawn with replacement."""
    arrays = [np.asarray(v, dtype=np.float64) for v in values]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("every seed needs at least one question")
    rng = np.random.default_rng(seed)
    replicates = np.empty(resamples)
    for b in range(resamples):
        drawn = rng.integers(len(arrays), size=len(arrays))
        replicates[b] = np.mean(
            [arrays[p][rng.integers(arrays[p].size, size=arrays[p].size)].mean() for p in drawn]
        )
    low, high = np.quantile(replicates, (0.5 - confidence / 2, 0.5 + confidence / 2))
    return Estimate(float(np.mean([a.mean() for a in arrays])), float(low), float(high))


@dataclass(frozen=True)
class Power:
    """What a design of ``seeds`` seeds can detect, from the spread of its per-seed mean differences.

    ``seed_variance`` is the variance of one seed's mean difference (between-seed spread plus the
    questions' noise of one seed; with one seed, the questions' part alone, a lower bound).
    ``detectable`` is the smallest true difference a two-sided t-test over the seeds finds with
    probability 0.8 at level 0.05 (:func:`power`'s defaults); ``seeds_needed`` is how many seeds
    ``effect`` (a difference the paper reports) needs for that (None without an effect)."""

    seeds: int
    seed_variance: float
    detectable: float
    effect: float | None
    seeds_needed: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "seed_variance": self.seed_variance,
            "detectable": self.detectable,
            "effect": self.effect,
            "seeds_needed": self.seeds_needed,
        }


def _t_sum(seeds: int, alpha: float, probability: float) -> float:
    """t_(1-alpha/2) + t_probability with ``seeds - 1`` degrees of freedom (the normal's with one seed)."""
    from scipy.stats import norm, t

    if seeds < 2:
        return float(norm.ppf(1 - alpha / 2) + norm.ppf(probability))
    return float(t.ppf(1 - alpha / 2, seeds - 1) + t.ppf(probability, seeds - 1))


def power(
    differences: Sequence[Sequence[float]],
    effect: float | None = None,
    alpha: float = 0.05,
    probability: float = 0.8,
    most_seeds: int = 100_000,
) -> Power:
    """:class:`Power` of a paired comparison from its per-seed, per-question ``differences``: with S seeds
    the mean difference has variance V / S (V the variance of one seed's mean), and a t-test over the
    seeds finds a true difference d with ``probability`` when |d| >= (t_(1-alpha/2) + t_probability)
    sqrt(V / S), t with S - 1 degrees of freedom (the usual approximation to the noncentral t).
    ``seeds_needed`` is the least S >= 2 that meets ``effect`` (at most ``most_seeds``)."""
    arrays = [np.asarray(v, dtype=np.float64) for v in differences if len(v)]
    if not arrays:
        raise ValueError("power needs at least one seed with questions")
    means = np.asarray([a.mean() for a in arrays])
    if len(arrays) > 1:
        variance = float(means.var(ddof=1))
    else:
        variance = float(arrays[0].var(ddof=1) / arrays[0].size) if arrays[0].size > 1 else 0.0
    detectable = _t_sum(len(arrays), alpha, probability) * math.sqrt(variance / len(arrays))
    needed = None
    if effect:
        needed = next(
            (
                n
                for n in range(2, most_seeds + 1)
                if _t_sum(n, alpha, probability) ** 2 * variance / n <= effect * effect
            ),
            most_seeds,
        )
    return Power(len(arrays), variance, detectable, effect, needed)
