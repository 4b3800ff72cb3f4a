"""Disk offload for CPU learners: tensors a learner reads in one phase of an iteration live in a file
between their uses (``.training(disk_offload=True)``).

On a CPU the policy's weights, AdamW's moments, the frozen reference and the EnvRunner's engine share host
memory, and a job's peak is their sum. Two of them are read in one phase only:

- the frozen reference, while a batch is scored (``score_batch``): written to the file once, read back for
  each scoring;
- AdamW's moments, in the optimizer step: written after each step, read back before the next (and for a
  checkpoint).

Between their uses each tensor is replaced by an empty one of its dtype (a parameter keeps its identity, its
``data`` is swapped, so the optimizer's references stay valid; AdamW's state entries are swapped in its
state dict), and anything that reads it meanwhile fails on its shape instead of reading stale memory.
Reading back fills new tensors from the file byte for byte, so no value changes. The file is an unlinked
temporary file (removed with the process) in the temporary directory (``TMPDIR``: where that is a tmpfs,
the file is memory too); the operating system keeps it in its page cache while memory allows, so a read
back is a copy from there.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rllib_search.llm.host_memory import release_free_heap


@dataclass
class Slot:
    """Where a tensor lives: ``get()`` reads it, ``put(tensor)`` replaces it."""

    get: Callable[[], torch.Tensor]
    put: Callable[[torch.Tensor], None]


class DiskOffload:
    """The tensors in the slots ``slots()`` yields, in a file while offloaded. ``frozen`` tensors (a
    reference) are written once; the others on each :meth:`offload`."""

    def __init__(self, slots: Callable[[], Iterable[Slot]], frozen: bool = False) -> None:
        self.slots = slots
        self.frozen = frozen
        self._file: Any = None
        self._layout: list[tuple[Slot, torch.Size, torch.dtype, int, int]] = []  # shape, dtype, bytes, offset
        self._offloaded = False

    @property
    def offloaded(self) -> bool:
        return self._offloaded

    def offload(self) -> int:
        """Write (unless frozen and written) and free every slot's tensor; returns the bytes freed."""
        if self._offloaded:
            return 0
        if not (self.frozen and self._layout):
            self._write([slot for slot in self.slots() if _offloadable(slot.get())])
        freed = 0
        for slot, _, dtype, size, _ in self._layout:
            slot.put(torch.empty(0, dtype=dtype))
            freed += size
        self._offloaded = bool(self._layout)
        release_free_heap()
        return freed

    def _write(self, slots: list[Slot]) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="rllib-search-offload-")  # noqa: SIM115 (kept open)
        self._file.seek(0)
        self._layout, offset = [], 0
        for slot in slots:
            tensor = slot.get().detach()
            data = _bytes(tensor.contiguous())
            self._file.write(data)
            self._layout.append((slot, tensor.shape, tensor.dtype, data.nbytes, offset))
            offset += data.nbytes
        self._file.flush()

    def load(self) -> None:
        """Fill every slot again from the file: each tensor as it was when offloaded."""
        if not self._offloaded:
            return
        for slot, shape, dtype, size, offset in self._layout:
            tensor = torch.empty(shape, dtype=dtype)
            self._file.seek(offset)
            if self._file.readinto(_bytes(tensor)) != size:
                raise OSError(f"the offload file ended before {size} bytes at offset {offset}")
            slot.put(tensor)
        self._offloaded = False

    @contextlib.contextmanager
    def loaded(self) -> Iterator[None]:
        """The tensors in memory for the block, offloaded again after it."""
        self.load()
        try:
            yield
        finally:
            self.offload()

    def discard(self) -> None:
        """Forget what is offloaded without reading it back: its slots' tensors were replaced (an optimizer
        that loaded another state)."""
        self._layout, self._offloaded = [], False

    def close(self) -> None:
        """Load what is offloaded and delete the file."""
        self.load()
        if self._file is not None:
            self._file.close()
            self._file = None
        self._layout = []


def _offloadable(tensor: Any) -> bool:
    """A host tensor with elements (0-dim state such as AdamW's step stays in memory)."""
    return isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and tensor.device.type == "cpu"


def _bytes(tensor: torch.Tensor) -> Any:
    """A contiguous tensor's bytes as a writable numpy view."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def parameter_slots(module: torch.nn.Module) -> Iterator[Slot]:
    """A slot per parameter of ``module`` (a tied parameter once): its ``data``."""
    for param in module.parameters():
        yield Slot(get=lambda p=param: p.data, put=lambda t, p=param: setattr(p, "data", t))


def optimizer_state_slots(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[Slot]:
    """A slot per tensor of the optimizers' per-parameter state (AdamW's moments)."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for key in list(state):
                yield Slot(get=lambda s=state, k=key: s[k], put=lambda t, s=state, k=key: s.__setitem__(k, t))
