"""FlatWeights: a model's weights as ONE byte buffer plus a table of names, dtypes and shapes.

Why: a state dict crosses two process boundaries on its way from a learner to vLLM (Ray's object store,
then vLLM's ``collective_rpc`` into its engine process), and a dict of tensors is pickled tensor by tensor
at both, a copy and a header per parameter (hundreds for a 3B model). One flat buffer is one numpy array:
Ray's object store holds it once and readers map it without a copy (numpy arrays are zero-copy in Ray),
vLLM serialises a tensor argument as one raw buffer, and the worker moves it to its GPU in one copy and
hands the model's own ``load_weights`` views of it. We chose this over vLLM's weight-transfer engines
(NCCL or CUDA IPC), which need the trainer process to join the transfer: here the learner and the
EnvRunner are separate Ray actors that RLlib's ``sync_weights`` connects through the object store, which
also restores weights after a checkpoint or a failed runner.

Written by hand because neither torch nor Ray has a flat-buffer state dict (``torch.save`` would write a
zip archive of per-tensor records, the thing avoided here). Entries are aligned to 16 bytes, so every
view is a valid tensor of its dtype.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 16


def engine_dtype_of(config: object) -> str:
    """The dtype a vLLM EnvRunner generates in, and so the dtype the learner packs its weights in:
    ``rollouts(engine_dtype=...)``, else ``engine_options["dtype"]``, else ``bfloat16``. The runner hands
    vLLM the same value, so the weights arrive in the engine's own dtype (no cast, half of fp32's bytes)."""
    dtype = getattr(config, "engine_dtype", None) or dict(getattr(config, "engine_options", {})).get("dtype")
    return str(dtype or "bfloat16")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


@dataclass
class FlatWeights:
    """Named tensors packed into ``buffer`` (uint8): entry i is ``dtypes[i]`` of ``shapes[i]`` at byte
    ``offsets[i]``. Build with :meth:`pack`; read with :meth:`tensors` or :meth:`state_dict`."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    buffer: np.ndarray

    @classmethod
    def pack(cls, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | str | None = None) -> FlatWeights:
        """Copy ``tensors`` (in their order) into one buffer, floating-point ones cast to ``dtype`` when
        given. The bytes are gathered on the tensors' device and moved to host memory in one copy."""
        if isinstance(dtype, str):
            dtype = None if dtype == "auto" else _dtype(dtype)
        names, dtypes, shapes, offsets, pieces = [], [], [], [], []
        size = 0
        device = None
        for name, tensor in tensors.items():
            tensor = tensor.detach()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            raw = tensor.contiguous().reshape(-1).view(torch.uint8)
            device = device or raw.device
            pad = -size % ALIGN
            if pad:
                pieces.append(torch.zeros(pad, dtype=torch.uint8, device=device))
                size += pad
            names.append(name)
            dtypes.append(str(tensor.dtype).removeprefix("torch."))
            shapes.append(tuple(tensor.shape))
            offsets.append(size)
            pieces.append(raw.to(device))
            size += raw.numel()
        flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.uint8)
        return cls(names, dtypes, shapes, offsets, flat.cpu().numpy())

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def tensors(self, device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` views into the buffer (moved to ``device`` first, in one copy)."""
        with warnings.catch_warnings():  # a buffer read from Ray's object store is read-only: views only
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            flat = torch.from_numpy(np.ascontiguousarray(self.buffer))
        if device is not None:
            flat = flat.to(device)
        for name, dtype, shape, offset in zip(
            self.names, self.dtypes, self.shapes, self.offsets, strict=True
        ):
            torch_dtype = _dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=torch_dtype).element_size()
            yield name, flat[offset : offset + count].view(torch_dtype).view(shape)

    def state_dict(self, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        return dict(self.tensors(device))
