"""Reward schedules: a run that moves through rewards as it learns (R1-Searcher's two stages).

R1-Searcher (arXiv 2503.05592, section 2.2) trains in two stages: first a retrieval + format reward that
teaches the model to call the search engine at all (its answers are not rewarded), then the answer's F1
with a -2 penalty for a broken format. A :class:`RewardSchedule` holds such stages; the Algorithm tells it
what each iteration measured, and it moves to the next stage after ``iterations`` iterations in a stage or
once a result metric (``env_runners/reward/retrieval``, ...) has reached ``threshold`` for ``patience``
iterations in a row. A stage may bring its own questions (R1-Searcher's stage 1 used 350 medium questions,
stage 2 8,142 medium and hard ones). The stage index is in every iteration's results (``reward_stage``) and
in checkpoints, so a resumed run continues in the stage it was in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_search.env.rewards import REWARDS


@dataclass(frozen=True)
class RewardStage:
    """One stage: its ``reward`` (a name from ``env/rewards.py``) and ``reward_config``, when to leave it
    (``iterations`` in the stage, or ``metric`` >= ``threshold`` for ``patience`` iterations in a row;
    whichever comes first), and optionally its own ``dataset`` (a QA file path or a list of records)."""

    reward: str
    reward_config: Mapping[str, Any] = field(default_factory=dict)
    iterations: int | None = None
    metric: str | None = None
    threshold: float | None = None
    patience: int = 1
    dataset: Any = None

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"unknown reward {self.reward!r}; known: {sorted(REWARDS)}")
        if (self.metric is None) != (self.threshold is None):
            raise ValueError("a stage's metric and threshold come together")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"iterations must be at least 1, got {self.iterations}")
        if self.patience < 1:
            raise ValueError(f"patience must be at least 1, got {self.patience}")

    @property
    def has_exit(self) -> bool:
        return self.iterations is not None or self.metric is not None

    @classmethod
    def coerce(cls, stage: RewardStage | Mapping[str, Any]) -> RewardStage:
        return stage if isinstance(stage, RewardStage) else cls(**dict(stage))


class RewardSchedule:
    """Which stage a run is in, and when it moves on (see the module docstring)."""

    def __init__(self, stages: Sequence[RewardStage | Mapping[str, Any]]) -> None:
        self.stages = [RewardStage.coerce(stage) for stage in stages]
        if not self.stages:
            raise ValueError("a reward schedule needs at least one stage")
        for number, stage in enumerate(self.stages[:-1], start=1):
            if not stage.has_exit:
                raise ValueError(f"stage {number} of {len(self.stages)} needs iterations or metric/threshold")
        self.index = 0
        self.iterations_in_stage = 0
        self.streak = 0

    @property
    def stage(self) -> RewardStage:
        return self.stages[self.index]

    def observe(self, metric: Callable[[str], float | None]) -> bool:
        """Count one finished iteration of the current stage, ``metric(name)`` giving its results; move to
        the next stage when the current one's exit condition holds. Returns whether the stage changed."""
        self.iterations_in_stage += 1
        stage = self.stage
        if self.index == len(self.stages) - 1:
            return False
        if stage.metric is not None:
            value = metric(stage.metric)
            reached = value is not None and float(value) >= float(stage.threshold)
            self.streak = self.streak + 1 if reached else 0
        done_by_metric = stage.metric is not None and self.streak >= stage.patience
        done_by_count = stage.iterations is not None and self.iterations_in_stage >= stage.iterations
        if done_by_metric or done_by_count:
            self.index += 1
            self.iterations_in_stage = 0
            self.streak = 0
            return True
        return False

    def get_state(self) -> dict[str, int]:
        return {"index": self.index, "iterations_in_stage": self.iterations_in_stage, "streak": self.streak}

    def set_state(self, state: Mapping[str, int]) -> None:
        index = int(state["index"])
        if not 0 <= index < len(self.stages):
            raise ValueError(f"checkpointed reward stage {index} but the schedule has {len(self.stages)}")
        self.index = index
        self.iterations_in_stage = int(state["iterations_in_stage"])
        self.streak = int(state["streak"])
