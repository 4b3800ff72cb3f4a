"""Learner offload for colocated runs: a learner's weights, gradients and optimizer state leave its GPU
while the EnvRunner that shares the GPU samples, and come back for the update.

With ``rollouts(colocate=True)`` a learner and an EnvRunner share one GPU (``algos/colocation.py``). The
Algorithm runs each iteration in this order (``SearchAlgorithm.training_step``):

1. sample: the engines are awake, every learner is offloaded;
2. the engines sleep (vLLM's sleep mode);
3. the learners come back (:meth:`LearnerOffload.onload`) and update;
4. the weight sync: each engine wakes its weights only, loads the new ones;
5. the learners are offloaded again (:meth:`LearnerOffload.offload`);
6. the engines wake their KV cache for the next sample.

What moves: every parameter and buffer of the policy and of the frozen reference (when the learner holds
one) goes to host memory through ``nn.Module._apply`` (what ``module.to`` / ``module.cpu()`` run, so
parameters keep their identity and the optimizers' and DDP's references stay valid; FSDP2 modules re-point
their shards there, which is how verl offloads FSDP2 models), gradients are freed (the next update starts
from none, as ``zero_grad(set_to_none=True)`` leaves them), and every optimizer state tensor with a shape
(AdamW's moments) goes to host memory; scalar state (AdamW's ``step``, which torch keeps on the host unless
``capturable``) stays. The host copies are fresh tensors (pinned where CUDA is, so the copies back are
asynchronous), so the device's storage is released even where the host is the compute device (a CPU run,
which is how the CPU tests can see it); ``torch.cuda.empty_cache()`` then returns the freed blocks to the
driver, where the engine's wake-up finds them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch

OFFLOAD = "offload"
ONLOAD = "onload"
EVENTS_KEPT = 64  # the colocation events each actor keeps, newest last (the colocation tests read them)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A fresh host tensor equal to ``tensor`` (pinned where CUDA is available)."""
    pin = torch.cuda.is_available() and tensor.device.type == "cuda"
    return torch.empty_like(tensor, device="cpu", pin_memory=pin).copy_(tensor, non_blocking=pin)


def offload_parameters(modules: Iterable[torch.nn.Module]) -> None:
    """Every parameter and buffer of ``modules`` to host memory (fresh copies; parameters keep their
    identity); gradients freed first."""
    for module in modules:
        for param in module.parameters():
            param.grad = None
        module._apply(_host_copy)


def onload_parameters(modules: Iterable[torch.nn.Module], device: torch.device | str) -> None:
    """Every parameter and buffer of ``modules`` back on ``device`` (``module.to``; identity kept)."""
    for module in modules:
        module.to(device, non_blocking=True)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str | None) -> None:
    """Every optimizer state tensor with a shape to ``device`` (None: host memory, a fresh copy), or, on
    the way back, to its parameter's device when ``device`` is ``"param"``; scalar state stays."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            if device is None:
                state[key] = _host_copy(value)
            else:
                target = param.device if device == "param" else torch.device(device)
                state[key] = value.to(target, non_blocking=True)


def synchronize(device: torch.device | str) -> None:
    """Wait for the asynchronous copies on ``device``, and hand freed CUDA blocks back to the driver."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class LearnerOffload:
    """Offloads and onloads one learner's modules and optimizers; remembers the phase it is in and a log
    of ``(phase, time.monotonic_ns())`` (the colocation tests order it against the other actors')."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.offloaded = False
        self.events: deque[tuple[str, int]] = deque(maxlen=EVENTS_KEPT)

    def offload(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if self.offloaded:
            return
        offload_parameters(modules)
        for optimizer in optimizers:
            move_optimizer_state(optimizer, None)
        synchronize(self.device)
        self.offloaded = True
        self.events.append((OFFLOAD, time.monotonic_ns()))

    def onload(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if not self.offloaded:
            return
        onload_parameters(modules, self.device)
        for optimizer in optimizers:
            move_optimizer_state(optimizer, "param")
        synchronize(self.device)
        self.offloaded = False
        self.events.append((ONLOAD, time.monotonic_ns()))


def colocation_phase(learner: Any, phase: str) -> None:
    """``phase`` (``"offload"`` or ``"onload"``) on a :class:`SearchTorchLearner` (or its FSDP2 variant):
    its policy module, its frozen reference (if any) and its optimizers."""
    if phase not in (OFFLOAD, ONLOAD):
        raise ValueError(f"colocation phase must be {OFFLOAD!r} or {ONLOAD!r}, got {phase!r}")
    offload = getattr(learner, "offload_state", None)
    if offload is None:
        offload = learner.offload_state = LearnerOffload(learner.device)
    modules = list(learner.module.values())
    reference = getattr(learner, "reference_scorer", None) or getattr(learner, "reference", None)
    if reference is not None:  # an FSDP2 learner's reference is sharded under its own root
        modules.append(reference)
    optimizers = [optimizer for _, optimizer in learner.optimizers()]
    if phase == OFFLOAD:
        offload.offload(modules, optimizers)
    else:
        offload.onload(modules, optimizers)
