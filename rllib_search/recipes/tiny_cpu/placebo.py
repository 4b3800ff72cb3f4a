"""A placebo control for the main job's GRPO: rewards unrelated to the answers, the rest unchanged.

``--placebo-rewards`` sets :class:`PlaceboRewards` as the EnvRunner's group hook in place of the teacher
guidance: it runs the guidance first (when the job guides) and then permutes the ``reward`` of the
returned episodes among all episodes of that sample call, every group of it, with a permutation seeded by
the job's seed and the sample's group ids. GRPO's advantages are computed from ``Rollout.reward`` alone
(``algos/algorithm.py``, ``episode_advantages``), so after the permutation a group's advantages follow
other questions' rewards. The runner's own metrics (``env_runners/reward``, EM, searches) are logged
before the hook runs and stay the true ones; each rollout keeps its true ``answer`` and
``reward_components``. Validation, the WiSE-FT check and the held-out evaluations read greedy answers,
not rewards: they are unchanged. ``env_runners/placebo_moved_rewards`` counts the episodes whose reward
the permutation changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rllib_search.algos.rollouts.record import Rollout
from rllib_search.data.records import QARecord
from rllib_search.recipes.tiny_cpu.guidance import TeacherGuidance


def sample_seed(seed: int, group_ids: Sequence[str]) -> int:
    """A permutation seed for one sample: the job's ``seed`` and the sample's group ids (unique per runner
    and draw), so each sample draws its own permutation and a rerun draws the same one."""
    digest = hashlib.sha256(f"{seed}\0{chr(0).join(group_ids)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def permute_rewards(rollouts: Sequence[Rollout], seed: int) -> list[Rollout]:
    """``rollouts`` with their ``reward`` values permuted among them (a seeded permutation); every other
    field stays the episode's own."""
    order = np.random.default_rng(seed).permutation(len(rollouts))
    rewards = [rollouts[int(i)].reward for i in order]
    return [dataclasses.replace(rollout, reward=reward) for rollout, reward in zip(rollouts, rewards)]


@dataclass(frozen=True)
class PlaceboRewards:
    """The group hook of ``--placebo-rewards``: ``guidance`` (None: none), then the sample's rewards
    permuted among all its episodes (see the module docstring)."""

    seed: int = 0
    guidance: TeacherGuidance | None = None

    def validate(self, config: Any) -> None:
        """The guidance's own checks, at config time."""
        if self.guidance is not None:
            self.guidance.validate(config)

    def __call__(
        self, runner: Any, episodes: Sequence[tuple[QARecord, str]], rollouts: list[Rollout]
    ) -> list[Rollout]:
        if self.guidance is not None:
            rollouts = list(self.guidance(runner, episodes, rollouts))
        permuted = permute_rewards(rollouts, sample_seed(self.seed, [group for _, group in episodes]))
        moved = sum(a.reward != b.reward for a, b in zip(rollouts, permuted))
        runner.metrics.log_value("placebo_moved_rewards", moved, reduce="sum")
        return permuted
