"""Collapse monitors and the guard that acts on them, once per ``Algorithm.train()``.

GRPO on search agents collapses in a recognisable way (Search-R1's issues, verl's valid-search metric, LLDS's
"lazy likelihood displacement"): the likelihood of correct trajectories falls, entropy and response length
drift, searches and valid actions vanish, the KL to the reference runs away, and more and more turns of
episodes that did well lose likelihood in the update itself (``displaced_actions``: the share of
non-negative-advantage turns whose log-likelihood fell since sampling, measured with or without LLDS's
penalty). :data:`MONITORS` names each
figure and where an iteration's result holds it; every iteration's result gets ``collapse/<monitor>`` for
each one it has (so the results files and the dashboard carry them; ``rllib_search/metrics.py``).

:class:`CollapseGuard` (``config.collapse_guard(bands={...}, on_breach=...)``) sets bands on monitors: a
monitor outside its band for ``patience`` iterations in a row is a breach, and the guard then

- ``"warn"``: logs it and records it in the result (``collapse/breaches``);
- ``"stop"``: also sets the result's ``done`` (Tune ends the trial; a recipe's loop stops);
- ``"rollback"``: restores the newest periodic checkpoint saved before the breach began
  (``config.checkpointing``) and goes on from there; after ``max_rollbacks`` it stops instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: Monitor name -> where an ``Algorithm.train()`` result holds it.
MONITORS: dict[str, str] = {
    "entropy": "learners/default_policy/entropy",
    "kl": "learners/default_policy/kl",
    "response_tokens": "env_runners/generated_tokens_per_episode",
    "searches": "env_runners/searches_per_episode",
    "valid_actions": "env_runners/valid_action_rate",
    "format_valid": "env_runners/format_valid_rate",
    "correct_likelihood": "env_runners/correct_logprob_mean",
    "displaced_actions": "learners/default_policy/llds_displaced_actions",
    "reward": "env_runners/episode_return_mean",
}
ACTIONS = ("warn", "stop", "rollback")


def monitor_values(result: Mapping[str, Any]) -> dict[str, float]:
    """Each monitor ``result`` holds (finite values only)."""
    values = {}
    for name, path in MONITORS.items():
        node: Any = result
        for key in path.split("/"):
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node):
            values[name] = float(node)
    return values


@dataclass
class CollapseGuard:
    """Bands on :data:`MONITORS` (name -> (low, high), either None for no bound) and what to do when a
    monitor stays outside its band for ``patience`` iterations in a row."""

    bands: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    on_breach: str = "warn"
    patience: int = 1
    max_rollbacks: int = 2
    outside: dict[str, int] = field(default_factory=dict)  # consecutive iterations out of band, per monitor
    rollbacks: int = 0
    first_bad_iteration: int | None = None  # where the current run of out-of-band iterations began

    def __post_init__(self) -> None:
        unknown = sorted(set(self.bands) - set(MONITORS))
        if unknown:
            raise ValueError(f"collapse_guard: unknown monitors {unknown}; known: {sorted(MONITORS)}")
        if self.on_breach not in ACTIONS:
            raise ValueError(f"collapse_guard: on_breach must be one of {ACTIONS}, got {self.on_breach!r}")
        if self.patience < 1 or self.max_rollbacks < 0:
            raise ValueError("collapse_guard: patience must be >= 1 and max_rollbacks >= 0")
        for name, band in self.bands.items():
            low, high = band
            if low is not None and high is not None and low > high:
                raise ValueError(f"collapse_guard: the band of {name!r} is empty: {band}")

    def out_of_band(self, values: Mapping[str, float]) -> list[str]:
        """The monitors with a value outside their band this iteration."""
        return [
            name
            for name, (low, high) in self.bands.items()
            if name in values
            and ((low is not None and values[name] < low) or (high is not None and values[name] > high))
        ]

    def check(self, result: dict[str, Any], iteration: int) -> str | None:
        """Record the monitors and this iteration's breaches in ``result`` (``collapse/...``); the action
        to take (``warn`` | ``stop`` | ``rollback``), or None when every banded monitor held."""
        values = monitor_values(result)
        out = self.out_of_band(values)
        for name in self.bands:
            self.outside[name] = self.outside.get(name, 0) + 1 if name in out else 0
        if out and self.first_bad_iteration is None:
            self.first_bad_iteration = iteration
        if not out:
            self.first_bad_iteration = None
        breaches = sorted(name for name, count in self.outside.items() if count >= self.patience)
        report: dict[str, Any] = dict(values)
        report["breaches"] = len(breaches)
        report["breached"] = ",".join(breaches)
        result["collapse"] = report
        if not breaches:
            return None
        action = self.on_breach
        if action == "rollback" and self.rollbacks >= self.max_rollbacks:
            action = "stop"
        logger.warning(
            "collapse guard: %s outside %s at iteration %d (%s)",
            {name: values.get(name) for name in breaches},
            {name: self.bands[name] for name in breaches},
            iteration,
            action,
        )
        return action

    def rolled_back(self) -> None:
        """After a rollback: count it and start the monitors' streaks afresh."""
        self.rollbacks += 1
        self.outside.clear()
        self.first_bad_iteration = None
