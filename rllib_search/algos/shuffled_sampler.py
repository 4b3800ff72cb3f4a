"""ShuffledSampler: indices of a dataset in a seeded order, reshuffled every epoch, with a checkpointable
position. The EnvRunner draws its questions and masked SFT its demonstrations through it;
StratifiedSampler draws the same way within strata, round-robin over them (``rollouts(balance_by=...)``)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np


class ShuffledSampler:
    """Draws indices in ``[0, size)``: a permutation from ``rng``, walked in order, a fresh permutation
    once it is used up (``epoch`` counts them). ``get_state``/``set_state`` carry the order, the position,
    the epoch and the generator, so a restored sampler draws exactly what the original would have."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.epoch = 0
        self.restart(size)

    def restart(self, size: int) -> None:
        """A fresh permutation of ``size`` indices, from the start (the dataset changed)."""
        self.size = int(size)
        self.order = self.rng.permutation(self.size)
        self.position = 0

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices, reshuffling at each epoch's end."""
        chosen = []
        for _ in range(count):
            if self.position >= len(self.order):
                self.epoch += 1
                self.order = self.rng.permutation(self.size)
                self.position = 0
            chosen.append(int(self.order[self.position]))
            self.position += 1
        return chosen

    def get_state(self) -> dict[str, Any]:
        return {
            "order": self.order.tolist(),
            "position": self.position,
            "epoch": self.epoch,
            "rng": self.rng.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.order = np.asarray(state["order"])
        self.position = int(state["position"])
        self.epoch = int(state.get("epoch", self.epoch))
        self.rng.bit_generator.state = state["rng"]


class StratifiedSampler:
    """Draws indices round-robin over strata (e.g. each question's hop count): one ``ShuffledSampler``
    per stratum, strata visited in sorted order, so every ``k`` consecutive draws hold one of each of the
    ``k`` strata whatever their sizes. GRPO batches then mix question kinds evenly every iteration rather
    than by the luck of a shuffle (a run of two same-kind prompts pushes a shared decision one way only).
    The checkpointable state is each stratum's sampler and the round-robin position."""

    def __init__(self, labels: Sequence[Hashable], rng: np.random.Generator) -> None:
        self.rng = rng
        by_label: dict[Hashable, list[int]] = {}
        for index, label in enumerate(labels):
            by_label.setdefault(label, []).append(index)
        self.members = [np.asarray(by_label[key]) for key in sorted(by_label, key=repr)]
        self.strata = [ShuffledSampler(len(members), rng) for members in self.members]
        self.turn = 0

    @property
    def epoch(self) -> int:
        """Passes over the smallest stratum (it is the one reshuffled most often)."""
        return max((s.epoch for s in self.strata), default=0)

    def take(self, count: int) -> list[int]:
        chosen = []
        for _ in range(count):
            k = self.turn % len(self.strata)
            chosen.append(int(self.members[k][self.strata[k].take(1)[0]]))
            self.turn += 1
        return chosen

    def get_state(self) -> dict[str, Any]:
        return {"strata": [s.get_state() for s in self.strata], "turn": self.turn}

    def set_state(self, state: dict[str, Any]) -> None:
        for sampler, sub in zip(self.strata, state["strata"], strict=True):
            sampler.set_state(sub)
        self.turn = int(state["turn"])
