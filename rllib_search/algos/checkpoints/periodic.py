"""Periodic checkpoints that a killed driver can resume from: every N iterations, the last K kept, each
written atomically.

``config.checkpointing(directory=DIR, every_n_iterations=N, keep_last=K)`` makes every
:class:`~rllib_search.algos.algorithm.SearchAlgorithm` write ``DIR/checkpoint_000012`` after iteration 12
(RLlib's ``save_to_path``). Resume with ``algo.restore_latest()`` (the current config, the checkpoint's
state: weights, optimizer, iteration count, every EnvRunner's data position) or
``Algorithm.from_checkpoint(latest_checkpoint(DIR))`` (the config saved in the checkpoint). RLlib's Tune
integration has its own policy (``tune.CheckpointConfig(checkpoint_frequency=, num_to_keep=)``); leave this
off under Tune.

How a save stays atomic (:func:`save_atomically`, also the recipe jobs' final ``OUT/checkpoint``):

1. the checkpoint is written to a hidden ``.tmp-<name>-<owner>`` directory beside its final name, then
   ``rllib_search_checkpoint.json`` (its iteration: the mark of a complete save), and flushed to disk;
2. a first save renames it to ``<name>``; a re-save renames the old checkpoint to
   ``.replaced-<name>-<owner>``, then the new one to ``<name>``, then deletes the replaced one.

Renames within one filesystem are atomic, so at every instant a complete checkpoint exists: under
``<name>``, or (between the two renames of a re-save) as the replaced and the complete temporary
directory. A loader that finds ``<name>`` missing puts the complete one back (:func:`recover_checkpoint`,
which :func:`latest_checkpoint`, ``check_checkpoint`` and every save call): the new checkpoint when its
save was complete, else the one it was replacing.

``<owner>`` is ``<host>-<pid>-<process start>-<token>``. A save removes the hidden directories beside it
that this process left or whose process is gone (no such pid on this host, or a pid reused by a later
process); another live writer's, or one of another host (whose processes cannot be seen from here), are
left alone. A ``.tmp-*`` directory without an owner stamp is not one a save in progress writes, and is
removed as a leftover. Old checkpoints beyond ``keep_last`` are renamed to ``.deleting-<name>-<owner>``
before they are deleted, so a kill during the deletion leaves nothing that looks like a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "checkpoint_"
TEMP_PREFIX = ".tmp-"
REPLACED_PREFIX = ".replaced-"
DELETING_PREFIX = ".deleting-"
#: Written last into every checkpoint this module saves: its iteration; its presence marks a complete save.
METADATA_FILE = "rllib_search_checkpoint.json"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")
_HIDDEN = (TEMP_PREFIX, REPLACED_PREFIX, DELETING_PREFIX)


def checkpoints(directory: str | Path) -> list[Path]:
    """The complete checkpoints under ``directory``, oldest first (by iteration)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint under ``directory`` (never a half-written one), or None; a checkpoint
    whose re-save was interrupted between its renames is recovered first."""
    root = Path(directory)
    if root.is_dir():
        for name in sorted({hidden.name for hidden in _hidden_entries(root) if hidden.recoverable}):
            recover_checkpoint(root / name, wait_s=0.0)
    found = checkpoints(directory)
    return found[-1] if found else None


def checkpoint_iteration(path: str | Path) -> int | None:
    """The training iteration a checkpoint was saved at, read without building the Algorithm: from
    ``rllib_search_checkpoint.json``, else from a ``checkpoint_<iteration>`` name, else from RLlib's
    ``algorithm_state`` (checked first; a pickle is unpickled, as a restore would). None without any."""
    root = Path(path)
    try:
        iteration = json.loads((root / METADATA_FILE).read_text()).get("iteration")
    except (OSError, ValueError, AttributeError):
        iteration = None
    if isinstance(iteration, int):
        return iteration
    if match := _NAME.match(root.name):
        return int(match.group(1))
    return _iteration_in_algorithm_state(root)


def _iteration_in_algorithm_state(root: Path) -> int | None:
    import pickle

    from rllib_search.algos.checkpoints.check import check_checkpoint_file

    for name in ("algorithm_state.msgpack", "algorithm_state.pkl"):
        state_file = root / name
        if not state_file.is_file():
            continue
        check_checkpoint_file(state_file)
        with open(state_file, "rb") as handle:
            if state_file.suffix == ".pkl":
                state = pickle.load(handle)  # this project's own checkpoint, as a restore loads it
            else:
                import msgpack

                state = msgpack.load(handle, strict_map_key=False)
        iteration = state.get("training_iteration") if isinstance(state, dict) else None
        return int(iteration) if iteration is not None else None
    return None


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
        ``keep_last``."""
        root = Path(self.directory).resolve()
        final = save_atomically(algo, root / f"{PREFIX}{iteration:06d}")
        if self.keep_last > 0:
            for old in checkpoints(root)[: -self.keep_last]:
                discard_checkpoint(old)
        return final


