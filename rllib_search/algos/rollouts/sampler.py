"""ShuffledSampler: indices of a dataset in a seeded order, reshuffled every epoch, with a checkpointable
position. The EnvRunner draws its questions and masked SFT its demonstrations through it;
StratifiedSampler draws the same way within strata, round-robin over them (``rollouts(balance_by=...)``), or
in proportion to their sizes (``sft(balance_by=...)``)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np


class ShuffledSampler:
    """Draws indices in ``[0, size)``: a permutation from ``rng``, walked in order, a fresh permutation
    once it is used up (``epoch`` counts them); with ``shuffle=False`` the indices in order, epoch after
    epoch. ``get_state``/``set_state`` carry the order, the position, the epoch and the generator, so a
    restored sampler draws exactly what the original would have."""

    def __init__(self, size: int, rng: np.random.Generator, shuffle: bool = True) -> None:
        self.rng = rng
        self.shuffle = shuffle
        self.epoch = 0
        self.restart(size)

    def restart(self, size: int) -> None:
        """A fresh permutation of ``size`` indices, from the start (the dataset changed)."""
        self.size = int(size)
        self.order = self._permutation()
        self.position = 0

    def _permutation(self) -> np.ndarray:
        return self.rng.permutation(self.size) if self.shuffle else np.arange(self.size)

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices, reshuffling at each epoch's end."""
        chosen = []
        for _ in range(count):
            if self.position >= len(self.order):
                self.epoch += 1
                self.order = self._permutation()
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
    """Draws indices stratum by stratum (e.g. each question's hop count), one ``ShuffledSampler`` per
    stratum, strata in sorted order.

    - Round-robin (the default): every ``k`` consecutive draws hold one of each of the ``k`` strata whatever
      their sizes. GRPO batches then mix question kinds evenly every iteration rather than by the luck of a
      shuffle (a run of two same-kind prompts pushes a shared decision one way only).
    - ``proportional``: strata are visited in proportion to their sizes, spread as evenly as they divide
      (smooth weighted round-robin: each draw adds every stratum's size to its credit and takes the stratum
      with the most, which then pays the total). Strata of 60, 45 and 15 give 4, 3 and 1 of every 8
      consecutive draws: each SFT batch holds the demonstrations' mix instead of the shuffle's.

    The checkpointable state is each stratum's sampler, the draw count and the credits."""

    def __init__(
        self, labels: Sequence[Hashable], rng: np.random.Generator, proportional: bool = False
    ) -> None:
        self.rng = rng
        by_label: dict[Hashable, list[int]] = {}
        for index, label in enumerate(labels):
            by_label.setdefault(label, []).append(index)
        self.members = [np.asarray(by_label[key]) for key in sorted(by_label, key=repr)]
        self.strata = [ShuffledSampler(len(members), rng) for members in self.members]
        self.proportional = proportional
        self.credits = [0] * len(self.members)
        self.turn = 0

    @property
    def epoch(self) -> int:
        """Passes over the stratum reshuffled most often."""
        return max((s.epoch for s in self.strata), default=0)

    def take(self, count: int) -> list[int]:
        chosen = []
        for _ in range(count):
            k = self._next_stratum()
            chosen.append(int(self.members[k][self.strata[k].take(1)[0]]))
            self.turn += 1
        return chosen

    def _next_stratum(self) -> int:
        if not self.proportional:
            return self.turn % len(self.strata)
        sizes = [len(members) for members in self.members]
        self.credits = [credit + size for credit, size in zip(self.credits, sizes)]
        k = max(range(len(sizes)), key=lambda i: (self.credits[i], -i))  # ties: the first stratum
        self.credits[k] -= sum(sizes)
        return k

    def get_state(self) -> dict[str, Any]:
        return {
            "strata": [s.get_state() for s in self.strata],
            "turn": self.turn,
            "credits": list(self.credits),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        for sampler, sub in zip(self.strata, state["strata"], strict=True):
            sampler.set_state(sub)
        self.turn = int(state["turn"])
        self.credits = [int(c) for c in state.get("credits", self.credits)]
