"""Greedy evaluations of weights that never change, kept on disk and reused.

The main job evaluates the base model before training on the same held-out questions in every run, and
greedy decoding of the same weights on the same prompts gives the same episodes: on 2 CPU cores that
evaluation (the base model writes its whole token budget in every turn) costs about 90 s of a 15-minute
run. :class:`EvaluationCache` keeps such a result under a key made of everything it depends on, the
weights' bytes (:func:`weights_digest`), the caller's settings (questions, protocol, token budgets) and the
versions of the libraries that decode, so a changed model, question set or library never reads an old
result. No library memoises an evaluation keyed on weights (``functools.cache`` is per process and keys
on arguments, not on a model directory's contents), hence this file.

A file that is unreadable or not what :meth:`EvaluationCache.store` wrote is reported and recomputed,
never trusted; files are written whole (a temporary file renamed into place).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rllib_search.serve.retrieval.build import file_sha256
from rllib_search.serve.retrieval.manifest import write_manifest

logger = logging.getLogger(__name__)

#: Files whose bytes are a Hugging Face model directory's weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def weights_digest(model_dir: str | Path) -> str:
    """SHA-256 over the names and SHA-256s of a Hugging Face model directory's weight files and its
    ``config.json``, in name order (about a second for SmolLM2-135M)."""
    directory = Path(model_dir)
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
    )
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"{directory}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_sha256(path)}\0".encode())
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    """The versions of the libraries whose kernels decide greedy tokens."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


class EvaluationCache:
    """JSON results of deterministic evaluations under ``root``, one file per key."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @staticmethod
    def key(model_dir: str | Path, settings: Mapping[str, Any]) -> str:
        """The key of evaluating ``model_dir``'s weights with ``settings`` (JSON-serialisable: the
        questions, the protocol, the token budgets ...) under the installed libraries."""
        identity = {
            "weights": weights_digest(model_dir),
            "settings": settings,
            "libraries": library_versions(),
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def path(self, key: str) -> Path:
        """Where the result under ``key`` lives."""
        return self.root / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The result stored under ``key``; None when there is none, or when its file cannot be read as
        one (logged with the file's path)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            logger.warning("evaluation cache %s unreadable (%s): evaluating again", path, error)
            return None
        if (
            not isinstance(stored, dict)
            or stored.get("key") != key
            or not isinstance(stored.get("result"), dict)
        ):
            logger.warning(
                "evaluation cache %s: field 'key' or 'result' missing or wrong: evaluating again", path
            )
            return None
        return stored["result"]

    def store(self, key: str, result: Mapping[str, Any]) -> Path:
        """Write ``result`` under ``key`` whole (temporary file, then rename); returns its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        write_manifest(path, {"key": key, "result": dict(result)})
        return path

    def get_or_compute(
        self, key: str, compute: Callable[[], Mapping[str, Any]]
    ) -> tuple[dict[str, Any], bool]:
        """The result under ``key``, computed by ``compute()`` and stored when absent; and whether it was
        read from the cache."""
        cached = self.load(key)
        if cached is not None:
            return cached, True
        result = dict(compute())
        self.store(key, result)
        return result, False
