"""CPU GEMM benchmark: where an fp32 decoding step's time goes on a CPU, and which BLAS would shorten it.

A decoding step of the main job's policy multiplies a few rows (32 episodes of a GRPO iteration, 100
questions of an evaluation) by every weight matrix of the model once, so the weights come from memory
cold at every step. This benchmark times exactly that: one step's matrix products, every decoder layer's
seven projections with the policy's shapes (read from its config; each layer its own weights, so they do
not stay in the cache) plus the vocabulary projection, with

- ``torch``: ``torch.nn.functional.linear``, what the engine runs (MKL's sgemm in PyTorch's CPU wheels);
- ``mkl_packed``: MKL's packed-weight GEMM (``torch.ops.mkl._mkl_linear``, the weights reordered once), the
  path torch.compile's CPU freezing takes;
- ``onednn``: oneDNN (``torch.utils.mkldnn.MkldnnLinear``);
- ``openblas``: numpy's OpenBLAS (``x @ W.T`` on the same memory).

Each backend's output is compared with ``torch``'s: only a backend whose outputs are bitwise the same can
replace it without changing what the main job learns (a float-level change reshuffles which seeds meet the
goal). Also timed: the vocabulary projection in chunks of ``--vocab-chunk`` rows
of the embedding, which gives bitwise the same logits.

Backends alternate within each repeat (the first repeat a warm-up, not counted); medians. Prints a final
JSON line and writes ``benchmarks/results/cpu_gemm.json`` (``_quick`` with ``--quick``: 3 repeats, 8
layers), with the commit and the machine (CPU model, vector unit, bf16: ``benchmarks/results_file.py``).

    python benchmarks/cpu_gemm_bench.py [--quick] [--rows 8,32,100]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from transformers import AutoConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.llm.models import cpu_description, describe_cpu, resolve_model_path  # noqa: E402

SETTLE_S = 0.3  # idle seconds before each timed run (see measure)


def layer_shapes(config) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's projections: q, k, v, o, gate, up, down."""
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    q = config.num_attention_heads * head_dim
    return [
        (q, hidden),
        (kv, hidden),
        (kv, hidden),
        (hidden, q),
        (inner, hidden),
        (inner, hidden),
        (hidden, inner),
    ]


