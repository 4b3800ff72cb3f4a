"""Faster formulations of a decoding step's matrix products, each used only where it is bitwise exact.

A decoding step of a small model on a CPU multiplies a few rows (one per sequence in the batch) by every
weight matrix. ``F.linear(x, W)`` asks MKL for ``x @ W.T``, which reads the (out, in) weight across its
rows; asking for ``(W @ x.T).T`` streams the weight in its stored order and, with SmolLM2's shapes, is
often faster at a few rows (``benchmarks/exact_products_bench.py`` times a decoding step with and
without it); the vocabulary projection also runs faster in blocks of 2048 embedding rows at a few rows.
Whether such a formulation gives *bitwise* ``F.linear``'s result depends on the kernel the BLAS picks for
the shape, which varies with the row count and the CPU: bitwise at some row counts, not at others. Bitwise
is the condition, not a detail: a float-level change of the logits changes greedy and sampled tokens, and
with them which seeds of the main job meet its goal.

So no formulation is assumed exact. :class:`ExactProducts` serves the bias-free ``nn.Linear`` layers of a
model while :meth:`ExactProducts.serving` is active, for fp32 CPU inputs of at most ``max_rows`` rows
(other calls go to ``F.linear`` as they are). The first product of each *shape key* (both operands'
shapes, strides and 64-byte alignment, the thread count: what a BLAS picks its kernel and summation order
from; never the values) is computed every way and returns ``F.linear``'s result; the formulations that gave
bitwise the same become candidates. The next products of that key are timed round-robin over the
candidates, ``trials`` each, and the fastest (median) serves the key from then on. Timing decides only the
speed: every candidate's output is the same bits. The layers' ``forward`` is swapped for the duration,
rather than every ``F.linear`` intercepted by a ``TorchFunctionMode``, whose Python dispatch of a step's
thousand other operations cost about 9% of a SmolLM2 decoding step.

No library does this: PyTorch and transformers call ``F.linear`` as it is, and torch.compile's CPU path and
oneDNN's packed weights reorder sums (``benchmarks/cpu_gemm_bench.py``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from statistics import median

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_BLOCK = 2048  # embedding rows per block of a vocabulary-sized projection


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def _weight_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (weight @ x.T).T.contiguous()


def _in_blocks(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.cat([F.linear(x, block) for block in weight.split(VOCAB_BLOCK)], dim=-1)


# Each formulation takes a 2-D (rows, in) input and an (out, in) weight.
FORMULATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": _linear,
    "weight_first": _weight_first,
    "in_blocks": _in_blocks,
}


def _applies(name: str, weight: torch.Tensor) -> bool:
    return name != "in_blocks" or weight.shape[0] > 2 * VOCAB_BLOCK


@dataclass
class _Key:
    """What is known about one shape key: the exact formulations, their timings, the one chosen."""

    exact: list[str]
    seconds: dict[str, list[float]] = field(default_factory=dict)
    chosen: str | None = None


class ExactProducts:
    """Serves a model's bias-free ``nn.Linear`` layers with the fastest formulation checked bitwise equal to
    ``F.linear`` for each product's shape key (see the module docstring).

    ``keys`` maps each shape key seen to what is known about it; ``calls`` counts the products served by
    each formulation (a key's first product counts as ``checked``).
    """

    def __init__(self, max_rows: int = 256, trials: int = 5) -> None:
        self.max_rows = max_rows
        self.trials = trials
        self.keys: dict[tuple, _Key] = {}
        self.calls: Counter[str] = Counter()

    @contextlib.contextmanager
    def serving(self, model: nn.Module) -> Iterator[None]:
        """Within the block, ``model``'s bias-free ``nn.Linear`` layers compute through :meth:`linear`."""
        layers = [
            module
            for module in model.modules()
            if type(module) is nn.Linear and module.bias is None and "forward" not in vars(module)
        ]
        for layer in layers:
            layer.forward = functools.partial(self.linear, weight=layer.weight)
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight)``, bitwise, by the formulation chosen for its shape key where it applies."""
        if not self._eligible(x, weight):
            return F.linear(x, weight)
        return self._product(x, weight)

    def _eligible(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            x.dtype == weight.dtype == torch.float32
            and x.device.type == weight.device.type == "cpu"
            and weight.dim() == 2
            and x.dim() >= 2
            and x.shape[-1] == weight.shape[1]
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and 0 < x.numel() // x.shape[-1] <= self.max_rows
        )

    def _product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # a view where x is contiguous, else a copy
        key = (
            tuple(x.shape),
            x.stride(),
            x.data_ptr() % 64,
            flat.stride(),
            flat.data_ptr() % 64,
            tuple(weight.shape),
            weight.stride(),
            weight.data_ptr() % 64,
            torch.get_num_threads(),
        )
        known = self.keys.get(key)
        if known is None:
            reference = F.linear(x, weight)
            exact = ["linear"] + [
                name
                for name, formulation in FORMULATIONS.items()
                if name != "linear"
                and _applies(name, weight)
                and torch.equal(formulation(flat, weight).view(reference.shape), reference)
            ]
            self.keys[key] = _Key(exact, chosen=None if len(exact) > 1 else "linear")
            self.calls["checked"] += 1
            return reference
        name = known.chosen or min(known.exact, key=lambda n: len(known.seconds.get(n, ())))
        started = time.perf_counter()
        # F.linear itself on x as given: exactly the product the check compared the others with.
        out = F.linear(x, weight) if name == "linear" else FORMULATIONS[name](flat, weight)
        if known.chosen is None:
            known.seconds.setdefault(name, []).append(time.perf_counter() - started)
            if all(len(known.seconds.get(n, ())) >= self.trials for n in known.exact):
                known.chosen = min(known.exact, key=lambda n: median(known.seconds[n]))
        self.calls[name] += 1
        return out.view(*x.shape[:-1], weight.shape[0])
