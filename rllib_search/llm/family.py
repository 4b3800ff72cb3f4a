"""Model families, for R-Search's cross-family guard: the evidence judge must be an independent reader.

R-Search scores evidence with a model "from a different family with distinct policy distributions" (a
Llama judge for a Qwen policy). Two models are taken to be of one family when their Hugging Face
``model_type`` belongs to the same group (``qwen2`` and ``qwen3`` are both Qwen). The ``llama``
architecture is shared by independent model lines (Meta's Llama 2 and 3, SmolLM2, TinyLlama...), so for it
the vocabulary size tells the lines apart: models of one line share their tokenizer. Where only a name is
known (an external OpenAI-compatible server), the family comes from the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_GROUPS = {
    "qwen": ("qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl"),
    "gemma": ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text"),
    "mistral": ("mistral", "mixtral", "ministral"),
    "phi": ("phi", "phi3", "phimoe", "phi4"),
    "deepseek": ("deepseek_v2", "deepseek_v3"),
    "olmo": ("olmo", "olmo2"),
}
_GROUP_OF_MODEL_TYPE = {model_type: group for group, types in _GROUPS.items() for model_type in types}

# Names seen on model hubs, checked in order (the first match wins).
_NAME_PATTERNS = (
    ("smollm", "llama/vocab49152"),
    ("tinyllama", "llama/vocab32000"),
    (r"llama[-_ ]?3|llama3", "llama/vocab128256"),
    (r"llama[-_ ]?2|llama2", "llama/vocab32000"),
    ("qwen", "qwen"),
    ("gemma", "gemma"),
    ("mistral|mixtral|ministral", "mistral"),
    (r"\bphi", "phi"),
    ("deepseek", "deepseek"),
    ("olmo", "olmo"),
)


@dataclass(frozen=True)
class ModelFamily:
    """A family name and how it was found (``config`` or ``name``)."""

    name: str
    source: str


def family_from_config(config: Any) -> ModelFamily:
    """The family of a model from its Hugging Face config (``model_type``, and ``vocab_size`` for llama)."""
    model_type = str(getattr(config, "model_type", "") or "")
    if not model_type:
        raise ValueError("the model config has no model_type")
    if model_type == "llama":
        return ModelFamily(f"llama/vocab{int(config.vocab_size)}", "config")
    return ModelFamily(_GROUP_OF_MODEL_TYPE.get(model_type, model_type), "config")


def family_from_name(name: str) -> ModelFamily | None:
    """The family a model name announces (``meta-llama/Llama-3.2-3B-Instruct`` -> Llama 3), or None."""
    lowered = name.lower()
    for pattern, family in _NAME_PATTERNS:
        if re.search(pattern, lowered):
            return ModelFamily(family, "name")
    return None


def family_from_description(description: dict[str, Any]) -> ModelFamily | None:
    """The family from what a judge says of its model: ``model_type`` (+ ``vocab_size``), else its name."""
    model_type = description.get("model_type")
    if model_type:
        return family_from_config(
            type("Config", (), {"model_type": model_type, "vocab_size": description.get("vocab_size", 0)})
        )
    name = description.get("model") or description.get("id")
    return family_from_name(str(name)) if name else None


class SameFamilyJudgeError(ValueError):
    """The evidence judge is of the policy's own family and that was not explicitly allowed."""


def check_cross_family(
    policy: ModelFamily, judge: ModelFamily | None, *, policy_name: str, judge_name: str, allow_same: bool
) -> str | None:
    """Raise :class:`SameFamilyJudgeError` when the judge is of the policy's family (unless ``allow_same``);
    return a warning when the judge's family is unknown, else None."""
    if judge is None:
        return f"could not tell the family of the evidence judge {judge_name!r}: cross-family check skipped"
    if judge.name == policy.name and not allow_same:
        raise SameFamilyJudgeError(
            f"the evidence judge {judge_name!r} is of the policy's own family ({judge.name}, like "
            f"{policy_name!r}): R-Search's evidence reward needs an independent reader of another family "
            "(e.g. a Llama judge for a Qwen policy, Gemma for SmolLM2). Pick a judge of another family, or "
            "set allow_same_family=True in the judge spec if you mean it."
        )
    return None