def save_atomically(algo: Any, path: str | Path) -> Path:
    """``algo.save_to_path`` into a temporary directory beside ``path``, then swapped into place by renames
    so that a complete checkpoint exists at every instant (see the module docstring); an older checkpoint
    at ``path`` is replaced. Returns ``path``, resolved."""
    final = Path(path).resolve()
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(parent)
    stamp = _owner_stamp()
    temp = parent / f"{TEMP_PREFIX}{final.name}-{stamp}"
    try:
        algo.save_to_path(str(temp))
        iteration = getattr(algo, "iteration", None)
        metadata = {"iteration": int(iteration) if iteration is not None else None, "saved_at": time.time()}
        (temp / METADATA_FILE).write_text(json.dumps(metadata))
        _fsync_tree(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if final.exists():
        replaced = parent / f"{REPLACED_PREFIX}{final.name}-{stamp}"
        _rename(final, replaced)
        _rename(temp, final)
        _fsync(parent)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        _rename(temp, final)
        _fsync(parent)
    return final


def discard_checkpoint(path: str | Path) -> None:
    """Delete a checkpoint: renamed out of the way first, so a kill mid-deletion leaves no partial
    checkpoint under a name a loader reads."""
    path = Path(path)
    doomed = path.parent / f"{DELETING_PREFIX}{path.name}-{_owner_stamp()}"
    try:
        _rename(path, doomed)
    except FileNotFoundError:
        return
    _fsync(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def recover_checkpoint(path: str | Path, *, wait_s: float = 5.0) -> Path | None:
    """``path`` when a checkpoint is there; when it is missing because a save was interrupted between its
    renames, the complete checkpoint beside it put back under ``path`` (the new one, else the one it was
    replacing) and ``path`` returned. A live writer's directories are never taken: while one is in the
    middle of its swap, this waits up to ``wait_s`` for its checkpoint to appear. None when there is none."""
    final = Path(path)
    deadline = time.monotonic() + wait_s
    while True:
        if final.exists():
            return final
        if not final.parent.is_dir():
            return None
        complete, replaced, busy = [], [], False
        for hidden in _hidden_entries(final.parent):
            if hidden.name != final.name or not hidden.recoverable:
                continue
            if hidden.owner_state() == "alive":
                busy = True
            elif hidden.prefix == TEMP_PREFIX and (hidden.path / METADATA_FILE).is_file():
                complete.append(hidden.path)
            elif hidden.prefix == REPLACED_PREFIX:
                replaced.append(hidden.path)
        for candidate in [*_newest_first(complete), *_newest_first(replaced)]:
            try:
                _rename(candidate, final)
            except FileNotFoundError:  # another loader took it
                continue
            except OSError:  # the name exists again: another loader or writer put one there
                if final.exists():
                    return final
                raise
            _fsync(final.parent)
            return final
        if final.exists():
            return final
        if not busy or time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def remove_leftovers(directory: str | Path) -> None:
    """Delete the hidden directories of interrupted saves and deletions under ``directory`` that this
    process left or whose process is gone, after recovering any checkpoint whose only complete copy is one
    of them. Another live writer's are left alone."""
    root = Path(directory)
    if not root.is_dir():
        return
    for name in sorted({hidden.name for hidden in _hidden_entries(root) if hidden.recoverable}):
        recover_checkpoint(root / name, wait_s=0.0)
    for hidden in _hidden_entries(root):
        if hidden.owner_state() != "alive":
            shutil.rmtree(hidden.path, ignore_errors=True)


# --- owners of hidden directories -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Hidden:
    """A hidden directory beside checkpoints: ``<prefix><name>-<host>-<pid>-<start>-<token>``."""

    path: Path
    prefix: str
    name: str
    owner: tuple[str, int, int] | None  # (host, pid, process start); None: no owner stamp

    @property
    def recoverable(self) -> bool:
        return self.owner is not None and self.prefix in (TEMP_PREFIX, REPLACED_PREFIX)

    def owner_state(self) -> str:
        """``"ours"`` (this process), ``"alive"`` (another process that may still be writing, or one on
        another host) or ``"gone"``."""
        if self.owner is None:
            return "gone"
        host, pid, start = self.owner
        if host != _host():
            return "alive"
        if pid == os.getpid() and abs(start - _process_start(pid)) <= 1:
            return "ours"
        try:
            began = _process_start(pid)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "alive"
        return "alive" if abs(began - start) <= 1 else "gone"  # else the pid is another process's now


def _hidden_entries(root: Path) -> list[_Hidden]:
    found = []
    for path in root.iterdir():
        prefix = next((p for p in _HIDDEN if path.name.startswith(p)), None)
        if prefix is None:
            continue
        rest = path.name[len(prefix) :]
        parts = rest.rsplit("-", 4)
        if len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit():
            name, host, pid, start, _token = parts
            found.append(_Hidden(path, prefix, name, (host, int(pid), int(start))))
        else:
            found.append(_Hidden(path, prefix, re.sub(r"-\d+$", "", rest), None))
    return found


def _owner_stamp() -> str:
    pid = os.getpid()
    return f"{_host()}-{pid}-{_process_start(pid)}-{uuid.uuid4().hex[:8]}"


def _host() -> str:
    return (socket.gethostname() or "localhost").replace("-", "_").replace(os.sep, "_")


def _process_start(pid: int) -> int:
    """When process ``pid`` started, in hundredths of a second since the epoch (with its pid, it names one
    process: a pid is reused, a start time is not)."""
    import psutil

    try:
        return round(psutil.Process(pid).create_time() * 100)
    except psutil.NoSuchProcess as err:
        raise ProcessLookupError(pid) from err
    except psutil.AccessDenied as err:
        raise PermissionError(pid) from err


def _newest_first(paths: list[Path]) -> list[Path]:
    def modified(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    return sorted(paths, key=modified, reverse=True)


def _rename(source: Path, target: Path) -> None:
    os.rename(source, target)


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