class Step:
    """One decoding step's matrix products with every layer's own weights, in each backend."""

    def __init__(self, config, layers: int, vocab_chunk: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        shapes = layer_shapes(config) * layers
        self.weights = [torch.randn(shape, generator=generator) * 0.02 for shape in shapes]
        self.head = torch.randn((config.vocab_size, config.hidden_size), generator=generator) * 0.02
        self.head_chunks = self.head.split(vocab_chunk)
        self.flops_per_row = 2 * (sum(w.numel() for w in self.weights) + self.head.numel())
        self.backends: dict[str, Callable[[dict[int, torch.Tensor]], list[torch.Tensor]]] = {
            "torch": self.torch_linear
        }
        if torch.backends.mkl.is_available():
            self.backends["mkl_packed"] = self.mkl_packed
            self._packed_rows = 0
        if torch.backends.mkldnn.is_available():
            from torch.utils.mkldnn import MkldnnLinear

            def as_linear(weight: torch.Tensor) -> torch.nn.Linear:
                linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
                linear.weight.data = weight
                return linear

            self._onednn = [MkldnnLinear(as_linear(w), torch.float32) for w in [*self.weights, self.head]]
            self.backends["onednn"] = self.onednn
        self._numpy = [w.numpy() for w in [*self.weights, self.head]]
        self.backends["openblas"] = self.openblas

    # Every backend multiplies the same inputs (one per input width, made before timing) by each weight in
    # turn: the layers' hidden states are not chained, since a step's arithmetic and memory traffic are what
    # is timed, not the model's values.
    def torch_linear(self, inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in [*self.weights, self.head]]

    def vocab_chunks(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.nn.functional.linear(x, chunk) for chunk in self.head_chunks], dim=-1)

    def pack_mkl(self, rows: int) -> None:
        """MKL packs a weight for a batch size: reordered once per size, outside the timing."""
        if "mkl_packed" in self.backends and self._packed_rows != rows:
            self._packed = [
                torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in [*self.weights, self.head]
            ]
            self._packed_rows = rows

    def mkl_packed(self, inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        weights = [*self.weights, self.head]
        return [
            torch.ops.mkl._mkl_linear(inputs[w.shape[1]], packed, w, None, self._packed_rows)
            for w, packed in zip(weights, self._packed, strict=True)
        ]

    def onednn(self, inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [linear(inputs[linear.weight.shape[1]]) for linear in self._onednn]

    def openblas(self, inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        arrays = {width: x.numpy() for width, x in inputs.items()}
        return [torch.from_numpy(arrays[w.shape[1]] @ w.T) for w in self._numpy]


def step_inputs(rows: int, widths: set[int], seed: int) -> dict[int, torch.Tensor]:
    """One (rows, width) input per input width of the step's weights."""
    generator = torch.Generator().manual_seed(seed)
    return {width: torch.randn((rows, width), generator=generator) for width in sorted(widths)}


def compare(reference: list[torch.Tensor], other: list[torch.Tensor]) -> dict[str, object]:
    """Whether ``other`` is bitwise ``reference``, and its largest absolute difference."""
    pairs = list(zip(reference, other, strict=True))
    return {
        "bitwise_equal": all(torch.equal(a, b) for a, b in pairs),
        "max_abs_diff": max(float((a - b).abs().max()) for a, b in pairs),
    }


def measure(step: Step, rows: int, hidden: int, repeats: int) -> dict[str, object]:
    """Every backend's step, and the vocabulary projection whole and in chunks, at ``rows`` rows: medians
    of alternating repeats (the first a warm-up), speed-ups over ``torch`` and bitwise comparisons."""
    inputs = step_inputs(rows, {w.shape[1] for w in step.weights}, seed=rows)
    step.pack_mkl(rows)
    runs: dict[str, Callable[[], object]] = {
        **{name: (lambda backend=backend: backend(inputs)) for name, backend in step.backends.items()},
        "head": lambda: [torch.nn.functional.linear(inputs[hidden], step.head)],
        "head_in_chunks": lambda: [step.vocab_chunks(inputs[hidden])],
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, object] = {}
    for repeat in range(repeats):
        for name, run in runs.items():
            # Each BLAS keeps its own worker threads spinning a while after a call (OpenBLAS for about
            # 0.1 s), which on 2 cores would slow whatever runs next: let them go idle first.
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            outputs[name] = run()
            if repeat:
                seconds[name].append(time.perf_counter() - started)
    took = {name: median(values) for name, values in seconds.items()}
    backends = {
        name: {
            "ms_per_step": round(took[name] * 1e3, 2),
            "gflops": round(step.flops_per_row * rows / took[name] / 1e9, 1),
            "speedup_vs_torch": round(took["torch"] / took[name], 3),
            **compare(outputs["torch"], outputs[name]),
        }
        for name in step.backends
    }
    vocabulary = {
        "ms_whole": round(took["head"] * 1e3, 2),
        "ms_in_chunks": round(took["head_in_chunks"] * 1e3, 2),
        "speedup": round(took["head"] / took["head_in_chunks"], 3),
        "share_of_step": round(took["head"] / took["torch"], 3),
        **compare(outputs["head"], outputs["head_in_chunks"]),
    }
    return {"rows": rows, "backends": backends, "vocabulary_projection": vocabulary}


def describe(row: dict[str, object]) -> str:
    """One line of :func:`measure`'s result."""
    parts = [
        f"{name} {b['ms_per_step']:.1f} ms ({b['speedup_vs_torch']:.2f}x"
        + ("" if b["bitwise_equal"] else ", differs")
        + ")"
        for name, b in row["backends"].items()
    ]
    vocab = row["vocabulary_projection"]
    same = "bitwise equal" if vocab["bitwise_equal"] else "differs"
    return (
        f"rows {row['rows']:3d}: {'  '.join(parts)}; vocabulary projection {vocab['share_of_step']:.0%} "
        f"of the step, in chunks {vocab['speedup']:.2f}x ({same})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, 8 layers")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the policy whose shapes are used")
    parser.add_argument("--rows", default="8,32,100", help="rows a decoding step multiplies")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the model's; 8 with --quick)")
    parser.add_argument("--repeats", type=int, help="alternating repeats, the first a warm-up (default 5)")
    parser.add_argument("--vocab-chunk", type=int, default=2048, help="rows of the embedding per chunk")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = AutoConfig.from_pretrained(resolve_model_path(args.model))
    layers = args.layers or (8 if args.quick else config.num_hidden_layers)
    repeats = args.repeats or (3 if args.quick else 5)
    step = Step(config, layers, args.vocab_chunk)
    cpu = describe_cpu(cpu_description())
    print(f"{cpu}; {args.model} shapes, {layers} layers, {repeats} repeats", flush=True)
    results = []
    with torch.no_grad():
        for rows in [int(r) for r in args.rows.split(",") if r.strip()]:
            results.append(measure(step, rows, config.hidden_size, repeats))
            print(describe(results[-1]), flush=True)
    summary = {
        "benchmark": "cpu_gemm",
        "model": args.model,
        "layers": layers,
        "repeats_counted": repeats - 1,
        "threads": args.threads,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "results": results,
    }
    write_results("cpu_gemm_quick" if args.quick else "cpu_gemm", summary)


if __name__ == "__main__":
    main()
