"""Checking a checkpoint directory before anything loads it: a missing, empty, truncated or garbled file is
named with what is wrong, instead of surfacing as an unpickling traceback deep inside RLlib.

RLlib's checkpoints (``Algorithm.save_to_path``, ``RLModule.save_to_path``) hold ``*.pkl`` state and
constructor arguments, ``*.json`` metadata and, for exported state, ``*.safetensors`` /
``*.pt`` files. Each is checked by its structure only, never executed: a pickle is walked opcode by opcode
with :mod:`pickletools` (which builds no object), so checking a file is safe even when loading it would not
be. Loading still unpickles (RLlib's own format): load only checkpoints you or your jobs wrote (see
``docs/security.md``).
"""

from __future__ import annotations

import json
import pickletools
import struct
import zipfile
from collections import deque
from pathlib import Path

#: Files every RLModule checkpoint directory holds (RLlib's ``Checkpointable`` layout).
MODULE_FILES = ("class_and_ctor_args.pkl",)
#: Where an Algorithm checkpoint keeps the policy's RLModule.
ALGORITHM_MODULE_DIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"


class CheckpointError(ValueError):
    """A checkpoint file that is missing, empty, truncated or not of its format; the message names it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self) -> tuple[type[CheckpointError], tuple[Path, str]]:
        return type(self), (self.path, self.reason)


def check_checkpoint(path: str | Path) -> Path:
    """Check an Algorithm or RLModule checkpoint directory and every file in it; returns the directory.

    An Algorithm checkpoint (it has ``algorithm_state.*``) must hold its policy's RLModule under
    ``learner_group/learner/rl_module/default_policy``; an RLModule directory needs
    ``class_and_ctor_args.pkl`` and ``module_state.*``. Raises :class:`CheckpointError` (or
    FileNotFoundError for a missing directory) naming the first bad file. A directory missing because its
    re-save was interrupted between renames is recovered first (``periodic.recover_checkpoint``).
    """
    from rllib_search.algos.checkpoints.periodic import recover_checkpoint

    root = Path(path).expanduser()
    if not root.exists() and recover_checkpoint(root) is None:
        raise FileNotFoundError(f"{root}: no such checkpoint directory")
    if not root.is_dir():
        raise CheckpointError(root, "a checkpoint is a directory (algo.save_to_path writes one), not a file")
    if any(root.glob("algorithm_state.*")):
        module_dir = root / ALGORITHM_MODULE_DIR
        if not module_dir.is_dir():
            raise CheckpointError(module_dir, "missing: the Algorithm checkpoint holds no policy RLModule")
        _require_module_files(module_dir)
    elif (root / "class_and_ctor_args.pkl").exists() or any(root.glob("module_state.*")):
        _require_module_files(root)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        check_checkpoint_file(file)
    return root


def _require_module_files(directory: Path) -> None:
    for name in MODULE_FILES:
        if not (directory / name).is_file():
            raise CheckpointError(directory / name, "missing (every RLModule checkpoint has it)")
    if not any(directory.glob("module_state.*")):
        raise CheckpointError(directory / "module_state.pkl", "missing: the module's weights are not there")


def check_checkpoint_file(path: Path) -> None:
    """Check one file by its suffix (``.pkl``, ``.json``, ``.safetensors``, ``.pt``/``.bin``); others
    only for being non-empty where they are state."""
    suffix = path.suffix
    if suffix not in (".pkl", ".json", ".safetensors", ".pt", ".bin", ".msgpack"):
        return
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(path, "empty file (a save that was interrupted?)")
    if suffix == ".pkl":
        _check_pickle(path)
    elif suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(path, f"not valid JSON ({err})") from err
    elif suffix == ".safetensors":
        _check_safetensors(path, size)
    elif suffix in (".pt", ".bin") and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise CheckpointError(path, f"a damaged torch archive ({err})") from err
        if bad is not None:
            raise CheckpointError(path, f"a damaged torch archive (member {bad!r} fails its CRC)")


def _check_pickle(path: Path) -> None:
    """Walk the pickle's opcodes without building anything: truncation or garbage fails the walk."""
    with open(path, "rb") as handle:
        try:
            tail = deque(pickletools.genops(handle), maxlen=1)  # opcodes only: nothing is built
        except (ValueError, EOFError, struct.error, UnicodeDecodeError) as err:
            raise CheckpointError(path, f"truncated or not a pickle ({err})") from err
        last = tail[0][0] if tail else None
        if last is None or last.name != "STOP":
            raise CheckpointError(path, "truncated pickle (no STOP opcode)")
        if handle.read(1):
            raise CheckpointError(path, "unexpected bytes after the pickle's end")


def _check_safetensors(path: Path, size: int) -> None:
    """The header (8-byte length, JSON) parses and the tensors it lists fit in the file."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(path, "truncated safetensors file (no header)")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise CheckpointError(path, f"truncated safetensors file (header of {length} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(path, f"garbled safetensors header ({err})") from err
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    if ends and 8 + length + max(ends) > size:
        raise CheckpointError(
            path, f"truncated safetensors file ({size} bytes, tensors need {8 + length + max(ends)})"
        )
