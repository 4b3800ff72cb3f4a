"""Linear learning-rate warmup (then constant, or a linear decay) as an RLlib ``Scheduler``, keyed by
optimizer steps.

RLlib's own per-optimizer schedule is keyed by sampled env steps and writes one value into every param
group after each ``update``; ours is disabled (optimizers are registered with ``lr_or_lr_schedule=None``)
so this schedule is the only writer: before each optimizer step the learner sets every param group's
``lr`` to its ``base_lr`` times :meth:`LearningRateWarmup.factor`. Param groups keep their own base (the
critic's optimizer stays at ``critic_lr``).

The factor is ``min(1, (step + 1) / warmup)`` with ``warmup = ceil(warmup_ratio * total_training_steps)``
(verl's linear warmup, then constant): a piecewise-linear RLlib schedule from ``1 / warmup`` at step 0
to 1 at step ``warmup - 1``, and 1 after. With ``decay="linear"`` the factor then falls linearly to 0 at
step ``total_training_steps`` (Hugging Face's ``linear`` scheduler): a short warm start's last steps then
move the model less, so where it ends depends less on which examples its last batch drew.
"""

from __future__ import annotations

import math

from ray.rllib.utils.schedules.scheduler import Scheduler


def warmup_steps(warmup_ratio: float, total_training_steps: int | None) -> int:
    """Optimizer steps of warmup (0: none)."""
    if not total_training_steps or warmup_ratio <= 0:
        return 0
    return max(1, math.ceil(warmup_ratio * total_training_steps))


LR_DECAYS = ("constant", "linear")


class LearningRateWarmup:
    """The learning-rate multiplier at each optimizer step (see the module docstring)."""

    def __init__(
        self, warmup_ratio: float, total_training_steps: int | None, decay: str = "constant"
    ) -> None:
        if decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {LR_DECAYS}, got {decay!r}")
        if decay == "linear" and not total_training_steps:
            raise ValueError("lr_decay='linear' needs total_training_steps (optimizer steps in the run)")
        self.steps = warmup_steps(warmup_ratio, total_training_steps)
        points = [[0, 1.0 / self.steps], [self.steps - 1, 1.0]] if self.steps > 1 else [[0, 1.0]]
        if decay == "linear":
            points.append([total_training_steps, 0.0])
        schedule: float | list[list[float]] = points if len(points) > 1 else 1.0
        self._scheduler = Scheduler(fixed_value_or_schedule=schedule, framework="torch", device="cpu")

    def factor(self, optimizer_step: int) -> float:
        """The multiplier for the optimizer step numbered ``optimizer_step`` (0 for the first)."""
        return float(self._scheduler.update(timestep=optimizer_step))
