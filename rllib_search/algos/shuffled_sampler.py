"""ShuffledSampler: indices of a dataset in a seeded order, reshuffled every epoch, with a checkpointable
position. The EnvRunner draws its questions and masked SFT its demonstrations through it."""

from __future__ import annotations

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
