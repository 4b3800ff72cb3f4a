"""Weights interpolated between where fine-tuning started and where it ended (WiSE-FT).

Wortsman et al. (2022, "Robust fine-tuning of zero-shot models") keep a fine-tuned model's gains and much
of its starting point's behaviour off the fine-tuning distribution by averaging the two models' weights,
``(1 - alpha) * start + alpha * end``. Here the start is the warm start and the end is RL's kept policy:
RL lifts the second search on 2-hop questions by a wide margin and spreads it to some 1-hop questions by
a narrow one, so a point on the line between them can keep the first and undo the second.

Written by hand: the averaging is one expression over RLlib's nested weight dicts
(``LearnerGroup.get_weights()``: module id -> parameter name -> array), a layout no library mixes.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def interpolate_weights(start: Any, end: Any, alpha: float, in_place: bool = False) -> Any:
    """``(1 - alpha) * start + alpha * end`` over two weight trees of the same layout (dicts of numpy
    arrays or tensors, as ``SearchAlgorithm.policy_weights()`` returns them); floating-point leaves are
    mixed in their own dtype, any other leaf (integer buffers, step counts) is taken from ``end``.
    ``alpha`` 0 gives ``start``'s values and 1 ``end``'s. ``in_place``: the mix is written into ``end``'s
    arrays (the same values, bit for bit), so no third tree of the policy's size exists at once."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if isinstance(end, dict):
        if not isinstance(start, dict) or start.keys() != end.keys():
            raise ValueError("the two weight trees differ in their keys")
        return {key: interpolate_weights(start[key], end[key], alpha, in_place) for key in end}
    if isinstance(end, torch.Tensor):
        if not isinstance(start, torch.Tensor) or start.shape != end.shape:
            raise ValueError(f"a tensor of shape {tuple(end.shape)} has no counterpart of that shape")
        if not end.is_floating_point():
            return end if in_place else end.clone()
        mixed = torch.lerp(start.to(end.dtype), end, alpha)
        return end.copy_(mixed) if in_place else mixed
    if isinstance(end, np.ndarray):
        start = np.asarray(start)
        if start.shape != end.shape:
            raise ValueError(f"an array of shape {end.shape} has no counterpart of that shape")
        if not np.issubdtype(end.dtype, np.floating):
            return end if in_place else end.copy()
        mixed = end if in_place else end.copy()
        mixed *= alpha
        mixed += (1.0 - alpha) * start.astype(end.dtype)
        return mixed
    return end


class WeightStore:
    """Weight snapshots kept on disk rather than in memory: each is the policy's size in fp32, and RL keeps
    up to three at once (the warm start, the best validation's, RL's end). ``save`` writes a snapshot under
    ``directory`` and ``load`` reads it back exactly; ``clear`` removes them all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def save(self, name: str, weights: Any) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / f"{name}.pkl", "wb") as file:
            pickle.dump(weights, file, protocol=pickle.HIGHEST_PROTOCOL)
        return name

    def load(self, name: str) -> Any:
        with open(self.directory / f"{name}.pkl", "rb") as file:  # written by save, in this job
            return pickle.load(file)

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
