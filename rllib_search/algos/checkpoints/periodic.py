"""Periodic checkpoints that a killed driver can resume from: every N iterations, the last K kept, each
written atomically.

``config.checkpointing(directory=DIR, every_n_iterations=N, keep_last=K)`` makes every
:class:`~rllib_search.algos.algorithm.SearchAlgorithm` write ``DIR/checkpoint_000012`` after iteration 12
(RLlib's ``save_to_path``). A save goes to a hidden temporary directory beside it and is renamed into
place when complete: a rename within one filesystem is atomic, so a process killed during a save leaves
only a ``.tmp-*`` directory that :func:`latest_checkpoint` never returns (the next save removes it).

Resume with ``algo.restore_latest()`` (the current config, the checkpoint's state: weights, optimizer,
iteration count, every EnvRunner's data position) or ``Algorithm.from_checkpoint(latest_checkpoint(DIR))``
(the config saved in the checkpoint). RLlib's Tune integration has its own policy
(``tune.CheckpointConfig(checkpoint_frequency=, num_to_keep=)``); leave this off under Tune.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "checkpoint_"
TEMP_PREFIX = ".tmp-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def checkpoints(directory: str | Path) -> list[Path]:
    """The complete checkpoints under ``directory``, oldest first (by iteration)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint under ``directory`` (never a half-written one), or None."""
    found = checkpoints(directory)
    return found[-1] if found else None


@dataclass
class PeriodicCheckpoints:
    """Saves an Algorithm every ``every_n_iterations`` iterations under ``directory`` and keeps the newest
    ``keep_last`` (0 keeps all)."""

    directory: str | Path
    every_n_iterations: int
    keep_last: int = 3

    def due(self, iteration: int) -> bool:
        return self.every_n_iterations > 0 and iteration % self.every_n_iterations == 0

    def save(self, algo: Any, iteration: int) -> Path:
        """Write ``algo`` as ``checkpoint_<iteration>`` atomically, then drop checkpoints beyond
        ``keep_last`` and leftovers of interrupted saves."""
        root = Path(self.directory).resolve()
        final = save_atomically(algo, root / f"{PREFIX}{iteration:06d}")
        if self.keep_last > 0:
            for old in checkpoints(root)[: -self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        return final


def save_atomically(algo: Any, path: str | Path) -> Path:
    """``algo.save_to_path`` into a temporary directory beside ``path``, renamed to ``path`` once complete
    (an older checkpoint there is replaced); removes what interrupted saves left beside it."""
    final = Path(path).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    for leftover in final.parent.glob(f"{TEMP_PREFIX}*"):  # a save that a kill interrupted
        shutil.rmtree(leftover, ignore_errors=True)
    temp = final.parent / f"{TEMP_PREFIX}{final.name}-{os.getpid()}"
    algo.save_to_path(str(temp))
    _fsync_tree(temp)
    if final.exists():  # the same iteration saved before (a resumed run repeating it), or a final save
        shutil.rmtree(final)
    os.rename(temp, final)
    _fsync(final.parent)
    return final


def _fsync(path: Path) -> None:
    """Flush a file or directory entry to disk (a rename is durable only once its directory is)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        _fsync(path)
    _fsync(root)
