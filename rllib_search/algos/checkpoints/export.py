"""Export a trained LLMRLModule as a plain Hugging Face directory that transformers and vLLM load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllib_search.llm.models import merged_state_dict


def export_module(module: Any, path: str | Path) -> Path:
    """Write ``module``'s policy (LoRA adapters merged into the base weights, no value head) and its
    tokenizer to ``path`` with ``save_pretrained``; returns the directory."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model = module.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.save_pretrained(out, state_dict=merged_state_dict(model), safe_serialization=True)
    module.tokenizer.save_pretrained(out)
    meta = {"exported_from": "rllib_search.LLMRLModule", "source_model": str(module.llm_config["model"])}
    (out / "rllib_search_export.json").write_text(json.dumps(meta, indent=2))
    return out
